"""Build-time packing of the int8 anchors' constants, in numpy.

Weights go into the 4-byte reduction groups `vpdpbusd` reads (one i32 lane = W[n, 4g..4g+3]),
zero-padded on K and on the lane axis, so the kernel never masks a load. The activation zero
point's correction `-zx * sum_k W[n, k]` is folded into the int32 bias here, once: the kernel
then sums raw `X * W` products. Int8 activations are flipped to u8 (`x ^ 0x80`, i.e. x + 128) by
the kernel, so their zero point is moved by 128 too.
"""

from __future__ import annotations

import math

import numpy as np

from schemas.task import TuningTask


def aligned(shape: tuple[int, ...], dtype: str, fill: int | float = 0) -> np.ndarray:
    """An array of `dtype` starting on a 64-byte boundary (whole-cache-line vector loads)."""
    item = np.dtype(dtype).itemsize
    size = math.prod(shape)
    raw = np.full(size + 64 // item, fill, dtype=dtype)
    off = (-raw.ctypes.data % 64) // item
    return raw[off:off + size].reshape(shape)


def effective_zx(task: TuningTask) -> int:
    """The activation zero point the kernel's u8 operand sees (int8 activations are shifted by 128)."""
    zx = int(task.attrs.get("x_zero_point", 0))
    return zx + 128 if task.inputs[0].dtype == "int8" else zx


def k_groups(k: int) -> int:
    return -(-k // 4)


def pack_panels(w: np.ndarray, nr: int) -> np.ndarray:
    """W (N, K) int8 → panels [ceil(N/nr)][ceil(K/4)][nr][4] int8, zero-padded on N and K."""
    n, k = w.shape
    panels, kg = -(-n // nr), k_groups(k)
    full = np.zeros((panels * nr, kg * 4), dtype=np.int8)
    full[:n, :k] = w
    out = aligned((panels, kg, nr, 4), "int8")
    out[...] = full.reshape(panels, nr, kg, 4).transpose(0, 2, 1, 3)
    return out


def folded_bias(bias: np.ndarray, w2d: np.ndarray, zx: int, padded: int) -> np.ndarray:
    """int32 `B[n] - zx * sum_k W[n, k]` (wrapping like the kernel's int32 sums), zero-padded to `padded`."""
    out = aligned((padded,), "int32")
    folded = bias.astype(np.int64) - zx * w2d.astype(np.int64).sum(axis=1)
    out[:len(folded)] = folded.astype(np.int32)
    return out


def padded(v: np.ndarray, size: int) -> np.ndarray:
    """A per-channel vector (scales, biases) zero-padded to `size`, aligned."""
    out = aligned((size,), str(v.dtype))
    out[:len(v)] = v
    return out


def random_operands(task: TuningTask, rng: np.random.Generator) -> list[np.ndarray]:
    """Seeded X, W, B, S over the spec's whole ranges: X any byte, W in [-128, 127], B a few thousand
    either way, S small enough that typical sums land inside the output's range rather than all saturating."""
    xs, ws, bs, _ = task.inputs
    lo, hi = (-128, 128) if xs.dtype == "int8" else (0, 256)
    x = rng.integers(lo, hi, size=xs.shape).astype(xs.dtype)
    w = rng.integers(-128, 128, size=ws.shape).astype(np.int8)
    b = rng.integers(-5000, 5000, size=bs.shape).astype(np.int32)
    red = math.prod(ws.shape[1:])
    s = (rng.uniform(0.5, 2.0, size=bs.shape) / (120.0 * math.sqrt(red))).astype(np.float32)
    return [x, w, b, s]
