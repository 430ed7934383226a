"""A tuning task: one workload (op kind, shapes, attributes, fused epilogue).

Two tasks with equal content share a signature, whatever the order of their dict keys, so a
log written for one model is found again for another that holds the same layer.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

OpKind = Literal["matmul", "dense", "batch_matmul", "conv2d", "conv2d_winograd", "qdense", "qconv2d", "qmatmul"]
CONV_OPS = ("conv2d", "conv2d_winograd")  # NCHW x OIHW float convolutions, whatever the algorithm
QUANT_OPS = ("qdense", "qconv2d", "qmatmul")  # int8 anchors (u8/s8 operands; qdense/qconv2d requantize)
DType = Literal["float32", "uint8", "int8", "int32"]
EpilogueKind = Literal[
    "bias", "scale_shift", "relu", "clip", "leaky_relu", "sigmoid", "tanh", "gelu", "gelu_tanh", "swish",
    "hard_sigmoid", "hard_swish", "residual_add",
]


class TensorSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    shape: tuple[int, ...]
    dtype: DType = "float32"

    @field_validator("shape")
    @classmethod
    def _positive(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if not v or any(d <= 0 for d in v):
            raise ValueError(f"every dimension must be a positive integer, got {list(v)}")
        return v

    @property
    def size(self) -> int:
        return math.prod(self.shape)


class EpilogueOp(BaseModel):
    """One element-wise op fused after the anchor op, e.g. `clip` with min/max."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: EpilogueKind
    attrs: dict[str, float] = Field(default_factory=dict)


class TuningTask(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    op: OpKind
    inputs: tuple[TensorSpec, ...] = Field(min_length=1)
    outputs: tuple[TensorSpec, ...] = Field(min_length=1)
    attrs: dict[str, int | float | str | bool | tuple[int, ...]] = Field(default_factory=dict)
    epilogue: tuple[EpilogueOp, ...] = ()

    @property
    def signature(self) -> str:
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    @property
    def description(self) -> str:
        shapes = ",".join("x".join(map(str, t.shape)) for t in self.inputs)
        epi = "+".join(e.kind for e in self.epilogue)
        if self.op in QUANT_OPS:  # the dtypes are part of what an int8 task is (u8 or s8 activations)
            shapes = ",".join("x".join(map(str, t.shape)) for t in self.inputs[:2])
            shapes += f":{self.inputs[0].dtype}->{self.outputs[0].dtype}"
        return f"{self.op}({shapes})" + (f"+{epi}" if epi else "")

    @property
    def flops(self) -> int:
        """Multiply-adds counted as two FLOPs (int8 ones too, so GOPS compare with GFLOPS); epilogues are not
        counted."""
        if self.op in ("matmul", "dense", "qdense", "qmatmul"):
            m, k = self.inputs[0].shape
            n = self.outputs[0].shape[-1]
            return 2 * m * n * k
        if self.op == "batch_matmul":
            k = self.inputs[0].shape[-1]
            return 2 * self.outputs[0].size * k
        if self.op in (*CONV_OPS, "qconv2d"):
            w = self.inputs[1].shape
            return 2 * self.outputs[0].size * w[1] * w[2] * w[3]
        raise ValueError(f"no FLOP count for op {self.op!r}")


def matmul_task(m: int, n: int, k: int) -> TuningTask:
    """C[m, n] = A[m, k] @ B[k, n], float32."""
    return TuningTask(
        op="matmul",
        inputs=(TensorSpec(shape=(m, k)), TensorSpec(shape=(k, n))),
        outputs=(TensorSpec(shape=(m, n)),),
    )


_EPILOGUE_PARAMS: dict[str, tuple[str, ...]] = {
    "clip": ("min", "max"), "leaky_relu": ("alpha",), "swish": ("alpha",), "hard_sigmoid": ("alpha", "beta"),
    "hard_swish": ("alpha", "beta"),
}


def parse_epilogue(text: str) -> tuple[EpilogueOp, ...]:
    """`bias,relu` or `clip:0:6,leaky_relu:0.1` → epilogue ops (parameters after colons)."""
    ops = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        kind, *params = item.split(":")
        names = _EPILOGUE_PARAMS.get(kind, ())
        if len(params) > len(names):
            raise ValueError(f"epilogue {kind!r} takes {len(names)} parameter(s) {list(names)}, got {params}")
        try:
            attrs = {name: float(p) for name, p in zip(names, params, strict=False)}
        except ValueError as exc:
            raise ValueError(f"epilogue {item!r}: parameters must be numbers") from exc
        ops.append(EpilogueOp(kind=kind, attrs=attrs))
    return tuple(ops)
