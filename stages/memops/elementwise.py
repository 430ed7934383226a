"""Element-wise ops with numpy broadcasting: one loop nest, operands read through broadcast strides."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from llvmlite import ir

from stages.memops.concat_chain import concat_chain
from stages.memops.loops import (
    Combine,
    Operand,
    broadcast_strides,
    call_f32,
    contiguous_strides,
    emit_map,
    epilogue_op,
    f32,
    select_max,
    select_min,
)
from stages.memops.opctx import OpCtx
from stages.memops.pool_map import pool_map
from stages.memops.typed import convert


def elementwise(ctx: OpCtx, fn: Combine, inputs: list[int] | None = None) -> None:
    """out = fn(inputs...) broadcast to the output's shape; an integer constant operand (Pow's exponent) is
    read as float."""
    shape = ctx.out_shape()
    idx = inputs if inputs is not None else [i for i in range(len(ctx.node.inputs)) if ctx.has_input(i)]
    kinds = [ctx.in_dtype(i) for i in idx]
    pool_map(ctx, shape, [(i, broadcast_strides(ctx.in_shape(i), shape)) for i in idx],
             lambda b, v: fn(b, [convert(b, x, k, "float32") for x, k in zip(v, kinds, strict=True)]))


Attr = Callable[..., Any]  # (name, default) -> the op's attribute
Unary = Callable[[ir.IRBuilder, ir.Value], ir.Value]


def _plain(f: Unary) -> Callable[[Attr], Unary]:
    return lambda attr: f


def _fold(f: Callable[[ir.IRBuilder, ir.Value, ir.Value], ir.Value]) -> Combine:
    def fn(b: ir.IRBuilder, v: list[ir.Value]) -> ir.Value:
        acc = v[0]
        for x in v[1:]:
            acc = f(b, acc, x)
        return acc
    return fn


def relu(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """The epilogue's relu: one rule (a NaN kept, as ONNX and onnxruntime give it) fused or not."""
    return epilogue_op(b, "relu", x)


def _gelu(attr: Attr) -> Unary:
    kind = "gelu_tanh" if attr("approximate", "none") == "tanh" else "gelu"
    return lambda b, x: epilogue_op(b, kind, x)


def _hard_swish(attr: Attr) -> Unary:
    alpha, beta = float(attr("alpha", 1 / 6)), float(attr("beta", 0.5))
    return lambda b, x: epilogue_op(b, "hard_swish", x, alpha=alpha, beta=beta)


def _swish(attr: Attr) -> Unary:
    alpha = float(attr("alpha", 1.0))
    return lambda b, x: epilogue_op(b, "swish", x, alpha=alpha)


def _clip(attr: Attr) -> Unary:
    lo, hi = attr("min"), attr("max")

    def f(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
        if lo is not None:
            x = select_max(b, x, f32(float(lo)))
        if hi is not None:
            x = select_min(b, x, f32(float(hi)))
        return x
    return f


def _leaky_relu(attr: Attr) -> Unary:
    alpha = float(attr("alpha", 0.01))
    return lambda b, x: b.select(b.fcmp_ordered(">=", x, f32(0)), x, b.fmul(x, f32(alpha)))


def _elu_value(b: ir.IRBuilder, x: ir.Value, alpha: float) -> ir.Value:
    """x, or alpha * (e^x - 1) below zero."""
    neg = b.fmul(f32(alpha), b.fsub(call_f32(b, "llvm.exp.f32", x), f32(1)))
    return b.select(b.fcmp_ordered(">=", x, f32(0)), x, neg)


def _elu(attr: Attr) -> Unary:
    alpha = float(attr("alpha", 1.0))
    return lambda b, x: _elu_value(b, x, alpha)


def _selu(attr: Attr) -> Unary:
    alpha, gamma = float(attr("alpha")), float(attr("gamma"))
    return lambda b, x: b.fmul(f32(gamma), _elu_value(b, x, alpha))


def _shrink(attr: Attr) -> Unary:
    lambd, bias = float(attr("lambd", 0.5)), float(attr("bias", 0.0))

    def f(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
        above = b.select(b.fcmp_ordered(">", x, f32(lambd)), b.fsub(x, f32(bias)), f32(0))
        return b.select(b.fcmp_ordered("<", x, f32(-lambd)), b.fadd(x, f32(bias)), above)
    return f


def _sign(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """1, -1, or x itself for zeros and NaN."""
    return b.select(b.fcmp_ordered(">", x, f32(0)), f32(1), b.select(b.fcmp_ordered("<", x, f32(0)), f32(-1), x))


def _softplus(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """log(1 + e^x) as max(x, 0) + log(1 + e^-|x|): no overflow to inf for large x."""
    decay = call_f32(b, "llvm.exp.f32", b.fneg(call_f32(b, "llvm.fabs.f32", x)))
    tail = call_f32(b, "llvm.log.f32", b.fadd(f32(1), decay))
    return b.fadd(relu(b, x), tail)


def _hard_sigmoid(attr: Attr) -> Unary:
    alpha, beta = float(attr("alpha", 0.2)), float(attr("beta", 0.5))
    return lambda b, x: select_min(b, select_max(b, b.fadd(b.fmul(x, f32(alpha)), f32(beta)), f32(0)), f32(1))


def _prelu(ctx: OpCtx) -> None:
    elementwise(ctx, lambda b, v: b.select(b.fcmp_ordered(">=", v[0], f32(0)), v[0], b.fmul(v[0], v[1])), [0, 1])


def _pow(ctx: OpCtx) -> None:
    """x ** y, with the common constant exponents (2, 0.5, 1, 3) turned into multiplies and sqrt."""
    y = ctx.const(1)
    if y is not None and y.size == 1:
        e = float(y.reshape(()))
        special = {1.0: lambda b, x: x, 2.0: lambda b, x: b.fmul(x, x), 3.0: lambda b, x: b.fmul(x, b.fmul(x, x)),
                   0.5: lambda b, x: call_f32(b, "llvm.sqrt.f32", x)}
        if e in special:
            elementwise(ctx, lambda b, v: special[e](b, v[0]), [0])
            return
    elementwise(ctx, lambda b, v: call_f32(b, "llvm.pow.f32", v[0], v[1]), [0, 1])


def _mean(ctx: OpCtx) -> None:
    n = sum(ctx.has_input(i) for i in range(len(ctx.node.inputs)))
    elementwise(ctx, lambda b, v: b.fmul(_fold(lambda b, x, y: b.fadd(x, y))(b, v), f32(1 / n)))


def batch_norm(ctx: OpCtx) -> None:
    """Inference batch-norm left unfolded: y = x * a[c] + s[c], a and s computed at build time."""
    consts = [ctx.const(i) for i in range(1, 5)]
    if any(c is None for c in consts):
        raise ctx.unsupported("scale, bias, mean and variance must be constants")
    scale, bias, mean, var = (c.astype(np.float64) for c in consts)
    a = scale / np.sqrt(var + float(ctx.attr("epsilon", 1e-5)))
    shape = ctx.out_shape()
    bshape = (a.size,) + (1,) * (len(shape) - 2)
    pa = ctx.weight("bn_scale", a.reshape(bshape))
    ps = ctx.weight("bn_shift", (bias - mean * a).reshape(bshape))
    ins = [Operand(ctx.inp(0), contiguous_strides(shape)), Operand(pa, broadcast_strides(bshape, shape)),
           Operand(ps, broadcast_strides(bshape, shape))]
    emit_map(ctx.b, shape, Operand(ctx.out(), contiguous_strides(shape)), ins,
             lambda b, v: b.fadd(b.fmul(v[0], v[1]), v[2]))


TRIG = ("Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh")

# One-input float ops by ONNX name: each makes its IR from the node's attributes, alone (`OPS`) or as a link
# of an `ElementwiseChain` (stages/graph/passes_chain.py).
UNARY: dict[str, Callable[[Attr], Unary]] = {
    "Relu": _plain(relu),
    "Sigmoid": _plain(lambda b, x: epilogue_op(b, "sigmoid", x)),
    "Tanh": _plain(lambda b, x: epilogue_op(b, "tanh", x)),
    "Erf": _plain(lambda b, x: call_f32(b, "erff", x)),
    "Sqrt": _plain(lambda b, x: call_f32(b, "llvm.sqrt.f32", x)),
    "Exp": _plain(lambda b, x: call_f32(b, "llvm.exp.f32", x)),
    "Log": _plain(lambda b, x: call_f32(b, "llvm.log.f32", x)),
    "Abs": _plain(lambda b, x: call_f32(b, "llvm.fabs.f32", x)),
    "Neg": _plain(lambda b, x: b.fneg(x)),
    "Reciprocal": _plain(lambda b, x: b.fdiv(f32(1), x)),
    "Floor": _plain(lambda b, x: call_f32(b, "llvm.floor.f32", x)),
    "Ceil": _plain(lambda b, x: call_f32(b, "llvm.ceil.f32", x)),
    **{op: _plain(lambda b, x, f=f"{op.lower()}f": call_f32(b, f, x)) for op in TRIG},  # libm: RoPE's sin/cos
    "Softplus": _plain(_softplus),
    "Softsign": _plain(lambda b, x: b.fdiv(x, b.fadd(f32(1), call_f32(b, "llvm.fabs.f32", x)))),
    "Sign": _plain(_sign),
    "Selu": _selu,
    "Shrink": _shrink,
    "Gelu": _gelu,
    "Clip": _clip,
    "LeakyRelu": _leaky_relu,
    "Elu": _elu,
    "HardSigmoid": _hard_sigmoid,
    "HardSwish": _hard_swish,
    "Swish": _swish,
}

# Two-input float ops a chain link may apply with a constant on either side.
BINARY: dict[str, Callable[[ir.IRBuilder, ir.Value, ir.Value], ir.Value]] = {
    "Add": lambda b, x, y: b.fadd(x, y), "Sub": lambda b, x, y: b.fsub(x, y), "Mul": lambda b, x, y: b.fmul(x, y),
    "Div": lambda b, x, y: b.fdiv(x, y), "Max": select_max, "Min": select_min,
}


def _unary_op(rule: Callable[[Attr], Unary]) -> Callable[[OpCtx], None]:
    def op(ctx: OpCtx) -> None:
        f = rule(ctx.attr)
        elementwise(ctx, lambda b, v: f(b, v[0]), [0])
    return op


def chain_fn(steps: list[dict]) -> Combine:
    """fn(v) of an `ElementwiseChain`: v[0] the running tensor, then each binary link's constant in order."""
    links = [(UNARY[s["op"]](lambda k, d=None, a=s["attrs"]: a.get(k, d)), None) if s.get("operand") is None
             else (BINARY[s["op"]], bool(s.get("left"))) for s in steps]

    def fn(b: ir.IRBuilder, v: list[ir.Value]) -> ir.Value:
        acc, k = v[0], 1
        for f, left in links:
            if left is None:
                acc = f(b, acc)
            else:
                acc = f(b, v[k], acc) if left else f(b, acc, v[k])
                k += 1
        return acc
    return fn


def chain(ctx: OpCtx) -> None:
    """Element-wise links applied in one pass (stages/graph/passes_chain.py), after a Concat over channels when
    the node has `concat` > 1 inputs to join."""
    steps = ctx.attr("steps")
    parts = int(ctx.attr("concat", 1))
    operands = [int(s["operand"]) for s in steps if s.get("operand") is not None]
    fn = chain_fn(steps)
    if parts == 1:
        elementwise(ctx, fn, [0, *operands])
    else:
        concat_chain(ctx, parts, operands, fn)


OPS: dict[str, Callable[[OpCtx], None]] = {
    **{op: _unary_op(rule) for op, rule in UNARY.items()},
    "PRelu": _prelu,
    **{op: (lambda ctx, f=BINARY[name]: elementwise(ctx, _fold(f))) for op, name in (
        ("Add", "Add"), ("Sum", "Add"), ("Sub", "Sub"), ("Mul", "Mul"), ("Div", "Div"), ("Max", "Max"),
        ("Min", "Min"))},
    "Mean": _mean,
    "Pow": _pow,
    "BatchNormalization": batch_norm,
    "ElementwiseChain": chain,
}
