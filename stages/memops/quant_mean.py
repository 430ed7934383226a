"""`qmean` of one image in onnxruntime's NHWC order, 16 planes a vector, split over the worker pool.

onnxruntime sums each channel over the positions in order (a running sum, stages/graph/reference_quant.py's
_qmean). Per plane that is a chain of dependent float adds, which ran at one element per add latency:
EfficientNet-B0's 17 squeeze-excite means took 1.48 ms of its 6.7 ms (Zen 5, 1 thread). Here 16 planes
share a vector: 16 positions of each are loaded as bytes, dequantized in vectors, transposed (so a vector
holds one position of 16 planes) and added to the running sums position by position, the same adds in the
same order per plane, 16 planes at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext

from llvmlite import ir

from stages.codegen.irb import I1, I32, for_range, gep, i64, intrinsic, mul, smin, transpose_square, vec
from stages.memops.opctx import OpCtx

LANES = 16
I8 = ir.IntType(8)
MIN_ITEM_BYTES = 32768  # input bytes per thread below which the mean runs on one thread


def running_means(ctx: OpCtx, planes: int, k: int, deq: Callable[[ir.IRBuilder, ir.Value], ir.Value],
                  finish: Callable[[ir.IRBuilder, ir.Value, ir.Value], None]) -> None:
    """For each of `planes` contiguous planes of `k` bytes: total = x[0] + x[1] + ... in order (`deq` turns a
    `<16 x i8>` into its dequantized `<16 x float>`), then `finish(b, plane, total)`."""
    blocks = -(-planes // LANES)
    fty = vec(LANES)
    full, rest = k // LANES, k % LANES
    with ctx.parallel(blocks, min_items=-(-MIN_ITEM_BYTES // (LANES * k))) as blk:
        b, x = ctx.b, ctx.inp()
        first = mul(b, blk, i64(LANES))
        rows = [gep(b, x, mul(b, smin(b, b.add(first, i64(r)), i64(planes - 1)), i64(k))) for r in range(LANES)]
        acc = ctx.local(fty)
        b.store(ir.Constant(fty, [-0.0] * LANES), acc)  # -0 + v == v for every v: the first add is exact

        def step(at: ir.Value, count: int) -> None:
            mask = None if count == LANES else ir.Constant(ir.VectorType(I1, LANES), [int(j < count)
                                                                                    for j in range(LANES)])
            vals = [deq(b, _load(b, gep(b, row, at), mask)) for row in rows]
            cols = transpose_square(b, vals)
            total = b.load(acc)
            for j in range(count):
                total = b.fadd(total, cols[j])
            b.store(total, acc)

        if full:
            with for_range(b, i64(0), i64(full), name="pos") as i:
                step(mul(b, i, i64(LANES)), LANES)
        if rest:
            step(i64(full * LANES), rest)
        sums = b.load(acc)
        for r in range(LANES):
            plane = b.add(first, i64(r))
            with b.if_then(b.icmp_unsigned("<", plane, i64(planes))) if planes % LANES else nullcontext():
                finish(b, plane, b.extract_element(sums, ir.Constant(I32, r)))


def _load(b: ir.IRBuilder, ptr: ir.Value, mask: ir.Constant | None) -> ir.Value:
    bty = ir.VectorType(I8, LANES)
    vptr = b.bitcast(ptr, bty.as_pointer())
    if mask is None:
        return b.load(vptr, align=1)
    fn = intrinsic(b.module, f"llvm.masked.load.v{LANES}i8.p0", bty, [bty.as_pointer(), I32, mask.type, bty])
    return b.call(fn, [vptr, ir.Constant(I32, 1), mask, ir.Constant(bty, None)])

