"""Element-wise maps split over the worker pool by their leading output indices.

A memory-bound op between two anchors ran on the calling thread alone while the other threads waited for the
next anchor (BERT's Gelu, Cast and Mul on 128x3072 tensors; the squeeze-excite gates of EfficientNet). Here the
output's leading dims are cut into items of at least `BLOCK` elements, each item one `emit_map` over the
remaining dims, so the inner loops stay the plain vectorisable loops they were.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from stages.codegen.irb import add, gep, i64, mul
from stages.memops.loops import Combine, Operand, contiguous_strides, emit_map
from stages.memops.opctx import OpCtx

BLOCK = 16384  # elements an item covers at least: a pool dispatch costs microseconds
ITEMS_PER_THREAD = 4  # leading indices wanted per thread before the split stops taking dims


def pool_map(ctx: OpCtx, shape: Sequence[int], ins: Sequence[tuple[int, tuple[int, ...]]], fn: Combine) -> None:
    """out = fn(ins...) over `shape`: `ins` are (input index, strides against `shape`), the output contiguous.
    Inputs are asked of `ctx` inside each item (pointers are per function)."""
    shape = tuple(shape)
    out_strides = contiguous_strides(shape)
    split = next((d for d in range(1, len(shape)) if math.prod(shape[:d]) >= ITEMS_PER_THREAD * ctx.threads),
                 len(shape) - 1)
    if ctx.threads < 2 or split < 1 or math.prod(shape) < 2 * BLOCK:
        emit_map(ctx.b, shape, Operand(ctx.out(), out_strides), [Operand(ctx.inp(i), s) for i, s in ins], fn)
        return
    lead, inner = shape[:split], shape[split:]
    strides = [s for _, s in ins] + [out_strides]
    with ctx.parallel(math.prod(lead), min_items=-(-BLOCK // math.prod(inner))) as item:
        b, rest, base = ctx.b, item, [i64(0)] * len(strides)
        for d in reversed(range(len(lead))):
            idx = b.urem(rest, i64(lead[d])) if d else rest
            rest = b.udiv(rest, i64(lead[d])) if d else rest
            base = [add(b, base[j], mul(b, idx, i64(strides[j][d]))) for j in range(len(strides))]
        ops = [Operand(gep(b, ctx.inp(i), base[j]), strides[j][split:]) for j, (i, _) in enumerate(ins)]
        emit_map(b, inner, Operand(gep(b, ctx.out(), base[-1]), out_strides[split:]), ops, fn)
