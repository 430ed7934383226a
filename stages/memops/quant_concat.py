"""`qconcat`: int8 tensors of different scales concatenated over channels into one quantized tensor
(stages/graph/passes_quant_islands.py; reference_quant._qconcat).

Input i of image n is one contiguous run of bytes, and so is its place in the output: the runs are cut into
blocks of `quant_flat.BLOCK` bytes, all blocks of all inputs one parallel range. Each byte goes through its
input's 256-entry table of Q(DQ_i(byte)), 64 at a time by byte permutes where the target has them (AVX-512
VBMI), otherwise as the float chain itself (dequantize, divide by the output scale, round, saturate), which
LLVM vectorises: the table holds exactly the values that chain computes.
"""

from __future__ import annotations

import math

from llvmlite import ir

from stages.codegen.irb import F32, I32, add, for_range, gep, i64, intrinsic, mul
from stages.memops import quant_flat
from stages.memops.loops import f32
from stages.memops.opctx import OpCtx
from stages.memops.quant import roundeven, saturate, widen
from stages.memops.quant_islands import BYTE_VEC, BYTES, bytes_at, lookup64


def qconcat(ctx: OpCtx) -> None:
    shape = ctx.out_shape()
    images, plane, channels = shape[0], math.prod(shape[2:]), shape[1]
    counts = [ctx.in_shape(i)[1] for i in range(len(ctx.attr("parts")))]
    offsets = [sum(counts[:i]) for i in range(len(counts))]
    runs = [c * plane for c in counts]
    blocks = [-(-r // quant_flat.BLOCK) for r in runs]
    firsts = [images * sum(blocks[:i]) for i in range(len(blocks))]
    with ctx.parallel(images * sum(blocks), min_items=quant_flat.MIN_BLOCKS) as item:
        for i, first in enumerate(firsts):
            b = ctx.b
            mine = b.and_(b.icmp_unsigned(">=", item, i64(first)),
                          b.icmp_unsigned("<", item, i64(first + images * blocks[i])))
            with b.if_then(mine):
                j = b.sub(item, i64(first))
                image, block = b.udiv(j, i64(blocks[i])), b.urem(j, i64(blocks[i]))
                start = mul(b, block, i64(quant_flat.BLOCK))
                count = b.select(b.icmp_unsigned("<", block, i64(blocks[i] - 1)), i64(quant_flat.BLOCK),
                                 b.sub(i64(runs[i]), start))
                src = gep(b, ctx.inp(i), add(b, mul(b, image, i64(runs[i])), start))
                dst = gep(b, ctx.out(), add(b, mul(b, image, i64(channels * plane)),
                                            add(b, i64(offsets[i] * plane), start)))
                if ctx.byte_permute:
                    _lookup_run(ctx, b, src, dst, gep(b, ctx.inp(len(counts)), i64(256 * i)), count)
                else:
                    _requantize_run(ctx, b, i, src, dst, count)


def _lookup_run(ctx: OpCtx, b: ir.IRBuilder, src: ir.Value, dst: ir.Value, table: ir.Value, count: ir.Value) \
        -> None:
    """dst[:count] = table[src[:count]]: whole vectors, then the rest by a byte-masked load and store."""
    rows = [bytes_at(b, table, i64(k * BYTES)) for k in range(4)]
    whole = b.udiv(count, i64(BYTES))
    with for_range(b, i64(0), whole, name="v") as v:
        at = mul(b, v, i64(BYTES))
        b.store(lookup64(b, rows, bytes_at(b, src, at)), b.bitcast(gep(b, dst, at), BYTE_VEC.as_pointer()), align=1)
    rest = b.sub(count, mul(b, whole, i64(BYTES)))
    with b.if_then(b.icmp_unsigned("!=", rest, i64(0))):
        at = mul(b, whole, i64(BYTES))
        mask = b.bitcast(b.sub(b.shl(i64(1), rest), i64(1)), ir.VectorType(ir.IntType(1), BYTES))
        ptr = [b.bitcast(gep(b, p, at), BYTE_VEC.as_pointer()) for p in (src, dst)]
        load = intrinsic(b.module, "llvm.masked.load.v64i8.p0", BYTE_VEC,
                         [BYTE_VEC.as_pointer(), I32, mask.type, BYTE_VEC])
        store = intrinsic(b.module, "llvm.masked.store.v64i8.p0", ir.VoidType(),
                          [BYTE_VEC, BYTE_VEC.as_pointer(), I32, mask.type])
        x = b.call(load, [ptr[0], ir.Constant(I32, 1), mask, ir.Constant(BYTE_VEC, None)])
        b.call(store, [lookup64(b, rows, x), ptr[1], ir.Constant(I32, 1), mask])


def _requantize_run(ctx: OpCtx, b: ir.IRBuilder, i: int, src: ir.Value, dst: ir.Value, count: ir.Value) -> None:
    """dst[:count] = saturate(round(float32(src - z_i) * s_i / sy) + zy), as DequantizeLinear then QuantizeLinear
    compute it."""
    sx, zx = ctx.attr("parts")[i]
    sy, zy, dtype = f32(float(ctx.attr("y_scale"))), f32(float(ctx.attr("y_zero_point"))), ctx.attr("y_dtype")
    with for_range(b, i64(0), count, name="e") as e:
        x = widen(b, b.load(gep(b, src, e), align=1), ctx.in_dtype(i))
        v = b.fmul(b.sitofp(b.sub(x, ir.Constant(I32, int(zx))), F32), f32(float(sx)))
        b.store(saturate(b, b.fadd(roundeven(b, b.fdiv(v, sy)), zy), dtype, finite=True), gep(b, dst, e), align=1)


OPS = {"qconcat": qconcat}
