"""Tune one operator: the tuning loop with one task, then its report and convergence chart."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from schemas.options import TuningOptions
from schemas.record import REMEASURE
from schemas.report import OpReport
from schemas.target import Target
from schemas.task import TuningTask
from stages.log import TuningLog
from stages.measure.numpy_ref import numpy_gflops
from stages.report.charts import convergence_chart
from stages.report.summary import op_report
from stages.tune.loop import DIRECT, Steps, tune_task
from stages.tune.session import Observer


def charts_beside(log: Path) -> Path:
    """Where a log's charts go by default: beside it, so the log directory holds only Parquet parts."""
    return log.parent / f"{log.name}-charts"


def tune_op(task: TuningTask, target: Target, options: TuningOptions, log: Path, charts: Path | None = None,
            observers: list[Observer] | None = None, steps: Steps = DIRECT,
            reference: Callable[[TuningTask, int], float] = numpy_gflops) -> OpReport:
    """`options.n_trials` trials of `task` in `log` (a rerun resumes), its chart in `charts` (default: beside
    the log) and its report, with `reference` (numpy's GFLOPS for the same op) measured afterwards, here: so
    not for candidates measured on RPC devices, whose figure would be this host's numpy, not theirs."""
    tlog = TuningLog(log)
    threads = options.measure.threads
    summary = tune_task(task, target, options, tlog, observers, steps)
    records = [r for r in tlog.for_task(task.signature, target.key, threads) if r.tuner != REMEASURE]
    chart = None
    if records:
        dest = (charts or charts_beside(log)) / f"{task.signature}_t{threads}.png"
        chart = convergence_chart(records, task.description, dest)
    if options.runner.kind == "rpc":
        return op_report(summary, tlog, target, threads, None, chart, numpy_note=(
            f"not measured: the candidates ran on the devices under key {options.runner.key!r}, numpy here"))
    return op_report(summary, tlog, target, threads, reference(task, threads), chart)
