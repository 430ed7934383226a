"""The numpy reference of the index, mask and type ops (normalised as stages/extract/normalize_index.py says).

Indices follow ONNX: a negative index counts from the end of its axis, and one outside [-n, n) is an
error (IndexError naming the index), never a read elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

OpFn = Callable[[list[np.ndarray], dict], list[np.ndarray]]


def wrap(idx: np.ndarray, n: int) -> np.ndarray:
    """Indices into an axis of `n`, negative ones counted from its end; IndexError when one is outside [-n, n)."""
    idx = np.asarray(idx, dtype=np.int64)
    bad = (idx < -n) | (idx >= n)
    if bad.any():
        raise IndexError(f"index {int(idx[bad].reshape(-1)[0])} is out of range for an axis of {n}")
    return np.where(idx < 0, idx + n, idx)


def gather(args: list[np.ndarray], a: dict) -> list[np.ndarray]:
    data, idx = args
    return [np.take(data, wrap(idx, data.shape[a["axis"]]), axis=a["axis"])]


def gather_elements(args: list[np.ndarray], a: dict) -> list[np.ndarray]:
    data, idx = args
    axis = a["axis"]
    if any(i > d for k, (i, d) in enumerate(zip(idx.shape, data.shape, strict=True)) if k != axis):
        raise IndexError(f"indices {list(idx.shape)} reach outside data {list(data.shape)}")
    view = data[tuple(slice(0, i) if k != axis else slice(None) for k, i in enumerate(idx.shape))]
    return [np.take_along_axis(view, wrap(idx, data.shape[axis]), axis=axis)]


def gather_nd(args: list[np.ndarray], a: dict) -> list[np.ndarray]:
    data, idx = args
    batch, k = a["batch_dims"], idx.shape[-1]
    lead = data.shape[:batch]
    inner = data.shape[batch:]
    flat_data = data.reshape(int(np.prod(lead, dtype=np.int64)), *inner)
    flat_idx = idx.reshape(flat_data.shape[0], -1, k)
    rows = []
    for b in range(flat_data.shape[0]):
        cols = [wrap(flat_idx[b, :, j], inner[j]) for j in range(k)]
        rows.append(flat_data[b][tuple(cols)])
    return [np.stack(rows).reshape(*idx.shape[:-1], *inner[k:])]


def cumsum(args: list[np.ndarray], a: dict) -> list[np.ndarray]:
    x, axis = args[0], a["axis"]
    y = np.flip(x, axis) if a["reverse"] else x
    total = np.cumsum(y, axis=axis, dtype=x.dtype)
    if a["exclusive"]:
        total = total - y
    return [np.ascontiguousarray(np.flip(total, axis) if a["reverse"] else total)]


def is_inf(args: list[np.ndarray], a: dict) -> list[np.ndarray]:
    x = args[0]
    return [(np.isposinf(x) & bool(a["detect_positive"])) | (np.isneginf(x) & bool(a["detect_negative"]))]


def _bool(fn: Callable[..., np.ndarray]) -> OpFn:
    return lambda args, a: [np.asarray(fn(*args), dtype=bool)]


INDEX_OPS: dict[str, OpFn] = {
    "Gather": gather, "GatherElements": gather_elements, "GatherND": gather_nd,
    "Equal": _bool(np.equal), "Less": _bool(np.less), "Greater": _bool(np.greater),
    "LessOrEqual": _bool(np.less_equal), "GreaterOrEqual": _bool(np.greater_equal),
    "And": _bool(np.logical_and), "Or": _bool(np.logical_or), "Xor": _bool(np.logical_xor),
    "Not": _bool(np.logical_not), "IsNaN": _bool(np.isnan), "IsInf": is_inf,
    "Where": lambda args, a: [np.where(args[0], args[1], args[2]).astype(args[1].dtype)],
    "Cast": lambda args, a: [args[0].astype(a["to"])],
    "Expand": lambda args, a: [np.ascontiguousarray(np.broadcast_to(args[0], a["shape"]))],
    "Trilu": lambda args, a: [(np.triu if a["upper"] else np.tril)(args[0], a["k"])],
    "CumSum": cumsum,
}
