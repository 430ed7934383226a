"""A Concat over channels whose result goes straight through element-wise links (DenseNet's BatchNorm-ReLU
ahead of each layer's 1x1 conv): each input is read once and written once, transformed, into its place.

The output is viewed as [N, C, P] (P: the product of the dims after the channels) and cut into blocks of `cb`
channels, `cb` a divisor of every input's channel count (so no block straddles two inputs) holding at most
`pool_map.BLOCK` elements where it can; all blocks are one parallel range. A block finds its input by a chain of
selects and is one `emit_map` over (cb, P), the links' per-channel constants read at its channels: one loop in
the code whatever the number of inputs (a loop per input made DenseNet-121's build 1.8x as long).
"""

from __future__ import annotations

import math

from stages.codegen.irb import add, gep, i64, mul
from stages.memops.loops import Combine, Operand, broadcast_strides, emit_map
from stages.memops.opctx import OpCtx
from stages.memops.pool_map import BLOCK


def concat_chain(ctx: OpCtx, parts: int, operands: list[int], fn: Combine) -> None:
    shape = ctx.out_shape()
    images, channels, plane = shape[0], shape[1], math.prod(shape[2:])
    counts = [ctx.in_shape(i)[1] for i in range(parts)]
    offsets = [sum(counts[:i]) for i in range(parts)]
    common = math.gcd(*counts)
    cb = max(d for d in range(1, common + 1) if common % d == 0 and (d == 1 or d * plane <= BLOCK))
    blocks = channels // cb
    # Per-channel (or scalar) constants: their stride along the channels, 0 along images and the plane.
    const_strides = [broadcast_strides(ctx.in_shape(k), shape)[1] for k in operands]
    total = images * blocks
    with ctx.parallel(total, min_items=total if images * channels * plane < 2 * BLOCK else 1) as item:
        b = ctx.b
        image, channel = b.udiv(item, i64(blocks)), mul(b, b.urem(item, i64(blocks)), i64(cb))
        src = None
        for i in (i for i in range(parts) if counts[i]):
            here = gep(b, ctx.inp(i), add(b, mul(b, image, i64(counts[i] * plane)),
                                          mul(b, b.sub(channel, i64(offsets[i])), i64(plane))))
            src = here if src is None else b.select(b.icmp_unsigned(">=", channel, i64(offsets[i])), here, src)
        dst = gep(b, ctx.out(), add(b, mul(b, image, i64(channels * plane)), mul(b, channel, i64(plane))))
        consts = [Operand(gep(b, ctx.inp(k), mul(b, channel, i64(s))), (s, 0))
                  for k, s in zip(operands, const_strides, strict=True)]
        emit_map(b, (cb, plane), Operand(dst, (plane, 1)), [Operand(src, (plane, 1)), *consts], fn)
