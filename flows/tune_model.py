"""Tune a whole model: extract → tune every task → build the library → charts.

Thin wiring of stages, like `tune_op`: the tuning log, not Prefect's database, is the record of
truth, so a rerun of this flow resumes every task from the log.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from schemas.options import TuningOptions
from schemas.target import Target
from stages.build.library import build_library
from stages.build.manifest import Manifest
from stages.build.tune_all import tunable
from stages.build.tune_all import tune_tasks as tune_all
from stages.extract import load_model
from stages.graph.ir import Graph
from stages.graph.passes import optimize
from stages.graph.tasks import ExtractedTask, extract_tasks
from stages.log import TuningLog
from stages.report.charts import log_charts
from stages.tune.session import SessionSummary


@task(name="extract", cache_policy=NO_CACHE)
def extract(model: str, input_shapes: dict[str, tuple[int, ...]]) -> tuple[Graph, list[ExtractedTask]]:
    graph = optimize(load_model(model, input_shapes))
    tasks = extract_tasks(graph)
    return graph, [t for t, ok in zip(tasks, tunable([t.task for t in tasks]), strict=True) if ok]


@task(name="tune-tasks", cache_policy=NO_CACHE)
def tune_tasks(tasks: list[ExtractedTask], target: Target, options: TuningOptions, log_path: str,
               scheduler: str) -> list[SessionSummary]:
    return tune_all([t.task for t in tasks], [t.weight for t in tasks], target, options, TuningLog(log_path),
                    options.n_trials, scheduler)


@task(name="build-library", cache_policy=NO_CACHE)
def build(graph: Graph, target: Target, out: str, threads: int, log_path: str) -> tuple[Manifest, str | None]:
    messages: list[str] = []
    manifest = build_library(graph, target, Path(out), threads, Path(log_path), on_fallback=messages.append)
    return manifest, (messages[0] if messages else None)


@task(name="charts", cache_policy=NO_CACHE)
def charts(log_path: str, out_dir: str, target_key: str, threads: int) -> list[str]:
    return [str(p) for p in log_charts(TuningLog(log_path), Path(out_dir), target_key, threads)]


@flow(name="tune-model", flow_run_name="tune-model {model}", log_prints=True)
def tune_model(model: str, target_name: str, options: TuningOptions, log_path: str, out: str,
               input_shapes: dict[str, tuple[int, ...]] | None = None, charts_dir: str | None = None,
               scheduler: str = "gradient") -> dict:
    """`options.n_trials` trials (log included) over the tasks of `model`, then the library in `out`."""
    target = Target.parse(target_name)
    graph, tasks = extract(model, input_shapes or {})
    summaries = tune_tasks(tasks, target, options, log_path, scheduler)
    manifest, fallback = build(graph, target, out, options.measure.threads, log_path)
    pngs = charts(log_path, charts_dir or str(Path(out) / "charts"), target.key, options.measure.threads)
    return {"tasks": tasks, "summaries": summaries, "manifest": manifest, "fallback": fallback, "charts": pngs}
