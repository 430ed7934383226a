"""Flat element-wise int8 loops split over the worker pool, and the per-tensor QuantizeLinear in explicit
vectors.

The int8 anchors run on every thread; the element-wise ops between them (the model input's QuantizeLinear,
the residual `qadd`s) ran on one, which at 2 threads left ResNet-50's adds (about 0.4 ms) on a single core.
`split` cuts a contiguous range into fixed blocks (static trip counts, so the loops inside stay plain
vectorisable loops) and hands them to `OpCtx.parallel`. The per-tensor QuantizeLinear is 16-lane vectors
with the scale a constant: its scalar loop re-read the scale from memory every element, which the stores
to the output might alias, and did not vectorise (139 us on a 3x224x224 image, Zen 5).
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir

from stages.codegen.irb import I1, I32, for_range, gep, i64, intrinsic, mul, store_ints, vec
from stages.graph.reference_quant import limits
from stages.memops.opctx import OpCtx

BLOCK = 16384  # elements one parallel item covers
MIN_BLOCKS = 2  # blocks per thread below which a loop stays on one thread (a pool dispatch costs microseconds)
LANES = 16


def split(ctx: OpCtx, total: int, body: Callable[[ir.IRBuilder, ir.Value, int], None]) -> None:
    """`body(b, start, count)` over [0, total) in blocks of `BLOCK` (the last one shorter), each with a
    static `count`, split over the threads; `body` asks `ctx` for its pointers (they are per function)."""
    blocks = -(-total // BLOCK)
    last = total - (blocks - 1) * BLOCK
    with ctx.parallel(blocks, min_items=MIN_BLOCKS) as blk:
        b = ctx.b
        start = mul(b, blk, i64(BLOCK))
        if last == BLOCK:
            body(b, start, BLOCK)
            return
        with b.if_else(b.icmp_unsigned("<", blk, i64(blocks - 1))) as (full, tail):
            with full:
                body(b, start, BLOCK)
            with tail:
                body(b, start, last)


def _vcall(b: ir.IRBuilder, name: str, ret: ir.Type, *args: ir.Value) -> ir.Value:
    return b.call(intrinsic(b.module, name, ret, [a.type for a in args]), list(args))


def _quantize(b: ir.IRBuilder, v: ir.Value, scale: float, zero: int, dtype: str) -> ir.Value:
    """saturate(roundeven(v / scale) + zero) on `<16 x float>`, as `quant.saturate` does per element: the
    clamps keep a NaN, a select makes it 0, then a plain conversion (LLVM 22 scalarises the vector
    `fptosi.sat`: 16 compares and branches a vector)."""
    fty = vec(LANES)
    lo, hi = limits(dtype)
    q = b.fadd(_vcall(b, "llvm.roundeven.v16f32", fty, b.fdiv(v, ir.Constant(fty, [scale] * LANES))),
               ir.Constant(fty, [float(zero)] * LANES))
    lo_v, hi_v = ir.Constant(fty, [float(lo)] * LANES), ir.Constant(fty, [float(hi)] * LANES)
    q = b.select(b.fcmp_unordered(">", q, lo_v), q, lo_v)
    q = b.select(b.fcmp_unordered("<", q, hi_v), q, hi_v)
    q = b.select(b.fcmp_ordered("ord", q, q), q, ir.Constant(fty, [0.0] * LANES))
    return b.trunc(b.fptosi(q, ir.VectorType(I32, LANES)), ir.VectorType(ir.IntType(8), LANES))


def quantize_per_tensor(ctx: OpCtx, total: int, scale: float, zero: int, dtype: str) -> None:
    """y = saturate(round_half_even(x / scale) + zero) over a contiguous float32 tensor of `total` elements."""
    fty, bty = vec(LANES), ir.VectorType(ir.IntType(8), LANES)
    masked_load = f"llvm.masked.load.v{LANES}f32.p0"

    def body(b: ir.IRBuilder, start: ir.Value, count: int) -> None:
        x, y = gep(b, ctx.inp(0), start), gep(b, ctx.out(), start)
        full = count // LANES
        if full:
            with for_range(b, i64(0), i64(full), name="qv") as i:
                at = mul(b, i, i64(LANES))
                v = b.load(b.bitcast(gep(b, x, at), fty.as_pointer()), align=4)
                b.store(_quantize(b, v, scale, zero, dtype), b.bitcast(gep(b, y, at), bty.as_pointer()), align=1)
        if count % LANES:
            mask = ir.Constant(ir.VectorType(I1, LANES), [int(k < count % LANES) for k in range(LANES)])
            at = i64(full * LANES)
            v = b.call(intrinsic(b.module, masked_load, fty, [fty.as_pointer(), I32, mask.type, fty]),
                       [b.bitcast(gep(b, x, at), fty.as_pointer()), ir.Constant(I32, 4), mask,
                        ir.Constant(fty, [0.0] * LANES)])
            store_ints(b, _quantize(b, v, scale, zero, dtype), gep(b, y, at), mask)

    split(ctx, total, body)

