"""The int8 anchors' requantize epilogue (the shared spec of issue 26), in IR and in numpy.

`y = saturate(round_half_to_even(float32(acc_i32) * S[n]) + zy)`, then the fused `relu` (a lower
clamp at zy) and `clip` (min, max given in the quantized domain) in order. The IR clamps the
rounded float before converting it (bounds shifted by -zy are small integers, so clamping there
is exact, and the conversion never sees a value out of the int32 range).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from schemas.task import EpilogueOp, TuningTask
from stages.codegen.irb import F32, call_math, fconst
from stages.templates.qgemm_isa import I8, ivec

FUSABLE = ("relu", "clip")
RANGES = {"uint8": (0, 255), "int8": (-128, 127)}


@dataclass(frozen=True)
class Requant:
    zy: int
    bounds: tuple[tuple[float | None, float | None], ...]  # (lower, upper) clamps in order, output domain


def validate(ops: tuple[EpilogueOp, ...]) -> None:
    bad = [op.kind for op in ops if op.kind not in FUSABLE]
    if bad:
        raise ValueError(f"int8 anchors fuse only {list(FUSABLE)} after requantizing, got {bad}")


def requant_of(task: TuningTask) -> Requant:
    validate(task.epilogue)
    zy = int(task.attrs.get("y_zero_point", 0))
    lo, hi = RANGES[task.outputs[0].dtype]
    bounds: list[tuple[float | None, float | None]] = [(float(lo), float(hi))]
    for op in task.epilogue:
        if op.kind == "relu":
            bounds.append((float(zy), None))
        else:
            bounds.append((op.attrs.get("min"), op.attrs.get("max")))
    return Requant(zy=zy, bounds=tuple(bounds))


def emit(b: ir.IRBuilder, rq: Requant, acc: ir.Value, scale: ir.Value) -> ir.Value:
    """`<lanes x i8>` outputs of `<lanes x i32>` sums (bias included) and `<lanes x float>` scales."""
    lanes = acc.type.count
    f = call_math(b, "llvm.rint", b.fmul(b.sitofp(acc, ir.VectorType(F32, lanes)), scale))
    for lo, hi in rq.bounds:
        if lo is not None:
            f = call_math(b, "llvm.maxnum", f, fconst(f.type, float(lo) - rq.zy))
        if hi is not None:
            f = call_math(b, "llvm.minnum", f, fconst(f.type, float(hi) - rq.zy))
    y = b.add(b.fptosi(f, ivec(lanes)), ir.Constant(ivec(lanes), [rq.zy] * lanes))
    return b.trunc(y, ir.VectorType(I8, lanes))


def reference(rq: Requant, acc: np.ndarray, scale: np.ndarray, dtype: str) -> np.ndarray:
    """The spec in numpy: `acc` exact integer sums (bias included), `scale` broadcast against it."""
    f = acc.astype(np.int32).astype(np.float32) * scale.astype(np.float32)
    y = np.rint(f).astype(np.float64) + rq.zy
    for lo, hi in rq.bounds:
        y = np.clip(y, lo, hi) if lo is not None and hi is not None else \
            np.maximum(y, lo) if lo is not None else np.minimum(y, hi) if hi is not None else y
    return y.astype(np.int64).astype(dtype)

