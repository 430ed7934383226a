"""Normalisers of the index, mask and type ops transformer exports use (token ids, attention masks).

Each becomes a node the library runs (stages/memops/indexing.py, typed.py) or, with constant inputs,
is folded by the numpy reference like any normalised node. Parameters that must be known to size the
output (Expand's shape, CumSum's axis, Trilu's k) must be constants; they become attributes:
Gather, GatherElements: `axis` (non-negative). GatherND: `batch_dims`. Cast: `to` (a numpy dtype
name). Expand: `shape` (the output's). Trilu: `upper`, `k`. CumSum: `axis`, `exclusive`, `reverse`.
IsInf: `detect_positive`, `detect_negative`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from onnx import helper

from schemas.errors import ModelError
from stages.extract.normalize import Ctx, Emit, _axis, _binary, _plain
from stages.extract.shapes import MAX_RANK


def _axis_of(ctx: Ctx, raw: dict, rank: int, default: int = 0) -> int:
    axis = int(raw.get("axis", default))
    if not -rank <= axis < rank:
        raise ModelError(f"{ctx.op} {ctx.node!r}: axis {axis} is out of range for its rank-{rank} data")
    return _axis(axis, rank)


def _indices(ctx: Ctx, name: str) -> None:
    if ctx.dtype(name) not in ("int64", "int32"):
        raise ModelError(f"{ctx.op} {ctx.node!r}: its indices ({name!r}) are {ctx.dtype(name)}, not int64 or int32")


def gather_elements(ins, outs, raw, ctx) -> list[Emit]:
    data, idx = ctx.shape(ins[0]), ctx.shape(ins[1])
    axis = _axis_of(ctx, raw, len(data))
    _indices(ctx, ins[1])
    if len(idx) != len(data):
        raise ModelError(f"GatherElements {ctx.node!r}: indices {list(idx)} and data {list(data)} differ in rank")
    return [("GatherElements", ins[:2], outs[:1], {"axis": axis})]


def gather_nd(ins, outs, raw, ctx) -> list[Emit]:
    data, idx = ctx.shape(ins[0]), ctx.shape(ins[1])
    batch = int(raw.get("batch_dims", 0))
    _indices(ctx, ins[1])
    if not idx or not 0 <= batch < min(len(data), len(idx)) or idx[-1] > len(data) - batch \
            or idx[:batch] != data[:batch]:
        raise ModelError(f"GatherND {ctx.node!r}: indices {list(idx)} (batch_dims {batch}) do not index data "
                         f"{list(data)}")
    return [("GatherND", ins[:2], outs[:1], {"batch_dims": batch})]


def cast(ins, outs, raw, ctx) -> list[Emit]:
    try:
        to = np.dtype(helper.tensor_dtype_to_np_dtype(int(raw["to"]))).name
    except (KeyError, TypeError, ValueError):
        raise ModelError(f"Cast {ctx.node!r}: target type {raw.get('to')} is not a numeric type") from None
    return [("Cast", ins[:1], outs[:1], {"to": to})]


def expand(ins, outs, raw, ctx) -> list[Emit]:
    src = ctx.shape(ins[0])
    target = tuple(int(d) for d in ctx.const(ins[1], "shape").reshape(-1))
    if max(len(src), len(target)) > MAX_RANK:
        raise ModelError(f"Expand {ctx.node!r}: a shape of {max(len(src), len(target))} dims; at most {MAX_RANK}")
    try:
        shape = tuple(np.broadcast_shapes(src, target))
    except ValueError:
        raise ModelError(f"Expand {ctx.node!r}: {list(src)} does not broadcast to {list(target)}") from None
    if shape == src:
        return [("Reshape", ins[:1], outs[:1], {"shape": list(shape)})]
    return [("Expand", ins[:1], outs[:1], {"shape": list(shape)})]


def trilu(ins, outs, raw, ctx) -> list[Emit]:
    if len(ctx.shape(ins[0])) < 2:
        raise ModelError(f"Trilu {ctx.node!r}: its input must have at least 2 dimensions")
    k = ctx.opt_const(ins, 1, "k")
    return [("Trilu", ins[:1], outs[:1], {"upper": int(raw.get("upper", 1)),
                                          "k": 0 if k is None else int(k.reshape(-1)[0])})]


def cumsum(ins, outs, raw, ctx) -> list[Emit]:
    rank = len(ctx.shape(ins[0]))
    axis = int(ctx.const(ins[1], "axis").reshape(-1)[0])
    if not -rank <= axis < rank:
        raise ModelError(f"CumSum {ctx.node!r}: axis {axis} is out of range for its rank-{rank} input")
    return [("CumSum", ins[:1], outs[:1], {"axis": _axis(axis, rank), "exclusive": int(raw.get("exclusive", 0)),
                                           "reverse": int(raw.get("reverse", 0))})]


def is_inf(ins, outs, raw, ctx) -> list[Emit]:
    return [("IsInf", ins[:1], outs[:1], {"detect_positive": int(raw.get("detect_positive", 1)),
                                          "detect_negative": int(raw.get("detect_negative", 1))})]


COMPARISONS = ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual")
LOGICAL = ("And", "Or", "Xor")
INDEX_NORMALIZERS: dict[str, Callable[..., list[Emit]]] = {
    **{op: _binary for op in (*COMPARISONS, *LOGICAL)},
    **{op: _plain for op in ("Not", "IsNaN", "Where")},
    "IsInf": is_inf, "Cast": cast, "Expand": expand, "Trilu": trilu, "CumSum": cumsum,
    "GatherElements": gather_elements, "GatherND": gather_nd,
}
