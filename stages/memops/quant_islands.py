"""Run-time kernels of the int8 islands onnxruntime computes its own way (stages/graph/passes_quant_islands.py;
arithmetic in stages/graph/reference_quant.py): `qlut` (a 256-byte table lookup), `qmul` (QLinearMul),
`qmean` (ReduceMean over H, W in onnxruntime's summation order) and `qbatchnorm`.

Every float operation is a separate LLVM instruction without fast-math flags, so LLVM neither fuses a multiply
and an add nor reorders a sum: the roundings are the ones onnxruntime's kernels make.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from llvmlite import ir

from stages.codegen.irb import F32, I32, add, for_range, gep, i64, intrinsic, mul, store_ints, vec
from stages.memops import quant_flat, quant_mean
from stages.memops.loops import Operand, broadcast_strides, contiguous_strides, emit_map, f32
from stages.memops.opctx import OpCtx
from stages.memops.pool_map import pool_map
from stages.memops.quant import roundeven, saturate, widen

I64 = ir.IntType(64)


def _dequantized(ctx: OpCtx) -> Callable[[ir.IRBuilder, ir.Value], ir.Value]:
    """x -> float32(x - zx) * sx, as onnxruntime's DequantizeLinear."""
    sx, zx, dtype = f32(float(ctx.attr("x_scale"))), ir.Constant(I32, int(ctx.attr("x_zero_point"))), ctx.in_dtype()
    return lambda b, v: b.fmul(b.sitofp(b.sub(widen(b, v, dtype), zx), F32), sx)


def _quantized(ctx: OpCtx, b: ir.IRBuilder, y: ir.Value, lo: int | None = None, finite: bool = False) -> ir.Value:
    """y -> saturate(round_half_even(y / sy) + zy), as onnxruntime's QuantizeLinear (`finite`: y cannot be NaN)."""
    sy, zy = f32(float(ctx.attr("y_scale"))), f32(float(ctx.attr("y_zero_point")))
    return saturate(b, b.fadd(roundeven(b, b.fdiv(y, sy)), zy), ctx.attr("y_dtype"), lo=lo, finite=finite)


def qlut(ctx: OpCtx) -> None:
    """y = table[byte of x]: 64 bytes at a time by byte permutes where the target has them (AVX-512 VBMI), one
    byte at a time otherwise. The scalar loop ran a byte a cycle or so: 1.2 ms for EfficientNet-B0's 65
    lookups on Zen 5, 26% of the int8 model."""
    def fn(b: ir.IRBuilder, v: list[ir.Value]) -> ir.Value:
        return b.load(gep(b, ctx.inp(1), b.zext(v[0], I64)), align=1)

    def block(b: ir.IRBuilder, start: ir.Value, count: int) -> None:
        src, dst = gep(b, ctx.inp(0), start), gep(b, ctx.out(), start)
        if ctx.byte_permute:
            lookup_run(b, src, dst, ctx.inp(1), i64(count))
        else:
            emit_map(b, (count,), Operand(dst, (1,)), [Operand(src, (1,))], fn)
    quant_flat.split(ctx, math.prod(ctx.out_shape()), block)


BYTES = 64
BYTE_VEC = ir.VectorType(ir.IntType(8), BYTES)


def bytes_at(b: ir.IRBuilder, base: ir.Value, at: ir.Value) -> ir.Value:
    return b.load(b.bitcast(gep(b, base, at), BYTE_VEC.as_pointer()), align=1)


def lookup_run(b: ir.IRBuilder, src: ir.Value, dst: ir.Value, table: ir.Value, count: ir.Value) -> None:
    """dst[:count] = table[src[:count]] (256 table bytes) by `lookup64`: whole vectors, then the rest through a
    byte-masked load and store."""
    rows = [bytes_at(b, table, i64(k * BYTES)) for k in range(4)]
    whole = b.udiv(count, i64(BYTES))
    with for_range(b, i64(0), whole, name="v") as v:
        at = mul(b, v, i64(BYTES))
        b.store(lookup64(b, rows, bytes_at(b, src, at)), b.bitcast(gep(b, dst, at), BYTE_VEC.as_pointer()), align=1)
    rest = b.sub(count, mul(b, whole, i64(BYTES)))
    with b.if_then(b.icmp_unsigned("!=", rest, i64(0))):
        at = mul(b, whole, i64(BYTES))
        mask = b.bitcast(b.sub(b.shl(i64(1), rest), i64(1)), ir.VectorType(ir.IntType(1), BYTES))
        load = intrinsic(b.module, "llvm.masked.load.v64i8.p0", BYTE_VEC,
                         [BYTE_VEC.as_pointer(), I32, mask.type, BYTE_VEC])
        x = b.call(load, [b.bitcast(gep(b, src, at), BYTE_VEC.as_pointer()), ir.Constant(I32, 1), mask,
                          ir.Constant(BYTE_VEC, None)])
        store_ints(b, lookup64(b, rows, x), gep(b, dst, at), mask)


def lookup64(b: ir.IRBuilder, table: list[ir.Value], idx: ir.Value) -> ir.Value:
    """table[idx] for 64 byte indices: each `vpermi2b` picks from 128 table bytes by an index's low 7 bits,
    its top bit chooses between the two halves."""
    fn = intrinsic(b.module, "llvm.x86.avx512.vpermi2var.qi.512", BYTE_VEC, [BYTE_VEC] * 3)
    low, high = (b.call(fn, [table[2 * h], idx, table[2 * h + 1]]) for h in (0, 1))
    return b.select(b.icmp_signed("<", idx, ir.Constant(BYTE_VEC, None)), high, low)


def qmul(ctx: OpCtx) -> None:
    """y = saturate(round(float32((a - za) * (b - zb)) * ratio + zy)), a and b broadcast to y's shape; zy shifted
    by `y_shift` before rounding and back after, where onnxruntime runs the int8 output as uint8."""
    shape, dtype = ctx.out_shape(), ctx.attr("y_dtype")
    za, zb = (ir.Constant(I32, int(ctx.attr(k))) for k in ("a_zero_point", "b_zero_point"))
    shift = int(ctx.attr("y_shift", 0))
    ratio, zy = f32(float(ctx.attr("ratio"))), f32(float(ctx.attr("y_zero_point") + shift))
    da, db = ctx.in_dtype(0), ctx.in_dtype(1)

    def fn(b: ir.IRBuilder, v: list[ir.Value]) -> ir.Value:
        prod = b.mul(b.sub(widen(b, v[0], da), za), b.sub(widen(b, v[1], db), zb))
        total = roundeven(b, b.fadd(b.fmul(b.sitofp(prod, F32), ratio), zy))
        return saturate(b, b.fsub(total, f32(shift)), dtype, finite=True)
    # squeeze-excite's gate broadcasts over the plane: items by leading indices (image x channel)
    pool_map(ctx, shape, [(i, broadcast_strides(ctx.in_shape(i), shape)) for i in (0, 1)], fn)


def qbatchnorm(ctx: OpCtx) -> None:
    """y = quantize(float32(dequantize(x) * scale[c]) + bias[c]), clamped at the zero point after a Relu."""
    shape = ctx.out_shape()
    deq = _dequantized(ctx)
    lo = int(ctx.attr("y_zero_point")) if ctx.attr("relu") else None
    # finite folded constants keep every value finite (no inf - inf, no NaN), and the plain conversion that
    # allows is what lets LLVM vectorise the map: 894 -> 78 us on a 1x256x56x56 plane set, one thread
    finite = all(np.isfinite(ctx.graph.constants[name]).all() for name in ctx.node.inputs[1:3])

    def fn(b: ir.IRBuilder, v: list[ir.Value]) -> ir.Value:
        return _quantized(ctx, b, b.fadd(b.fmul(deq(b, v[0]), v[1]), v[2]), lo, finite)
    if len(shape) < 3:
        strides = contiguous_strides(shape)
        per_channel = broadcast_strides((shape[1],) + (1,) * (len(shape) - 2), shape)
        emit_map(ctx.b, shape, Operand(ctx.out(), strides),
                 [Operand(ctx.inp(0), strides), Operand(ctx.inp(1), per_channel), Operand(ctx.inp(2), per_channel)],
                 fn)
        return
    # one item per (image, channel) plane, on the worker pool: DenseNet-121 runs 120 of these on its
    # concatenated feature maps, which on one core kept its 2-thread int8 build at its 1-thread latency
    channels, plane = shape[1], math.prod(shape[2:])
    with ctx.parallel(math.prod(shape[:2]), min_items=-(-quant_flat.BLOCK // plane)) as item:
        b = ctx.b
        base, ch = mul(b, item, i64(plane)), b.urem(item, i64(channels))
        ins = [Operand(gep(b, ctx.inp(0), base), (1,)), Operand(gep(b, ctx.inp(1), ch), (0,)),
               Operand(gep(b, ctx.inp(2), ch), (0,))]
        emit_map(b, (plane,), Operand(gep(b, ctx.out(), base), (1,)), ins, fn)


def qmean(ctx: OpCtx) -> None:
    """Per (image, channel) plane: the dequantized values summed in onnxruntime's order (`order` nhwc: in
    position order for one image, by fours for a batch; nchw: Eigen's; reference_quant.py's _qmean), divided by
    the count, quantized."""
    n, c, h, w = ctx.in_shape()
    k, planes = h * w, n * c
    b, x, y = ctx.b, ctx.inp(), ctx.out()
    deq = _dequantized(ctx)

    def at(plane: ir.Value, i: ir.Value) -> ir.Value:
        return deq(b, b.load(gep(b, x, add(b, mul(b, plane, i64(k)), i)), align=1))

    def finish(plane: ir.Value, total: ir.Value) -> None:
        b.store(_quantized(ctx, b, b.fdiv(total, f32(k))), gep(b, y, plane), align=1)

    if ctx.attr("order") == "nhwc" and n == 1:
        sx, zx = float(ctx.attr("x_scale")), int(ctx.attr("x_zero_point"))
        ity, fty = ir.VectorType(I32, quant_mean.LANES), vec(quant_mean.LANES)
        extend = ir.IRBuilder.zext if ctx.in_dtype() == "uint8" else ir.IRBuilder.sext

        def deq_vec(vb: ir.IRBuilder, v: ir.Value) -> ir.Value:
            diff = vb.sub(extend(vb, v, ity), ir.Constant(ity, [zx] * quant_mean.LANES))
            return vb.fmul(vb.sitofp(diff, fty), ir.Constant(fty, [sx] * quant_mean.LANES))

        def finish_at(vb: ir.IRBuilder, plane: ir.Value, total: ir.Value) -> None:
            vb.store(_quantized(ctx, vb, vb.fdiv(total, f32(k))), gep(vb, ctx.out(), plane), align=1)
        quant_mean.running_means(ctx, planes, k, deq_vec, finish_at)
        return
    if ctx.attr("order") == "nhwc":
        with for_range(b, i64(0), i64(planes), name="p") as p:
            finish(p, _sum_by_fours(ctx, lambda i, p=p: at(p, i), k))
        return
    period = 4 // math.gcd(k, 4)  # planes whose first element has the same alignment recur with this period
    lanes = [ctx.local() for _ in range(8)]
    with for_range(b, i64(0), i64(planes // period), name="p") as group:
        for r in range(period):
            p = add(b, mul(b, group, i64(period)), i64(r))
            finish(p, _eigen_plane(ctx, lambda i, p=p: at(p, i), k, (-r * k) % 4, lanes))
    for r in range(planes - planes % period, planes):
        finish(i64(r), _eigen_plane(ctx, lambda i, r=r: at(i64(r), i), k, (-r * k) % 4, lanes))


def _sum_by_fours(ctx: OpCtx, at: Callable[[ir.Value], ir.Value], k: int) -> ir.Value:
    """MLAS's M=1 SGEMM order (reference_quant.sum_by_fours): groups of four in order, each added to the total."""
    b, acc = ctx.b, ctx.local()
    sizes = [2] * ((k % 4) // 2) + [1] * (k % 2)
    if k >= 4:
        first = at(i64(0))
        for j in range(1, 4):
            first = b.fadd(first, at(i64(j)))
        b.store(first, acc)
        with for_range(b, i64(4), i64(k - k % 4), step=4, name="g") as i:
            group = at(i)
            for j in range(1, 4):
                group = b.fadd(group, at(add(b, i, i64(j))))
            b.store(b.fadd(group, b.load(acc)), acc)
    i = k - k % 4
    for size in sizes:
        group = at(i64(i))
        if size == 2:
            group = b.fadd(group, at(i64(i + 1)))
        b.store(group if i == 0 else b.fadd(group, b.load(acc)), acc)
        i += size
    return b.load(acc)


def _eigen_plane(ctx: OpCtx, at: Callable[[ir.Value], ir.Value], k: int, start: int, lanes: list[ir.Value]) \
        -> ir.Value:
    """Eigen's SSE sum of k values starting `start` elements before a 16-byte boundary (in order when no
    aligned packet fits)."""
    b = ctx.b
    packets = max(0, k - start) // 4
    if packets == 0:
        total = at(i64(0))
        for i in range(1, k):
            total = b.fadd(total, at(i64(i)))
        return total
    end2, end = start + (packets // 2) * 8, start + packets * 4
    for lane in range(8 if packets > 1 else 4):
        b.store(at(i64(start + lane)), lanes[lane])
    if packets > 1:
        with for_range(b, i64(start + 8), i64(end2), step=8, name="pk") as i:
            for lane in range(8):
                b.store(b.fadd(b.load(lanes[lane]), at(add(b, i, i64(lane)))), lanes[lane])
        for lane in range(4):
            b.store(b.fadd(b.load(lanes[lane]), b.load(lanes[lane + 4])), lanes[lane])
        if end > end2:
            for lane in range(4):
                b.store(b.fadd(b.load(lanes[lane]), at(i64(end2 + lane))), lanes[lane])
    p = [b.load(lane) for lane in lanes[:4]]
    total = b.fadd(b.fadd(p[0], p[2]), b.fadd(p[1], p[3]))
    for i in (*range(start), *range(end, k)):
        total = b.fadd(total, at(i64(i)))
    return total


OPS: dict[str, Callable[[OpCtx], None]] = {"qlut": qlut, "qmul": qmul, "qmean": qmean, "qbatchnorm": qbatchnorm}
