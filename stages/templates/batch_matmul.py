"""float32 batch matmul with ONNX MatMul broadcasting: `C[..., M, N] = A[..., M, K] @ B[..., K, N]`.

Batch dimensions broadcast numpy-style (3-D and 4-D, e.g. attention's 12x128x64 @ 12x64x128, or
`(2,12,M,K) @ (12,K,N)`). Both operands are activations, so B is read in place (row-major, no
build-time packing); a table of per-batch (A, B) offsets, fixed at compile time, encodes the
broadcast. Threads split batch x blocks. Inputs `[A, B, *epilogue tensors]`.

In a whole-model build A, B and C may be strided views of other buffers (`Views`, planned by
`stages/build/gemm_views.py`): attention's head transposes are then read and written in place. The
schedule is the one tuned on contiguous operands; only the row strides and batch offsets differ.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from schemas.config import Config
from schemas.target import Target
from schemas.task import EpilogueOp, TensorSpec, TuningTask, parse_epilogue
from stages.graph import epilogue
from stages.graph.ir import contiguous_strides
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


View = tuple[int, tuple[int, ...]]  # (base, strides of every logical dim) into the buffer the operand lives in


@dataclass(frozen=True)
class Views:
    """Where a built kernel's A, B and C live when they are views of other tensors' buffers (None: their own
    contiguous buffer). The last dim of each is unit-stride (the micro-kernel's vectors and A's K loop)."""

    a: View | None = None
    b: View | None = None
    c: View | None = None

    @property
    def label(self) -> str:
        """As the manifest shows it: e.g. "A, B read strided; C written strided"."""
        read = [n for n, v in (("A", self.a), ("B", self.b)) if v is not None]
        parts = [f"{', '.join(read)} read strided"] * bool(read) + ["C written strided"] * (self.c is not None)
        return "; ".join(parts)


NO_VIEWS = Views()


def batch_offsets(task: TuningTask, views: Views = NO_VIEWS) -> tuple[tuple[int, int, int], ...]:
    """(A, B, C) element offsets of every output batch, in output order (broadcast dims repeat)."""
    out = task.outputs[0].shape
    batch = out[:-2]
    layouts = [v or (0, contiguous_strides(t.shape))
               for v, t in zip((views.a, views.b, views.c), (*task.inputs[:2], task.outputs[0]), strict=True)]
    shapes = [task.inputs[0].shape, task.inputs[1].shape, out]
    rows = []
    for idx in itertools.product(*map(range, batch)):
        row = []
        for shape, (base, strides) in zip(shapes, layouts, strict=True):
            lead = len(batch) - (len(shape) - 2)
            row.append(base + sum(idx[lead + d] * st for d, (n, st) in enumerate(zip(shape[:-2], strides[:-2],
                                                                                  strict=True)) if n != 1))
        rows.append(tuple(row))
    return tuple(rows)


def row_strides(task: TuningTask, views: Views) -> tuple[int, int, int]:
    """(lda, ldb, ldc): the distance between rows of A, B and C; ValueError unless each last dim is unit-stride."""
    strides = []
    for name, v, t in zip("ABC", (views.a, views.b, views.c), (*task.inputs[:2], task.outputs[0]), strict=True):
        if v is None:
            strides.append(0)
            continue
        if t.shape[-1] > 1 and v[1][-1] != 1:
            raise ValueError(f"batch_matmul's {name} view must be unit-stride along its last dim, got {v[1]}")
        strides.append(v[1][-2])
    return strides[0], strides[1], strides[2]


def space(task: TuningTask, target: Target) -> ConfigSpace:
    return gemm_space(*dims(task), target)


def default_config(task: TuningTask, target: Target) -> Config:
    return default_gemm(*dims(task), target, batch=len(batch_offsets(task)), what=task.description)


def reference(task: TuningTask, inputs: list[np.ndarray]) -> np.ndarray:
    a, b, *rest = inputs
    return epilogue.apply_reference(task.epilogue, np.matmul(a.astype(np.float64), b.astype(np.float64)), rest)


def kernel_args(task: TuningTask, knobs: Knobs, inputs: list[np.ndarray], views: Views = NO_VIEWS) \
        -> list[np.ndarray]:
    """`[A, B, *epilogue tensors, C]`: nothing is packed (both operands are activations; with `views`, A and B
    are the buffers they are views of, and C is a buffer as large as the output)."""
    return [*(np.ascontiguousarray(t) for t in inputs), aligned_zeros(task.outputs[0].shape)]


def build_ir(task: TuningTask, knobs: Knobs, target: Target, threads: int = 1, views: Views = NO_VIEWS) \
        -> ir.Module:
    m, n, k = dims(task)
    lda, ldb, ldc = row_strides(task, views)
    spec = GemmSpec(m=m, n=n, k=k, batch_offsets=batch_offsets(task, views), b_packed=False, epilogue=task.epilogue,
                    lda=lda, ldb=ldb, ldc=ldc)
    name = f"batch_matmul_{'x'.join(map(str, task.outputs[0].shape))}x{k}"
    return build_module(name, spec, Schedule.from_knobs(knobs), target.triple, threads)


__all__ = ["CLI_OPTIONS", "NAME", "NO_VIEWS", "VERSION", "Views", "build_ir", "default_config", "kernel_args",
           "make_inputs", "reference", "space", "task", "task_from_cli"]
