"""The result of tuning one operator, as the CLI prints it and the flow returns it."""

from __future__ import annotations

from schemas.measure import MeasureResult
from stages.tune.session import SessionSummary


def op_report(summary: SessionSummary, default: MeasureResult, numpy_gflops: float, log_path: str) -> dict:
    default_gflops = summary.task.flops / default.median / 1e9 if default.ok else 0.0
    best = summary.best
    return {
        "task": summary.task.description,
        "task_signature": summary.task.signature,
        "target_key": summary.target_key,
        "trials": summary.trials,
        "new_trials": summary.new_trials,
        "wall_s": round(summary.wall_s, 3),
        "best_gflops": round(summary.best_gflops, 2),
        "best_config": best.config.knobs if best else None,
        "best_latency_ms": round(best.result.median * 1e3, 4) if best else None,
        "best_spread": round(best.result.spread, 4) if best else None,
        "default_gflops": round(default_gflops, 2),
        "speedup_over_default": round(summary.best_gflops / default_gflops, 3) if default_gflops else None,
        "numpy_gflops": round(numpy_gflops, 2),
        "errors": summary.errors,
        "log": log_path,
    }
