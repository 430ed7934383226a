"""The int8 anchors' requantize epilogue (the shared spec of issue 26), in IR and in numpy.

`y = saturate(round_half_to_even(float32(acc_i32) * S[n]) + zy)`, then the fused `relu` (a lower
clamp at zy) and `clip` (min, max given in the quantized domain) in order. Every bound is an
integer, so clamping before or after rounding gives the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from schemas.task import EpilogueOp, TuningTask
from stages.codegen.irb import F32, call_math, fconst, intrinsic
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


def emit(b: ir.IRBuilder, rq: Requant, acc: ir.Value, scale: ir.Value, x86: bool) -> ir.Value:
    """`<lanes x i8>` outputs of `<lanes x i32>` sums (bias included) and `<lanes x float>` scales.

    The clamps act on the float (bounds shifted by -zy), so the conversion never leaves the int32
    range; on x86 (`x86`) rounding and conversion are one `llvm.lrint` (`cvtps2dq`, round-half-even
    under the default MXCSR), elsewhere `llvm.rint` then a truncating conversion, which every LLVM
    backend lowers natively. (Clamping in int32 instead, which LLVM folds into a saturating masked
    `vpmovusdb` store, gave wrong bytes at tiles' right edges in test_qdense's odd shapes.)"""
    lanes = acc.type.count
    ity = ivec(lanes)
    f = b.fmul(b.sitofp(acc, ir.VectorType(F32, lanes)), scale)
    if not x86:
        f = call_math(b, "llvm.rint", f)
    for lo, hi in rq.bounds:
        if lo is not None:
            f = call_math(b, "llvm.maxnum", f, fconst(f.type, float(lo) - rq.zy))
        if hi is not None:
            f = call_math(b, "llvm.minnum", f, fconst(f.type, float(hi) - rq.zy))
    if x86:
        y = b.call(intrinsic(b.module, f"llvm.lrint.v{lanes}i32.v{lanes}f32", ity, [f.type]), [f])
    else:
        y = b.fptosi(f, ity)
    return b.trunc(b.add(y, ir.Constant(ity, [rq.zy] * lanes)), ir.VectorType(I8, lanes))


def reference(rq: Requant, acc: np.ndarray, scale: np.ndarray, dtype: str) -> np.ndarray:
    """The spec in numpy: `acc` exact integer sums (bias included), `scale` broadcast against it."""
    f = acc.astype(np.int32).astype(np.float32) * scale.astype(np.float32)
    y = np.rint(f).astype(np.float64) + rq.zy
    for lo, hi in rq.bounds:
        y = np.clip(y, lo, hi) if lo is not None and hi is not None else \
            np.maximum(y, lo) if lo is not None else np.minimum(y, hi) if hi is not None else y
    return y.astype(np.int64).astype(dtype)

