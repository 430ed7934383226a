"""Element-wise ops on any run-time type: comparisons, logic, NaN/Inf tests, Where, Cast, Expand, Trilu,
CumSum, and integer arithmetic (position ids, mask sums).

Values are loaded in their own type (float, i64, i32; a bool's i8) and combined with numpy's
broadcasting through `emit_map`, as the float ops are. A bool is read as "not zero", so a byte that
is neither 0 nor 1 still means true, and written as 0 or 1.
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir

from stages.codegen.irb import F32, I1, add, for_range, gep, i64, intrinsic, mul
from stages.memops.loops import (
    Combine,
    Operand,
    align_of,
    broadcast_strides,
    const_like,
    contiguous_strides,
    emit_map,
    loop_nest,
    offset,
)
from stages.memops.opctx import ELEMENT, OpCtx

I8 = ir.IntType(8)


def truth(b: ir.IRBuilder, v: ir.Value, dtype: str) -> ir.Value:
    """An i1: the value is not zero (NaN counts as true, as numpy's astype(bool) has it)."""
    if dtype == "float32":
        return b.fcmp_unordered("!=", v, ir.Constant(F32, 0.0))
    return b.icmp_unsigned("!=", v, ir.Constant(v.type, 0))


def convert(b: ir.IRBuilder, v: ir.Value, src: str, dst: str) -> ir.Value:
    """`v` of type `src` as `dst`: floats to integers saturate (NaN becomes 0), as no value is poison."""
    if src == dst:
        return v
    if dst == "bool":
        return b.zext(truth(b, v, src), I8)
    if src == "bool":
        bit = truth(b, v, src)
        return b.uitofp(bit, F32) if dst == "float32" else b.zext(bit, ELEMENT[dst])
    if dst == "float32":
        return b.uitofp(v, F32) if src == "uint8" else b.sitofp(v, F32)
    ty = ELEMENT[dst]
    if src == "float32":
        sat = "fptoui" if dst == "uint8" else "fptosi"
        return b.call(intrinsic(b.module, f"llvm.{sat}.sat.i{ty.width}.f32", ty, [F32]), [v])
    if ty.width <= v.type.width:
        return b.trunc(v, ty) if ty.width < v.type.width else v
    return b.zext(v, ty) if src == "uint8" else b.sext(v, ty)


def typed_map(ctx: OpCtx, fn: Combine, inputs: list[int] | None = None) -> None:
    """out = fn(inputs...) over the output's shape, operands broadcast, each loaded in its own type."""
    shape = ctx.out_shape()
    idx = inputs if inputs is not None else list(range(len(ctx.node.inputs)))
    ins = [Operand(ctx.inp(i), broadcast_strides(ctx.in_shape(i), shape)) for i in idx]
    emit_map(ctx.b, shape, Operand(ctx.out(), contiguous_strides(shape)), ins, fn)


def _bit(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    return b.zext(v, I8)


FLOAT_CMP = {"Equal": "==", "Less": "<", "Greater": ">", "LessOrEqual": "<=", "GreaterOrEqual": ">="}


def _compare(op: str) -> Callable[[OpCtx], None]:
    def gen(ctx: OpCtx) -> None:
        dtype = ctx.in_dtype(0)
        if dtype != ctx.in_dtype(1):
            raise ctx.unsupported(f"it compares {dtype} with {ctx.in_dtype(1)}")
        if dtype == "float32":
            typed_map(ctx, lambda b, v: _bit(b, b.fcmp_ordered(FLOAT_CMP[op], v[0], v[1])))
        elif dtype == "bool":
            typed_map(ctx, lambda b, v: _bit(b, b.icmp_unsigned(FLOAT_CMP[op], truth(b, v[0], dtype),
                                                                truth(b, v[1], dtype))))
        else:
            cmp = "icmp_unsigned" if dtype == "uint8" else "icmp_signed"
            typed_map(ctx, lambda b, v: _bit(b, getattr(b, cmp)(FLOAT_CMP[op], v[0], v[1])))
    return gen


def _logical(combine: Callable[[ir.IRBuilder, ir.Value, ir.Value], ir.Value]) -> Callable[[OpCtx], None]:
    def gen(ctx: OpCtx) -> None:
        d0, d1 = ctx.in_dtype(0), ctx.in_dtype(1)
        typed_map(ctx, lambda b, v: _bit(b, combine(b, truth(b, v[0], d0), truth(b, v[1], d1))))
    return gen


def _not(ctx: OpCtx) -> None:
    dtype = ctx.in_dtype(0)
    typed_map(ctx, lambda b, v: _bit(b, b.not_(truth(b, v[0], dtype))))


def _float_test(ctx: OpCtx, test: Callable[[ir.IRBuilder, ir.Value], ir.Value]) -> None:
    if ctx.in_dtype(0) != "float32":
        typed_map(ctx, lambda b, v: ir.Constant(I8, 0))  # an integer is never NaN or infinite
        return
    typed_map(ctx, lambda b, v: _bit(b, test(b, v[0])))


def _is_inf(ctx: OpCtx) -> None:
    pos, neg = bool(ctx.attr("detect_positive", 1)), bool(ctx.attr("detect_negative", 1))

    def test(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
        hit = ir.Constant(I1, 0)
        if pos:
            hit = b.or_(hit, b.fcmp_ordered("==", x, ir.Constant(F32, float("inf"))))
        if neg:
            hit = b.or_(hit, b.fcmp_ordered("==", x, ir.Constant(F32, float("-inf"))))
        return hit
    _float_test(ctx, test)


def _where(ctx: OpCtx) -> None:
    cond, out = ctx.in_dtype(0), ctx.out_dtype()
    d1, d2 = ctx.in_dtype(1), ctx.in_dtype(2)
    typed_map(ctx, lambda b, v: b.select(truth(b, v[0], cond), convert(b, v[1], d1, out), convert(b, v[2], d2, out)))


def _cast(ctx: OpCtx) -> None:
    src, dst = ctx.in_dtype(0), ctx.out_dtype()
    typed_map(ctx, lambda b, v: convert(b, v[0], src, dst))


def _expand(ctx: OpCtx) -> None:
    typed_map(ctx, lambda b, v: v[0])


def _trilu(ctx: OpCtx) -> None:
    """The upper (j - i >= k) or lower (j - i <= k) triangle of each trailing matrix; zeros elsewhere."""
    *lead, n, m = ctx.in_shape()
    upper, k = bool(ctx.attr("upper", 1)), int(ctx.attr("k", 0))
    b, x, y = ctx.b, ctx.inp(), ctx.out()
    zero = const_like(y, 0)
    batch = 1
    for d in lead:
        batch *= d
    with loop_nest(b, (batch, n, m), "t") as (bi, i, j):
        at = offset(b, (bi, i, j), (n * m, m, 1))
        diff = b.sub(j, i)
        keep = b.icmp_signed(">=" if upper else "<=", diff, i64(k))
        v = b.load(gep(b, x, at), align=align_of(x))
        b.store(b.select(keep, v, zero), gep(b, y, at), align=align_of(y))


def _cumsum(ctx: OpCtx) -> None:
    """Running sums along `axis` (from its end with `reverse`; each excluding itself with `exclusive`)."""
    shape = ctx.in_shape()
    axis = int(ctx.attr("axis"))
    outer, n, inner = 1, shape[axis], 1
    for d in shape[:axis]:
        outer *= d
    for d in shape[axis + 1:]:
        inner *= d
    reverse, exclusive = bool(ctx.attr("reverse", 0)), bool(ctx.attr("exclusive", 0))
    b, x, y = ctx.b, ctx.inp(), ctx.out()
    ty = x.type.pointee
    is_float = isinstance(ty, ir.FloatType)
    acc = ctx.local(ty)
    with loop_nest(b, (outer, inner), "c") as (o, q):
        b.store(const_like(x, 0), acc)
        with for_range(b, i64(0), i64(n), name="s") as t:
            pos = b.sub(i64(n - 1), t) if reverse else t
            at = add(b, add(b, mul(b, o, i64(n * inner)), mul(b, pos, i64(inner))), q)
            v = b.load(gep(b, x, at), align=align_of(x))
            before = b.load(acc)
            total = b.fadd(before, v) if is_float else b.add(before, v)
            b.store(total, acc)
            b.store(before if exclusive else total, gep(b, y, at), align=align_of(y))


def _int_fold(f: Callable[[ir.IRBuilder, ir.Value, ir.Value], ir.Value]) -> Callable[[OpCtx], None]:
    def gen(ctx: OpCtx) -> None:
        def fn(b: ir.IRBuilder, v: list[ir.Value]) -> ir.Value:
            acc = v[0]
            for other in v[1:]:
                acc = f(b, acc, other)
            return acc
        typed_map(ctx, fn)
    return gen


def _int_abs(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    return b.select(b.icmp_signed("<", x, ir.Constant(x.type, 0)), b.neg(x), x)


# Ops whose kernels take any run-time type.
TYPED_OPS: dict[str, Callable[[OpCtx], None]] = {
    **{op: _compare(op) for op in FLOAT_CMP},
    "And": _logical(lambda b, x, y: b.and_(x, y)), "Or": _logical(lambda b, x, y: b.or_(x, y)),
    "Xor": _logical(lambda b, x, y: b.xor(x, y)), "Not": _not,
    "IsNaN": lambda ctx: _float_test(ctx, lambda b, x: b.fcmp_unordered("uno", x, x)),
    "IsInf": _is_inf, "Where": _where, "Cast": _cast, "Expand": _expand, "Trilu": _trilu, "CumSum": _cumsum,
}
# Integer versions of float ops (int64 or int32 tensors throughout).
INT_OPS: dict[str, Callable[[OpCtx], None]] = {
    "Add": _int_fold(lambda b, x, y: b.add(x, y)), "Sum": _int_fold(lambda b, x, y: b.add(x, y)),
    "Sub": _int_fold(lambda b, x, y: b.sub(x, y)), "Mul": _int_fold(lambda b, x, y: b.mul(x, y)),
    "Max": _int_fold(lambda b, x, y: b.select(b.icmp_signed(">", x, y), x, y)),
    "Min": _int_fold(lambda b, x, y: b.select(b.icmp_signed("<", x, y), x, y)),
    "Neg": lambda ctx: typed_map(ctx, lambda b, v: b.neg(v[0])),
    "Abs": lambda ctx: typed_map(ctx, lambda b, v: _int_abs(b, v[0])),
}
