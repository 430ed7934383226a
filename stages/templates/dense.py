"""float32 dense layer / ONNX Gemm: `Y = alpha * op(X) @ op(W)` (+ fused epilogue, e.g. bias, relu).

Attributes: `trans_a` (X stored `(K, M)`), `trans_b` (W stored `(N, K)`, the usual `X @ W^T` of a
linear layer; the default) and `alpha`. ONNX Gemm's `beta * C` is a `bias` (C of shape `(N,)`)
or `residual_add` (C of shape `(M, N)`) epilogue op with attribute `beta`. W is a weight: packed
once into panels at build time, from either layout. Inputs `[X, W, *epilogue tensors]`. The
template is `gemm_template`'s, which matmul shares.
"""

from __future__ import annotations

from schemas.task import EpilogueOp, TensorSpec, TuningTask
from stages.graph import epilogue
from stages.templates.gemm_operands import make_inputs
from stages.templates.gemm_template import build_ir, cli_dims, default_config, dims, kernel_args, reference, space

NAME = "dense"
VERSION = 3  # 3: K unrolled by LLVM from loop metadata

CLI_OPTIONS = ("m", "n", "k", "epilogue")


def task(m: int, n: int, k: int, ops: tuple[EpilogueOp, ...] = (), trans_a: bool = False, trans_b: bool = True,
         alpha: float = 1.0) -> TuningTask:
    epilogue.validate(ops)
    x = (k, m) if trans_a else (m, k)
    w = (n, k) if trans_b else (k, n)
    return TuningTask(op="dense", inputs=(TensorSpec(shape=x), TensorSpec(shape=w),
                                          *epilogue.operand_specs(ops, (m, n), -1)),
                      outputs=(TensorSpec(shape=(m, n)),), epilogue=ops,
                      attrs={"trans_a": trans_a, "trans_b": trans_b, "alpha": float(alpha)})


def task_from_cli(opts: dict) -> TuningTask:
    """`tunaflow tune-op dense --m M --n N --k K [--epilogue bias,relu]`: X (M,K) times W (N,K) transposed."""
    return task(*cli_dims(NAME, opts))


__all__ = ["CLI_OPTIONS", "NAME", "VERSION", "build_ir", "default_config", "dims", "kernel_args", "make_inputs",
           "reference", "space", "task", "task_from_cli"]
