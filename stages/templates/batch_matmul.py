"""float32 batch matmul with ONNX MatMul broadcasting: `C[..., M, N] = A[..., M, K] @ B[..., K, N]`.

Batch dimensions broadcast numpy-style (3-D and 4-D, e.g. attention's 12x128x64 @ 12x64x128, or
`(2,12,M,K) @ (12,K,N)`). Both operands are activations, so B is read in place (row-major, no
build-time packing); a table of per-batch (A, B) offsets, fixed at compile time, encodes the
broadcast. Threads split batch x blocks. Inputs `[A, B, *epilogue tensors]`.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir

from schemas.config import Config
from schemas.target import Target
from schemas.task import EpilogueOp, TensorSpec, TuningTask, parse_epilogue
from stages.graph import epilogue
from stages.templates.gemm_codegen import GemmSpec, Schedule, build_module
from stages.templates.gemm_operands import aligned_zeros, make_inputs
from stages.templates.gemm_schedule import default_gemm, gemm_space
from stages.templates.space import ConfigSpace, Knobs

NAME = "batch_matmul"
VERSION = 3  # 3: K unrolled by LLVM from loop metadata

CLI_OPTIONS = ("b", "m", "n", "k", "epilogue")


def output_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """The broadcast output shape; ValueError when the shapes do not fit ONNX MatMul."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"batch_matmul needs operands of rank >= 2, got {list(a)} and {list(b)}")
    if a[-1] != b[-2]:
        raise ValueError(f"batch_matmul inner dimensions differ: A is {list(a)}, B is {list(b)}")
    try:
        batch = np.broadcast_shapes(a[:-2], b[:-2])
    except ValueError:
        raise ValueError(f"batch dimensions {list(a[:-2])} and {list(b[:-2])} do not broadcast") from None
    return (*batch, a[-2], b[-1])


def task(a: tuple[int, ...], b: tuple[int, ...], ops: tuple[EpilogueOp, ...] = ()) -> TuningTask:
    epilogue.validate(ops)
    out = output_shape(a, b)
    return TuningTask(op="batch_matmul", inputs=(TensorSpec(shape=a), TensorSpec(shape=b),
                                                 *epilogue.operand_specs(ops, out, -1)),
                      outputs=(TensorSpec(shape=out),), epilogue=ops)


def task_from_cli(opts: dict) -> TuningTask:
    """`tunaflow tune-op batch_matmul --b B --m M --n N --k K`: (B,M,K) @ (B,K,N)."""
    missing = [f"--{o}" for o in ("b", "m", "n", "k") if opts.get(o) is None]
    if missing:
        raise ValueError(f"batch_matmul needs {', '.join(missing)}")
    nb, m, n, k = (int(opts[o]) for o in ("b", "m", "n", "k"))
    return task((nb, m, k), (nb, k, n), parse_epilogue(opts.get("epilogue") or ""))


def dims(task: TuningTask) -> tuple[int, int, int]:
    a, b = task.inputs[0].shape, task.inputs[1].shape
    output_shape(a, b)
    return a[-2], b[-1], a[-1]


def batch_offsets(task: TuningTask) -> tuple[tuple[int, int], ...]:
    """(A, B) element offsets of every output batch, in output order (broadcast dims repeat)."""
    a, b = task.inputs[0].shape, task.inputs[1].shape
    batch = task.outputs[0].shape[:-2]
    ia = np.broadcast_to(np.arange(math.prod(a[:-2])).reshape(a[:-2]), batch).ravel() * (a[-2] * a[-1])
    ib = np.broadcast_to(np.arange(math.prod(b[:-2])).reshape(b[:-2]), batch).ravel() * (b[-2] * b[-1])
    return tuple(zip(ia.tolist(), ib.tolist(), strict=True))


def space(task: TuningTask, target: Target) -> ConfigSpace:
    return gemm_space(*dims(task), target)


def default_config(task: TuningTask, target: Target) -> Config:
    return default_gemm(*dims(task), target, batch=len(batch_offsets(task)), what=task.description)


def reference(task: TuningTask, inputs: list[np.ndarray]) -> np.ndarray:
    a, b, *rest = inputs
    return epilogue.apply_reference(task.epilogue, np.matmul(a.astype(np.float64), b.astype(np.float64)), rest)


def kernel_args(task: TuningTask, knobs: Knobs, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """`[A, B, *epilogue tensors, C]`: nothing is packed (both operands are activations)."""
    return [*(np.ascontiguousarray(t) for t in inputs), aligned_zeros(task.outputs[0].shape)]


def build_ir(task: TuningTask, knobs: Knobs, target: Target, threads: int = 1) -> ir.Module:
    m, n, k = dims(task)
    spec = GemmSpec(m=m, n=n, k=k, batch_offsets=batch_offsets(task), b_packed=False, epilogue=task.epilogue)
    name = f"batch_matmul_{'x'.join(map(str, task.outputs[0].shape))}x{k}"
    return build_module(name, spec, Schedule.from_knobs(knobs), target.triple, threads)


__all__ = ["CLI_OPTIONS", "NAME", "VERSION", "build_ir", "default_config", "kernel_args", "make_inputs",
           "reference", "space", "task", "task_from_cli"]
