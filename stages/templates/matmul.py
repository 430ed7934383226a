"""float32 matmul `C[M,N] = A[M,K] @ B[K,N]` (+ fused epilogue) on the shared BLIS-style GEMM core.

B is treated as a weight: packed once into panels at build time (`kernel_args`). Inputs are
`[A, B, *epilogue tensors]` (see `epilogue`); the schedule space is `gemm_schedule`'s.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from schemas.config import Config
from schemas.target import Target
from schemas.task import EpilogueOp, TensorSpec, TuningTask, parse_epilogue
from stages.graph import epilogue
from stages.templates.gemm_codegen import GemmSpec, Schedule, aligned_zeros, build_module, pack_b
from stages.templates.gemm_schedule import default_gemm, gemm_space
from stages.templates.space import ConfigSpace, Knobs

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
    missing = [f"--{o}" for o in ("m", "n", "k") if opts.get(o) is None]
    if missing:
        raise ValueError(f"matmul needs {', '.join(missing)}")
    return task(int(opts["m"]), int(opts["n"]), int(opts["k"]), parse_epilogue(opts.get("epilogue") or ""))


def dims(task: TuningTask) -> tuple[int, int, int]:
    (m, k), (k2, n) = task.inputs[0].shape, task.inputs[1].shape
    if k != k2:
        raise ValueError(f"matmul inner dimensions differ: A is {m}x{k}, B is {k2}x{n}")
    return m, n, k


def space(task: TuningTask, target: Target) -> ConfigSpace:
    return gemm_space(*dims(task), target)


def default_config(task: TuningTask, target: Target) -> Config:
    return default_gemm(*dims(task), target, what=task.description)


def make_inputs(task: TuningTask, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    m, n, _ = dims(task)
    anchor = [rng.uniform(-1, 1, size=t.shape).astype(np.float32) for t in task.inputs[:2]]
    return anchor + epilogue.make_operands(task.epilogue, (m, n), -1, rng)


def reference(task: TuningTask, inputs: list[np.ndarray]) -> np.ndarray:
    a, b, *rest = inputs
    return epilogue.apply_reference(task.epilogue, a.astype(np.float64) @ b.astype(np.float64), rest)


def kernel_args(task: TuningTask, knobs: Knobs, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """`[A, packed B, *epilogue tensors, C]` (C, the output, last)."""
    m, n, _ = dims(task)
    a, b, *rest = inputs
    nr = int(knobs["nv"]) * int(knobs["vw"])
    return [np.ascontiguousarray(a), pack_b(b, nr), *(np.ascontiguousarray(t) for t in rest),
            aligned_zeros((m, n))]


def build_ir(task: TuningTask, knobs: Knobs, target: Target, threads: int = 1) -> ir.Module:
    m, n, k = dims(task)
    spec = GemmSpec(m=m, n=n, k=k, epilogue=task.epilogue)
    return build_module(f"matmul_{m}x{n}x{k}", spec, Schedule.from_knobs(knobs), target.triple, threads)


__all__ = ["CLI_OPTIONS", "NAME", "VERSION", "build_ir", "default_config", "kernel_args", "make_inputs",
           "reference", "space", "task", "task_from_cli"]
