"""Fused epilogues: element-wise ops applied to an accumulator in registers before its one store.

Shared by every template (dense, matmul, batch matmul, conv2d). A chain is the task's
`epilogue` (any order, any length) of: bias, scale_shift, relu, clip, leaky_relu, sigmoid, tanh,
gelu (exact, erf form), gelu_tanh (the tanh approximation), swish (x * sigmoid(alpha x); SiLU at
alpha 1), hard_sigmoid (clamp(alpha x + beta, 0, 1)), hard_swish (x * hard_sigmoid(x); ONNX's
HardSwish at alpha 1/6, beta 1/2), residual_add. `DEFAULTS` holds the attributes an op assumes
when they are absent (the fusion pass drops attributes equal to them, so a model's layer and
`--epilogue hard_swish` are one task).

Epilogue tensors (the contract between tasks, `make_inputs`, `kernel_args` and codegen):
- In `TuningTask.inputs` they follow the anchor op's own inputs, in epilogue order:
  `inputs = [X, W, *epilogue tensors]`. `bias` brings one tensor `(C,)`, `scale_shift` two,
  scale `(C,)` then shift `(C,)`, and `residual_add` one tensor of the output's shape. `C` is
  the output's channel axis: the last axis for dense/matmul/batch matmul, axis 1 for NCHW conv2d.
- In `kernel_args` they come in the same order after the anchor's (packed) operands and before
  the output, which stays LAST: `[X, Wpacked, *epilogue tensors, Y]`. A template may re-lay a
  per-channel tensor at build time (e.g. to NCHWc blocks) but keeps its position.
- `bias` and `residual_add` take an optional `beta` attribute: `y + beta * t` (ONNX Gemm's beta).

Codegen: `emit(b, ops, acc, load)` transforms the accumulator `acc` (a float vector or scalar);
`load(slot)` must return epilogue tensor number `slot` (its position among the epilogue tensors)
at the accumulator's position, with `acc`'s type: a vector load along the vectorised channel
axis, a splat of one per-channel scalar when channels are not the vectorised axis, or a
(masked) load of the residual. Transcendentals are inline polynomials (no libm calls), accurate
to a few float32 ulps.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from schemas.task import EpilogueOp, TensorSpec
from stages.codegen.irb import I32, call_math, fconst, lanes_of

ROLES: dict[str, tuple[str, ...]] = {
    "bias": ("bias",), "scale_shift": ("scale", "shift"), "residual_add": ("residual",),
}
DEFAULTS: dict[str, dict[str, float]] = {
    "swish": {"alpha": 1.0}, "hard_sigmoid": {"alpha": 0.2, "beta": 0.5},
    "hard_swish": {"alpha": 1 / 6, "beta": 0.5},
}


@dataclass(frozen=True)
class Operand:
    """One epilogue tensor: which op reads it, in what role, and whether it is per channel."""

    op_index: int
    role: str

    @property
    def per_channel(self) -> bool:
        return self.role != "residual"


def operands(ops: Sequence[EpilogueOp]) -> tuple[Operand, ...]:
    """The epilogue tensors of a chain, in slot order."""
    return tuple(Operand(i, role) for i, op in enumerate(ops) for role in ROLES.get(op.kind, ()))


def operand_specs(ops: Sequence[EpilogueOp], out_shape: tuple[int, ...], channel_axis: int) -> tuple[TensorSpec, ...]:
    """The `TuningTask.inputs` entries the chain adds after the anchor op's inputs."""
    channels = out_shape[channel_axis]
    return tuple(TensorSpec(shape=(channels,) if o.per_channel else out_shape) for o in operands(ops))


def make_operands(ops: Sequence[EpilogueOp], out_shape: tuple[int, ...], channel_axis: int,
                  rng: np.random.Generator) -> list[np.ndarray]:
    """Random epilogue tensors (scales kept positive and near 1 so chains stay well-conditioned)."""
    out = []
    for spec, o in zip(operand_specs(ops, out_shape, channel_axis), operands(ops), strict=True):
        lo, hi = (0.5, 1.5) if o.role == "scale" else (-1.0, 1.0)
        out.append(rng.uniform(lo, hi, size=spec.shape).astype(np.float32))
    return out


def param(kind: str, attrs: dict[str, float], name: str) -> float:
    """Attribute `name` of an op of `kind`, or its default."""
    return attrs.get(name, DEFAULTS[kind][name])


def validate(ops: Sequence[EpilogueOp]) -> None:
    """Raise ValueError for attributes an op does not take or values it cannot use."""
    allowed = {"clip": {"min", "max"}, "leaky_relu": {"alpha"}, "bias": {"beta"}, "residual_add": {"beta"},
               **{kind: set(d) for kind, d in DEFAULTS.items()}}
    for op in ops:
        extra = sorted(set(op.attrs) - allowed.get(op.kind, set()))
        if extra:
            raise ValueError(f"epilogue {op.kind!r} does not take attribute(s) {extra}")
        if op.kind == "clip" and op.attrs.get("min", -math.inf) > op.attrs.get("max", math.inf):
            raise ValueError(f"clip min {op.attrs['min']} exceeds max {op.attrs['max']}")


# ---- numpy reference -------------------------------------------------------------------------

def apply_reference(ops: Sequence[EpilogueOp], y: np.ndarray, tensors: Sequence[np.ndarray],
                    channel_axis: int = -1) -> np.ndarray:
    """The chain applied to `y` in float64 (per-channel tensors broadcast along `channel_axis`)."""
    y = y.astype(np.float64)
    axis = channel_axis % y.ndim
    shape = [1] * y.ndim
    shape[axis] = y.shape[axis]
    slot = iter(range(len(tensors)))

    def take(per_channel: bool) -> np.ndarray:
        t = np.asarray(tensors[next(slot)], dtype=np.float64)
        return t.reshape(shape) if per_channel else t

    for op in ops:
        a = op.attrs
        if op.kind == "bias":
            y = y + a.get("beta", 1.0) * take(True)
        elif op.kind == "scale_shift":
            scale = take(True)
            y = y * scale + take(True)
        elif op.kind == "residual_add":
            y = y + a.get("beta", 1.0) * take(False)
        elif op.kind == "relu":
            y = np.maximum(y, 0.0)
        elif op.kind == "clip":
            y = np.clip(y, a.get("min", -np.inf), a.get("max", np.inf))
        elif op.kind == "leaky_relu":
            y = np.where(y > 0, y, a.get("alpha", 0.01) * y)
        elif op.kind == "sigmoid":
            y = 1.0 / (1.0 + np.exp(-y))
        elif op.kind == "tanh":
            y = np.tanh(y)
        elif op.kind == "gelu":
            y = 0.5 * y * (1.0 + _erf(y / math.sqrt(2.0)))
        elif op.kind == "gelu_tanh":
            y = 0.5 * y * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (y + 0.044715 * y ** 3)))
        elif op.kind == "swish":
            y = 0.5 * y * (1.0 + np.tanh(0.5 * param(op.kind, a, "alpha") * y))
        elif op.kind in ("hard_sigmoid", "hard_swish"):
            h = np.clip(param(op.kind, a, "alpha") * y + param(op.kind, a, "beta"), 0.0, 1.0)
            y = h if op.kind == "hard_sigmoid" else y * h
        else:
            raise ValueError(f"no reference for epilogue op {op.kind!r}")
    return y.astype(np.float32)


_np_erf = np.vectorize(math.erf, otypes=[np.float64])


def _erf(x: np.ndarray) -> np.ndarray:
    return _np_erf(x) if x.size else x


# ---- codegen ---------------------------------------------------------------------------------

def emit(b: ir.IRBuilder, ops: Sequence[EpilogueOp], acc: ir.Value, load: Callable[[int], ir.Value]) -> ir.Value:
    """`acc` after the chain; `load(slot)` gives epilogue tensor `slot` at `acc`'s position."""
    slot = 0
    for op in ops:
        n = len(ROLES.get(op.kind, ()))
        try:
            rule = _RULES[op.kind]
        except KeyError:
            raise ValueError(f"no code generator for epilogue op {op.kind!r}") from None
        acc = rule(b, acc, op.attrs, [load(slot + i) for i in range(n)])
        slot += n
    return acc


def _scaled_add(b: ir.IRBuilder, x: ir.Value, t: ir.Value, beta: float) -> ir.Value:
    return b.fadd(x, t) if beta == 1.0 else call_math(b, "llvm.fma", t, fconst(x.type, beta), x)


def _max(b: ir.IRBuilder, x: ir.Value, v: float) -> ir.Value:
    return call_math(b, "llvm.maxnum", x, fconst(x.type, v))


def _min(b: ir.IRBuilder, x: ir.Value, v: float) -> ir.Value:
    return call_math(b, "llvm.minnum", x, fconst(x.type, v))


def _leaky(b: ir.IRBuilder, x: ir.Value, alpha: float) -> ir.Value:
    return b.select(b.fcmp_ordered(">", x, fconst(x.type, 0.0)), x, b.fmul(x, fconst(x.type, alpha)))


def _clip(b: ir.IRBuilder, x: ir.Value, a: dict[str, float]) -> ir.Value:
    if "min" in a:
        x = _max(b, x, a["min"])
    if "max" in a:
        x = _min(b, x, a["max"])
    return x


def _exp(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """exp(x) for float32 (Cephes expf: range reduction by ln 2, degree-6 polynomial, 2^n by bits)."""
    ty = x.type

    def c(v: float) -> ir.Value:
        return fconst(ty, v)

    def fma(p: ir.Value, q: ir.Value, r: ir.Value) -> ir.Value:
        return call_math(b, "llvm.fma", p, q, r)

    x = _min(b, _max(b, x, -87.3), 88.3)
    n = call_math(b, "llvm.rint", b.fmul(x, c(1.4426950408889634)))
    r = fma(n, c(-0.693359375), x)
    r = fma(n, c(2.12194440e-4), r)
    p = c(1.9875691500e-4)
    for k in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
        p = fma(p, r, c(k))
    p = fma(p, b.fmul(r, r), b.fadd(r, c(1.0)))
    ity = ir.VectorType(I32, lanes_of(ty)) if lanes_of(ty) else I32
    bits = b.shl(b.add(b.fptosi(n, ity), _iconst(ity, 127)), _iconst(ity, 23))
    return b.fmul(p, b.bitcast(bits, ty))


def _iconst(ty: ir.Type, v: int) -> ir.Constant:
    return ir.Constant(ty, [v] * ty.count) if isinstance(ty, ir.VectorType) else ir.Constant(ty, v)


def _sigmoid(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    one = fconst(x.type, 1.0)
    return b.fdiv(one, b.fadd(one, _exp(b, b.fneg(x))))


def _tanh(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """sign(x) * (1 - e) / (1 + e) with e = exp(-2|x|): no overflow, ~1e-7 absolute error."""
    one = fconst(x.type, 1.0)
    e = _exp(b, b.fmul(call_math(b, "llvm.fabs", x), fconst(x.type, -2.0)))
    t = b.fdiv(b.fsub(one, e), b.fadd(one, e))
    return call_math(b, "llvm.copysign", t, x)


def _gelu(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """0.5 x (1 + erf(x / sqrt 2)), erf by Abramowitz-Stegun 7.1.26 (|error| < 1.5e-7)."""
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
    erf = b.fsub(c(1.0), b.fmul(p, _exp(b, b.fneg(b.fmul(az, az)))))
    erf = call_math(b, "llvm.copysign", erf, z)
    return b.fmul(b.fmul(x, c(0.5)), b.fadd(c(1.0), erf))


def _gelu_tanh(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3) (GPT-2's and ONNX Gelu(approximate="tanh")), as
    x * sigmoid(2u): the same function, without the cancellation of 1 + tanh(u) for negative u."""
    ty = x.type
    x3 = b.fmul(x, b.fmul(x, x))
    two_u = b.fmul(call_math(b, "llvm.fma", x3, fconst(ty, 0.044715), x), fconst(ty, 2 * math.sqrt(2.0 / math.pi)))
    return b.fmul(x, _sigmoid(b, two_u))


def _swish(b: ir.IRBuilder, x: ir.Value, alpha: float) -> ir.Value:
    return b.fmul(x, _sigmoid(b, x if alpha == 1.0 else b.fmul(x, fconst(x.type, alpha))))


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
