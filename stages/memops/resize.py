"""Resize of NCHW planes on H and W, nearest or bilinear (normalised by stages/extract/normalize_resize.py).

Which input rows and columns an output row or column reads, and with what bilinear weights, depends on the static
sizes alone: the tables are computed at build time by the reference's own rules (stages/graph/reference_resize.py)
and baked into the module as constants, so an output pixel costs a table read and a copy (nearest) or four table
reads, four input reads and a blend (linear). Output rows are independent and split over the worker pool; within a
row the loop runs along the output width (unit-stride tables and stores, the input read where the table says; a
width left alone reads its row in order). Nearest copies any element type; linear blends float32.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from llvmlite import ir

from stages.codegen.irb import F32, I64, add, for_range, gep, i64, mul
from stages.graph.reference_resize import axis_coords, linear_taps, nearest_index
from stages.memops.loops import align_of
from stages.memops.opctx import OpCtx
from stages.memops.pool_map import BLOCK

Reader = Callable[[ir.IRBuilder, ir.Value], ir.Value]


def _table(ctx: OpCtx, tag: str, values: np.ndarray) -> Reader:
    """A read of a build-time table (int64 indices or float32 weights) kept as a private module constant."""
    ty = F32 if values.dtype.kind == "f" else I64
    array = ir.ArrayType(ty, len(values))
    table = ir.GlobalVariable(ctx.fn.module, array, name=f"{ctx.fn.name}.{tag}")
    table.global_constant = True
    table.linkage = "private"
    table.initializer = ir.Constant(array, [float(v) if ty is F32 else int(v) for v in values])
    return lambda b, i: b.load(b.gep(table, [i64(0), i], inbounds=True))


def _column(ctx: OpCtx, tag: str, index: np.ndarray) -> Reader:
    """Column reads of an index table; an identity one (W not resized) is the column itself, so the row reads
    stay unit-stride."""
    if np.array_equal(index, np.arange(len(index))):
        return lambda b, i: i
    return _table(ctx, tag, index)


def resize(ctx: OpCtx) -> None:
    n, c, h, w = ctx.in_shape()
    oh, ow = ctx.out_shape()[2:]
    mode = ctx.attr("mode")
    if mode == "linear" and ctx.in_dtype() != "float32":
        raise ctx.unsupported(f"mode 'linear' runs on float32; its input is {ctx.in_dtype()}")
    rows_in, cols_in = axis_coords(ctx.node.attrs, 2, h), axis_coords(ctx.node.attrs, 3, w)
    if mode == "nearest":
        rounding = ctx.attr("nearest_mode")
        scale_h, scale_w = ctx.attr("scales")[2:]
        rows = [_table(ctx, "row", nearest_index(rows_in, h, rounding, scale_h))]
        cols = [_column(ctx, "col", nearest_index(cols_in, w, rounding, scale_w))]
        row_w, col_w = [], []
    else:
        top, bottom, w_top, w_bottom = linear_taps(rows_in, h)
        left, right, w_left, w_right = linear_taps(cols_in, w)
        rows = [_table(ctx, "top", top), _table(ctx, "bottom", bottom)]
        cols = [_column(ctx, "left", left), _column(ctx, "right", right)]
        row_w = [_table(ctx, "w_top", w_top), _table(ctx, "w_bottom", w_bottom)]
        col_w = [_table(ctx, "w_left", w_left), _table(ctx, "w_right", w_right)]
    with ctx.parallel(n * c * oh, min_items=-(-BLOCK // ow)) as item:
        b, x, y = ctx.b, ctx.inp(), ctx.out()
        plane, oy = b.udiv(item, i64(oh)), b.urem(item, i64(oh))
        sources = [gep(b, x, add(b, mul(b, plane, i64(h * w)), mul(b, r(b, oy), i64(w)))) for r in rows]
        weights = [wt(b, oy) for wt in row_w]
        out_row = gep(b, y, mul(b, item, i64(ow)))
        with for_range(b, i64(0), i64(ow), name="ox") as ox:
            if mode == "nearest":
                value = b.load(gep(b, sources[0], cols[0](b, ox)), align=align_of(x))
            else:
                value = _blend(b, sources, cols, weights, [wt(b, ox) for wt in col_w], ox)
            b.store(value, gep(b, out_row, ox), align=align_of(y))


def _blend(b: ir.IRBuilder, sources: list[ir.Value], cols: list[Reader], row_w: list[ir.Value],
           col_w: list[ir.Value], ox: ir.Value) -> ir.Value:
    """sum over (row r, column k) of row_w[r] * col_w[k] * x[r, k], in onnxruntime's order (top row first)."""
    at = [cl(b, ox) for cl in cols]
    total = None
    for src, wr in zip(sources, row_w, strict=True):
        for col, wc in zip(at, col_w, strict=True):
            term = b.fmul(b.fmul(wc, wr), b.load(gep(b, src, col), align=4))
            total = term if total is None else b.fadd(total, term)
    return total


OPS: dict[str, Callable[[OpCtx], None]] = {"Resize": resize}
