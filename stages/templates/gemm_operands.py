"""The buffers of the GEMM-family templates (matmul, dense, batch matmul): seeded inputs, B packed
into the micro-kernel's panels, and the output, all numpy; `gemm_codegen` emits the code that reads them."""

from __future__ import annotations

import math

import numpy as np

from schemas.task import TuningTask
from stages.graph import epilogue
from stages.templates.space import Knobs


def aligned_zeros(shape: tuple[int, ...]) -> np.ndarray:
    """A zeroed float32 array starting on a 64-byte boundary (numpy's large arrays start 16 bytes
    past one, so every 512-bit access would split across two cache lines)."""
    size = math.prod(shape)
    raw = np.zeros(size + 16, dtype=np.float32)
    off = (-raw.ctypes.data % 64) // 4
    return raw[off:off + size].reshape(shape)


def pack_b(b: np.ndarray, nr: int, trans: bool = False) -> np.ndarray:
    """B (K,N) — or (N,K) when `trans` — → panels Bp[ceil(N/nr)][K][nr], zero-padded on N."""
    bt = b.T if trans else b
    k, n = bt.shape
    panels = -(-n // nr)
    out = aligned_zeros((panels, k, nr))
    full = n // nr
    out[:full] = bt[:, :full * nr].reshape(k, full, nr).transpose(1, 0, 2)
    if full < panels:
        out[full, :, :n - full * nr] = bt[:, full * nr:]
    return out


def make_inputs(task: TuningTask, seed: int = 0) -> list[np.ndarray]:
    """A and B uniform in [-1, 1), then the epilogue's tensors for the task's output."""
    rng = np.random.default_rng(seed)
    anchor = [rng.uniform(-1, 1, size=t.shape).astype(np.float32) for t in task.inputs[:2]]
    return anchor + epilogue.make_operands(task.epilogue, task.outputs[0].shape, -1, rng)


def packed_args(task: TuningTask, knobs: Knobs, inputs: list[np.ndarray], trans_b: bool = False) -> list[np.ndarray]:
    """`[A, B packed into panels of the schedule's nv*vw columns, *epilogue tensors, C]`: B is a weight,
    packed once at build time (from (N,K) when `trans_b`); C, the output, last."""
    a, b, *rest = inputs
    nr = int(knobs["nv"]) * int(knobs["vw"])
    return [np.ascontiguousarray(a), pack_b(b, nr, trans=trans_b), *(np.ascontiguousarray(t) for t in rest),
            aligned_zeros(task.outputs[0].shape)]
