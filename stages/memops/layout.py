"""Data movement: transpose, concat, split, slice, pad, tile and plain copies, all as strided copies."""

from __future__ import annotations

import math
from collections.abc import Callable

from llvmlite import ir

from stages.codegen.irb import add, for_range, gep, i64, intrinsic, load_vec, mul, store_vec, vec
from stages.memops.loops import Operand, align_of, collapse, const_like, contiguous_strides, emit_map, loop_nest, offset
from stages.memops.opctx import OpCtx

# Shortest contiguous run copied by memmove rather than an element loop: a loop per concat input is
# vectorised and unrolled by LLVM, which made DenseNet's concats (about 530 inputs in all) most of its build.
MEMCPY_RUN = 16
I8P = ir.IntType(8).as_pointer()
TILE = 16  # a transposing copy moves TILE x TILE float tiles through registers


def _copy(ctx: OpCtx, extents, out: Operand, src: Operand) -> None:
    """out[i] = src[i] over the box; a run contiguous in both views is one memmove (memcpy's speed, and
    right even if two views ever overlapped); a float transpose goes tile by tile (`_transposed`)."""
    ext, (o, s) = collapse(extents, [out, src])
    if _transposed(ctx, ext, o, s):
        return
    if not ext or o.strides[-1] != 1 or s.strides[-1] != 1 or ext[-1] < MEMCPY_RUN:
        emit_map(ctx.b, extents, out, [src], lambda b, v: v[0])
        return
    b = ctx.b
    size = align_of(out.ptr)
    move = intrinsic(b.module, "llvm.memmove.p0.p0.i64", ir.VoidType(), [I8P, I8P, i64(0).type, ir.IntType(1)])
    with loop_nest(b, ext[:-1]) as idx:
        dst = b.bitcast(gep(b, o.ptr, offset(b, idx, o.strides[:-1], o.base)), I8P)
        frm = b.bitcast(gep(b, s.ptr, offset(b, idx, s.strides[:-1], s.base)), I8P)
        b.call(move, [dst, frm, i64(ext[-1] * size), ir.Constant(ir.IntType(1), 0)])


def _transposed(ctx: OpCtx, ext: tuple[int, ...], o: Operand, s: Operand) -> bool:
    """A float copy whose output runs (unit stride) along a dim the source strides over, while the source runs
    along another (BERT's K^T: 64 x 128 per head, source rows 768 floats apart): TILE source rows are loaded as
    vectors, transposed in registers (log2 TILE rounds of two-input shuffles, each swapping one bit of the row
    index with the same bit of the lane index) and stored as TILE output rows; edge tiles use masked loads and
    stores. Replaces a loop of gathers. False (nothing emitted) for any other copy."""
    if len(ext) < 2 or o.strides[-1] != 1 or s.strides[-1] in (0, 1) or not isinstance(o.ptr.type.pointee,
                                                                                      ir.FloatType):
        return False
    runs = [d for d in range(len(ext) - 1) if s.strides[d] == 1 and o.strides[d] != 0]
    if not runs or ext[-1] < TILE or ext[runs[0]] < TILE:
        return False
    b, a, last = ctx.b, runs[0], len(ext) - 1
    rest = [d for d in range(last) if d != a]
    full_a, full_j = ext[a] // TILE, ext[last] // TILE
    tail_a, tail_j = ext[a] % TILE, ext[last] % TILE

    with loop_nest(b, [ext[d] for d in rest]) as outer:
        def tile(a0: ir.Value, j0: ir.Value, na: int, nj: int) -> None:
            def at(op: Operand, da: ir.Value, dj: ir.Value) -> ir.Value:
                idx = [i64(0)] * len(ext)
                for d, v in zip(rest, outer, strict=True):
                    idx[d] = v
                idx[a], idx[last] = da, dj
                return gep(b, op.ptr, offset(b, idx, op.strides, op.base))

            zero = ir.Constant(vec(TILE), None)
            rows = [load_vec(b, at(s, a0, add(b, j0, i64(r))), TILE, na) if r < nj else zero for r in range(TILE)]
            bit = 1
            while bit < TILE:
                for i in (i for i in range(TILE) if not i & bit):
                    lo = [c if not c & bit else TILE + (c ^ bit) for c in range(TILE)]
                    hi = [c ^ bit if not c & bit else TILE + c for c in range(TILE)]
                    rows[i], rows[i | bit] = (b.shuffle_vector(rows[i], rows[i | bit], ir.Constant(
                        ir.VectorType(ir.IntType(32), TILE), m)) for m in (lo, hi))
                bit *= 2
            for r in range(na):
                store_vec(b, rows[r], at(o, add(b, a0, i64(r)), j0), nj)

        def tiles(a_count: int, a_from: int, na: int, j_count: int, j_from: int, nj: int) -> None:
            if not (a_count and j_count and na and nj):
                return
            with for_range(b, i64(0), i64(a_count), name="ta", unroll=False) as ta, \
                    for_range(b, i64(0), i64(j_count), name="tj", unroll=False) as tj:
                tile(add(b, i64(a_from), mul(b, ta, i64(TILE))), add(b, i64(j_from), mul(b, tj, i64(TILE))), na, nj)

        tiles(full_a, 0, TILE, full_j, 0, TILE)
        tiles(full_a, 0, TILE, 1, full_j * TILE, tail_j)
        tiles(1, full_a * TILE, tail_a, full_j, 0, TILE)
        tiles(1, full_a * TILE, tail_a, 1, full_j * TILE, tail_j)
    return True


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


def tile(ctx: OpCtx) -> None:
    """The output viewed as (r0, s0, r1, s1, ...) reads the input with stride 0 along every repeat axis."""
    shape = ctx.in_shape()
    reps = [int(r) for r in ctx.attr("repeats")]
    extents = [d for pair in zip(reps, shape, strict=True) for d in pair]
    in_strides = [s for st in contiguous_strides(shape) for s in (0, st)]
    _copy(ctx, extents, Operand(ctx.out(), contiguous_strides(extents)), Operand(ctx.inp(), tuple(in_strides)))


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
    """Element i of each axis is `starts + i * steps` (the importer's normalised Slice)."""
    shape = ctx.in_shape()
    starts, steps, sizes = (ctx.attr(k) for k in ("starts", "steps", "sizes"))
    istr = contiguous_strides(shape)
    base = sum(int(f) * s for f, s in zip(starts, istr, strict=True))
    _copy(ctx, sizes, Operand(ctx.out(), contiguous_strides(sizes)),
          Operand(ctx.inp(), tuple(s * int(st) for s, st in zip(istr, steps, strict=True)), base))


def strided_copy(ctx: OpCtx) -> None:
    """Element i of the output is element `base + sum(i_d * strides[d])` of the input (passes_views.py's
    composed chains of Slices and Transposes)."""
    out_shape = ctx.out_shape()
    _copy(ctx, out_shape, Operand(ctx.out(), contiguous_strides(out_shape)),
          Operand(ctx.inp(), tuple(int(s) for s in ctx.attr("strides")), int(ctx.attr("base"))))


def pad(ctx: OpCtx) -> None:
    """Pad with `pads` (all begins, then all ends; negative ones crop) in constant, edge or reflect mode."""
    shape, out_shape = ctx.in_shape(), ctx.out_shape()
    rank = len(shape)
    pads = [int(p) for p in ctx.attr("pads")]
    begin, end = pads[:rank], pads[rank:]
    crop = [max(0, -bg) for bg in begin]
    extent = [s - max(0, -bg) - max(0, -en) for s, bg, en in zip(shape, begin, end, strict=True)]
    ostr, istr = contiguous_strides(out_shape), contiguous_strides(shape)
    mode = ctx.attr("mode", "constant")
    if mode != "constant":
        _pad_gather(ctx, mode, out_shape, [max(0, bg) for bg in begin], crop, extent, istr)
        return
    fill = const_like(ctx.out(), float(ctx.attr("value", 0.0)))
    emit_map(ctx.b, (math.prod(out_shape),), Operand(ctx.out(), (1,)), [], lambda b, v: fill)
    if min(extent, default=1) <= 0:
        return
    obase = sum(max(0, bg) * s for bg, s in zip(begin, ostr, strict=True))
    ibase = sum(c * s for c, s in zip(crop, istr, strict=True))
    _copy(ctx, extent, Operand(ctx.out(), ostr, obase), Operand(ctx.inp(), istr, ibase))


def _pad_gather(ctx: OpCtx, mode: str, out_shape, before, crop, extent, istr) -> None:
    """Edge / reflect padding: every output element reads the input at a clamped or mirrored index."""
    b, x, y = ctx.b, ctx.inp(), ctx.out()
    with loop_nest(b, out_shape) as idx:
        src = i64(0)
        for o, bg, c, n, st in zip(idx, before, crop, extent, istr, strict=True):
            i = b.sub(o, i64(bg))
            if mode == "edge":
                i = b.select(b.icmp_signed("<", i, i64(0)), i64(0), i)
                i = b.select(b.icmp_signed(">", i, i64(n - 1)), i64(n - 1), i)
            else:
                i = b.select(b.icmp_signed("<", i, i64(0)), b.neg(i), i)
                i = b.select(b.icmp_signed(">", i, i64(n - 1)), b.sub(i64(2 * (n - 1)), i), i)
            src = add(b, src, mul(b, add(b, i, i64(c)), i64(st)))
        b.store(b.load(gep(b, x, src), align=align_of(x)), gep(b, y, offset(b, idx, contiguous_strides(out_shape))),
                align=align_of(y))


OPS: dict[str, Callable[[OpCtx], None]] = {
    "Identity": copy,
    "Dropout": copy,
    "Reshape": copy,
    "Flatten": copy,
    "Squeeze": copy,
    "Unsqueeze": copy,
    "Transpose": transpose,
    "Tile": tile,
    "Concat": concat,
    "Split": split,
    "Slice": slice_,
    "StridedCopy": strided_copy,
    "Pad": pad,
}

# Ops whose output is the input's buffer reinterpreted: no kernel unless a copy is forced.
ALIASES = frozenset({"Identity", "Dropout", "Reshape", "Flatten", "Squeeze", "Unsqueeze"})
