"""Reports of a tuning run, built once from the session summaries, the log and the manifest, so the
CLI, `--json`, the flows and their artifacts show the same numbers."""

from __future__ import annotations

from pathlib import Path

from schemas.manifest import Manifest
from schemas.report import OpReport, TaskReport
from schemas.target import Target
from stages.log import TuningLog
from stages.tune.loop import default_record
from stages.tune.session import SessionSummary


def task_report(summary: SessionSummary, log: TuningLog, target: Target, threads: int, weight: int = 1,
                built: bool | None = None) -> TaskReport:
    """The task's best against its default schedule's trial in the log (None when the log has none)."""
    default = default_record(log, summary.task, target, threads)
    best = summary.best
    default_gflops = round(default.gflops, 2) if default else None
    rounds_cv = best.rounds_cv if best else None
    return TaskReport(
        task=summary.task.description, task_signature=summary.task.signature, weight=weight, trials=summary.trials,
        new_trials=summary.new_trials, wall_s=round(summary.wall_s, 3), best_gflops=round(summary.best_gflops, 2),
        best_latency_ms=round(best.cost_s * 1e3, 4) if best else None,
        best_config=best.config.knobs if best else None, best_spread=round(best.result.spread, 4) if best else None,
        default_gflops=default_gflops,
        speedup_over_default=round(summary.best_gflops / default_gflops, 3) if default_gflops else None,
        errors=summary.errors, built=built, remeasured=bool(best and best.rounds), rounds=summary.rounds,
        rounds_cv=round(rounds_cv, 4) if rounds_cv is not None else None, unstable=bool(best and best.unstable),
        repeat_cv=round(summary.repeat_cv, 4) if summary.repeat_cv is not None else None, noise=summary.noise)


def op_report(summary: SessionSummary, log: TuningLog, target: Target, threads: int, numpy_gflops: float | None,
              chart: Path | None, numpy_note: str | None = None) -> OpReport:
    return OpReport(**task_report(summary, log, target, threads).model_dump(), target_key=target.key, target=target,
                    numpy_gflops=round(numpy_gflops, 2) if numpy_gflops is not None else None, numpy_note=numpy_note,
                    log=str(log.path), chart=str(chart) if chart else None)


def build_summary(manifest: Manifest, output: Path, verification=None) -> dict:
    """What `build` and `tune` report; `verification` is the build's self-check (None: built without one)."""
    kinds: dict[str, int] = {}
    templates: dict[str, int] = {}  # anchors per implementation: which ran Winograd, which the direct kernel
    for op in manifest.ops:
        kinds[op.kind] = kinds.get(op.kind, 0) + 1
        if op.kind in ("tuned", "default") and op.task:
            name = op.task.split("(")[0]
            templates[name] = templates.get(name, 0) + 1
    return {"library": str(output), "ops": kinds, "templates": templates, "threads": manifest.threads,
            "target_key": manifest.target_key,
            "log_digest": manifest.log_digest, "workspace_bytes": manifest.workspace_bytes,
            "naive_workspace_bytes": manifest.naive_workspace_bytes, "weights_bytes": manifest.weights_bytes,
            "build_s": round(manifest.build_s, 2),
            "padded_hand_offs": sum(1 for op in manifest.ops if op.layout and "x padded" in op.layout),
            "verify": verification.summary() if verification is not None else None}
