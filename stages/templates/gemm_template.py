"""The one implementation of the matmul and dense templates: both are a single 2-D GEMM on the
BLIS-style core, told apart only by their operands' layout. A matmul is `A (M,K) @ B (K,N)`; a
dense layer (ONNX Gemm) takes `trans_a` (X stored `(K, M)`), `trans_b` (W stored `(N, K)`, a
linear layer's `X @ W^T`, its default) and `alpha` from its attributes. B (W) is a weight:
packed once into panels at build time, from either layout."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from schemas.config import Config
from schemas.target import Target
from schemas.task import EpilogueOp, TuningTask, parse_epilogue
from stages.graph import epilogue
from stages.templates.gemm_codegen import GemmSpec, Schedule, build_module
from stages.templates.gemm_operands import packed_args
from stages.templates.gemm_schedule import default_gemm, gemm_space
from stages.templates.space import ConfigSpace, Knobs


@dataclass(frozen=True)
class Layout:
    trans_a: bool = False  # A stored (K, M)
    trans_b: bool = False  # B stored (N, K)
    alpha: float = 1.0


def layout(task: TuningTask) -> Layout:
    """A matmul's fixed layout, or a dense task's attributes (absent ones at ONNX Gemm's defaults but
    `trans_b`, a linear layer's)."""
    if task.op != "dense":
        return Layout()
    a = task.attrs
    return Layout(bool(a.get("trans_a", False)), bool(a.get("trans_b", True)), float(a.get("alpha", 1.0)))


def cli_dims(op: str, opts: dict) -> tuple[int, int, int, tuple[EpilogueOp, ...]]:
    """(M, N, K, epilogue) of `tunaflow tune-op OP --m M --n N --k K [--epilogue bias,relu]`."""
    missing = [f"--{o}" for o in ("m", "n", "k") if opts.get(o) is None]
    if missing:
        raise ValueError(f"{op} needs {', '.join(missing)}")
    return int(opts["m"]), int(opts["n"]), int(opts["k"]), parse_epilogue(opts.get("epilogue") or "")


def dims(task: TuningTask) -> tuple[int, int, int]:
    lay = layout(task)
    xs, ws = task.inputs[0].shape, task.inputs[1].shape
    m, k = xs[::-1] if lay.trans_a else xs
    n, k2 = ws if lay.trans_b else ws[::-1]
    if k != k2:
        raise ValueError(f"{task.op} reduction lengths differ: {list(xs)} gives K={k}, {list(ws)} gives K={k2}")
    return m, n, k


def space(task: TuningTask, target: Target) -> ConfigSpace:
    return gemm_space(*dims(task), target)


def default_config(task: TuningTask, target: Target) -> Config:
    """B is a weight packed at build time: with few rows of A the default reads it once (`gemm_schedule`)."""
    return default_gemm(*dims(task), target, what=task.description, packed_b=True)


def reference(task: TuningTask, inputs: list[np.ndarray]) -> np.ndarray:
    lay = layout(task)
    x, w, *rest = (t.astype(np.float64) for t in inputs)
    y = lay.alpha * ((x.T if lay.trans_a else x) @ (w.T if lay.trans_b else w))
    return epilogue.apply_reference(task.epilogue, y, rest)


def kernel_args(task: TuningTask, knobs: Knobs, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """`[A, packed B, *epilogue tensors, C]` (C, the output, last)."""
    return packed_args(task, knobs, inputs, trans_b=layout(task).trans_b)


def build_ir(task: TuningTask, knobs: Knobs, target: Target, threads: int = 1) -> ir.Module:
    m, n, k = dims(task)
    lay = layout(task)
    spec = GemmSpec(m=m, n=n, k=k, a_trans=lay.trans_a, alpha=lay.alpha, epilogue=task.epilogue)
    return build_module(f"{task.op}_{m}x{n}x{k}", spec, Schedule.from_knobs(knobs), target.triple, threads)
