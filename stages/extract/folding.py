"""Import-time constant folding, planned before it is done.

Each fold-only op (ops that exist to compute constants) comes as a pair: a plan, which says the
shape and dtype of the result from the inputs' shapes and values alone, and the fold itself. The
importer checks the plan against the constant budget (stages/extract/budget.py) first, so a
ConstantOfShape of [100000, 100000] is refused without allocating anything. Normalised ops with
constant inputs are folded by the numpy reference; `scratch` lists the float64 arrays it makes
besides its outputs (padded inputs, accumulators), which must fit in the budget too.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
from onnx import numpy_helper

from schemas.errors import ModelError

if TYPE_CHECKING:
    from stages.extract.normalize import Ctx

Shape = tuple[int, ...]
Plan = list[tuple[Shape, np.dtype]] | None  # None: the model's own tensor, nothing is computed
Planner = Callable[[dict, list[np.ndarray], "Ctx"], Plan]
Folder = Callable[[dict, list[np.ndarray], "Ctx"], np.ndarray]


def _constant(raw: dict, args: list[np.ndarray], ctx: Ctx) -> np.ndarray:
    if "value" in raw:
        return numpy_helper.to_array(raw["value"])
    for key, dtype in (("value_float", np.float32), ("value_floats", np.float32), ("value_int", np.int64),
                       ("value_ints", np.int64)):
        if key in raw:
            return np.asarray(raw[key], dtype=dtype)
    raise ModelError(f"Constant {ctx.node!r}: only tensor, float and int values are supported")


def _fill_value(raw: dict) -> np.ndarray:
    return numpy_helper.to_array(raw["value"]).reshape(-1)[:1] if "value" in raw else np.zeros(1, np.float32)


def _target_shape(arg: np.ndarray) -> Shape:
    return tuple(int(d) for d in arg.reshape(-1))


def _plan_const_of_shape(raw: dict, args: list[np.ndarray], ctx: Ctx) -> Plan:
    return [(_target_shape(args[0]), _fill_value(raw).dtype)]


def _const_of_shape(raw: dict, args: list[np.ndarray], ctx: Ctx) -> np.ndarray:
    value = _fill_value(raw)
    if args[0].ndim != 1:
        raise ModelError(f"ConstantOfShape {ctx.node!r}: its shape input must be 1-D, it is {list(args[0].shape)}")
    return np.full(_target_shape(args[0]), value[0], dtype=value.dtype)


def _scalars(args: list[np.ndarray], ctx: Ctx) -> list:
    if any(a.size != 1 for a in args):
        raise ModelError(f"Range {ctx.node!r}: start, limit and delta must be scalars, they have shapes "
                         f"{[list(a.shape) for a in args]}")
    return [a.reshape(-1)[0].item() for a in args]


def _plan_range(raw: dict, args: list[np.ndarray], ctx: Ctx) -> Plan:
    start, limit, delta = _scalars(args, ctx)
    if not all(math.isfinite(v) for v in (start, limit, delta)) or delta == 0:
        raise ModelError(f"Range {ctx.node!r}: start {start}, limit {limit} and delta {delta} must be finite, "
                         "with a non-zero delta")
    exact = all(isinstance(v, int) for v in (start, limit, delta))
    count = -((start - limit) // delta) if exact else math.ceil((limit - start) / delta)
    return [((max(count, 0),), args[0].dtype)]


def _range(raw: dict, args: list[np.ndarray], ctx: Ctx) -> np.ndarray:
    start, limit, delta = _scalars(args, ctx)
    return np.arange(start, limit, delta, dtype=args[0].dtype)


_SCATTER = {"none": None, "add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _reduction(raw: dict) -> str:
    """A scatter's `reduction` attribute ("none" when absent)."""
    return str(raw.get("reduction", "none"))


def _scatter_nd(raw: dict, args: list[np.ndarray], ctx: Ctx) -> np.ndarray:
    """ONNX ScatterND: data with the slices `indices` names replaced by (or reduced with) `updates`. Swin's
    shifted-window attention mask is built this way, from constants only."""
    data, indices, updates = args
    reduction = _reduction(raw)
    k = indices.shape[-1] if indices.ndim else 0
    if reduction not in _SCATTER or indices.ndim < 1 or k > data.ndim or \
            updates.shape != indices.shape[:-1] + data.shape[k:]:
        raise ModelError(f"ScatterND {ctx.node!r}: data {list(data.shape)}, indices {list(indices.shape)}, updates "
                         f"{list(updates.shape)} and reduction {reduction!r} do not fit ONNX's ScatterND")
    out = data.copy()
    flat = indices.reshape(-1, k).astype(np.int64)
    if ((flat < -np.array(data.shape[:k])) | (flat >= np.array(data.shape[:k]))).any():
        raise ModelError(f"ScatterND {ctx.node!r}: an index is out of range for data {list(data.shape)}")
    rows = updates.reshape(len(flat), *data.shape[k:])
    combine = _SCATTER[reduction]
    for idx, row in zip(flat, rows, strict=True):
        at = tuple(int(i) for i in idx)
        out[at] = row if combine is None else combine(out[at], row)
    return out


def _scatter_elements(raw: dict, args: list[np.ndarray], ctx: Ctx) -> np.ndarray:
    """ONNX ScatterElements: data with updates[i] written (or reduced) at data[..., indices[i], ...] along
    `axis`. BEiT's relative position index is built this way (select_scatter), from constants only."""
    data, indices, updates = args
    reduction = _reduction(raw)
    axis = int(raw.get("axis", 0))
    if reduction not in _SCATTER or indices.shape != updates.shape or indices.ndim != data.ndim or \
            not -data.ndim <= axis < data.ndim or any(i > d for i, d in zip(indices.shape, data.shape, strict=True)):
        raise ModelError(f"ScatterElements {ctx.node!r}: data {list(data.shape)}, indices {list(indices.shape)}, "
                         f"updates {list(updates.shape)}, axis {axis} and reduction {reduction!r} do not fit ONNX's "
                         "ScatterElements")
    axis %= data.ndim
    idx = indices.astype(np.int64)
    if ((idx < -data.shape[axis]) | (idx >= data.shape[axis])).any():
        raise ModelError(f"ScatterElements {ctx.node!r}: an index is out of range for axis {axis} of size "
                         f"{data.shape[axis]}")
    where = list(np.indices(indices.shape, sparse=True))
    where[axis] = np.where(idx < 0, idx + data.shape[axis], idx)
    out = data.copy()
    combine = _SCATTER[reduction]
    if combine is None:
        out[tuple(where)] = updates
    else:
        combine.at(out, tuple(where), updates)
    return out


# Ops that exist only to compute constants: they are evaluated at import and must have constant inputs.
FOLD_ONLY: dict[str, tuple[Planner, Folder]] = {
    "Constant": (lambda raw, args, ctx: None, _constant),
    "ConstantOfShape": (_plan_const_of_shape, _const_of_shape),
    "Range": (_plan_range, _range),
    "ScatterND": (lambda raw, args, ctx: [(args[0].shape, args[0].dtype)], _scatter_nd),
    "ScatterElements": (lambda raw, args, ctx: [(args[0].shape, args[0].dtype)], _scatter_elements),
}


def scratch(op: str, shapes: list[Shape], attrs: dict, outputs: list[Shape]) -> list[Shape]:
    """The float64 arrays the numpy reference makes when it folds `op` (stages/graph/reference.py), by shape."""
    if op == "Conv":
        (n, c, h, w), (pt, pl, pb, pr) = shapes[0], attrs["pads"]
        return [(n, c, h + pt + pb, w + pl + pr), *outputs]
    if op in ("MaxPool", "AveragePool"):
        (*lead, h, w), (pt, pl, pb, pr), (sh, sw) = shapes[0], attrs["pads"], attrs["strides"]
        return [(*lead, h + pt + pb + sh, w + pl + pr + sw), *outputs]
    if op == "ConvTranspose":
        (n, _, h, w), (_, _, kh, kw) = shapes[0], shapes[1]
        (sh, sw), (dh, dw), (eh, ew) = attrs["strides"], attrs["dilations"], attrs["output_padding"]
        return [(n, outputs[0][1], sh * (h - 1) + eh + (kh - 1) * dh + 1, sw * (w - 1) + ew + (kw - 1) * dw + 1)]
    if op == "Resize":  # resampled along H first, then W
        return [(*shapes[0][:2], outputs[0][2], shapes[0][3]), *outputs]
    if op == "LRN":
        x = shapes[0]
        return [(x[0], x[1] + int(attrs["size"]) - 1, *x[2:])]
    return []
