"""Fused epilogues in LLVM IR: a chain (`stages.graph.epilogue` says what each op means and which
tensors it reads) applied to an accumulator in registers before its one store. Shared by every
template (dense, matmul, batch matmul, conv2d, Winograd) and the generated ops that fuse one.

`emit(b, ops, acc, load)` transforms the accumulator `acc` (a float vector or scalar);
`load(slot)` must return epilogue tensor number `slot` (its position among the epilogue tensors)
at the accumulator's position, with `acc`'s type: a vector load along the vectorised channel
axis, a splat of one per-channel scalar when channels are not the vectorised axis, or a
(masked) load of the residual. Transcendentals are inline polynomials (no libm calls), accurate
to a few float32 ulps.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from llvmlite import ir

from schemas.task import EpilogueOp
from stages.codegen.irb import I32, call_math, fconst, lanes_of
from stages.graph.epilogue import operands, param


def emit(b: ir.IRBuilder, ops: Sequence[EpilogueOp], acc: ir.Value, load: Callable[[int], ir.Value]) -> ir.Value:
    """`acc` after the chain; `load(slot)` gives epilogue tensor `slot` at `acc`'s position."""
    slots = operands(ops)
    for i, op in enumerate(ops):
        try:
            rule = _RULES[op.kind]
        except KeyError:
            raise ValueError(f"no code generator for epilogue op {op.kind!r}") from None
        acc = rule(b, acc, op.attrs, [load(slot) for slot, o in enumerate(slots) if o.op_index == i])
    return acc


def _scaled_add(b: ir.IRBuilder, x: ir.Value, t: ir.Value, beta: float) -> ir.Value:
    return b.fadd(x, t) if beta == 1.0 else call_math(b, "llvm.fma", t, fconst(x.type, beta), x)


def _max(b: ir.IRBuilder, x: ir.Value, v: float) -> ir.Value:
    """max(x, v) keeping a NaN x, as ONNX's Relu, Clip and HardSigmoid and onnxruntime do (`llvm.maxnum`
    returned v: a NaN reaching a Relu came out 0); still one `maxps`, its operands swapped."""
    c = fconst(x.type, v)
    return b.select(b.fcmp_ordered("<", x, c), c, x)


def _min(b: ir.IRBuilder, x: ir.Value, v: float) -> ir.Value:
    c = fconst(x.type, v)
    return b.select(b.fcmp_ordered(">", x, c), c, x)


def _leaky(b: ir.IRBuilder, x: ir.Value, alpha: float) -> ir.Value:
    return b.select(b.fcmp_ordered(">", x, fconst(x.type, 0.0)), x, b.fmul(x, fconst(x.type, alpha)))


def _clip(b: ir.IRBuilder, x: ir.Value, a: dict[str, float]) -> ir.Value:
    if "min" in a:
        x = _max(b, x, a["min"])
    if "max" in a:
        x = _min(b, x, a["max"])
    return x


EXP_LO, EXP_HI = -87.3, 88.3  # exp_f32's clamp: 2^n stays a normal float32 scale between them


def exp_f32(b: ir.IRBuilder, x: ir.Value, flush: bool = True) -> ir.Value:
    """exp(x) for float32 (Cephes expf: range reduction by ln 2, degree-6 polynomial, 2^n by bits);
    vectorisable, so the generated softmax uses it too. n = round(x / ln 2) comes from adding 1.5 * 2^23
    (+ 127, the exponent bias): the sum's low mantissa bits are then n + 127, shifted into place as the
    exponent of 2^n. That is defined for every input, where a float-to-int conversion is not for NaN (the
    old clamp dropped a NaN first, so Sigmoid and Tanh gave 1 and Softmax a number for it, where onnxruntime
    gives NaN): the clamp keeps a NaN now and a NaN comes out, at one instruction less than rint, convert
    and add. Bit for bit the old results on finite inputs (1.2 million checked).

    Below the clamp (x < -87.3, where exp is 1.2e-38 or less) the result is 0, not the clamp's 1.2e-38: a
    caller that scales it (GELU's erfc tail p * e, Softmax's e / sum over a masked score) made a denormal
    of it, and every arithmetic op on a denormal takes a microcode assist. A built model sets DAZ/FTZ while
    it runs (`tf_fp_enter`), but tuning times each kernel alone without: ViT-B/16's bias+GELU dense measured
    9% slower than plain bias in tuning from that alone (216 vs 236 GFLOPS; 232 with exp(-z^2) kept normal).
    `flush=False` skips that compare and select for a caller whose x never goes below -87.3."""
    ty = x.type
    below = b.fcmp_ordered("<", x, fconst(ty, EXP_LO)) if flush else None

    def c(v: float) -> ir.Value:
        return fconst(ty, v)

    def fma(p: ir.Value, q: ir.Value, r: ir.Value) -> ir.Value:
        return call_math(b, "llvm.fma", p, q, r)

    x = _min(b, _max(b, x, EXP_LO), EXP_HI)
    shifter = c(SHIFTER)
    t = b.fadd(b.fmul(x, c(1.4426950408889634)), shifter)  # rounds to an integer as rint would
    n = b.fsub(t, shifter)
    r = fma(n, c(-0.693359375), x)
    r = fma(n, c(2.12194440e-4), r)
    p = c(1.9875691500e-4)
    for k in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
        p = fma(p, r, c(k))
    y = _times_pow2(b, fma(p, b.fmul(r, r), b.fadd(r, c(1.0))), t)
    return y if below is None else b.select(below, fconst(ty, 0.0), y)


SHIFTER = 12582912.0 + 127.0  # 1.5 * 2^23 + the exponent bias: see `exp_f32`
# exp(r) = 1 + r + r^2 P(r) on |r| <= ln 2 / 2, P of degree 4 fitted for relative error (highest first):
# within 2 float32 ulps of exp (1.2e-7), against Cephes' degree 5 within 1.
EXP_SHORT = (1.375641324557364e-3, 8.366390131413937e-3, 4.166917875409126e-2, 1.6666540503501892e-1,
             4.9999991059303284e-1)


def _times_pow2(b: ir.IRBuilder, p: ir.Value, t: ir.Value) -> ir.Value:
    """p * 2^n, n + 127 in the low mantissa bits of the shifted `t`."""
    ity = ir.VectorType(I32, lanes_of(t.type)) if lanes_of(t.type) else I32
    return b.fmul(p, b.bitcast(b.shl(b.bitcast(t, ity), _iconst(ity, 23)), t.type))


def exp_neg_f32(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """exp(-x) for the logistic family (Sigmoid, Swish, tanh-form GELU), 3 ops fewer than `exp_f32(-x)`: the
    negation folded into the constants (the reduced argument is -r, P's odd coefficients change sign; exact),
    x / ln 2 + shifter as one FMA, and the degree-4 `EXP_SHORT`. -x is clamped to [EXP_LO, EXP_HI]: callers
    handle x > -EXP_LO. Their epilogues were a vector of these per output: EfficientNet-B0's bias+swish
    16x112x112 -> 96 conv 0.43 ms against 0.19 with ReLU (Zen 5), a Swish pass 2.56 -> 1.9-2.2 ns per 16 floats."""
    ty = x.type

    def c(v: float) -> ir.Value:
        return fconst(ty, v)

    def fma(p: ir.Value, q: ir.Value, r: ir.Value) -> ir.Value:
        return call_math(b, "llvm.fma", p, q, r)

    x = _min(b, _max(b, x, -EXP_HI), -EXP_LO)
    shifter = c(SHIFTER)
    t = fma(x, c(-1.4426950408889634), shifter)
    n = b.fsub(t, shifter)
    rn = fma(n, c(0.693359375), x)  # -r
    rn = fma(n, c(-2.12194440e-4), rn)
    r2 = b.fmul(rn, rn)
    c4, c3, c2, c1, c0 = EXP_SHORT  # P(r) = (c0 + c1 r) + r^2 ((c2 + c3 r) + r^2 c4), with r = -rn
    p = fma(fma(c(c4), r2, fma(c(-c3), rn, c(c2))), r2, fma(c(-c1), rn, c(c0)))
    return _times_pow2(b, fma(p, r2, b.fsub(c(1.0), rn)), t)


def _iconst(ty: ir.Type, v: int) -> ir.Constant:
    return ir.Constant(ty, [v] * ty.count) if isinstance(ty, ir.VectorType) else ir.Constant(ty, v)


def _sigmoid(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """1 / (1 + exp(-x)), and 0 below x = -87.3 (the true value is a denormal or 0 there): the quotient was
    a denormal 4.5e-39 that every later op on it (Swish's product, an SE scale) paid an assist for. The exp
    needs no flush: above x = 87.3 its 1.2e-38 vanishes in 1 + e as a 0 would. Within 3 ulps of the true
    value, as with Cephes' exp (1.1 million values incl. +-inf, NaN and the cut-offs; the specials unchanged)."""
    one = fconst(x.type, 1.0)
    s = b.fdiv(one, b.fadd(one, exp_neg_f32(b, x)))
    return b.select(b.fcmp_ordered("<", x, fconst(x.type, EXP_LO)), fconst(x.type, 0.0), s)


def _times_sigmoid(b: ir.IRBuilder, x: ir.Value, z: ir.Value) -> ir.Value:
    """x * sigmoid(z) as x / (1 + exp(-z)), one multiply fewer; x * 0 below z = -87.3, as `_sigmoid`'s 0 gives
    (NaN for an infinite x, as ONNX's Mul(x, Sigmoid(x)))."""
    q = b.fdiv(x, b.fadd(fconst(x.type, 1.0), exp_neg_f32(b, z)))
    return b.select(b.fcmp_ordered("<", z, fconst(x.type, EXP_LO)), b.fmul(x, fconst(x.type, 0.0)), q)


def _tanh(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """sign(x) * (1 - e) / (1 + e) with e = exp(-2|x|): no overflow, ~1e-7 absolute error (e unflushed: a
    1.2e-38 leaves 1 - e and 1 + e at 1, as a 0 does)."""
    one = fconst(x.type, 1.0)
    e = exp_f32(b, b.fmul(call_math(b, "llvm.fabs", x), fconst(x.type, -2.0)), flush=False)
    t = b.fdiv(b.fsub(one, e), b.fadd(one, e))
    return call_math(b, "llvm.copysign", t, x)


def _gelu(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """0.5 x (1 + erf(x / sqrt 2)), erf by Abramowitz-Stegun 7.1.26 (|error| < 1.5e-7). erf(z) rounds to
    +-1 in float32 from |z| = 4 (z^2 = 16), so z^2 is clamped at 30: no result changes, and the tail
    p * exp(-z^2) stays a normal number (a denormal there cost the dense 9%, see `exp_f32`), which lets
    the exp skip its flush to zero, one compare and select fewer in the dense's epilogue."""
    ty = x.type

    def c(v: float) -> ir.Value:
        return fconst(ty, v)

    z = b.fmul(x, c(1.0 / math.sqrt(2.0)))
    az = call_math(b, "llvm.fabs", z)
    t = b.fdiv(c(1.0), call_math(b, "llvm.fma", az, c(0.3275911), c(1.0)))
    p = c(1.061405429)
    for k in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
        p = call_math(b, "llvm.fma", p, t, c(k))
    p = b.fmul(p, t)
    erf = b.fsub(c(1.0), b.fmul(p, exp_f32(b, b.fneg(_min(b, b.fmul(az, az), 30.0)), flush=False)))
    erf = call_math(b, "llvm.copysign", erf, z)
    return b.fmul(b.fmul(x, c(0.5)), b.fadd(c(1.0), erf))


def _gelu_tanh(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3) (GPT-2's and ONNX Gelu(approximate="tanh")), as
    x * sigmoid(2u): the same function, without the cancellation of 1 + tanh(u) for negative u."""
    ty = x.type
    x3 = b.fmul(x, b.fmul(x, x))
    two_u = b.fmul(call_math(b, "llvm.fma", x3, fconst(ty, 0.044715), x), fconst(ty, 2 * math.sqrt(2.0 / math.pi)))
    return _times_sigmoid(b, x, two_u)


def _swish(b: ir.IRBuilder, x: ir.Value, alpha: float) -> ir.Value:
    return _times_sigmoid(b, x, x if alpha == 1.0 else b.fmul(x, fconst(x.type, alpha)))


def _hard_sigmoid(b: ir.IRBuilder, x: ir.Value, kind: str, a: dict[str, float]) -> ir.Value:
    h = call_math(b, "llvm.fma", x, fconst(x.type, param(kind, a, "alpha")), fconst(x.type, param(kind, a, "beta")))
    return _min(b, _max(b, h, 0.0), 1.0)


_Rule = Callable[[ir.IRBuilder, ir.Value, dict[str, float], list[ir.Value]], ir.Value]

_RULES: dict[str, _Rule] = {
    "bias": lambda b, x, a, t: _scaled_add(b, x, t[0], a.get("beta", 1.0)),
    "scale_shift": lambda b, x, a, t: call_math(b, "llvm.fma", x, t[0], t[1]),
    "residual_add": lambda b, x, a, t: _scaled_add(b, x, t[0], a.get("beta", 1.0)),
    "relu": lambda b, x, a, t: _max(b, x, 0.0),
    "clip": lambda b, x, a, t: _clip(b, x, a),
    "leaky_relu": lambda b, x, a, t: _leaky(b, x, a.get("alpha", 0.01)),
    "sigmoid": lambda b, x, a, t: _sigmoid(b, x),
    "tanh": lambda b, x, a, t: _tanh(b, x),
    "gelu": lambda b, x, a, t: _gelu(b, x),
    "gelu_tanh": lambda b, x, a, t: _gelu_tanh(b, x),
    "swish": lambda b, x, a, t: _swish(b, x, param("swish", a, "alpha")),
    "hard_sigmoid": lambda b, x, a, t: _hard_sigmoid(b, x, "hard_sigmoid", a),
    "hard_swish": lambda b, x, a, t: b.fmul(x, _hard_sigmoid(b, x, "hard_swish", a)),
}
