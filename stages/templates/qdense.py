"""int8 dense layer (issue 26's `qdense` anchor): `Y[M, N] = requant(sum_k (X[m, k] - zx) * W[n, k] + B[n])`.

Operands `[X (M, K) uint8 or int8, W (N, K) int8, B (N,) int32, S (N,) float32]`, output (M, N)
uint8 or int8; attributes `x_zero_point`, `y_zero_point`; epilogue `relu` / `clip` (quantized
domain). W, B and S are constants: W is packed into 4-byte reduction groups and `-zx * sum_k W`
folded into B at build time (`qgemm_pack`); the kernel is `qgemm_codegen`'s, on the fastest
dot-product path the target has (`qgemm_isa`), and the requantize epilogue `qgemm_requant`'s.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from schemas.config import Config
from schemas.target import Target
from schemas.task import EpilogueOp, TensorSpec, TuningTask
from stages.templates import qgemm_requant
from stages.templates.gemm_template import cli_dims
from stages.templates.qgemm_codegen import QGemmSpec, QSchedule, build_module
from stages.templates.qgemm_pack import aligned, effective_zx, folded_bias, pack_panels, padded, random_operands
from stages.templates.qgemm_schedule import default_qgemm, qgemm_space
from stages.templates.space import ConfigSpace, Knobs

NAME = "qdense"
VERSION = 1

CLI_OPTIONS = ("m", "n", "k", "epilogue")
ACTIVATION_DTYPES = ("uint8", "int8")


def task(m: int, n: int, k: int, ops: tuple[EpilogueOp, ...] = (), x_dtype: str = "uint8", y_dtype: str = "uint8",
         x_zero_point: int = 0, y_zero_point: int = 0) -> TuningTask:
    qgemm_requant.validate(ops)
    for what, dt, zp in (("x", x_dtype, x_zero_point), ("y", y_dtype, y_zero_point)):
        if dt not in ACTIVATION_DTYPES:
            raise ValueError(f"qdense {what}_dtype must be uint8 or int8, got {dt!r}")
        lo, hi = qgemm_requant.RANGES[dt]
        if not lo <= zp <= hi:
            raise ValueError(f"qdense {what}_zero_point={zp} is outside the {dt} range [{lo}, {hi}]")
    return TuningTask(op="qdense",
                      inputs=(TensorSpec(shape=(m, k), dtype=x_dtype), TensorSpec(shape=(n, k), dtype="int8"),
                              TensorSpec(shape=(n,), dtype="int32"), TensorSpec(shape=(n,), dtype="float32")),
                      outputs=(TensorSpec(shape=(m, n), dtype=y_dtype),), epilogue=tuple(ops),
                      attrs={"x_zero_point": int(x_zero_point), "y_zero_point": int(y_zero_point)})


def task_from_cli(opts: dict) -> TuningTask:
    """`tunaflow tune-op qdense --m M --n N --k K [--epilogue relu]`: uint8 X (M,K) times int8 W (N,K)
    transposed, zero points 0 (they change no instruction the kernel runs)."""
    return task(*cli_dims(NAME, opts))


def dims(task: TuningTask) -> tuple[int, int, int]:
    (m, k), (n, k2) = task.inputs[0].shape, task.inputs[1].shape
    if k != k2:
        raise ValueError(f"qdense reduction lengths differ: X {m}x{k}, W {n}x{k2}")
    return m, n, k


def space(task: TuningTask, target: Target) -> ConfigSpace:
    return qgemm_space(*dims(task), target, x_signed=task.inputs[0].dtype == "int8")


def default_config(task: TuningTask, target: Target) -> Config:
    return default_qgemm(*dims(task), target, what=task.description, x_signed=task.inputs[0].dtype == "int8")


def make_inputs(task: TuningTask, seed: int = 0) -> list[np.ndarray]:
    return random_operands(task, np.random.default_rng(seed))


def reference(task: TuningTask, inputs: list[np.ndarray]) -> np.ndarray:
    """The spec in int64 numpy, then its requantize epilogue."""
    x, w, bias, scale = inputs
    zx = int(task.attrs.get("x_zero_point", 0))
    acc = (x.astype(np.int64) - zx) @ w.astype(np.int64).T + bias.astype(np.int64)
    return qgemm_requant.reference(qgemm_requant.requant_of(task), acc, scale[None, :], task.outputs[0].dtype)


def kernel_args(task: TuningTask, knobs: Knobs, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """`[X, W packed in panels, B with the zero point folded in, S, Y]` (B and S padded to whole panels)."""
    x, w, bias, scale = inputs
    s = QSchedule.from_knobs(knobs)
    size = -(-w.shape[0] // s.nr) * s.nr
    return [np.ascontiguousarray(x), pack_panels(w, s.nr), folded_bias(bias, w, effective_zx(task), size),
            padded(scale, size), aligned(task.outputs[0].shape, task.outputs[0].dtype)]


def build_ir(task: TuningTask, knobs: Knobs, target: Target, threads: int = 1) -> ir.Module:
    m, n, k = dims(task)
    spec = QGemmSpec(m=m, n=n, k=k, x_signed=task.inputs[0].dtype == "int8",
                     requant=qgemm_requant.requant_of(task))
    return build_module(f"qdense_{m}x{n}x{k}", spec, QSchedule.from_knobs(knobs), target.triple, threads)
