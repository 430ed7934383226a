"""Data movement: transpose, concat, split, slice, pad and plain copies, all as strided copies."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from stages.build.loops import Operand, contiguous_strides, emit_map, f32
from stages.build.opctx import OpCtx


def _copy(ctx: OpCtx, extents, out: Operand, src: Operand) -> None:
    emit_map(ctx.b, extents, out, [src], lambda b, v: v[0])


def copy(ctx: OpCtx) -> None:
    """Identity, Dropout (inference), and reshapes whose result must live in its own buffer."""
    n = math.prod(ctx.out_shape())
    _copy(ctx, (n,), Operand(ctx.out(), (1,)), Operand(ctx.inp(), (1,)))


def _axis(ctx: OpCtx, rank: int, default: int = 0) -> int:
    axis = int(ctx.attr("axis", default))
    return axis + rank if axis < 0 else axis


def transpose(ctx: OpCtx) -> None:
    shape = ctx.in_shape()
    perm = [int(p) for p in ctx.attr("perm", list(reversed(range(len(shape)))))]
    in_strides = contiguous_strides(shape)
    out_shape = ctx.out_shape()
    _copy(ctx, out_shape, Operand(ctx.out(), contiguous_strides(out_shape)),
          Operand(ctx.inp(), tuple(in_strides[p] for p in perm)))


def concat(ctx: OpCtx) -> None:
    out_shape = ctx.out_shape()
    axis = _axis(ctx, len(out_shape))
    ostr = contiguous_strides(out_shape)
    pos = 0
    for i in range(len(ctx.node.inputs)):
        shape = ctx.in_shape(i)
        if shape[axis]:
            src = Operand(ctx.inp(i), contiguous_strides(shape))
            _copy(ctx, shape, Operand(ctx.out(), ostr, pos * ostr[axis]), src)
        pos += shape[axis]


def split(ctx: OpCtx) -> None:
    shape = ctx.in_shape()
    axis = _axis(ctx, len(shape))
    istr = contiguous_strides(shape)
    pos = 0
    for j, name in enumerate(ctx.node.outputs):
        oshape = ctx.out_shape(j)
        if name and oshape[axis]:
            _copy(ctx, oshape, Operand(ctx.out(j), contiguous_strides(oshape)),
                  Operand(ctx.inp(), istr, pos * istr[axis]))
        pos += oshape[axis]


def slice_(ctx: OpCtx) -> None:
    """ONNX Slice (starts/ends/axes/steps as constant inputs, or attributes before opset 10)."""
    shape = ctx.in_shape()
    starts = ctx.static(1, "starts")
    ends = ctx.static(2, "ends")
    if starts is None or ends is None:
        raise ctx.unsupported("starts and ends are required")
    axes = ctx.static(3, "axes")
    steps = ctx.static(4, "steps")
    axes = list(range(len(starts))) if axes is None else [int(a) + len(shape) if a < 0 else int(a) for a in axes]
    steps = [1] * len(starts) if steps is None else [int(s) for s in steps]
    first = [0] * len(shape)
    step = [1] * len(shape)
    extent = list(shape)
    for a, s, e, st in zip(axes, starts.tolist(), ends.tolist(), steps, strict=True):
        first[a], extent[a] = _slice_range(shape[a], int(s), int(e), st)
        step[a] = st
    if tuple(extent) != ctx.out_shape():
        raise ctx.unsupported(f"computed output shape {extent} differs from the graph's {list(ctx.out_shape())}")
    istr = contiguous_strides(shape)
    base = sum(f * s for f, s in zip(first, istr, strict=True))
    _copy(ctx, extent, Operand(ctx.out(), contiguous_strides(extent)),
          Operand(ctx.inp(), tuple(s * st for s, st in zip(istr, step, strict=True)), base))


def _slice_range(dim: int, start: int, end: int, step: int) -> tuple[int, int]:
    """First index and element count of start:end:step on a dim of size `dim` (ONNX clamping)."""
    if step == 0:
        raise ValueError("Slice step 0")
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    if step > 0:
        start, end = min(max(start, 0), dim), min(max(end, 0), dim)
        return start, max(0, -(-(end - start) // step))
    start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
    return start, max(0, -(-(start - end) // -step))


def pad(ctx: OpCtx) -> None:
    """Constant-mode Pad (negative pads crop)."""
    mode = ctx.attr("mode", "constant")
    if isinstance(mode, bytes):
        mode = mode.decode()
    if mode != "constant":
        raise ctx.unsupported(f"mode {mode!r} (only 'constant' is built)")
    shape, out_shape = ctx.in_shape(), ctx.out_shape()
    rank = len(shape)
    pads = ctx.static(1, "pads")
    if pads is None:
        raise ctx.unsupported("pads are required")
    pads = [int(p) for p in pads.tolist()]
    axes = ctx.static(3, "axes")
    begin, end = [0] * rank, [0] * rank
    axes = list(range(rank)) if axes is None else [int(a) + rank if a < 0 else int(a) for a in axes.tolist()]
    for k, a in enumerate(axes):
        begin[a], end[a] = pads[k], pads[k + len(axes)]
    value = ctx.static(2, "value", 0.0)
    value = 0.0 if value is None or np.asarray(value).size == 0 else float(np.asarray(value).reshape(-1)[0])
    ostr, istr = contiguous_strides(out_shape), contiguous_strides(shape)
    emit_map(ctx.b, (math.prod(out_shape),), Operand(ctx.out(), (1,)), [], lambda b, v: f32(value))
    extent = [s - max(0, -bg) - max(0, -en) for s, bg, en in zip(shape, begin, end, strict=True)]
    if min(extent, default=1) <= 0:
        return
    obase = sum(max(0, bg) * s for bg, s in zip(begin, ostr, strict=True))
    ibase = sum(max(0, -bg) * s for bg, s in zip(begin, istr, strict=True))
    _copy(ctx, extent, Operand(ctx.out(), ostr, obase), Operand(ctx.inp(), istr, ibase))


OPS: dict[str, Callable[[OpCtx], None]] = {
    "Identity": copy,
    "Dropout": copy,
    "Reshape": copy,
    "Flatten": copy,
    "Squeeze": copy,
    "Unsqueeze": copy,
    "Transpose": transpose,
    "Concat": concat,
    "Split": split,
    "Slice": slice_,
    "Pad": pad,
}

# Ops whose output is the input's buffer reinterpreted: no kernel unless a copy is forced.
ALIASES = frozenset({"Identity", "Dropout", "Reshape", "Flatten", "Squeeze", "Unsqueeze"})
