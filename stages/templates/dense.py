"""float32 dense layer / ONNX Gemm: `Y = alpha * op(X) @ op(W)` (+ fused epilogue, e.g. bias, relu).

Attributes: `trans_a` (X stored `(K, M)`), `trans_b` (W stored `(N, K)`, the usual `X @ W^T` of a
linear layer; the default) and `alpha`. ONNX Gemm's `beta * C` is a `bias` (C of shape `(N,)`)
or `residual_add` (C of shape `(M, N)`) epilogue op with attribute `beta`. W is a weight: packed
once into panels at build time, from either layout. Inputs `[X, W, *epilogue tensors]`.
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
    missing = [f"--{o}" for o in ("m", "n", "k") if opts.get(o) is None]
    if missing:
        raise ValueError(f"dense needs {', '.join(missing)}")
    return task(int(opts["m"]), int(opts["n"]), int(opts["k"]), parse_epilogue(opts.get("epilogue") or ""))


def _flags(task: TuningTask) -> tuple[bool, bool, float]:
    a = task.attrs
    return bool(a.get("trans_a", False)), bool(a.get("trans_b", True)), float(a.get("alpha", 1.0))


def dims(task: TuningTask) -> tuple[int, int, int]:
    trans_a, trans_b, _ = _flags(task)
    xs, ws = task.inputs[0].shape, task.inputs[1].shape
    m, k = xs[::-1] if trans_a else xs
    n, k2 = ws if trans_b else ws[::-1]
    if k != k2:
        raise ValueError(f"dense reduction lengths differ: X gives K={k}, W gives K={k2}")
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
    trans_a, trans_b, alpha = _flags(task)
    x, w, *rest = (t.astype(np.float64) for t in inputs)
    y = alpha * ((x.T if trans_a else x) @ (w.T if trans_b else w))
    return epilogue.apply_reference(task.epilogue, y, rest)


def kernel_args(task: TuningTask, knobs: Knobs, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """`[X, packed W, *epilogue tensors, Y]` (Y, the output, last)."""
    m, n, _ = dims(task)
    _, trans_b, _ = _flags(task)
    x, w, *rest = inputs
    nr = int(knobs["nv"]) * int(knobs["vw"])
    return [np.ascontiguousarray(x), pack_b(w, nr, trans=trans_b), *(np.ascontiguousarray(t) for t in rest),
            aligned_zeros((m, n))]


def build_ir(task: TuningTask, knobs: Knobs, target: Target, threads: int = 1) -> ir.Module:
    m, n, k = dims(task)
    trans_a, _, alpha = _flags(task)
    spec = GemmSpec(m=m, n=n, k=k, a_trans=trans_a, alpha=alpha, epilogue=task.epilogue)
    return build_module(f"dense_{m}x{n}x{k}", spec, Schedule.from_knobs(knobs), target.triple, threads)


__all__ = ["CLI_OPTIONS", "NAME", "VERSION", "build_ir", "default_config", "kernel_args", "make_inputs",
           "reference", "space", "task", "task_from_cli"]
