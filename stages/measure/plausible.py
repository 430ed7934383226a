"""A device's result is a claim: judge it before the host records it.

A result that does not parse, a cost that is not a positive finite number, or a cost faster than
the target could possibly run the task's FLOPs becomes an `implausible_result` error, so it can
never crash the host's arithmetic nor become the best config. The bound is deliberately generous
(every vector lane doing two fused multiply-adds a cycle on two FMA units at 6 GHz, on every
thread, then a margin of 2, and the Winograd twin's 4x fewer multiplies on top): no honest
measurement comes near it, and a lying one (1e-12 s for a matmul) is far past it.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

from pydantic import ValidationError

from schemas.measure import MeasureErrorNo, MeasureResult
from schemas.target import Target
from schemas.task import TuningTask

PEAK_CLOCK_HZ = 6e9
FMA_UNITS = 2
MARGIN = 2.0
# F(4x4, 3x3): 36 multiplies where the direct conv does 144; int8 anchors: vpdpbusd does 4 multiply-adds per
# 32-bit lane where an FMA does one
ALGORITHMIC_GAIN = {"conv2d_winograd": 4.0, "qdense": 4.0, "qconv2d": 4.0, "qmatmul": 4.0}
MAX_MSG_CHARS = 2000


def peak_flops(target: Target, threads: int) -> float:
    """An upper bound of the float32 FLOP/s `threads` threads can reach on `target`."""
    return target.vector_lanes * 2 * FMA_UNITS * PEAK_CLOCK_HZ * max(1, threads)


def fastest_plausible_s(task: TuningTask, target: Target, threads: int) -> float:
    """Seconds per call below which a cost for `task` cannot be a real measurement."""
    return task.flops / (peak_flops(target, threads) * MARGIN * ALGORITHMIC_GAIN.get(task.op, 1.0))


def judge(raw: object, task: TuningTask, target: Target, threads: int) -> MeasureResult:
    """`raw` (a MeasureResult as received, or its JSON object) if it is plausible, else an implausible_result error."""
    try:
        result = raw if isinstance(raw, MeasureResult) else MeasureResult.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "result"
        return _implausible(f"malformed device result ({where}: {first['msg']})", 0.0)
    if len(result.error_msg) > MAX_MSG_CHARS:
        result = result.model_copy(update={"error_msg": result.error_msg[:MAX_MSG_CHARS] + "..."})
    why = _why_implausible(result, task, target, threads)
    return _implausible(why, result.build_s) if why else result


def _why_implausible(result: MeasureResult, task: TuningTask, target: Target, threads: int) -> str:
    bad = [c for c in result.costs if not (math.isfinite(c) and c > 0)]
    if bad:
        return f"device reported a cost of {bad[0]!r} s (costs must be positive and finite)"
    if not math.isfinite(result.run_s) or not math.isfinite(result.build_s):
        return "device reported a non-finite run or build time"
    if result.error_no != MeasureErrorNo.no_error:
        return ""
    if not result.costs:
        return "device reported success without any timing"
    floor = fastest_plausible_s(task, target, threads)
    fastest = min(result.costs)
    if fastest < floor:
        gflops = task.flops / fastest / 1e9
        return (f"device reported {fastest:.3g} s ({gflops:.3g} GFLOPS), faster than {target.name}'s peak allows "
                f"at {threads} thread(s) (at least {floor:.3g} s)")
    return ""


def _implausible(why: str, build_s: float) -> MeasureResult:
    return MeasureResult(error_no=MeasureErrorNo.implausible_result, error_msg=why,
                         build_s=build_s if math.isfinite(build_s) else 0.0, timestamp=datetime.now(UTC))
