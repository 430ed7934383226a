"""`tunaflow demo` (what `make demo` runs): tune the bundled CNN end to end, build, run, compare."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from tunaflow import runs as pipelines
from tunaflow.commands.model import VerifyOpt
from tunaflow.console import fail, interrupted, out
from tunaflow.limits import MAX_THREADS

DATA = Path(__file__).resolve().parent.parent.parent / "data"


def demo(
    trials: Annotated[int, typer.Option(help="trial budget over all of the CNN's tasks")] = 480,
    threads: Annotated[int, typer.Option(min=1, max=MAX_THREADS,
                                         help="threads the kernels are tuned, built and run with")] = 1,
    runs: Annotated[Path, typer.Option(help="where the demo's log, libraries and charts go")] = Path("runs"),
    prefect: Annotated[bool, typer.Option("--prefect/--no-prefect", help="run the tuning as a Prefect flow")] = True,
    verify: VerifyOpt = True,
) -> None:
    """Tune the bundled ResNet-like CNN, build its library, and time it against the default build and onnxruntime."""
    from rich.table import Table

    from schemas import MeasureOptions, Target, TuningOptions
    from stages.runtime.compare import paired_ratio

    model = DATA / "models" / "cnn.onnx"
    if not model.is_file():
        raise fail(f"{model} is missing; regenerate the bundled models with `python data/make_models.py`")
    run_dir = runs / f"demo-{datetime.now():%Y%m%d-%H%M%S}"
    out.print(f"[bold]tunaflow demo[/]: {model.name}, {trials} trials over its tasks, {threads} thread(s)"
              + (" (a temporary local Prefect server starts first, 10-20 s)" if prefect else ""))
    options = TuningOptions(n_trials=trials, batch_size=8, measure=MeasureOptions(threads=threads))
    try:
        report = pipelines.tune_model(model, Target.host(), options, run_dir / "log", run_dir / "lib", prefect=prefect,
                                      progress=True, budget=trials, verify=verify, compare_default=True,
                                      default_out=run_dir / "lib-default", charts_dir=run_dir / "charts")
    except KeyboardInterrupt:
        raise interrupted(run_dir / "log") from None
    stats = report.latency
    names = {"tuned": "tuned library", "default": "default-schedule library", "onnxruntime": "onnxruntime"}
    table = Table(title=f"{model.name}, batch 1, {threads} thread(s), median of 100 interleaved calls")
    for col in ("", "median ms", "p90 ms", "vs onnxruntime"):
        table.add_column(col, justify="left" if not col else "right")
    for name, s in stats.items():
        vs = f"{paired_ratio(stats, name, 'onnxruntime'):.2f}x" if "onnxruntime" in stats else "-"
        table.add_row(names[name], f"{s['median_ms']:.3f}", f"{s['p90_ms']:.3f}", vs)
    out.print(table)
    speedup = paired_ratio(stats, "default", "tuned")
    errors = (f"; max relative difference from onnxruntime: tuned {stats['tuned']['max_rel_error']:.1e}, default "
              f"{stats['default']['max_rel_error']:.1e}" if "onnxruntime" in stats else "")
    out.print(f"tuned vs default schedules: [bold green]{speedup:.2f}x faster[/]{errors}")
    tuned_tasks = sum(1 for t in report.tasks if t.best_gflops > 0)
    out.print(f"tasks tuned   : {tuned_tasks} of {len(report.tasks)} ({sum(t.trials for t in report.tasks)} "
              "trials in the log)")
    out.print(f"tuning log    : {escape(report.log)}")
    out.print(f"library       : {escape(str(run_dir / 'lib'))} (model.so, weights.bin, manifest.json)")
    out.print(f"default build : {escape(str(run_dir / 'lib-default'))}")
    out.print(f"charts        : {escape(str(run_dir / 'charts'))} ({len(report.charts)} PNG)")
    out.print(f"next          : tunaflow run {escape(str(run_dir / 'lib'))} --bench 50")
