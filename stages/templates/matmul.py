"""float32 matmul `C[M,N] = A[M,K] @ B[K,N]` (+ fused epilogue) on the shared BLIS-style GEMM core.

B is treated as a weight: packed once into panels at build time (`kernel_args`). Inputs are
`[A, B, *epilogue tensors]` (see `epilogue`); the schedule space is `gemm_schedule`'s, the rest
of the template is `gemm_template`'s, which dense shares.
"""

from __future__ import annotations

from schemas.task import EpilogueOp, TensorSpec, TuningTask
from stages.graph import epilogue
from stages.templates.gemm_operands import make_inputs
from stages.templates.gemm_template import build_ir, cli_dims, default_config, dims, kernel_args, reference, space

NAME = "matmul"
VERSION = 4  # 4: K unrolled by LLVM from loop metadata

CLI_OPTIONS = ("m", "n", "k", "epilogue")


def task(m: int, n: int, k: int, ops: tuple[EpilogueOp, ...] = ()) -> TuningTask:
    epilogue.validate(ops)
    return TuningTask(op="matmul", inputs=(TensorSpec(shape=(m, k)), TensorSpec(shape=(k, n)),
                                           *epilogue.operand_specs(ops, (m, n), -1)),
                      outputs=(TensorSpec(shape=(m, n)),), epilogue=ops)


def task_from_cli(opts: dict) -> TuningTask:
    """The task `tunaflow tune-op matmul --m M --n N --k K [--epilogue bias,relu]` means."""
    return task(*cli_dims(NAME, opts))


__all__ = ["CLI_OPTIONS", "NAME", "VERSION", "build_ir", "default_config", "dims", "kernel_args", "make_inputs",
           "reference", "space", "task", "task_from_cli"]
