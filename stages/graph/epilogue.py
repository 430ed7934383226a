"""Fused epilogues, what they mean: the element-wise ops the fusion pass folds into an anchor op
(conv2d, dense, matmul, batch matmul), the tensors they read, and their numpy reference. Graph
passes, tasks and templates all read this; the LLVM IR that applies a chain to an accumulator is
`stages.templates.epilogue`.

A chain is the task's `epilogue` (any order, any length) of: bias, scale_shift, relu, clip,
leaky_relu, sigmoid, tanh, gelu (exact, erf form), gelu_tanh (the tanh approximation), swish
(x * sigmoid(alpha x); SiLU at alpha 1), hard_sigmoid (clamp(alpha x + beta, 0, 1)), hard_swish
(x * hard_sigmoid(x); ONNX's HardSwish at alpha 1/6, beta 1/2), residual_add. `DEFAULTS` holds
the attributes an op assumes when they are absent (the fusion pass drops attributes equal to
them, so a model's layer and `--epilogue hard_swish` are one task).

Epilogue tensors (the contract between tasks, `make_inputs`, `kernel_args` and codegen):
- In `TuningTask.inputs` they follow the anchor op's own inputs, in epilogue order:
  `inputs = [X, W, *epilogue tensors]`. `bias` brings one tensor `(C,)`, `scale_shift` two,
  scale `(C,)` then shift `(C,)`, and `residual_add` one tensor of the output's shape. `C` is
  the output's channel axis: the last axis for dense/matmul/batch matmul, axis 1 for NCHW conv2d.
- In `kernel_args` they come in the same order after the anchor's (packed) operands and before
  the output, which stays LAST: `[X, Wpacked, *epilogue tensors, Y]`. A template may re-lay a
  per-channel tensor at build time (e.g. to NCHWc blocks) but keeps its position.
- `bias` and `residual_add` take an optional `beta` attribute: `y + beta * t` (ONNX Gemm's beta).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from schemas.task import EpilogueOp, TensorSpec

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
