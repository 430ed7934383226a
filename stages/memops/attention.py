"""Fused row kernels of transformer blocks (the nodes stages/graph/passes_transformer.py makes).

`AttentionSoftmax(S, [mask])`: softmax over the last axis of `scale * S + mask`, a NaN result replaced by
`nan_to` when set. One kernel over each row of scores, where the export runs a Mul, an Add, a Softmax, an
IsNaN and a Where over the whole tensor: the scaled, masked row is written once, exponentiated and summed in
place, then normalised. A row whose maximum is not finite (every key masked with -inf, or an inf or NaN
score) is all NaN, as in onnxruntime, and so `nan_to` when that is set.
"""

from __future__ import annotations

import math

from llvmlite import ir

from stages.codegen.irb import add, fconst, gep, i64, mul, splat, store_vec, vec
from stages.memops.loops import broadcast_strides, call_f32, f32
from stages.memops.opctx import OpCtx
from stages.memops.reduce import ROW_LANES, across_lanes, row_chunks, row_load, window_max
from stages.templates.epilogue import exp_f32

MIN_ROWS_PER_THREAD = 16  # a 12-head 128-key attention has 1536 rows of 128


def attention_softmax(ctx: OpCtx) -> None:
    shape = ctx.in_shape()
    n, rows = shape[-1], math.prod(shape[:-1])
    scale = float(ctx.attr("scale", 1.0))
    nan_to = ctx.attr("nan_to")
    strides = broadcast_strides(ctx.in_shape(1), shape) if ctx.has_input(1) else None
    L = ROW_LANES
    with ctx.parallel(rows, MIN_ROWS_PER_THREAD) as r:
        b = ctx.b
        x, y = ctx.inp(), ctx.out()
        base = mul(b, r, i64(n))
        mask = _mask_row(ctx, r, shape, strides) if strides is not None else None
        ninf, zero = fconst(vec(L), -math.inf), fconst(vec(L), 0.0)
        acc = ctx.local(vec(L))
        b.store(ninf, acc)

        def scaled(at: ir.Value, m: ir.Value | None) -> None:
            z = row_load(b, x, at, m, zero)
            z = z if scale == 1.0 else b.fmul(z, fconst(vec(L), scale))
            if mask is not None:
                z = b.fadd(z, mask(b.sub(at, base), m))
            store_vec(b, z, gep(b, y, at), m)
            b.store(window_max(b, b.load(acc), z if m is None else b.select(m, z, ninf)), acc)
        row_chunks(b, n, base, scaled)
        top = across_lanes(b, "fmax", b.load(acc))
        finite = b.fcmp_ordered("<", call_f32(b, "llvm.fabs.f32", top), f32(math.inf))
        with b.if_else(finite, likely=True) as (normal, degenerate):
            with normal:
                _exp_normalise(ctx, y, base, n, splat(b, top, L), nan_to)
            with degenerate:
                fill = fconst(vec(L), math.nan if nan_to is None else float(nan_to))
                row_chunks(b, n, base, lambda at, m: store_vec(b, fill, gep(b, y, at), m))


def _exp_normalise(ctx: OpCtx, y: ir.Value, base: ir.Value, n: int, top: ir.Value, nan_to: float | None) -> None:
    """y = exp(y - top) / its sum over the row (`nan_to` where that is NaN)."""
    b, L = ctx.b, ROW_LANES
    zero = fconst(vec(L), 0.0)
    acc = ctx.local(vec(L))
    b.store(zero, acc)

    def exp_sum(at: ir.Value, m: ir.Value | None) -> None:
        e = exp_f32(b, b.fsub(row_load(b, y, at, m, top), top))
        e = e if m is None else b.select(m, e, zero)
        b.store(b.fadd(b.load(acc), e), acc)
        store_vec(b, e, gep(b, y, at), m)
    row_chunks(b, n, base, exp_sum)
    inv = splat(b, b.fdiv(f32(1), across_lanes(b, "fadd", b.load(acc))), L)

    def scale(at: ir.Value, m: ir.Value | None) -> None:
        p = b.fmul(row_load(b, y, at, m, zero), inv)
        if nan_to is not None:
            p = b.select(b.fcmp_unordered("uno", p, p), fconst(vec(L), float(nan_to)), p)
        store_vec(b, p, gep(b, y, at), m)
    row_chunks(b, n, base, scale)


def _mask_row(ctx: OpCtx, r: ir.Value, shape: tuple[int, ...], strides: tuple[int, ...]):
    """A loader of the mask's vector at column offset `k` of row `r` (the mask broadcast to `shape`)."""
    b = ctx.b
    m = ctx.inp(1)
    offset: ir.Value = i64(0)
    inner = 1
    for d in range(len(shape) - 2, -1, -1):
        if strides[d]:
            idx = b.urem(b.udiv(r, i64(inner)), i64(shape[d])) if inner > 1 else b.urem(r, i64(shape[d]))
            offset = add(b, offset, mul(b, idx, i64(strides[d])))
        inner *= shape[d]
    if strides[-1] == 0:
        value = splat(b, b.load(gep(b, m, offset), align=4), ROW_LANES)
        return lambda k, valid: value
    return lambda k, valid: row_load(b, m, add(b, offset, k), valid, fconst(vec(ROW_LANES), 0.0))


OPS = {"AttentionSoftmax": attention_softmax}
__all__ = ["OPS", "attention_softmax"]
