"""Ops that reduce: pooling, softmax, layer norm (of a sum too), ReduceMean and friends, LRN."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from stages.codegen.irb import (
    F32,
    I1,
    I64,
    add,
    fconst,
    for_range,
    gep,
    i64,
    intrinsic,
    lane_mask,
    load_vec,
    mul,
    splat,
    store_vec,
    vec,
)
from stages.memops.loops import (
    Operand,
    broadcast_strides,
    call_f32,
    contiguous_strides,
    emit_map,
    f32,
    fadd_reassoc,
    loop_nest,
    select_max,
    select_min,
)
from stages.memops.opctx import OpCtx
from stages.templates.epilogue import exp_f32

_INIT = {"sum": 0.0, "mean": 0.0, "max": -math.inf, "min": math.inf, "prod": 1.0}
_COMBINE = {"sum": fadd_reassoc, "mean": fadd_reassoc, "max": select_max,
            "min": select_min, "prod": lambda b, x, y: b.fmul(x, y)}


@dataclass(frozen=True)
class Reduction:
    """An ONNX reduction as a map of each element, a combine (`_COMBINE`), then a map of each result:
    ReduceL2 is sqrt(sum(x * x)), ReduceLogSum log(sum(x))."""

    combine: str
    pre: Callable[[ir.IRBuilder, ir.Value], ir.Value] | None = None
    post: Callable[[ir.IRBuilder, ir.Value], ir.Value] | None = None


def _square(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return b.fmul(x, x)


REDUCTIONS = {
    "ReduceMean": Reduction("mean"), "ReduceSum": Reduction("sum"), "ReduceMax": Reduction("max"),
    "ReduceMin": Reduction("min"), "ReduceProd": Reduction("prod"),
    "ReduceL1": Reduction("sum", pre=lambda b, x: call_f32(b, "llvm.fabs", x)),
    "ReduceL2": Reduction("sum", pre=_square, post=lambda b, x: call_f32(b, "llvm.sqrt", x)),
    "ReduceSumSquare": Reduction("sum", pre=_square),
    "ReduceLogSum": Reduction("sum", post=lambda b, x: call_f32(b, "llvm.log", x)),
}


def _load(b: ir.IRBuilder, ptr: ir.Value, off: ir.Value) -> ir.Value:
    return b.load(gep(b, ptr, off), align=4)


def _store(b: ir.IRBuilder, v: ir.Value, ptr: ir.Value, off: ir.Value) -> None:
    b.store(v, gep(b, ptr, off), align=4)


def reduce_axes(ctx: OpCtx, kind: str | Reduction, axes: list[int]) -> None:
    """out = reduce over `axes` of the input (keepdims or not: the output buffer is the same)."""
    r = Reduction(kind) if isinstance(kind, str) else kind
    shape = ctx.in_shape()
    axes = sorted({a + len(shape) if a < 0 else a for a in axes})
    kept = tuple(1 if d in axes else s for d, s in enumerate(shape))
    n_out = math.prod(kept)
    count = math.prod(shape) // n_out
    out, flat = ctx.out(), Operand(ctx.out(), (1,))
    if r.combine in ("sum", "mean") and r.pre is None and axes == list(range(len(shape) - len(axes), len(shape))):
        _sum_rows(ctx, n_out, count, 1 / count if r.combine == "mean" else 1)  # each output sums a contiguous row
    else:
        emit_map(ctx.b, (n_out,), flat, [], lambda b, v: f32(_INIT[r.combine]))
        acc = Operand(out, broadcast_strides(kept, shape))
        combine, pre = _COMBINE[r.combine], r.pre or (lambda b, x: x)
        emit_map(ctx.b, shape, acc, [acc, Operand(ctx.inp(), contiguous_strides(shape))],
                 lambda b, v: combine(b, v[0], pre(b, v[1])))
        if r.combine == "mean":
            emit_map(ctx.b, (n_out,), flat, [flat], lambda b, v: b.fmul(v[0], f32(1 / count)))
    if r.post is not None:
        emit_map(ctx.b, (n_out,), flat, [flat], lambda b, v: r.post(b, v[0]))


def _reduce(op: str) -> Callable[[OpCtx], None]:
    return lambda ctx: reduce_axes(ctx, REDUCTIONS[op], [int(a) for a in ctx.attr("axes")])


def _global(kind: str) -> Callable[[OpCtx], None]:
    return lambda ctx: reduce_axes(ctx, kind, list(range(2, len(ctx.in_shape()))))


def _rows(ctx: OpCtx, axis: int, last: bool) -> tuple[int, int, int]:
    """(outer, n, inner) viewing the input around `axis`; with `last`, n covers axis..end."""
    shape = ctx.in_shape()
    axis = axis + len(shape) if axis < 0 else axis
    if last:
        return math.prod(shape[:axis]), math.prod(shape[axis:]), 1
    return math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])


ROW_LANES = 16  # vectors along a contiguous row (split by LLVM on narrower targets)


def row_chunks(b: ir.IRBuilder, n: int, base: ir.Value, body: Callable[[ir.Value, ir.Value | None], None]) -> None:
    """`body(offset, mask)` over a row of `n` floats at `base`: its whole vectors (mask None), then its tail."""
    full, tail = divmod(n, ROW_LANES)
    with for_range(b, i64(0), i64(full), name="v") as c:
        body(add(b, base, mul(b, c, i64(ROW_LANES))), None)
    if tail:
        body(add(b, base, i64(full * ROW_LANES)), lane_mask(ROW_LANES, tail))


def row_load(b: ir.IRBuilder, ptr: ir.Value, at: ir.Value, mask: ir.Value | None, fill: ir.Value) -> ir.Value:
    v = load_vec(b, gep(b, ptr, at), ROW_LANES, mask)
    return v if mask is None else b.select(mask, v, fill)


def _sum_rows(ctx: OpCtx, rows: int, n: int, scale: float) -> None:
    """out[r] = scale * the sum of row r's `n` contiguous floats: vector partial sums, then one sum across
    lanes. GlobalAveragePool of the CNN's 64x8x8: 2.0 us accumulating element by element into out."""
    b, x, y = ctx.b, ctx.inp(), ctx.out()
    zero = fconst(vec(ROW_LANES), 0.0)
    acc = ctx.local(vec(ROW_LANES))
    with for_range(b, i64(0), i64(rows), name="row") as r:
        b.store(zero, acc)
        row_chunks(b, n, mul(b, r, i64(n)), lambda at, mask: b.store(
            b.fadd(b.load(acc), row_load(b, x, at, mask, zero)), acc))
        total = across_lanes(b, "fadd", b.load(acc))
        _store(b, total if scale == 1 else b.fmul(total, f32(scale)), y, r)


def _softmax_rows(ctx: OpCtx, rows: int, n: int, log: bool) -> None:
    """Softmax over contiguous rows of `n`, in explicit vectors with a masked tail: max, then
    exp(x - max) and its sum, then the scale (or `(x - max) - log(sum)`). The transformer's 4x64 rows
    of 64: 10.4 us, where the scalar loops below (kept for rows strided by `inner`) took 28."""
    b, x, y, L = ctx.b, ctx.inp(), ctx.out(), ROW_LANES
    ninf, zero = fconst(vec(L), -math.inf), fconst(vec(L), 0.0)

    def chunks(base: ir.Value, body: Callable[[ir.Value, ir.Value | None], None]) -> None:
        row_chunks(b, n, base, body)

    def load(ptr: ir.Value, at: ir.Value, mask: ir.Value | None, fill: ir.Value) -> ir.Value:
        return row_load(b, ptr, at, mask, fill)

    with for_range(b, i64(0), i64(rows), name="row") as o:
        base = mul(b, o, i64(n))
        acc = ctx.local(vec(L))
        b.store(ninf, acc)
        chunks(base, lambda at, mask: b.store(
            window_max(b, b.load(acc), load(x, at, mask, ninf)), acc))
        top = across_lanes(b, "fmax", b.load(acc))
        mx = splat(b, top, L)
        b.store(zero, acc)

        def exp_sum(at: ir.Value, mask: ir.Value | None) -> None:
            e = exp_f32(b, b.fsub(load(x, at, mask, mx), mx))
            e = e if mask is None else b.select(mask, e, zero)
            b.store(b.fadd(b.load(acc), e), acc)
            if not log:
                store_vec(b, e, gep(b, y, at), mask)
        chunks(base, exp_sum)
        total = across_lanes(b, "fadd", b.load(acc))
        if log:
            # (x - max) - log(sum): exact differences first, so rows of large values keep their precision
            ls = splat(b, call_f32(b, "llvm.log.f32", total), L)
            chunks(base, lambda at, mask: store_vec(b, b.fsub(b.fsub(load(x, at, mask, zero), mx), ls), gep(b, y, at),
                                                     mask))
        else:
            r = splat(b, b.fdiv(f32(1), total), L)
            chunks(base, lambda at, mask: store_vec(b, b.fmul(load(y, at, mask, zero), r), gep(b, y, at), mask))


def across_lanes(b: ir.IRBuilder, kind: str, v: ir.Value) -> ir.Value:
    """A vector's lanes combined into one float (`fadd` in any order, `fmax`)."""
    n = v.type.count
    if kind == "fmax":
        fn = intrinsic(b.module, f"llvm.vector.reduce.fmax.v{n}f32", F32, [v.type])
        return b.call(fn, [v])
    fn = intrinsic(b.module, f"llvm.vector.reduce.fadd.v{n}f32", F32, [F32, v.type])
    total = b.call(fn, [f32(0.0), v])
    total.flags.append("reassoc")
    return total


def _softmax(log: bool) -> Callable[[OpCtx], None]:
    def build(ctx: OpCtx) -> None:
        outer, n, inner = _rows(ctx, int(ctx.attr("axis", -1)), last=False)
        if inner == 1:
            _softmax_rows(ctx, outer, n, log)
            return
        b, x, y = ctx.b, ctx.inp(), ctx.out()
        mx, total = ctx.local(), ctx.local()
        with loop_nest(b, (outer, inner), "row") as (o, i):
            base = add(b, mul(b, o, i64(n * inner)), i)

            def at(k: ir.Value) -> ir.Value:
                return add(b, base, mul(b, k, i64(inner)))
            b.store(f32(-math.inf), mx)
            with for_range(b, i64(0), i64(n), name="k") as k:
                b.store(select_max(b, b.load(mx), _load(b, x, at(k))), mx)
            b.store(f32(0), total)
            with for_range(b, i64(0), i64(n), name="k") as k:
                e = exp_f32(b, b.fsub(_load(b, x, at(k)), b.load(mx)))
                b.store(fadd_reassoc(b, b.load(total), e), total)
                if not log:
                    _store(b, e, y, at(k))
            if log:
                lse = b.fadd(b.load(mx), call_f32(b, "llvm.log.f32", b.load(total)))
                with for_range(b, i64(0), i64(n), name="k") as k:
                    _store(b, b.fsub(_load(b, x, at(k)), lse), y, at(k))
            else:
                r = b.fdiv(f32(1), b.load(total))
                with for_range(b, i64(0), i64(n), name="k") as k:
                    _store(b, b.fmul(_load(b, y, at(k)), r), y, at(k))
    return build


def _affine_param(ctx: OpCtx, i: int, tail: tuple[int, ...], tag: str) -> ir.Value | None:
    """LayerNorm's scale/bias as a full `tail`-shaped buffer (constants are broadcast at build time)."""
    if not ctx.has_input(i):
        return None
    value = ctx.const(i)
    if value is not None:
        return ctx.weight(tag, np.broadcast_to(value.astype(np.float32), tail))
    if math.prod(ctx.in_shape(i)) != math.prod(tail):
        raise ctx.unsupported(f"a non-constant input {i} must have the normalised shape {list(tail)}")
    return ctx.inp(i)


def layer_norm(ctx: OpCtx) -> None:
    axis = int(ctx.attr("axis", -1))
    shape = ctx.in_shape()
    outer, n, _ = _rows(ctx, axis, last=True)
    tail = shape[(axis + len(shape) if axis < 0 else axis):]
    scale, shift = _affine_param(ctx, 1, tail, "ln_scale"), _affine_param(ctx, 2, tail, "ln_bias")
    stats = [ctx.out(j) if len(ctx.node.outputs) > j and ctx.node.outputs[j] else None for j in (1, 2)]
    _normalize_rows(ctx, outer, n, None, scale, shift, stats)


def instance_norm(ctx: OpCtx) -> None:
    """Each (image, channel) plane normalised, then that channel's scale and bias."""
    shape = ctx.in_shape()
    c = shape[1]
    _normalize_rows(ctx, shape[0] * c, math.prod(shape[2:]), lambda o: ctx.b.urem(o, i64(c)), ctx.inp(1),
                    ctx.inp(2), [None, None])


def add_layer_norm(ctx: OpCtx) -> None:
    """LayerNormalization of the sum of the first `terms` inputs (run-time tensors of the output's shape, or
    constants broadcast to it; stages/graph/passes_norm.py makes these nodes): each row is summed into the
    second output (the sum, when something else reads it) or into Y, then normalised from there while it is
    still in cache. The sum is taken left to right, as the chain of Adds was."""
    terms = int(ctx.attr("terms"))
    shape = ctx.out_shape()
    axis = int(ctx.attr("axis", -1)) % len(shape)
    outer, n = math.prod(shape[:axis]), math.prod(shape[axis:])
    tail = shape[axis:]
    scale, shift = _affine_param(ctx, terms, tail, "ln_scale"), _affine_param(ctx, terms + 1, tail, "ln_bias")
    parts = []
    for i in range(terms):
        value = ctx.const(i)
        if value is None and math.prod(ctx.in_shape(i)) != math.prod(shape):
            raise ctx.unsupported(f"a run-time term (input {i}) must have the output's shape {list(shape)}")
        parts.append(ctx.inp(i) if value is None else ctx.weight(f"term{i}", np.broadcast_to(value, shape)))
    dst = ctx.out(1) if len(ctx.node.outputs) > 1 else ctx.out()
    b = ctx.b

    def row_sum(base: ir.Value) -> None:
        with for_range(b, i64(0), i64(n), name="t") as k:
            at = add(b, base, k)
            v = _load(b, parts[0], at)
            for p in parts[1:]:
                v = b.fadd(v, _load(b, p, at))
            _store(b, v, dst, at)
    _normalize_rows(ctx, outer, n, None, scale, shift, [None, None], x=dst, before=row_sum)


def _normalize_rows(ctx: OpCtx, outer: int, n: int, row_param: Callable[[ir.Value], ir.Value] | None,
                    scale: ir.Value | None, shift: ir.Value | None, stats: list[ir.Value | None],
                    x: ir.Value | None = None, before: Callable[[ir.Value], None] | None = None) -> None:
    """y = (x - mean) / sqrt(var + epsilon) * scale + shift over rows of `n`, in explicit vectors with a masked
    tail (the scalar loops took 237 us a call on ViT-B/16's 197x768 rows, onnxruntime 64). Scale and shift run
    along the row, or are one value per row at `row_param(row)`; `stats` receive each row's mean and 1/std where
    given. `x` defaults to the node's input; `before(row offset)` runs first in each row (to compute that row of
    `x`)."""
    eps = float(ctx.attr("epsilon", 1e-5))
    b, y, L = ctx.b, ctx.out(), ROW_LANES
    x = ctx.inp() if x is None else x
    zero = fconst(vec(L), 0.0)
    acc = ctx.local(vec(L))
    with for_range(b, i64(0), i64(outer), name="row") as o:
        base = mul(b, o, i64(n))
        if before is not None:
            before(base)
        b.store(zero, acc)
        row_chunks(b, n, base, lambda at, mask: b.store(b.fadd(b.load(acc), row_load(b, x, at, mask, zero)), acc))
        m = b.fmul(across_lanes(b, "fadd", b.load(acc)), f32(1 / n))
        mv = splat(b, m, L)
        b.store(zero, acc)

        def squares(at: ir.Value, mask: ir.Value | None) -> None:
            d = b.fsub(row_load(b, x, at, mask, mv), mv)
            b.store(b.fadd(b.load(acc), b.fmul(d, d)), acc)
        row_chunks(b, n, base, squares)
        var = b.fmul(across_lanes(b, "fadd", b.load(acc)), f32(1 / n))
        rstd = b.fdiv(f32(1), call_f32(b, "llvm.sqrt.f32", b.fadd(var, f32(eps))))
        rv = splat(b, rstd, L)
        per_row = [None if p is None or row_param is None else splat(b, _load(b, p, row_param(o)), L)
                   for p in (scale, shift)]

        def param(i: int, ptr: ir.Value, at: ir.Value, mask: ir.Value | None) -> ir.Value:
            return per_row[i] if per_row[i] is not None else row_load(b, ptr, b.sub(at, base), mask, zero)

        def normalise(at: ir.Value, mask: ir.Value | None) -> None:
            v = b.fmul(b.fsub(row_load(b, x, at, mask, zero), mv), rv)
            if scale is not None:
                v = b.fmul(v, param(0, scale, at, mask))
            if shift is not None:
                v = b.fadd(v, param(1, shift, at, mask))
            store_vec(b, v, gep(b, y, at), mask)
        row_chunks(b, n, base, normalise)
        for ptr, val in zip(stats, (m, rstd), strict=True):
            if ptr is not None:
                _store(b, val, ptr, o)


def lrn(ctx: OpCtx) -> None:
    """y = x / (bias + alpha/size * sum of x^2 over a window of channels) ** beta."""
    shape = ctx.in_shape()
    n, c, hw = shape[0], shape[1], math.prod(shape[2:])
    size = int(ctx.attr("size"))
    alpha, beta, bias = float(ctx.attr("alpha", 1e-4)), float(ctx.attr("beta", 0.75)), float(ctx.attr("bias", 1.0))
    lo, hi = (size - 1) // 2, -(-(size - 1) // 2)
    b, x, y = ctx.b, ctx.inp(), ctx.out()
    flat = Operand(y, (1,))
    emit_map(b, (math.prod(shape),), flat, [], lambda b, v: f32(0))
    with loop_nest(b, (n, c), "nc") as (ni, ci):
        first = b.select(b.icmp_signed("<", ci, i64(lo)), i64(0), b.sub(ci, i64(lo)))
        last = add(b, ci, i64(hi + 1))
        last = b.select(b.icmp_signed(">", last, i64(c)), i64(c), last)
        out_base = mul(b, add(b, mul(b, ni, i64(c)), ci), i64(hw))
        with for_range(b, first, last, name="c2") as c2:
            in_base = mul(b, add(b, mul(b, ni, i64(c)), c2), i64(hw))
            with for_range(b, i64(0), i64(hw), name="hw") as p:
                v = _load(b, x, add(b, in_base, p))
                o = add(b, out_base, p)
                _store(b, b.fadd(_load(b, y, o), b.fmul(v, v)), y, o)
    xs = Operand(x, (1,))
    emit_map(b, (math.prod(shape),), flat, [xs, flat], lambda b, v: b.fmul(
        v[0], call_f32(b, "llvm.pow.f32", b.fadd(f32(bias), b.fmul(v[1], f32(alpha / size))), f32(-beta))))


def _pool(kind: str) -> Callable[[OpCtx], None]:
    def build(ctx: OpCtx) -> None:
        r = len(ctx.in_shape()) - 2
        k = [int(v) for v in ctx.attr("kernel_shape")]
        s = [int(v) for v in ctx.attr("strides", [1] * r)]
        d = [int(v) for v in ctx.attr("dilations", [1] * r)]
        pads = [int(p) for p in ctx.attr("pads", [0] * 2 * r)]
        include_pad = bool(int(ctx.attr("count_include_pad", 0)))
        _emit_pool(ctx, kind, ctx.in_shape()[2:], ctx.out_shape()[2:], k, s, d, pads[:r], pads[r:], include_pad)
    return build


POOL_ITEM_FLOATS = 16384  # input floats per thread below which a pool runs on one thread
# Border columns (window partly outside the row) unrolled with their taps and count fixed at build time, up to
# this many taps a row: the loop over taps with run-time bounds checks, once per border column of every row of
# every plane, was most of Inception-v3's 3x3 average pools on 35-, 17- and 8-wide maps.
BORDER_UNROLL = 64


def _emit_pool(ctx, kind, sp, osp, k, s, d, pb, pe, include_pad) -> None:
    """Separable, one output row at a time: the window's input rows are combined column by column
    into a row buffer (unit stride, vectorised), then each output combines its window's columns of
    that buffer, so a k x k window costs k + k operations per output instead of k*k. Rows and
    columns whose window lies inside the input run branch-free; the border checks bounds. Output
    rows are split over the worker pool, as the convs around a pool split theirs (`par=oh`), so a
    thread mostly reads rows its own core wrote."""
    if len(sp) != 2:
        raise ctx.unsupported(f"{len(sp)}-D pooling (only 2-D is built)")
    nc = ctx.in_shape()[0] * ctx.in_shape()[1]
    (h, w), (oh_n, ow_n) = sp, osp
    if tuple(osp) == tuple(sp) and s == [1, 1] and d == [1, 1] and h * w <= SAME_POOL_FLOATS:
        _same_pool(ctx, kind, h, w, k, pb, include_pad, pe)
        return
    lo = [-(-p // st) for p, st in zip(pb, s, strict=True)]
    hi = [max(lo_d, min(o, (i - 1 + p - (kk - 1) * dd) // st + 1)) if i - 1 + p - (kk - 1) * dd >= 0 else lo_d
          for o, i, p, kk, dd, st, lo_d in zip(osp, sp, pb, k, d, s, lo, strict=True)]
    combine, init = _combiner(kind)
    counted = (-pb[1], w + pe[1]) if include_pad else (0, w)
    with ctx.parallel(oh_n, min_items=-(-POOL_ITEM_FLOATS // (nc * w * s[0]))) as oh:
        b, x, y = ctx.b, ctx.inp(), ctx.out()
        rows, acc, cnt = ctx.buffer(2 * w), ctx.local(), ctx.local()
        top = b.sub(mul(b, oh, i64(s[0])), i64(pb[0]))
        taps = [add(b, top, i64(i * d[0])) for i in range(k[0])]
        inside = b.and_(b.icmp_signed(">=", oh, i64(lo[0])), b.icmp_signed("<", oh, i64(hi[0])))
        rows_counted = [_within(b, [r], [-pb[0] if include_pad else 0], [h + pe[0] if include_pad else h])
                        for r in taps]
        rows_n = b.uitofp(functools.reduce(b.add, [b.zext(v, I64) for v in rows_counted]), F32)

        def slot(c: ir.Value) -> ir.Value:
            """Plane c's half of the row buffer."""
            return gep(b, rows, mul(b, b.and_(c, i64(1)), i64(w)))

        def row_pass(c: ir.Value) -> None:
            """The window's input rows of plane c combined column by column."""
            row = slot(c)
            in_base = mul(b, c, i64(h * w))

            def in_row(r: ir.Value) -> ir.Value:
                return add(b, in_base, mul(b, r, i64(w)))

            with b.if_else(inside) as (inner_row, border_row):
                with inner_row:
                    starts = [in_row(r) for r in taps]
                    with for_range(b, i64(0), i64(w), name="col") as col:
                        total = None
                        for start in starts:
                            v = _load(b, x, add(b, start, col))
                            total = v if total is None else combine(b, total, v)
                        _store(b, total, row, col)
                with border_row:
                    with for_range(b, i64(0), i64(w), name="fill") as col:
                        _store(b, init, row, col)
                    for r in taps:
                        with b.if_then(_within(b, [r], [0], [h])):
                            start = in_row(r)
                            with for_range(b, i64(0), i64(w), name="colb") as col:
                                _store(b, combine(b, _load(b, row, col), _load(b, x, add(b, start, col))), row, col)

        def column_pass(c: ir.Value) -> None:
            row = slot(c)
            out_row = mul(b, add(b, mul(b, c, i64(oh_n)), oh), i64(ow_n))

            def fast(ow: ir.Value) -> None:
                left = b.sub(mul(b, ow, i64(s[1])), i64(pb[1]))
                total = None
                for j in range(k[1]):
                    v = _load(b, row, add(b, left, i64(j * d[1])))
                    total = v if total is None else combine(b, total, v)
                _store(b, total if kind == "max" else b.fdiv(total, b.fmul(rows_n, f32(k[1]))), y, add(b, out_row, ow))

            def slow(ow: ir.Value) -> None:
                left = b.sub(mul(b, ow, i64(s[1])), i64(pb[1]))
                b.store(init, acc)
                b.store(f32(0), cnt)
                with for_range(b, i64(0), i64(k[1]), name="kw") as j:
                    col = add(b, left, mul(b, j, i64(d[1])))
                    valid = _within(b, [col], [0], [w])
                    padded = _within(b, [col], [-pb[1]], [w + pe[1]])
                    b.store(b.fadd(b.load(cnt), b.uitofp(padded if include_pad else valid, F32)), cnt)
                    with b.if_then(valid):
                        b.store(combine(b, b.load(acc), _load(b, row, col)), acc)
                result = b.load(acc) if kind == "max" else b.fdiv(b.load(acc), b.fmul(rows_n, b.load(cnt)))
                _store(b, result, y, add(b, out_row, ow))

            def border(ow: int) -> None:
                cols = [ow * s[1] - pb[1] + j * d[1] for j in range(k[1])]
                result = _border_column(b, kind, row, i64(0), cols, w, counted, rows_n)
                _store(b, result, y, add(b, out_row, i64(ow)))

            for first, last, body in ((0, lo[1], slow), (lo[1], hi[1], fast), (hi[1], ow_n, slow)):
                if body is slow and (last - first) * k[1] <= BORDER_UNROLL:
                    for ow in range(first, last):
                        border(ow)
                elif last > first:
                    with for_range(b, i64(first), i64(last), name="ow") as ow:
                        body(ow)

        # The column pass reads its row one plane later: read right after the row pass's vector
        # stores, its unaligned loads waited for those stores to reach the cache.
        row_pass(i64(0))
        with for_range(b, i64(0), i64(nc), name="plane") as c:
            with b.if_then(b.icmp_signed("<", add(b, c, i64(1)), i64(nc))):
                row_pass(add(b, c, i64(1)))
            column_pass(c)


SAME_POOL_FLOATS = 4096  # planes up to this many floats run `_same_pool`, whole planes at a time


def _same_pool(ctx, kind, h, w, k, pb, include_pad, pe) -> None:
    """A stride-1 pool whose output is the input's size (Inception's 3x3 pad-1 average pools on 35-, 17- and 8-wide
    maps), one plane at a time as flat vector loops: the window's rows combined into a buffer (the rows whose
    window lies inside the plane as one loop over all of them), then every output combined from the buffer's
    neighbours as one loop over the plane, border columns (whose flat neighbours belong to the next row) then
    rewritten with their taps fixed at build time. `_emit_pool` went one output row at a time, two loops of `w`
    per row and plane: 2.3-7x onnxruntime's blocked pools on those maps. The same taps combine in the same order
    and divide by the same counts, so the bits are `_emit_pool`'s."""
    combine, init = _combiner(kind)
    pt, pl = pb
    inner = (pt, h - (k[0] - 1 - pt))  # output rows whose window rows all lie inside the plane
    counts = [sum((-pt <= r - pt + i < h + pe[0]) if include_pad else (0 <= r - pt + i < h) for i in range(k[0]))
              for r in range(h)]
    nc = ctx.in_shape()[0] * ctx.in_shape()[1]
    margin = max(pl, k[1] - 1 - pl)
    with ctx.parallel(nc, min_items=max(1, -(-POOL_ITEM_FLOATS // (h * w)))) as c:
        b, x, y = ctx.b, ctx.inp(), ctx.out()  # pointers are the body's own: on the pool it is a function
        rows_n = ctx.weight("rows_counted", np.array(counts, dtype=np.float32))
        # The inner columns' divisor at every output: rows counted x the window's width, exact in float32.
        divisor = ctx.weight("inner_divisor", np.repeat(np.array(counts, dtype=np.float32) * k[1], w))
        buf = ctx.buffer(h * w + 2 * margin)
        rows = gep(b, buf, i64(margin))  # rows[-margin .. h*w + margin): the margins feed only border columns
        for m in (*range(-margin, 0), *range(h * w, h * w + margin)):
            _store(b, init, rows, i64(m))
        plane, out = gep(b, x, mul(b, c, i64(h * w))), gep(b, y, mul(b, c, i64(h * w)))
        if inner[1] > inner[0]:
            with for_range(b, i64(inner[0] * w), i64(inner[1] * w), name="vrow") as j:
                total = None
                for i in range(k[0]):
                    v = _load(b, plane, add(b, j, i64((i - pt) * w)))
                    total = v if total is None else combine(b, total, v)
                _store(b, total, rows, j)
        for r in (r for r in range(h) if not inner[0] <= r < inner[1]):
            taps = [r - pt + i for i in range(k[0]) if 0 <= r - pt + i < h]
            with for_range(b, i64(0), i64(w), name="brow") as col:
                total = init
                for t in taps:
                    total = combine(b, total, _load(b, plane, add(b, i64(t * w), col)))
                _store(b, total, rows, add(b, i64(r * w), col))
        with for_range(b, i64(0), i64(h * w), name="hcol") as j:
            total = None
            for t in range(k[1]):
                v = _load(b, rows, add(b, j, i64(t - pl)))
                total = v if total is None else combine(b, total, v)
            if kind != "max":
                total = b.fdiv(total, _load(b, divisor, j))
            _store(b, total, out, j)
        borders = [col for col in range(w) if not pl <= col < w - (k[1] - 1 - pl)]
        counted = (-pl, w + pe[1]) if include_pad else (0, w)
        with for_range(b, i64(0), i64(h), name="bcol") as r:
            start = mul(b, r, i64(w))
            for col in borders:
                cols = [col - pl + t for t in range(k[1])]
                total = _border_column(b, kind, rows, start, cols, w, counted, _load(b, rows_n, r))
                _store(b, total, out, add(b, start, i64(col)))


def _border_column(b: ir.IRBuilder, kind: str, row: ir.Value, start: ir.Value, cols: list[int], w: int,
                   counted: tuple[int, int], rows_n: ir.Value) -> ir.Value:
    """One output whose window leaves its row of combined rows (`row` from `start`, `w` wide): the taps at
    `cols` that lie in the row, known at build time, combined in order; an average divides by `rows_n` times
    the taps in [counted[0], counted[1]) (the padded width when the pad counts)."""
    combine, total = _combiner(kind)
    for col in (col for col in cols if 0 <= col < w):
        total = combine(b, total, _load(b, row, add(b, start, i64(col))))
    if kind == "max":
        return total
    return b.fdiv(total, b.fmul(rows_n, f32(float(sum(counted[0] <= col < counted[1] for col in cols)))))


def _combiner(kind: str) -> tuple[Callable[[ir.IRBuilder, ir.Value, ir.Value], ir.Value], ir.Value]:
    """How a pool's window folds its taps, and the value it starts from (the identity: -inf or 0)."""
    if kind == "max":
        return window_max, f32(-math.inf)
    return (lambda b, a, v: b.fadd(a, v)), f32(0.0)


def window_max(b: ir.IRBuilder, total: ir.Value, v: ir.Value) -> ir.Value:
    """`total > v ? total : v` compare-ordered: one `maxps` (a NaN tap wins over the taps before it).
    The unordered form that keeps a NaN total costs a compare and a blend per tap: MaxPool 12.5 -> 9.9 us
    on the bundled CNN's 16x64x64 input."""
    return b.select(b.fcmp_ordered(">", total, v), total, v)


def _within(b: ir.IRBuilder, coords, lo, hi) -> ir.Value:
    ok = ir.Constant(I1, 1)
    for c, lo_d, hi_d in zip(coords, lo, hi, strict=True):
        ok = b.and_(ok, b.and_(b.icmp_signed(">=", c, i64(lo_d)), b.icmp_signed("<", c, i64(hi_d))))
    return ok


OPS: dict[str, Callable[[OpCtx], None]] = {
    "MaxPool": _pool("max"),
    "AveragePool": _pool("avg"),
    "GlobalAveragePool": _global("mean"),
    "GlobalMaxPool": _global("max"),
    **{op: _reduce(op) for op in REDUCTIONS},
    "Softmax": _softmax(log=False),
    "LogSoftmax": _softmax(log=True),
    "LayerNormalization": layer_norm,
    "AddLayerNormalization": add_layer_norm,
    "InstanceNormalization": instance_norm,
    "LRN": lrn,
}
