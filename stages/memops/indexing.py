"""Gather, GatherElements and GatherND with indices known only at run time (token ids into an embedding
table) or constant ones (an exporter's mask reshuffles).

Indices follow ONNX: a negative one counts from the end of its axis. One outside [-n, n) is never
read through: run-time indices are checked as they are loaded, and the first bad one stops the op
with the STATUS slot saying which value and which extent (tf_run then returns the call's number and
the loader names the node); constant ones are checked once, at build time.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from llvmlite import ir

from stages.codegen.irb import I64, add, for_range, gep, i64, mul
from stages.memops.loops import align_of, contiguous_strides, loop_nest, offset
from stages.memops.opctx import OpCtx


def _index_reader(ctx: OpCtx, i: int, extents: list[int]) -> Callable[[ir.Value, int], ir.Value]:
    """`read(at, extent)`: input i's element `at` as an i64 in [0, extent), negative ones wrapped. Constant
    indices are checked here, the element in column c of each len(extents)-long row against extents[c];
    run-time ones when read."""
    const = ctx.const(i)
    if const is not None:
        rows = np.asarray(const, dtype=np.int64).reshape(-1, len(extents))
        for column, n in zip(rows.T, extents, strict=True):
            bad = (column < -n) | (column >= n)
            if bad.any():
                raise ctx.unsupported(f"constant index {int(column[bad][0])} is out of range for an axis of {n}")
    ptr = ctx.inp(i)

    def read(at: ir.Value, extent: int) -> ir.Value:
        b = ctx.b
        v = b.load(gep(b, ptr, at), align=align_of(ptr))
        if v.type != I64:
            v = b.sext(v, I64)
        if const is None:
            ok = b.and_(b.icmp_signed(">=", v, i64(-extent)), b.icmp_signed("<", v, i64(extent)))
            ctx.fail_unless(ok, v, i64(extent))
        return b.select(b.icmp_signed("<", v, i64(0)), b.add(v, i64(extent)), v)
    return read


def _copy_run(ctx: OpCtx, src: ir.Value, dst: ir.Value, count: int) -> None:
    b, x, y = ctx.b, ctx.inp(0), ctx.out()
    with for_range(b, i64(0), i64(count), name="q") as q:
        v = b.load(gep(b, x, add(b, src, q)), align=align_of(x))
        b.store(v, gep(b, y, add(b, dst, q)), align=align_of(y))


def gather(ctx: OpCtx) -> None:
    """out[o, j, q] = data[o, idx[j], q] viewing data as (outer, n, inner) around `axis`."""
    data, idx = ctx.in_shape(0), ctx.in_shape(1)
    axis = int(ctx.attr("axis", 0))
    outer, n, inner, count = math.prod(data[:axis]), data[axis], math.prod(data[axis + 1:]), math.prod(idx)
    read = _index_reader(ctx, 1, [n])
    with loop_nest(ctx.b, (outer, count), "g") as (o, j):
        row = read(j, n)
        src = mul(ctx.b, add(ctx.b, mul(ctx.b, o, i64(n)), row), i64(inner))
        _copy_run(ctx, src, mul(ctx.b, add(ctx.b, mul(ctx.b, o, i64(count)), j), i64(inner)), inner)


def gather_elements(ctx: OpCtx) -> None:
    """out[i] = data[i with its `axis` coordinate replaced by idx[i]] (indices may be smaller than data)."""
    data, idx = ctx.in_shape(0), ctx.in_shape(1)
    axis = int(ctx.attr("axis", 0))
    if any(i > d for k, (i, d) in enumerate(zip(idx, data, strict=True)) if k != axis):
        raise ctx.unsupported(f"indices {list(idx)} reach outside data {list(data)}")
    read = _index_reader(ctx, 1, [data[axis]])
    strides = contiguous_strides(data)
    b, x, y = ctx.b, ctx.inp(0), ctx.out()
    with loop_nest(b, idx, "e") as at:
        flat = offset(b, at, contiguous_strides(idx))
        v = read(flat, data[axis])
        src = add(b, offset(b, [a for k, a in enumerate(at) if k != axis],
                            [s for k, s in enumerate(strides) if k != axis]), mul(b, v, i64(strides[axis])))
        b.store(b.load(gep(b, x, src), align=align_of(x)), gep(b, y, flat), align=align_of(y))


def gather_nd(ctx: OpCtx) -> None:
    """Each index tuple (the indices' last axis, k long) picks a slice of data[batch]; `batch_dims` leading
    axes are shared by data and indices."""
    data, idx = ctx.in_shape(0), ctx.in_shape(1)
    bd, k = int(ctx.attr("batch_dims", 0)), idx[-1]
    batches, tuples = math.prod(data[:bd]), math.prod(idx[bd:-1])
    block, piece = math.prod(data[bd:]), math.prod(data[bd + k:])
    strides = contiguous_strides(data[bd:])
    read = _index_reader(ctx, 1, list(data[bd:bd + k]))
    b = ctx.b
    with loop_nest(b, (batches, tuples), "n") as (bi, t):
        pair = add(b, mul(b, bi, i64(tuples)), t)
        src: ir.Value = mul(b, bi, i64(block))
        for c in range(k):
            v = read(add(b, mul(b, pair, i64(k)), i64(c)), data[bd + c])
            src = add(b, src, mul(b, v, i64(strides[c])))
        _copy_run(ctx, src, mul(b, pair, i64(piece)), piece)


OPS: dict[str, Callable[[OpCtx], None]] = {"Gather": gather, "GatherElements": gather_elements,
                                           "GatherND": gather_nd}
