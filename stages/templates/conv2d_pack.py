"""The direct conv2d's memory phases: the input pack (stride phases, zero padding) and the zeroing of
a padded Y's borders.

Row-tile schedules pack inside the compute loop, on each thread's stack (the rows its range is
first to read, or, past L2, each tile's rows into a slab); the others run a separate parallel pack
phase first (`emit_pack_planes`). Both call one `tf_pack_rows` function.
"""

from __future__ import annotations

from llvmlite import ir

from stages.codegen.irb import F32, F32P, I1, I64, VOIDP, add, for_range, gep, i64, load_vec, mul, store_vec, vec
from stages.codegen.parallel import body_args, range_body
from stages.templates.conv2d_loop import loop
from stages.templates.conv2d_plan import Plan
from stages.templates.conv2d_shape import ConvGeom

PACK_LANES = 8  # columns per phase of one step of the strided pack copy
ROW_LANES = 16  # floats per vector of the stride-1 row copy


def emit_pack_rows(mod: ir.Module, p: Plan) -> ir.Function:
    """`tf_pack_rows(args, plane0, plane1, row0, row1, dst, shift)`: padded rows [row0, row1) of
    planes [plane0, plane1) of X → zero-padded planes from `dst` on (plane0's), split into stride
    phases, padded row r at row r - shift (a multiple of the row stride)."""
    g = p.g
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [VOIDP, I64, I64, I64, I64, F32P, I64]),
                     name="tf_pack_rows")
    fn.linkage = "internal"
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    x = b.load(b.bitcast(fn.args[0], F32P.as_pointer()))
    ws, shift = fn.args[5], fn.args[6]
    zero = ir.Constant(F32, 0.0)

    def zero_fill(base: ir.Value, lo: ir.Value, hi: ir.Value, name: str) -> None:
        with for_range(b, lo, hi, name=name) as q:
            b.store(zero, gep(b, base, q))

    def unit_row(dst: ir.Value, srow: ir.Value | None) -> None:
        """A stride-1 padded row (or, without `srow`, a row of zeros) in vectors of 16 with constant
        masks at the edges: zeros, the input row (read at column q - pl), zeros; no per-element
        loops, no run-time alias checks."""
        lo = min(p.wq, g.pl)
        hi = lo if srow is None else min(p.wq, g.pl + g.w)  # input columns land in [lo, hi)
        blocks = range(0, p.wq, ROW_LANES)
        inner = [q for q in blocks if lo <= q and q + ROW_LANES <= min(hi, p.wq)]
        edge = [q for q in blocks if q not in inner]

        def put(q: ir.Value, valid: tuple[int, int] | None, stored: int) -> None:
            if srow is None or valid is None:
                v = ir.Constant(vec(ROW_LANES), None)
            elif valid == (0, ROW_LANES):
                v = load_vec(b, gep(b, srow, b.sub(q, i64(g.pl))), ROW_LANES)
            else:
                mask = ir.Constant(ir.VectorType(I1, ROW_LANES), [valid[0] <= i < valid[1] for i in range(ROW_LANES)])
                v = load_vec(b, gep(b, srow, b.sub(q, i64(g.pl))), ROW_LANES, mask)
            store_vec(b, v, gep(b, dst, q), None if stored >= ROW_LANES else stored)

        if inner:
            with loop(b, i64(inner[0]), i64(inner[-1] + ROW_LANES), step=ROW_LANES, name="cpr") as q:
                put(q, (0, ROW_LANES), ROW_LANES)
        for q in edge:
            a, z = max(lo, q) - q, min(hi, q + ROW_LANES) - q
            put(i64(q), (a, z) if z > a else None, p.wq - q)

    def row(dst: ir.Value, padded_row: ir.Value, cph: int) -> ir.Value:
        """Start of one padded row's column phase `cph` in the plane at `dst`."""
        rph, r = (b.urem(padded_row, i64(g.sh)), b.udiv(padded_row, i64(g.sh))) if g.sh > 1 else (i64(0), padded_row)
        return gep(b, dst, mul(b, add(b, mul(b, add(b, mul(b, rph, i64(g.sw)), i64(cph)), i64(p.hq)), r), i64(p.wq)))

    def strided_row(dphs: list[ir.Value], srow: ir.Value) -> None:
        """A padded row split into its `sw` column phases (rows at `dphs`)."""
        bounds = []
        for cph in range(g.sw):
            lo = min(p.wq, max(0, -(-(g.pl - cph) // g.sw)))
            bounds.append((lo, max(lo, min(p.wq, -(-(g.w + g.pl - cph) // g.sw)))))
        vlo, vend = _pack_blocks(g, bounds)

        def block(q: ir.Value) -> None:  # every phase from one load of sw*8 columns
            wide = load_vec(b, gep(b, srow, b.sub(mul(b, q, i64(g.sw)), i64(g.pl))), g.sw * PACK_LANES)
            for cph, dph in enumerate(dphs):
                picked = b.shuffle_vector(wide, ir.Constant(wide.type, None),
                                          ir.Constant(ir.VectorType(ir.IntType(32), PACK_LANES),
                                                      [i * g.sw + cph for i in range(PACK_LANES)]))
                store_vec(b, picked, gep(b, dph, q))

        if vend > vlo:
            full = vlo + (vend - vlo) // PACK_LANES * PACK_LANES
            with loop(b, i64(vlo), i64(full), step=PACK_LANES, name="cpv") as q:
                block(q)
            if full < vend:  # the tail as one more block, overlapping the last
                block(i64(vend - PACK_LANES))
        for cph, ((lo, hi), dph) in enumerate(zip(bounds, dphs, strict=True)):
            zero_fill(dph, i64(0), i64(lo), "zl")
            for a, z in ((lo, vlo), (vend, hi)) if vend > vlo else ((lo, hi),):
                with for_range(b, i64(a), i64(z), name="cp") as q:
                    col = add(b, mul(b, q, i64(g.sw)), i64(cph - g.pl))
                    b.store(b.load(gep(b, srow, col)), gep(b, dph, q))
            zero_fill(dph, i64(hi), i64(p.wq), "zr")

    with loop(b, fn.args[1], fn.args[2], name="plane") as pl:
        src = gep(b, x, mul(b, pl, i64(g.h * g.w)))
        dst = gep(b, ws, mul(b, b.sub(pl, fn.args[1]), i64(p.plane)))
        with loop(b, fn.args[3], fn.args[4], name="prow") as pr:
            r = b.sub(pr, i64(g.pt))
            inside = b.and_(b.icmp_signed(">=", r, i64(0)), b.icmp_signed("<", r, i64(g.h)))
            with b.if_else(inside) as (data, padding):
                with padding:
                    for cph in range(g.sw):
                        unit_row(row(dst, b.sub(pr, shift), cph), None)
                with data:
                    srow = gep(b, src, mul(b, r, i64(g.w)))
                    if g.sw == 1:
                        unit_row(row(dst, b.sub(pr, shift), 0), srow)
                    else:
                        strided_row([row(dst, b.sub(pr, shift), cph) for cph in range(g.sw)], srow)
    b.ret_void()
    return fn


def emit_border(mod: ir.Module, p: Plan, n_args: int) -> ir.Function:
    """Zero the borders of Y planes [begin, end): the next conv reads them as its padding (the
    buffer is shared with other tensors between calls, so they are rewritten every call)."""
    fn, b = range_body(mod, "tf_border_range")
    y = body_args(b, fn, n_args)[-1]
    (top, left, bottom, right), g, pitch = p.y_pad, p.g, p.y_pitch
    zero = ir.Constant(F32, 0.0)

    def fill(start: ir.Value, count: int) -> None:
        if count:
            with loop(b, start, add(b, start, i64(count)), name="z") as q:
                b.store(zero, gep(b, y, q))

    with loop(b, fn.args[1], fn.args[2], name="plane") as pl:
        base = mul(b, pl, i64(p.y_plane))
        fill(base, top * pitch)
        fill(add(b, base, i64((top + g.oh) * pitch)), bottom * pitch)
        with loop(b, i64(top), i64(top + g.oh), name="row") as r:
            row = add(b, base, mul(b, r, i64(pitch)))
            fill(row, left)
            fill(add(b, row, i64(left + g.ow)), right)
    b.ret_void()
    return fn


def _pack_blocks(g: ConvGeom, bounds: list[tuple[int, int]]) -> tuple[int, int]:
    """Phase columns [vlo, vend) a strided pack copies in blocks of PACK_LANES (the last block may
    overlap the one before): inside every phase's [lo, hi), reading only input columns inside the
    row. Empty (vlo == vend) at stride 1 or when not one block fits."""
    if g.sw == 1:
        return 0, 0
    vlo = max(max(lo for lo, _ in bounds), -(-g.pl // g.sw))
    last_start = (g.w + g.pl - g.sw * PACK_LANES) // g.sw  # a block's sw*8 columns end inside the row
    vend = min(min(hi for _, hi in bounds), last_start + PACK_LANES)
    return (vlo, vend) if vend - vlo >= PACK_LANES else (0, 0)


def emit_pack_planes(mod: ir.Module, p: Plan, rows: ir.Function, ws_slot: int) -> ir.Function:
    """Whole planes [begin, end): the separate pack phase, for schedules whose items are not row tiles."""
    fn, b = range_body(mod, "tf_pack_range")
    ws = b.load(b.gep(b.bitcast(fn.args[0], F32P.as_pointer()), [i64(ws_slot)]))
    b.call(rows, [fn.args[0], fn.args[1], fn.args[2], i64(0), i64(p.hq * p.g.sh),
                  gep(b, ws, mul(b, fn.args[1], i64(p.plane))), i64(0)])
    b.ret_void()
    return fn
