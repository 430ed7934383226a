"""Tune one operator as a Prefect flow: `stages.pipeline.op.tune_op` with each step a task run, plus the
UI's artifacts (live progress, the results table, the convergence chart)."""

from __future__ import annotations

from pathlib import Path

from prefect import flow

from flows.artifacts import ProgressArtifact, artifact_key, publish_chart, publish_results, resolve_target, run_name
from flows.steps import DISTRIBUTED, STEPS
from schemas.options import TuningOptions
from schemas.report import OpReport
from schemas.target import Target
from schemas.task import TuningTask
from stages.pipeline import op as pipeline
from stages.report.progress import TerminalProgress


@flow(name="tune-op", flow_run_name=run_name("tune-op", "op"), log_prints=True)
def tune_op(op: TuningTask, target: Target | str, options: TuningOptions, log_path: str, charts_dir: str | None = None,
            progress: bool = True, distributed_builds: bool = False) -> OpReport:
    """Tune `op` for `target` until the log holds `options.n_trials` trials for it."""
    target = resolve_target(target, options.runner)
    observers = [ProgressArtifact(artifact_key("progress", op.op, op.signature), f"{op.description} on {target.name}",
                                  options.batch_size)]
    with TerminalProgress(op.description, options.n_trials, every=options.batch_size) as bar:
        report = pipeline.tune_op(op, target, options, Path(log_path), Path(charts_dir) if charts_dir else None,
                                  observers + ([bar] if progress else []), DISTRIBUTED if distributed_builds else STEPS)
    publish_results(artifact_key("results", op.op, op.signature), [report.model_dump()])
    if report.chart:
        publish_chart(artifact_key("convergence", op.op, op.signature), Path(report.chart), op.description)
    return report
