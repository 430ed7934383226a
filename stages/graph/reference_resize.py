"""The numpy reference of Resize (normalised by stages/extract/normalize_resize.py), and the per-axis source tables
the generated kernel bakes in (stages/memops/resize.py), so both read the same input pixels.

Attributes: `mode` (nearest | linear), `coordinate_transformation_mode`, `nearest_mode` (round_prefer_floor,
round_prefer_ceil, floor, ceil, or simple: floor, ceil on a downscaled axis, what Resize-10 and Upsample do in
onnxruntime), `scales` (per axis, what maps output to input coordinates) and `sizes` (the output shape).
Resize is separable: each axis whose scale is not 1 is resampled in turn, reading outside the input as its edge
(ONNX's edge padding). Source coordinates are computed in float32, in the order onnxruntime computes them, so a
coordinate landing exactly half-way between two pixels rounds the same way in both.
"""

from __future__ import annotations

import numpy as np

F32 = np.float32
TIE = 1e-6  # how close to half-way a nearest coordinate counts as a tie


def source_coords(transform: str, out_len: int, in_len: int, scale: float) -> np.ndarray:
    """x_original (float32) of every output index along one axis, by `coordinate_transformation_mode`."""
    x, s, half = np.arange(out_len, dtype=F32), F32(scale), F32(0.5)
    if transform == "half_pixel":
        return (x + half) / s - half
    if transform == "pytorch_half_pixel":
        return (x + half) / s - half if out_len > 1 else np.zeros(out_len, F32)
    if transform == "align_corners":
        return x * F32(in_len - 1) / F32(out_len - 1) if out_len > 1 else np.zeros(out_len, F32)
    if transform == "asymmetric":
        return x / s
    if transform == "tf_half_pixel_for_nn":
        return (x + half) / s
    if transform == "half_pixel_symmetric":  # the output's centre kept on the input's when sizes were rounded
        offset = F32(in_len) / F32(2) * (F32(1) - F32(out_len) / (s * F32(in_len)))
        return (np.float64(offset) + (x.astype(np.float64) + 0.5) / np.float64(s) - 0.5).astype(F32)
    raise ValueError(f"coordinate_transformation_mode {transform!r} has no reference")


def nearest_index(coords: np.ndarray, in_len: int, rule: str, scale: float) -> np.ndarray:
    """The input index each coordinate rounds to by `nearest_mode`, clamped into the axis. A coordinate within
    TIE of half-way is a tie, as onnxruntime takes it: float32 arithmetic puts the exact 14.5 of 20 -> 6 pixels
    (half_pixel) at 14.4999994."""
    x = coords.astype(np.float64)
    low = np.floor(x)
    tie = np.abs(x - low - 0.5) <= TIE
    if rule == "round_prefer_floor":
        idx = low + (~tie & (x - low > 0.5))
    elif rule == "round_prefer_ceil":
        idx = low + (tie | (x - low > 0.5))
    elif rule == "floor":
        idx = low
    elif rule == "ceil":
        idx = np.ceil(x)
    elif rule == "simple":
        idx = np.ceil(x) if scale < 1 else np.trunc(x)
    else:
        raise ValueError(f"nearest_mode {rule!r} has no reference")
    return np.clip(idx, 0, in_len - 1).astype(np.int64)


def linear_taps(coords: np.ndarray, in_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(left index, right index, left weight, right weight) of each coordinate clamped into the axis; a
    coordinate on the last pixel reads it twice at weight 0.5."""
    c = np.clip(coords, F32(0), F32(in_len - 1))
    left = np.minimum(c.astype(np.int64), in_len - 1)
    right = np.minimum(left + 1, in_len - 1)
    w_right, w_left = np.abs(c - left.astype(F32)), np.abs(c - right.astype(F32))
    same = left == right
    w_left[same], w_right[same] = 0.5, 0.5
    return left, right, w_left, w_right


def axis_coords(a: dict, axis: int, in_len: int) -> np.ndarray:
    """Source coordinates along `axis`: the identity where its scale is 1 (onnxruntime skips the transform)."""
    out_len, scale = int(a["sizes"][axis]), float(a["scales"][axis])
    if scale == 1.0:
        return np.arange(out_len, dtype=F32)
    return source_coords(a["coordinate_transformation_mode"], out_len, in_len, scale)


def resize(args: list[np.ndarray], a: dict) -> list[np.ndarray]:
    x = args[0]
    y = x
    for axis in range(x.ndim):
        if float(a["scales"][axis]) == 1.0:
            continue
        coords = axis_coords(a, axis, x.shape[axis])
        if a["mode"] == "nearest":
            y = np.take(y, nearest_index(coords, x.shape[axis], a["nearest_mode"], a["scales"][axis]), axis=axis)
            continue
        left, right, w_left, w_right = linear_taps(coords, x.shape[axis])
        along = [1] * x.ndim
        along[axis] = -1
        y = np.take(y, left, axis=axis) * w_left.reshape(along) + np.take(y, right, axis=axis) * w_right.reshape(along)
    return [np.ascontiguousarray(y, dtype=x.dtype)]


RESIZE_OPS = {"Resize": resize}
