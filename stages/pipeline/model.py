"""Tune a whole model: extract → the tuning loop over its tasks → each op's top records timed inside the
model (`stages/refine`) → build the library and check it → charts → (optionally) its latency against the
default-schedule build and onnxruntime.

The tuning log, not Prefect's database, is the record of truth: a rerun resumes every task from it.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from schemas.manifest import Manifest
from schemas.options import ImportLimits, TuningOptions
from schemas.report import ModelReport, RefineReport
from schemas.target import Target
from schemas.task import TuningTask
from stages.build.verify import Verification, build_verified
from stages.extract import load_model
from stages.graph.ir import Graph
from stages.graph.passes import optimize
from stages.graph.tasks import ExtractedTask, extract_tasks
from stages.log import TuningLog
from stages.refine.in_model import refine
from stages.report.charts import log_charts
from stages.report.summary import build_summary, task_report
from stages.runtime import load
from stages.runtime.compare import compare, max_rel_error, onnxruntime_runner, random_feeds
from stages.tune.loop import Steps, tunable, tune_tasks
from stages.tune.session import Observer

TRIALS_PER_TASK = 64  # the bundled CNN: 10 tasks and 5 Winograd twins, 960 trials


def load_graph(model: str | Path, input_shapes: dict[str, tuple[int, ...]] | None = None,
               limits: ImportLimits | None = None) -> Graph:
    """The model imported (static shapes bound, within `limits`) and optimised: what tasks come from."""
    return optimize(load_model(model, input_shapes or {}, **(limits or ImportLimits()).model_dump()))


def tunable_tasks(graph: Graph) -> list[ExtractedTask]:
    """The graph's tasks a template can tune, each op followed by its alternative implementations."""
    tasks = extract_tasks(graph)
    return [t for t, ok in zip(tasks, tunable([t.task for t in tasks]), strict=True) if ok]


def default_budget(tasks: list[ExtractedTask]) -> int:
    """The trial budget when none is given: TRIALS_PER_TASK for each tunable task."""
    return TRIALS_PER_TASK * max(1, len(tasks))


def extract(model: str, input_shapes: dict[str, tuple[int, ...]], limits: ImportLimits
            ) -> tuple[Graph, list[ExtractedTask]]:
    graph = load_graph(model, input_shapes, limits)
    return graph, tunable_tasks(graph)


def build_checked(model: str, graph: Graph, target: Target, out: str, threads: int, log: str | None,
                  verify: bool = True) -> tuple[Manifest, str | None, Verification]:
    """The library in `out`, checked against `model` when `verify` (`stages/build/verify.py`), and the
    first fallback message (an anchor the log had no schedule for), if any."""
    messages: list[str] = []
    manifest, verification = build_verified(model, graph, target, Path(out), threads, Path(log) if log else None,
                                            on_fallback=messages.append, verify=verify)
    return manifest, (messages[0] if messages else None), verification


def refine_in_model(graph: Graph, target: Target, threads: int, log: str, top_k: int) -> RefineReport:
    return refine(graph, target, threads, Path(log), top_k)


def charts(log: str, out_dir: str, target_key: str, threads: int) -> list[str]:
    return [str(p) for p in log_charts(TuningLog(log), Path(out_dir), target_key, threads)]


def time_libraries(model: str, tuned: str, default: str, threads: int) -> dict[str, dict]:
    """Latency of the tuned and the default-schedule library (and onnxruntime where installed), interleaved
    in one process on the same seeded inputs, and each library's largest relative difference from
    onnxruntime's outputs (`max_rel_error`, only with onnxruntime)."""
    libs = {"tuned": load(tuned), "default": load(default)}
    feeds = random_feeds(libs["tuned"])
    contenders: dict[str, Callable[[], object]] = {name: (lambda m=m: m.run(**feeds)) for name, m in libs.items()}
    errors = {}
    with contextlib.suppress(ImportError):
        ort = onnxruntime_runner(Path(model), threads)
        want = ort(feeds)
        errors = {name: max(max_rel_error(got, w) for got, w in zip(m.run(**feeds).values(), want, strict=True))
                  for name, m in libs.items()}
        contenders["onnxruntime"] = lambda: ort(feeds)
    stats = compare(contenders)
    for name, err in errors.items():
        stats[name]["max_rel_error"] = err
    return stats


@dataclass(frozen=True)
class ModelSteps(Steps):
    """The tuning loop's steps plus the model's own: extract, refine, build, charts, latency."""

    extract: Callable[[str, dict[str, tuple[int, ...]], ImportLimits], tuple[Graph, list[ExtractedTask]]] = extract
    refine: Callable[[Graph, Target, int, str, int], RefineReport] = refine_in_model
    build_library: Callable[..., tuple[Manifest, str | None, Verification]] = build_checked
    charts: Callable[[str, str, str, int], list[str]] = charts
    latency: Callable[[str, str, str, int], dict[str, dict]] = time_libraries


DIRECT = ModelSteps()

# Given the tasks and the budget, a context (a live progress view, say) yielding each task's observers.
View = Callable[[list[ExtractedTask], int], AbstractContextManager[Callable[[TuningTask], list[Observer]]]]


def tune_model(model: Path, target: Target, options: TuningOptions, log: Path, out: Path, *,
               budget: int | None = None, input_shapes: dict[str, tuple[int, ...]] | None = None,
               limits: ImportLimits | None = None, scheduler: str = "gradient", verify: bool = True,
               compare_default: bool = False, default_out: Path | None = None, charts_dir: Path | None = None,
               view: View | None = None, steps: ModelSteps = DIRECT) -> tuple[ModelReport, Manifest]:
    """`budget` trials (log included; default TRIALS_PER_TASK per task) over the tasks of `model`, then the
    library in `out`, its charts in `charts_dir` (default OUT/charts) and, with `compare_default`, the
    default-schedule build (kept in `default_out` and checked there, else in a temporary directory) timed
    against it."""
    TuningLog(log).records()  # a log that cannot be read stops the run before any import or tuning
    threads = options.measure.threads
    graph, tasks = steps.extract(str(model), input_shapes or {}, limits or ImportLimits())
    budget = default_budget(tasks) if budget is None else budget
    with view(tasks, budget) if view else contextlib.nullcontext(None) as observers:
        summaries = tune_tasks([t.task for t in tasks], [t.weight for t in tasks], target, options, TuningLog(log),
                               budget, scheduler, observers, steps)
    refined = None
    if options.refine_top_k > 1:
        refined = steps.refine(graph, target, threads, str(log), options.refine_top_k) \
            if options.runner.kind == "local" else RefineReport(
                ops=[], variants=0, rounds=0, seconds=0.0,
                skipped="the kernels ran on an RPC device; in-model timing runs the library on this machine")
    manifest, fallback, verification = steps.build_library(str(model), graph, target, str(out), threads, str(log),
                                                           verify)
    pngs = steps.charts(str(log), str(charts_dir or out / "charts"), target.key, threads)
    latency = None
    if compare_default:
        with (contextlib.nullcontext(str(default_out)) if default_out else
              tempfile.TemporaryDirectory(prefix="tunaflow-default-")) as default_dir:
            steps.build_library(str(model), graph, target, default_dir, threads, None, verify and bool(default_out))
            latency = steps.latency(str(model), str(out), default_dir, threads)
    built = {op.task_signature for op in manifest.ops if op.task_signature}  # of a conv and its twin, the faster
    tlog = TuningLog(log)
    rows = [task_report(s, tlog, target, threads, t.weight, t.task.signature in built)
            for t, s in zip(tasks, summaries, strict=True)]
    report = ModelReport(model=str(model), log=str(log), target=target, charts=pngs, fallback=fallback, tasks=rows,
                         build=build_summary(manifest, out, verification), latency=latency,
                         refine=refined)
    return report, manifest
