"""Output check against the numpy reference, with a tolerance fit for float32 reductions."""

from __future__ import annotations

import math

import numpy as np

from schemas.task import CONV_OPS, TuningTask


def reduction_size(task: TuningTask) -> int:
    """How many products each output element sums (the error of float32 grows with it)."""
    if task.op in ("matmul", "dense", "batch_matmul"):
        return task.inputs[0].shape[-1]
    if task.op in CONV_OPS:
        _, cin_per_group, kh, kw = task.inputs[1].shape
        return cin_per_group * kh * kw
    return 1


def compare(out: np.ndarray, ref: np.ndarray, reduction: int) -> tuple[bool, float]:
    """(matches, max abs error); NaN or inf where the reference is finite never matches; integer outputs (the
    int8 anchors') are exact or wrong."""
    if out.shape != ref.shape:
        return False, math.inf
    if np.issubdtype(ref.dtype, np.integer):
        err = float(np.abs(out.astype(np.int64) - ref.astype(np.int64)).max()) if ref.size else 0.0
        return err == 0.0, err
    diff = np.abs(out.astype(np.float64) - ref.astype(np.float64))
    if not np.all(np.isfinite(diff)):
        return False, math.inf
    scale = max(1.0, float(np.max(np.abs(ref))) if ref.size else 1.0)
    err = float(diff.max()) if diff.size else 0.0
    return err <= 4e-6 * math.sqrt(reduction) * scale + 1e-6, err
