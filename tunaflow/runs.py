"""How a command runs a pipeline: as a Prefect flow on a temporary local server (every step a task run,
visible in the UI) or directly; the same stage code either way, and the same one-line errors."""

from __future__ import annotations

import contextlib
from pathlib import Path

from tunaflow.console import fail, prefect_env


def tune_model(model: Path, target, options, log: Path, output: Path, *, prefect: bool, progress: bool,
               budget: int | None = None, input_shapes: dict | None = None, limits=None, scheduler: str = "gradient",
               verify: bool = True, compare_default: bool = False, default_out: Path | None = None,
               charts_dir: Path | None = None):
    """`stages.pipeline.model.tune_model`'s ModelReport; bad input and unusable logs end in `fail`."""
    from schemas.errors import ModelError
    from stages.build.library import BuildError
    from stages.log import LogError

    try:
        if prefect:
            prefect_env()
            from flows.server import local_server
            from flows.tune_model import tune_model as flow

            with local_server():
                return flow(str(model), target, options, str(log), str(output), budget, input_shapes,
                            str(charts_dir) if charts_dir else None, scheduler, compare_default,
                            str(default_out) if default_out else None, progress=progress, verify=verify,
                            limits=limits)
        from stages.pipeline.model import tune_model as direct
        from stages.report.progress import ModelProgress

        @contextlib.contextmanager
        def view(tasks, total):
            live = ModelProgress(tasks, total, every=options.batch_size)
            with live if progress else contextlib.nullcontext():
                yield (lambda t: [live.observer(t)]) if progress else None

        return direct(model, target, options, log, output, budget=budget, input_shapes=input_shapes, limits=limits,
                      scheduler=scheduler, verify=verify, compare_default=compare_default, default_out=default_out,
                      charts_dir=charts_dir, view=view)[0]
    except (ModelError, BuildError, LogError) as exc:  # the records already in the log are intact
        raise fail(str(exc)) from exc


def tune_op(task, target, options, log: Path, *, prefect: bool, progress: bool, task_runner: str = "local",
            charts: Path | None = None):
    """`stages.pipeline.op.tune_op`, directly or as the Prefect flow (whose steps are task runs)."""
    from stages.log import LogError, TuningLog

    try:
        TuningLog(log).records()
        if prefect:
            prefect_env()
            from flows.runners import is_distributed, make_task_runner
            from flows.server import local_server
            from flows.tune_op import tune_op as flow

            try:
                runner = make_task_runner(task_runner)
            except ValueError as exc:
                raise fail(str(exc)) from exc
            with local_server():
                return (flow.with_options(task_runner=runner) if runner else flow)(
                    task, target, options, str(log), str(charts) if charts else None, progress=progress,
                    distributed_builds=is_distributed(task_runner))
        from stages.pipeline.op import tune_op as direct
        from stages.report.progress import TerminalProgress

        with TerminalProgress(task.description, options.n_trials, every=options.batch_size) as bar:
            return direct(task, target, options, log, charts, [bar] if progress else [])
    except LogError as exc:  # unwritable or busy log: one line, the records already there are intact
        raise fail(str(exc)) from exc
