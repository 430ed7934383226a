"""Tune a whole model: extract → task scheduler → per round: propose → build → measure → record
(log append + cost-model retrain) → … → build the library → report.

Thin wiring of stages: the scheduler loop is `stages.tune.model.tune_tasks`, handed the
task-run versions of each round's steps (from `flows.tune_op`), so every step of every round
shows in the Prefect UI under the tuning task's name. The tuning log, not Prefect's database,
is the record of truth: a rerun of this flow resumes every task from the log.
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from flows.artifacts import ProgressArtifact, artifact_key, publish_chart, publish_results
from flows.tune_op import build as build_step
from flows.tune_op import propose, record, remeasure, run
from schemas.manifest import Manifest
from schemas.options import ImportLimits, TuningOptions
from schemas.record import REMEASURE
from schemas.target import Target
from schemas.task import TuningTask
from stages.build.verify import Verification, build_verified
from stages.extract import load_model
from stages.graph.ir import Graph
from stages.graph.passes import optimize
from stages.graph.tasks import ExtractedTask, extract_tasks
from stages.log import TuningLog
from stages.report.charts import log_charts
from stages.report.progress import ModelProgress
from stages.runtime import load
from stages.runtime.compare import compare, random_feeds
from stages.templates import template_for
from stages.tune.model import RoundSteps, tunable
from stages.tune.model import tune_tasks as tune_all
from stages.tune.session import SessionSummary

STEPS = RoundSteps(propose=propose, build=build_step, run=run, record=record, remeasure=remeasure)


@task(name="extract", task_run_name="extract {model}", cache_policy=NO_CACHE)
def extract(model: str, input_shapes: dict[str, tuple[int, ...]], limits: ImportLimits
            ) -> tuple[Graph, list[ExtractedTask]]:
    graph = optimize(load_model(model, input_shapes, **limits.model_dump()))
    tasks = extract_tasks(graph)
    return graph, [t for t, ok in zip(tasks, tunable([t.task for t in tasks]), strict=True) if ok]


@task(name="build-library", task_run_name="build-library {out}", cache_policy=NO_CACHE)
def build(model: str, graph: Graph, target: Target, out: str, threads: int, log_path: str | None,
          verify: bool = True) -> tuple[Manifest, str | None, Verification]:
    """The library in `out`, checked against `model` (`stages/build/verify.py`) when `verify`."""
    messages: list[str] = []
    manifest, verification = build_verified(model, graph, target, Path(out), threads,
                                            Path(log_path) if log_path else None, on_fallback=messages.append,
                                            verify=verify)
    return manifest, (messages[0] if messages else None), verification


@task(name="charts", cache_policy=NO_CACHE)
def charts(log_path: str, out_dir: str, target_key: str, threads: int) -> list[str]:
    return [str(p) for p in log_charts(TuningLog(log_path), Path(out_dir), target_key, threads)]


@task(name="latency", task_run_name="latency tuned vs default", cache_policy=NO_CACHE)
def latency(tuned: str, default: str) -> dict[str, dict]:
    """End-to-end latency of the tuned and the default-schedule library, interleaved in one process."""
    models = {"tuned": load(tuned), "default": load(default)}
    feeds = random_feeds(models["tuned"])
    return compare({name: (lambda m=m: m.run(**feeds)) for name, m in models.items()}, number=10, rounds=3)


@flow(name="tune-model", flow_run_name="tune-model {model} on {target_name}", log_prints=True)
def tune_model(model: str, target_name: str, options: TuningOptions, log_path: str, out: str,
               input_shapes: dict[str, tuple[int, ...]] | None = None, charts_dir: str | None = None,
               scheduler: str = "gradient", compare_default: bool = True, progress: bool = False,
               verify: bool = True, limits: ImportLimits | None = None) -> dict:
    """`options.n_trials` trials (log included) over the tasks of `model`, then the library in `out`."""
    target = Target.parse(target_name)
    threads = options.measure.threads
    graph, tasks = extract(model, input_shapes or {}, limits or ImportLimits())

    view = ModelProgress([t.task.description for t in tasks], options.n_trials, every=options.batch_size)

    def observers(t: TuningTask) -> list:
        artifact = ProgressArtifact(artifact_key("progress", t.op, t.signature), f"{t.description} on {target.name}",
                                    options.batch_size)
        return [artifact, view.observer(t.description)] if progress else [artifact]

    with view if progress else contextlib.nullcontext():
        summaries = tune_all([t.task for t in tasks], [t.weight for t in tasks], target, options,
                             TuningLog(log_path), options.n_trials, scheduler, observers, STEPS)
    manifest, fallback, verification = build(model, graph, target, out, threads, log_path, verify)
    pngs = charts(log_path, charts_dir or str(Path(out) / "charts"), target.key, threads)
    publish_results(artifact_key("results", Path(model).stem, target.name),
                    [_row(t, s, TuningLog(log_path), target, threads) for t, s in zip(tasks, summaries, strict=True)])
    for t, png in zip(tasks, _charts_by_task(pngs, tasks), strict=True):
        if png:
            publish_chart(artifact_key("convergence", t.task.op, t.task.signature), Path(png), t.task.description)
    latencies = None
    if compare_default:
        with tempfile.TemporaryDirectory(prefix="tunaflow-default-") as default_out:
            build(model, graph, target, default_out, threads, None, verify=False)  # only timed, never kept
            latencies = latency(out, default_out)
    create_markdown_artifact(_build_report(manifest, fallback, verification, latencies),
                             key=artifact_key("build", Path(model).stem), description=f"build report of {model}")
    return {"tasks": tasks, "summaries": summaries, "manifest": manifest, "fallback": fallback,
            "verification": verification, "charts": pngs, "latency": latencies}


def _row(t: ExtractedTask, s: SessionSummary, log: TuningLog, target: Target, threads: int) -> dict:
    """A results-table row; the default schedule's GFLOPS comes from its record in the log."""
    default_knobs = template_for(t.task).default_config(t.task, target).knobs
    default = [r for r in log.for_task(t.task.signature, target.key, threads)
               if r.tuner != REMEASURE and r.result.ok and r.config.knobs == default_knobs]
    default_gflops = max((r.gflops for r in default), default=0.0)
    best = s.best
    return {"task": f"{t.task.description} x{t.weight}", "trials": s.trials, "best_gflops": s.best_gflops,
            "best_latency_ms": best.result.median * 1e3 if best else None, "default_gflops": default_gflops,
            "speedup_over_default": s.best_gflops / default_gflops if default_gflops else None}


def _charts_by_task(pngs: list[str], tasks: list[ExtractedTask]) -> list[str | None]:
    return [next((p for p in pngs if t.task.signature in Path(p).name), None) for t in tasks]


def _build_report(manifest: Manifest, fallback: str | None, verification: Verification,
                  latencies: dict | None) -> str:
    lines = ["| node | op | schedule | task | from record |", "| --- | --- | --- | --- | --- |"]
    for op in manifest.ops:
        rec = f"trial {op.record['trial']} of {op.record['session_id']}" if op.record else "-"
        lines.append(f"| {op.node} | {op.op} | {op.kind} | {op.task or '-'} | {rec} |")
    head = [f"**{manifest.model}** for `{manifest.target_key}`, {manifest.threads} thread(s), "
            f"built in {manifest.build_s:.1f} s."]
    if fallback:
        head.append(f"Fallbacks: {fallback}")
    head.append(f"Checked against {verification.reference} on seeded random inputs in {verification.verify_s:.2f} s "
                f"(worst output off by {verification.max_error:.1e} of its max abs)." if verification.status == "passed"
                else f"Not checked: {verification.reason}.")
    if latencies:
        t, d = latencies["tuned"]["median_ms"], latencies["default"]["median_ms"]
        head.append(f"End-to-end latency (median): tuned {t:.3f} ms, default-schedule build {d:.3f} ms "
                    f"({d / t:.2f}x faster tuned).")
    return "\n\n".join(head) + "\n\n" + "\n".join(lines)
