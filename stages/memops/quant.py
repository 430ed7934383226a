"""Run-time kernels of the quantized ops: Quantize/DequantizeLinear, DynamicQuantizeLinear, ConvInteger,
MatMulInteger, Add (`qadd`) and AveragePool (`qavgpool`), and the canonical int8 anchors `qconv2d` / `qdense`
(arithmetic in stages/graph/reference_quant.py); the int8 MaxPool is in stages/memops/quant_pool.py.

Integer products accumulate exactly in int32; a float is rounded half to even (`llvm.roundeven`, what
`cvtps2dq` does under the default MXCSR) and saturated in float before the conversion, so NaN becomes 0 and
nothing is poison. These are plain loop nests over static shapes that LLVM vectorises (the conv's kernel
taps are unrolled at build time so every inner loop is branch-free); the fast int8 templates replace the
anchors once a node has a task. uint8 is widened with zext, int8 with sext.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from llvmlite import ir

from stages.codegen.irb import F32, I32, add, for_range, gep, i64, intrinsic, loop_carry, mul, smin
from stages.graph.reference_quant import limits
from stages.memops import quant_flat
from stages.memops.loops import Operand, broadcast_strides, contiguous_strides, emit_map, f32, select_max, select_min
from stages.memops.opctx import OpCtx
from stages.memops.quant_pool import max_pool_int8
from stages.templates import qgemm_isa

I8 = ir.IntType(8)


def widen(b: ir.IRBuilder, v: ir.Value, dtype: str) -> ir.Value:
    """An 8- or 32-bit integer as i32 (uint8 zero-extended, int8 sign-extended)."""
    if v.type.width == 32:
        return v
    return b.zext(v, I32) if dtype == "uint8" else b.sext(v, I32)


def saturate(b: ir.IRBuilder, x: ir.Value, dtype: str, lo: int | None = None, hi: int | None = None,
             finite: bool = False) -> ir.Value:
    """A float already rounded, clamped to [lo, hi] (default: the type's range) and converted (NaN -> 0). The
    clamps keep a NaN and a select makes it 0 (not `fptosi.sat`, which LLVM scalarises in vector loops); a
    value known `finite` (computed from integers) skips the select."""
    tlo, thi = limits(dtype)
    x = select_min(b, select_max(b, x, f32(tlo if lo is None else lo)), f32(thi if hi is None else hi))
    if not finite:
        x = b.select(b.fcmp_ordered("ord", x, x), x, f32(0))
    as_int = b.fptosi(x, I32)
    return b.trunc(as_int, I8) if dtype in ("uint8", "int8") else as_int


def roundeven(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return b.call(intrinsic(b.module, "llvm.roundeven.f32", F32, [F32]), [x])


def _int_weight(ctx: OpCtx, tag: str, array: np.ndarray) -> ir.Value:
    """A build-time integer constant of this op (stored with the weights in its own type)."""
    name = f"{ctx.node.name}/{tag}"
    ctx.new_constants[name] = np.ascontiguousarray(array)
    return ctx.ptr(name)


def _axis_shape(ctx: OpCtx, size: int, rank: int) -> tuple[int, ...]:
    axis = ctx.attr("axis")
    return (1,) * rank if axis is None else (1,) * axis + (size,) + (1,) * (rank - axis - 1)


def _params(ctx: OpCtx, rank: int) -> tuple[Operand, np.ndarray, tuple[int, ...]]:
    """The scale as a broadcast operand, the zero points (int64, 1-D) and the shape they broadcast from."""
    scale, zp = ctx.const(1), ctx.const(2)
    if scale is None or zp is None:
        raise ctx.unsupported("its scale and zero point must be constants")
    shape = _axis_shape(ctx, scale.size, rank)
    s = ctx.weight("scale", scale.astype(np.float32).reshape(shape))
    return Operand(s, broadcast_strides(shape, ctx.out_shape())), zp.astype(np.int64).reshape(-1), shape


def quantize_linear(ctx: OpCtx) -> None:
    """y = saturate(round_half_even(x / scale) + zero_point)."""
    out_shape, dtype = ctx.out_shape(), ctx.out_dtype()
    s, z = ctx.const(1), ctx.const(2)
    if s is not None and z is not None and s.size == 1 and z.size == 1 and dtype in ("uint8", "int8") \
            and ctx.in_dtype(0) == "float32":
        quant_flat.quantize_per_tensor(ctx, math.prod(out_shape), float(np.float32(s.reshape(-1)[0])),
                                       int(z.reshape(-1)[0]), dtype)
        return
    scale, zp, pshape = _params(ctx, len(out_shape))
    ins = [Operand(ctx.inp(0), contiguous_strides(out_shape)), scale]
    if zp.size == 1:
        z = float(zp[0])
        fn = lambda b, v: saturate(b, b.fadd(roundeven(b, b.fdiv(v[0], v[1])), f32(z)), dtype)  # noqa: E731
    else:
        ins.append(Operand(ctx.weight("zero_point", zp.astype(np.float32).reshape(pshape)),
                           broadcast_strides(pshape, out_shape)))
        fn = lambda b, v: saturate(b, b.fadd(roundeven(b, b.fdiv(v[0], v[1])), v[2]), dtype)  # noqa: E731
    emit_map(ctx.b, out_shape, Operand(ctx.out(), contiguous_strides(out_shape)), ins, fn)


def dequantize_linear(ctx: OpCtx) -> None:
    """x = float32(q - zero_point) * scale, the difference taken in int32."""
    out_shape, dtype = ctx.out_shape(), ctx.in_dtype(0)
    scale, zp, pshape = _params(ctx, len(out_shape))
    ins = [Operand(ctx.inp(0), contiguous_strides(out_shape)), scale]
    if zp.size == 1:
        z = int(zp[0])
        fn = lambda b, v: b.fmul(b.sitofp(b.sub(widen(b, v[0], dtype), ir.Constant(I32, z)), F32), v[1])  # noqa: E731
    else:
        ins.append(Operand(_int_weight(ctx, "zero_point", zp.astype(np.int32).reshape(pshape)),
                           broadcast_strides(pshape, out_shape)))
        fn = lambda b, v: b.fmul(b.sitofp(b.sub(widen(b, v[0], dtype), v[2]), F32), v[1])  # noqa: E731
    emit_map(ctx.b, out_shape, Operand(ctx.out(), contiguous_strides(out_shape)), ins, fn)


def dynamic_quantize_linear(ctx: OpCtx) -> None:
    """The range of x (widened to hold 0) over 255 steps: scale and zero point, then x quantized by them (an
    all-zero x has scale 0 and quantizes to zeros)."""
    n = math.prod(ctx.in_shape())
    b, x = ctx.b, ctx.inp(0)
    lanes = quant_flat.LANES
    fty = ir.VectorType(F32, lanes)
    # min and max in 16 lanes (each starts at 0 and, like the scalar select, passes over a NaN), then lane by lane
    bounds = [ir.Constant(fty, [0.0] * lanes)] * 2
    with loop_carry(b, i64(0), i64(n // lanes), bounds, name="r") as i:
        v = b.load(b.bitcast(gep(b, x, mul(b, i, i64(lanes))), fty.as_pointer()), align=4)
        bounds[:] = [select_min(b, bounds[0], v), select_max(b, bounds[1], v)]
    ends = [f32(0), f32(0)]
    for lane in range(lanes):
        at = ir.Constant(I32, lane)
        ends = [select_min(b, ends[0], b.extract_element(bounds[0], at)),
                select_max(b, ends[1], b.extract_element(bounds[1], at))]
    with loop_carry(b, i64(n - n % lanes), i64(n), ends, name="rt") as i:
        v = b.load(gep(b, x, i), align=4)
        ends[:] = [select_min(b, ends[0], v), select_max(b, ends[1], v)]
    low = ends[0]
    scale = b.fdiv(b.fsub(ends[1], low), f32(255))
    empty = b.fcmp_ordered("==", scale, f32(0))
    zero = b.select(empty, f32(0), roundeven(b, b.fsub(f32(0), b.fdiv(low, scale))))
    zero = select_min(b, select_max(b, zero, f32(0)), f32(255))
    b.store(scale, ctx.out(1))
    b.store(saturate(b, zero, "uint8"), ctx.out(2))

    def block(vb: ir.IRBuilder, start: ir.Value, count: int) -> None:
        s = vb.load(ctx.out(1), align=4)  # each block's function reads the parameters back
        z = vb.uitofp(vb.load(ctx.out(2), align=1), F32)
        nothing = vb.fcmp_ordered("==", s, f32(0))
        src, dst = gep(vb, ctx.inp(0), start), gep(vb, ctx.out(0), start)
        with for_range(vb, i64(0), i64(count), name="q") as i:
            v = vb.load(gep(vb, src, i), align=4)
            q = vb.select(nothing, f32(0), vb.fadd(roundeven(vb, vb.fdiv(v, s)), z))
            vb.store(saturate(vb, q, "uint8"), gep(vb, dst, i), align=1)
    quant_flat.split(ctx, n, block)


# --- convolutions ---------------------------------------------------------------------------------------

def _conv_loops(ctx: OpCtx, x: ir.Value, x_dtype: str, zx: int, w: ir.Value, w_dtype: str,
                init: Callable[[ir.IRBuilder, ir.Value], ir.Value], acc: Callable[[ir.Value], ir.Value],
                finish: Callable[[ir.Value, ir.Value], None] | None) -> None:
    """For each (image, output channel): plane = init(oc); plane += (x - zx) * w over the receptive field; then
    finish(n, oc). `acc(n_oc)` is where the int32 plane lives. Taps are unrolled, so each tap's valid output
    rows and columns are constants and the inner loop is branch-free (unit stride at stride 1)."""
    (n, c, h, wd), (o, cg, kh, kw) = ctx.in_shape(0), ctx.in_shape(1)
    oh, ow = ctx.out_shape()[2:]
    (sh, sw), (dh, dw), (pt, pl, _, _) = ctx.attr("strides"), ctx.attr("dilations"), ctx.attr("pads")
    og = o // int(ctx.attr("group"))
    b = ctx.b

    def valid(out: int, k: int, s: int, d: int, pad: int, size: int) -> tuple[int, int]:
        lo = next((i for i in range(out) if 0 <= i * s - pad + k * d), out)
        hi = next((i + 1 for i in reversed(range(out)) if i * s - pad + k * d < size), 0)
        return lo, max(lo, hi)

    with for_range(b, i64(0), i64(n * o), name="noc") as noc:
        plane = acc(noc)
        oc = b.urem(noc, i64(o))
        img = b.udiv(noc, i64(o))
        bias = init(b, oc)
        with for_range(b, i64(0), i64(oh * ow), name="i") as p:
            b.store(bias, gep(b, plane, p), align=4)
        first = add(b, mul(b, img, i64(c)), mul(b, b.udiv(oc, i64(og)), i64(cg)))  # this group's first channel
        with for_range(b, i64(0), i64(cg), name="ic") as ic:
            xbase = mul(b, add(b, first, ic), i64(h * wd))
            wbase = mul(b, add(b, mul(b, oc, i64(cg)), ic), i64(kh * kw))
            for ky in range(kh):
                r0, r1 = valid(oh, ky, sh, dh, pt, h)
                for kx in range(kw):
                    c0, c1 = valid(ow, kx, sw, dw, pl, wd)
                    if r0 >= r1 or c0 >= c1:
                        continue
                    wv = widen(b, b.load(gep(b, w, add(b, wbase, i64(ky * kw + kx))), align=1), w_dtype)
                    with for_range(b, i64(r0), i64(r1), name="oy") as y:
                        row = add(b, xbase, mul(b, add(b, mul(b, y, i64(sh)), i64(ky * dh - pt)), i64(wd)))
                        orow = mul(b, y, i64(ow))
                        with for_range(b, i64(c0), i64(c1), name="ox") as xo:
                            at = add(b, row, add(b, mul(b, xo, i64(sw)), i64(kx * dw - pl)))
                            xv = b.sub(widen(b, b.load(gep(b, x, at), align=1), x_dtype), ir.Constant(I32, zx))
                            slot = gep(b, plane, add(b, orow, xo))
                            b.store(b.add(b.load(slot, align=4), b.mul(xv, wv)), slot, align=4)
        if finish is not None:
            finish(noc, oc)


def _requantize(b: ir.IRBuilder, acc: ir.Value, scale: ir.Value, zy: int, dtype: str, lo: int, hi: int) -> ir.Value:
    return saturate(b, b.fadd(roundeven(b, b.fmul(b.sitofp(acc, F32), scale)), f32(zy)), dtype, lo, hi, finite=True)


def _clamps(ctx: OpCtx) -> tuple[int, int]:
    dtype = ctx.attr("y_dtype")
    lo, hi = limits(dtype)
    for op in ctx.attr("epilogue", ()):
        if op["kind"] == "relu":
            lo = max(lo, int(ctx.attr("y_zero_point")))
        else:
            lo, hi = max(lo, int(op["min"])), min(hi, int(op["max"]))
    return lo, hi


def _load(b: ir.IRBuilder, ptr: ir.Value, at: ir.Value) -> ir.Value:
    return b.load(gep(b, ptr, at), align=4)


def qconv2d(ctx: OpCtx) -> None:
    oh, ow = ctx.out_shape()[2:]
    plane = ctx.b.bitcast(ctx.buffer(oh * ow), I32.as_pointer())
    bias, scale, y = ctx.inp(2), ctx.inp(3), ctx.out()
    zy, dtype = int(ctx.attr("y_zero_point")), ctx.attr("y_dtype")
    lo, hi = _clamps(ctx)
    b = ctx.b

    def finish(noc: ir.Value, oc: ir.Value) -> None:
        s = _load(b, scale, oc)
        base = mul(b, noc, i64(oh * ow))
        with for_range(b, i64(0), i64(oh * ow), name="rq") as p:
            v = _requantize(b, b.load(gep(b, plane, p), align=4), s, zy, dtype, lo, hi)
            b.store(v, gep(b, y, add(b, base, p)), align=1)

    _conv_loops(ctx, ctx.inp(0), ctx.in_dtype(0), int(ctx.attr("x_zero_point")), ctx.inp(1), "int8",
                lambda b, oc: _load(b, bias, oc), lambda noc: plane, finish)


def conv_integer(ctx: OpCtx) -> None:
    """int32 y = sum (x - zx) * (w - zw[oc]); the weight's zero point is taken out at build time."""
    w, xz, wz = ctx.const(1), ctx.const(2), ctx.const(3)
    if w is None or xz is None or wz is None:
        raise ctx.unsupported("its weight and zero points must be constants")
    zero = wz.astype(np.int64).reshape(-1)
    ws = w.astype(np.int64) - (zero.reshape(-1, 1, 1, 1) if zero.size > 1 else zero[0])
    wp = _int_weight(ctx, "w", ws.astype(np.int32))
    oh, ow = ctx.out_shape()[2:]
    y = ctx.out()
    _conv_loops(ctx, ctx.inp(0), ctx.in_dtype(0), int(xz.reshape(-1)[0]), wp, "int32",
                lambda b, oc: ir.Constant(I32, 0), lambda noc: gep(ctx.b, y, mul(ctx.b, noc, i64(oh * ow))), None)


def qdense(ctx: OpCtx) -> None:
    """y[m, n] = requant(sum_k (x[m, k] - zx) * w[n, k] + b[n]): an int32 dot product per output."""
    xs, (n, k) = ctx.in_shape(0), ctx.in_shape(1)
    m = math.prod(xs[:-1])
    b, x, w, bias, scale, y = ctx.b, ctx.inp(0), ctx.inp(1), ctx.inp(2), ctx.inp(3), ctx.out()
    zx, zy = ir.Constant(I32, int(ctx.attr("x_zero_point"))), int(ctx.attr("y_zero_point"))
    xd, dtype = ctx.in_dtype(0), ctx.attr("y_dtype")
    lo, hi = _clamps(ctx)
    acc = ctx.local(I32)
    with for_range(b, i64(0), i64(m), name="m") as mi:
        with for_range(b, i64(0), i64(n), name="n") as ni:
            b.store(_load(b, bias, ni), acc)
            with for_range(b, i64(0), i64(k), name="k") as ki:
                xv = b.sub(widen(b, b.load(gep(b, x, add(b, mul(b, mi, i64(k)), ki)), align=1), xd), zx)
                wv = b.sext(b.load(gep(b, w, add(b, mul(b, ni, i64(k)), ki)), align=1), I32)
                b.store(b.add(b.load(acc), b.mul(xv, wv)), acc)
            v = _requantize(b, b.load(acc), _load(b, scale, ni), zy, dtype, lo, hi)
            b.store(v, gep(b, y, add(b, mul(b, mi, i64(n)), ni)), align=1)


def matmul_integer(ctx: OpCtx) -> None:
    """int32 y[r, n] = sum_k (a[r, k] - za) * (b[k, n] - zb[n]); za is read at run time (DynamicQuantizeLinear's)."""
    xs, (k, n) = ctx.in_shape(0), ctx.in_shape(1)
    if math.prod(ctx.in_shape(2)) != 1:
        raise ctx.unsupported("a per-row zero point of its left operand is not supported")
    rows = math.prod(xs[:-1])
    w, wz = ctx.const(1), ctx.const(3)
    if w is not None and wz is not None and ctx.in_dtype(0) == "uint8":
        shifted = w.astype(np.int64) - wz.astype(np.int64).reshape(-1)
        if shifted.min() >= -128 and shifted.max() <= 127:
            _matmul_integer_dot(ctx, rows, k, n, shifted)
            return
    b, a, w, y = ctx.b, ctx.inp(0), ctx.inp(1), ctx.out()
    ad, wd = ctx.in_dtype(0), ctx.in_dtype(1)
    za = widen(b, b.load(ctx.inp(2), align=1), ad)
    per_col = math.prod(ctx.in_shape(3)) > 1
    zb_ptr = ctx.inp(3)
    with for_range(b, i64(0), i64(rows), name="r") as r:
        orow = mul(b, r, i64(n))
        with for_range(b, i64(0), i64(n), name="z") as j:
            b.store(ir.Constant(I32, 0), gep(b, y, add(b, orow, j)), align=4)
        with for_range(b, i64(0), i64(k), name="k") as kk:
            av = b.sub(widen(b, b.load(gep(b, a, add(b, mul(b, r, i64(k)), kk)), align=1), ad), za)
            with for_range(b, i64(0), i64(n), name="n") as j:
                zb = widen(b, b.load(gep(b, zb_ptr, j if per_col else i64(0)), align=1), wd)
                bv = b.sub(widen(b, b.load(gep(b, w, add(b, mul(b, kk, i64(n)), j)), align=1), wd), zb)
                slot = gep(b, y, add(b, orow, j))
                b.store(b.add(b.load(slot, align=4), b.mul(av, bv)), slot, align=4)


ROWS, COLUMNS = 4, 4  # the output tile of one dot-product step: weights reused over rows, activations over columns


def _matmul_integer_dot(ctx: OpCtx, rows: int, k: int, n: int, w: np.ndarray) -> None:
    """Constant weights (zero point taken out, still int8), transposed at build time so each output is a
    contiguous dot product of u8 activations and s8 weights, four bytes a lane on the target's dot-product path
    (`vpdpbusd` with VNNI; `qgemm_isa.dot4`), the last k % (4 x lanes) bytes one at a time; the activation zero
    point comes out afterwards as `za * sum_k w[k, n]`. A ROWS x COLUMNS tile of outputs per step, one item per
    block of rows on the worker pool. On BERT's 128x768x3072 (Zen 5, one thread): the old loop 7.3 ms (LLVM's
    own vectorisation, 41 GMAC/s), one output at a time 3.1 ms (every row streamed all 2.4 MB of weights
    again), the 4 x 4 tile 1.1 ms (276 GMAC/s)."""
    isa = ctx.int8_isa
    lanes = qgemm_isa.LANES[isa]
    vty = qgemm_isa.ivec(lanes)
    chunk = 4 * lanes
    names = {tag: f"{ctx.node.name}/{tag}" for tag in ("wt", "colsum")}
    ctx.new_constants[names["wt"]] = np.ascontiguousarray(w.T.astype(np.int8))
    ctx.new_constants[names["colsum"]] = w.sum(axis=0).astype(np.int32)
    with ctx.parallel(-(-rows // ROWS)) as item:
        b, a, y = ctx.b, ctx.inp(0), ctx.out()
        wt, colsum = ctx.ptr(names["wt"]), ctx.ptr(names["colsum"])
        za = b.zext(b.load(ctx.inp(2), align=1), I32)
        # a last, partial block repeats the last row: the same values stored twice
        rs = [smin(b, add(b, mul(b, item, i64(ROWS)), i64(i)), i64(rows - 1)) for i in range(ROWS)]
        arows = [gep(b, a, mul(b, r, i64(k))) for r in rs]
        parts = qgemm_isa.PARTS[isa]
        reduce = intrinsic(b.module, f"llvm.vector.reduce.add.v{lanes}i32", I32, [vty])

        def columns(j0: ir.Value, cols: int) -> None:
            """Outputs j0 .. j0 + cols - 1 of the block's rows: each weight load serves every row, each
            activation load every column."""
            wrows = [gep(b, wt, mul(b, add(b, j0, i64(c)), i64(k))) for c in range(cols)]
            tiles = [(i, c) for i in range(ROWS) for c in range(cols)]
            accs = [v for _ in tiles for v in qgemm_isa.zero_acc(isa)]
            with loop_carry(b, i64(0), i64(k // chunk), accs, name="kv") as kv:
                at = mul(b, kv, i64(chunk))
                avs = [b.load(b.bitcast(gep(b, row, at), vty.as_pointer()), align=1) for row in arows]
                wvs = [b.load(b.bitcast(gep(b, row, at), vty.as_pointer()), align=1) for row in wrows]
                for t, (i, c) in enumerate(tiles):
                    accs[t * parts:(t + 1) * parts] = qgemm_isa.dot4(b, isa, accs[t * parts:(t + 1) * parts],
                                                                     avs[i], wvs[c])
            totals = [b.call(reduce, [qgemm_isa.finish(b, isa, accs[t * parts:(t + 1) * parts])])
                      for t in range(len(tiles))]
            with loop_carry(b, i64(k - k % chunk), i64(k), totals, name="kt") as kk:
                avs = [b.zext(b.load(gep(b, row, kk), align=1), I32) for row in arows]
                wvs = [b.sext(b.load(gep(b, row, kk), align=1), I32) for row in wrows]
                totals[:] = [b.add(totals[t], b.mul(avs[i], wvs[c])) for t, (i, c) in enumerate(tiles)]
            for t, (i, c) in enumerate(tiles):
                j = add(b, j0, i64(c))
                out = b.sub(totals[t], b.mul(za, b.load(gep(b, colsum, j), align=4)))
                b.store(out, gep(b, y, add(b, mul(b, rs[i], i64(n)), j)), align=4)

        with for_range(b, i64(0), i64(n // COLUMNS), name="nb") as jb:
            columns(mul(b, jb, i64(COLUMNS)), COLUMNS)
        if n % COLUMNS:
            columns(i64(n - n % COLUMNS), n % COLUMNS)


def qadd(ctx: OpCtx) -> None:
    """y = saturate(round(fma(a, ra, fma(b, rb, offset)))) over two int8 tensors of one shape, in float32; int8
    operands shifted into uint8 where onnxruntime runs them so (`*_shift`; the offset is the shifted one) and the
    output back after rounding. With one input (a constant scalar operand, folded into the offset at build time):
    y = saturate(round(fma(a, ra, offset)))."""
    shape, dtype = ctx.out_shape(), ctx.attr("y_dtype")
    n_in = len(ctx.node.inputs)
    ra, offset = f32(float(ctx.attr("a_ratio"))), f32(float(ctx.attr("offset")))
    rb = f32(float(ctx.attr("b_ratio"))) if n_in == 2 else None
    dtypes = [ctx.in_dtype(i) for i in range(n_in)]
    shifts = [int(ctx.attr(k, 0)) for k in ("a_shift", "b_shift")[:n_in]]
    shift = int(ctx.attr("y_shift", 0))

    def fn(b: ir.IRBuilder, v: list[ir.Value]) -> ir.Value:
        x, *y = (b.sitofp(b.add(widen(b, val, d), ir.Constant(I32, s)), F32)
                 for val, d, s in zip(v, dtypes, shifts, strict=True))
        fma = intrinsic(b.module, "llvm.fma.f32", F32, [F32] * 3)
        inner = b.call(fma, [y[0], rb, offset]) if y else offset
        total = roundeven(b, b.call(fma, [x, ra, inner]))
        return saturate(b, b.fsub(total, f32(shift)), dtype, finite=True)

    def block(b: ir.IRBuilder, start: ir.Value, count: int) -> None:
        emit_map(b, (count,), Operand(gep(b, ctx.out(), start), (1,)),
                 [Operand(gep(b, ctx.inp(i), start), (1,)) for i in range(n_in)], fn)
    quant_flat.split(ctx, math.prod(shape), block)


def qavgpool(ctx: OpCtx) -> None:
    """onnxruntime's QLinearAveragePool, which it runs for every DQ -> AveragePool -> Q: the window's dequantized
    values summed in float32 in tap order (padding left out), divided by the count (of real elements unless
    `count_include_pad`), then y = round(avg / sy + zy) (zy shifted by `y_shift`). The zero point is added
    before rounding, unlike
    QuantizeLinear (round, then add): with an odd zero point an exact .5 tie goes to the other neighbour, one
    step that following layers multiply (DenseNet-121 at 224x224: 2 output steps off onnxruntime)."""
    *lead, h, wd = ctx.in_shape()
    oh, ow = ctx.out_shape()[-2:]
    kh, kw = ctx.attr("kernel_shape")
    (sh, sw), (pt, pl) = ctx.attr("strides"), ctx.attr("pads")[:2]
    dtype, out_dtype = ctx.in_dtype(), ctx.attr("y_dtype")
    sx, zx = f32(float(ctx.attr("x_scale"))), ir.Constant(I32, int(ctx.attr("x_zero_point")))
    shift = int(ctx.attr("y_shift", 0))
    sy, zy = f32(float(ctx.attr("y_scale"))), f32(float(ctx.attr("y_zero_point") + shift))
    def extent(b: ir.IRBuilder, o: ir.Value, stride: int, pad: int, k: int, size: int) -> ir.Value:
        start = b.sub(mul(b, o, i64(stride)), i64(pad))
        end = b.add(start, i64(k))
        end = b.select(b.icmp_signed("<", end, i64(size)), end, i64(size))
        return b.sub(end, b.select(b.icmp_signed(">", start, i64(0)), start, i64(0)))

    # planes on the worker pool: DenseNet-121's three transition pools took 0.23 ms on one core at 2 threads
    with ctx.parallel(math.prod(lead), min_items=-(-quant_flat.BLOCK // (h * wd))) as plane:
        b, x, y = ctx.b, ctx.inp(), ctx.out()
        acc = ctx.local()
        with for_range(b, i64(0), i64(oh), name="oy") as oy, for_range(b, i64(0), i64(ow), name="ox") as ox:
            b.store(f32(0), acc)
            for ky in range(kh):
                iy = add(b, mul(b, oy, i64(sh)), i64(ky - pt))
                for kx in range(kw):
                    ix = add(b, mul(b, ox, i64(sw)), i64(kx - pl))
                    inside = b.and_(b.and_(b.icmp_signed(">=", iy, i64(0)), b.icmp_signed("<", iy, i64(h))),
                                    b.and_(b.icmp_signed(">=", ix, i64(0)), b.icmp_signed("<", ix, i64(wd))))
                    with b.if_then(inside):
                        at = add(b, mul(b, plane, i64(h * wd)), add(b, mul(b, iy, i64(wd)), ix))
                        v = b.sub(widen(b, b.load(gep(b, x, at), align=1), dtype), zx)
                        b.store(b.fadd(b.load(acc), b.fmul(sx, b.sitofp(v, F32))), acc)
            if ctx.attr("count_include_pad", 0):
                count = f32(kh * kw)
            else:
                count = b.sitofp(b.mul(extent(b, oy, sh, pt, kh, h), extent(b, ox, sw, pl, kw, wd)), F32)
            avg = b.fdiv(b.load(acc), count)
            q = saturate(b, b.fsub(roundeven(b, b.fadd(b.fdiv(avg, sy), zy)), f32(shift)), out_dtype)
            b.store(q, gep(b, y, add(b, mul(b, plane, i64(oh * ow)), add(b, mul(b, oy, i64(ow)), ox))), align=1)


# Kernels of the quantized ops, whatever their operand types.
OPS: dict[str, Callable[[OpCtx], None]] = {
    "QuantizeLinear": quantize_linear, "DequantizeLinear": dequantize_linear,
    "DynamicQuantizeLinear": dynamic_quantize_linear, "ConvInteger": conv_integer, "MatMulInteger": matmul_integer,
    "qconv2d": qconv2d, "qdense": qdense, "qadd": qadd, "qavgpool": qavgpool,
}
# uint8 / int8 versions of float memory-bound ops (the quant pass leaves them on the integers).
INT8_OPS: dict[str, Callable[[OpCtx], None]] = {"MaxPool": max_pool_int8}
