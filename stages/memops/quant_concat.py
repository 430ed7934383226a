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

from stages.codegen.irb import F32, I32, add, for_range, gep, i64, mul
from stages.memops import quant_flat
from stages.memops.loops import f32
from stages.memops.opctx import OpCtx
from stages.memops.quant import roundeven, saturate, widen
from stages.memops.quant_islands import lookup_run


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
                    lookup_run(b, src, dst, gep(b, ctx.inp(len(counts)), i64(256 * i)), count)
                else:
                    _requantize_run(ctx, b, i, src, dst, count)


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
