"""int8 MatMulInteger as `quantize_dynamic` writes it (issue 26's dynamic transformers): int32
`Y[M, N] = sum_k (X[m, k] - zx) * W[k, n]`, X uint8 quantized at run time with its zero point zx (a byte
DynamicQuantizeLinear computes, so read by the kernel), W a constant int8 matrix whose zero point is 0.

Operands `[X (M, K) uint8, W (K, N) int8, ZX (1,) uint8, ZW (1,) int8]` (MatMulInteger's own; ZW must be 0),
output (M, N) int32. W is packed at build time into
`qgemm_codegen`'s panels with `C[n] = -sum_k W[k, n]`, and the kernel adds `zx * C[n]` to the sums: the
same micro-kernel as `qdense`, on the fastest dot-product path the target has; the Cast and scale after it stay
separate float ops.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from schemas.config import Config
from schemas.target import Target
from schemas.task import TensorSpec, TuningTask
from stages.templates.gemm_template import cli_dims
from stages.templates.qgemm_codegen import QGemmSpec, QSchedule, build_module
from stages.templates.qgemm_pack import aligned, folded_bias, pack_panels
from stages.templates.qgemm_schedule import default_qgemm, qgemm_space
from stages.templates.space import ConfigSpace, Knobs

NAME = "qmatmul"
VERSION = 1

CLI_OPTIONS = ("m", "n", "k")


def task(m: int, n: int, k: int) -> TuningTask:
    return TuningTask(op="qmatmul",
                      inputs=(TensorSpec(shape=(m, k), dtype="uint8"), TensorSpec(shape=(k, n), dtype="int8"),
                              TensorSpec(shape=(1,), dtype="uint8"), TensorSpec(shape=(1,), dtype="int8")),
                      outputs=(TensorSpec(shape=(m, n), dtype="int32"),))


def task_from_cli(opts: dict) -> TuningTask:
    """`tunaflow tune-op qmatmul --m M --n N --k K`: uint8 X (M,K) times int8 W (K,N), int32 out."""
    m, n, k, _ = cli_dims(NAME, opts)
    return task(m, n, k)


def dims(task: TuningTask) -> tuple[int, int, int]:
    (m, k), (k2, n) = task.inputs[0].shape, task.inputs[1].shape
    if k != k2:
        raise ValueError(f"qmatmul reduction lengths differ: X {m}x{k}, W {k2}x{n}")
    return m, n, k


def space(task: TuningTask, target: Target) -> ConfigSpace:
    return qgemm_space(*dims(task), target)


def default_config(task: TuningTask, target: Target) -> Config:
    return default_qgemm(*dims(task), target, what=task.description)


def make_inputs(task: TuningTask, seed: int = 0) -> list[np.ndarray]:
    """X any byte, W over all of int8, zx any byte, zw 0."""
    rng = np.random.default_rng(seed)
    (m, k), (_, n) = task.inputs[0].shape, task.inputs[1].shape
    return [rng.integers(0, 256, size=(m, k)).astype(np.uint8), rng.integers(-128, 128, size=(k, n)).astype(np.int8),
            rng.integers(0, 256, size=(1,)).astype(np.uint8), np.zeros(1, np.int8)]


def reference(task: TuningTask, inputs: list[np.ndarray]) -> np.ndarray:
    """The spec in int64 numpy, wrapped to int32 as the kernel's sums are."""
    x, w, zx, zw = inputs
    return ((x.astype(np.int64) - int(zx.reshape(-1)[0])) @ (w.astype(np.int64) - int(zw.reshape(-1)[0]))
            ).astype(np.int32)


def kernel_args(task: TuningTask, knobs: Knobs, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """`[X, W packed in panels, C = -sum_k W (padded to whole panels), ZX, Y]`; X and ZX as given (run time)."""
    x, w, zx, zw = inputs
    if zw.any():
        raise ValueError(f"qmatmul takes W with zero point 0, got {int(zw.reshape(-1)[0])}")
    s = QSchedule.from_knobs(knobs)
    size = -(-w.shape[1] // s.nr) * s.nr
    wt = np.ascontiguousarray(w.T)
    return [np.ascontiguousarray(x), pack_panels(wt, s.nr), folded_bias(np.zeros(w.shape[1], np.int32), wt, 1, size),
            np.ascontiguousarray(zx), aligned(task.outputs[0].shape, "int32")]


def build_ir(task: TuningTask, knobs: Knobs, target: Target, threads: int = 1) -> ir.Module:
    m, n, k = dims(task)
    spec = QGemmSpec(m=m, n=n, k=k, x_signed=False, requant=None)
    return build_module(f"qmatmul_{m}x{n}x{k}", spec, QSchedule.from_knobs(knobs), target.triple, threads)
