"""LLVM IR of the direct conv2d: an input pack (a phase of its own, or inside the compute loop),
then register-tiled micro-kernels.

Vectors run along the output width (so activations stay NCHW and the output is stored as it is,
no layout transform): a register tile holds `mr` output channels x `rh` output rows x `nw`
vectors of `vw` output columns. Each reduction step broadcasts `mr` weights and loads `rh*nw`
input vectors, like a GEMM micro-kernel whose A panel is the packed weights. With `axis=oc` the
lanes hold output channels instead (weight vectors, input pixels broadcast, as NCHWc kernels do)
and each `vw x vw` block is transposed in registers before the epilogue, so Y stays NCHW.

The pack writes the zero-padded input split into stride phases along both axes,
`Xp[n][c][rph][cph][r][q] = Xpad[n][c][r*sh + rph][q*sw + cph]`, so every window tap reads the
same `oh*wq + ow` grid at a constant offset: a unit-stride vector for any stride and dilation.
Row-tile schedules pack inside the compute loop, on each thread's stack (the rows its range is
first to read, or, past L2, each tile's rows into a slab); the others run a separate parallel pack
phase first. Threads split single output-channel tiles, so any layer splits evenly within a tile.
With `flat`, the tile runs along that grid as one axis (output rows `wq` apart, the `wq - ow`
padding columns computed and never stored), so narrow layers (28 wide) fill whole vectors.
In a whole-model build a stride-1 conv may get X already in its packed layout (`x_padded`: the
conv before wrote its output inside this conv's zero padding, `y_pad`) and skip the pack.
A 1x1, stride-1, unpadded conv skips the pack: its grid is the image itself (`wq == ow`), so
flat it is a GEMM over the flattened image (weights packed into panels, the image read in place).
Group convolutions tile the global output-channel axis: a tile inside one group shares its
input vectors; a tile spanning whole groups (depthwise) loads each group's own input.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from llvmlite import ir

from schemas.task import EpilogueOp
from stages.codegen.irb import (
    F32,
    F32P,
    I1,
    I64,
    VOIDP,
    add,
    fma,
    for_range,
    gep,
    i64,
    load_vec,
    mul,
    smin,
    splat,
    store_vec,
    transpose_square,
    vec,
)
from stages.codegen.parallel import body_args, emit_main, emit_phases, range_body
from stages.templates import epilogue
from stages.templates.conv2d_shape import ConvGeom

PACK_LANES = 8  # columns per phase of one step of the strided pack copy
ROW_LANES = 16  # floats per vector of the stride-1 row copy
SLAB_MIN_BYTES = 1 << 20  # a packed image past this is packed row tile by row tile into a slab


@dataclass(frozen=True)
class Plan:
    """Compile-time facts of one (geometry, knobs) pair, shared by the IR and the argument packer."""

    g: ConvGeom
    vw: int
    mr: int
    nw: int
    rh: int
    icb: int
    order: str
    unroll: int
    uk: int
    ocn: int
    par: str
    flat_grid: int = 0
    axis: str = "w"
    x_padded: bool = False  # X arrives zero-padded (a stride-1 conv's packed layout): no pack
    y_pad: tuple[int, int, int, int] = (0, 0, 0, 0)  # Y is written inside zero borders (top, left, bottom, right)

    def __post_init__(self) -> None:
        if self.x_padded and (self.g.sh, self.g.sw) != (1, 1):
            raise ValueError("only a stride-1 conv reads its padded input as it is")

    @property
    def y_pitch(self) -> int:
        """Floats per row of Y as stored (borders included)."""
        return self.g.ow + self.y_pad[1] + self.y_pad[3]

    @property
    def y_plane(self) -> int:
        return (self.g.oh + self.y_pad[0] + self.y_pad[2]) * self.y_pitch

    @property
    def y_origin(self) -> int:
        """Offset of output (0, 0) in a stored plane."""
        return self.y_pad[0] * self.y_pitch + self.y_pad[1]

    @property
    def oc_vectors(self) -> bool:
        """Vectors of `vw` output channels FMA broadcast input pixels; the tile is transposed into
        pixel vectors before the epilogue and the stores."""
        return self.axis == "oc"

    @property
    def gemm(self) -> bool:
        """A 1x1, stride-1, unpadded conv: a GEMM over the flattened image, read in place."""
        return self.g.is_1x1_gemm

    @property
    def in_place(self) -> bool:
        """X is read as it is: no pack phase, no packed buffer."""
        return self.gemm or self.x_padded

    @property
    def flat(self) -> bool:
        """The tile runs along the `oh*wq` grid as one axis (`rh` is 1)."""
        return bool(self.flat_grid)

    @property
    def hq(self) -> int:
        """Rows of one stride phase of a packed input plane (of the slab's plane, with a slab)."""
        return self.hq_slab if self.slab else self.hq_image

    @property
    def hq_image(self) -> int:
        return -(-(self.g.h + self.g.pt + self.g.pb) // self.g.sh)

    @property
    def hq_slab(self) -> int:
        """Rows per stride phase that one row tile's `span` padded rows fill."""
        return -(-self.span // self.g.sh)

    @property
    def span(self) -> int:
        """Padded input rows one row tile reads."""
        return (self.rh - 1) * self.g.sh + (self.g.kh - 1) * self.g.dh + 1

    @property
    def wq(self) -> int:
        """Columns of one stride phase of a packed input row: the grid's row pitch."""
        return -(-(self.g.w + self.g.pl + self.g.pr) // self.g.sw)

    @property
    def out_h(self) -> int:
        return 1 if self.flat else self.g.oh

    @property
    def out_w(self) -> int:
        """Extent of the tiled column axis (the grid up to the last output when flat)."""
        return (self.g.oh - 1) * self.wq + self.g.ow if self.flat else self.g.ow

    @property
    def tile_w(self) -> int:
        """Columns of the tiled axis one tile covers. Channel-vector tiles broadcast their pixels one by
        one, so a tile narrower than `nw*vw` computes only its own pixels: they split the axis into
        equal tiles (28 columns are two tiles of 14, not 16 + 12 with 4 computed for nothing)."""
        full = self.nw * self.vw
        if not self.oc_vectors:
            return full
        return -(-self.out_w // -(-self.out_w // full))

    @property
    def w_tiles(self) -> int:
        return -(-self.out_w // self.tile_w)

    def pixels(self, j: int) -> int:
        """Pixels of a channel-vector tile's group `j` (of `vw`) that are computed."""
        return max(0, min(self.vw, self.tile_w - j * self.vw))

    @property
    def accumulators(self) -> int:
        """Vector registers the tile's sums occupy."""
        if self.oc_vectors:
            return self.mr // self.vw * self.rh * self.tile_w
        return self.mr * self.rh * self.nw

    @property
    def segmented(self) -> bool:
        """A flat vector may span output rows: it is stored in pieces that skip the padding columns of
        the grid (`wq` apart) or of a padded Y (`y_pitch` apart): either pitch differing from `ow`."""
        return self.flat and (self.wq != self.g.ow or self.y_pitch != self.g.ow)

    @property
    def plane(self) -> int:
        """Floats per input channel plane as the micro-kernel reads it."""
        return self.g.sh * self.g.sw * self.hq * self.wq

    def tap(self, kh: int, kw: int) -> int:
        """Offset of window tap (kh, kw) in a packed plane, relative to its output position."""
        g = self.g
        y, x = kh * g.dh, kw * g.dw
        return ((y % g.sh * g.sw + x % g.sw) * self.hq + y // g.sh) * self.wq + x // g.sw

    @property
    def workspace(self) -> int:
        """Floats of the shared packed-input buffer (0 when X is read in place or each range packs
        its own rows on its stack)."""
        if self.in_place or self.pack_rows:
            return 0
        return self.packed_floats

    @property
    def packed_floats(self) -> int:
        """Floats of the whole packed input and the slack its edge tiles read past it: the size of a
        padded X buffer (`x_padded`) too."""
        return self.g.n * self.g.c * self.plane + self._slack(self.tiled_rows)

    @property
    def slab(self) -> bool:
        """Row tiles pack their rows into a small per-thread buffer instead of the whole packed
        image, when that image would not fit in L2 (1 MB; the slab must, too): the packed rows
        then never travel to L3 and back. Halo rows are packed once per tile that reads them."""
        if not self.pack_rows:
            return False
        g = self.g
        per_row = 4 * g.c * g.sw * self.wq
        return per_row * g.sh * self.hq_image > SLAB_MIN_BYTES >= per_row * g.sh * self.hq_slab

    @property
    def stack_floats(self) -> int:
        """Floats of a range's private packed image (or slab): one image's planes and the edge slack."""
        return self.g.c * self.plane + self._slack(self.rh if self.slab else self.tiled_rows)

    @property
    def tiled_rows(self) -> int:
        """Output rows the row tiles cover, the last tile's masked-off rows included."""
        return -(-self.out_h // self.rh) * self.rh

    def _slack(self, rows: int) -> int:
        """Floats past the last plane that the masked-off rows and grid columns of its edge tiles read."""
        g = self.g
        cols = self.w_tiles * self.tile_w  # pixel broadcasts are not masked
        end = max(self.tap(i, j) for i in range(g.kh) for j in range(g.kw)) + (rows - 1) * self.wq + cols
        return max(0, end - self.plane)

    @property
    def shared(self) -> bool:
        """All rows of a tile lie in one group, so they read the same input vectors."""
        return self.g.groups == 1 or self.g.ocg % self.mr == 0

    @property
    def pack_in_item(self) -> bool:
        """Channel blocks hold whole groups (depthwise, grouped convs split by channels), so each block
        packs its own input planes right before using them: no separate pack phase, and they are hot."""
        return not self.in_place and self.par == "oc" and self.g.groups > 1 and (self.ocn * self.mr) % self.g.ocg == 0

    @property
    def pack_rows(self) -> bool:
        """Segments are output row tiles: a thread's range packs the input rows it is first to need,
        right before computing them, into a buffer on its own stack: no separate pack phase (one
        barrier less per call at 2+ threads), rows packed by the core that reads them (and, after a
        conv split the same way, wrote them), hot in cache, and no packed line written by two cores
        (a shared buffer's halo rows were rewritten by the next thread while this one read them).
        Each range packs its halo rows itself."""
        return not self.in_place and not self.pack_in_item and self.par == "oh" and not self.flat

    @property
    def tiles(self) -> int:
        return -(-self.g.oc // self.mr)

    @property
    def ic_pad(self) -> int:
        """Input channels per group as laid out in the packed weights."""
        return self.g.icg if self.order == "chw" else -(-self.g.icg // self.icb) * self.icb

    @property
    def panel(self) -> int:
        """Floats of one tile's packed weight panel."""
        return self.ic_pad * self.g.kh * self.g.kw * self.mr

    @property
    def ic_blocks(self) -> int:
        return -(-self.g.icg // self.icb)


def build(mod: ir.Module, p: Plan, ops: tuple[EpilogueOp, ...], threads: int) -> ir.Function:
    """Emit the phases and return `tf_main(ptr args)`; args are `[X, Wp, *epilogue, (workspace), Y]`."""
    n_epi = len(epilogue.operands(ops))
    if any(p.y_pad) and not all(s.per_channel for s in epilogue.operands(ops)):
        raise ValueError("a padded Y would misplace Y-shaped epilogue operands")
    rows = None if p.in_place else _emit_pack_rows(mod, p)
    conv = _Conv(p, ops, n_epi).emit(mod, rows if p.pack_in_item or p.pack_rows else None)
    phases = [emit_main(mod, conv, p.g.n * _segments(p) * p.tiles, threads, name="tf_conv")]
    if rows is not None and not (p.pack_in_item or p.pack_rows):
        pack = _emit_pack_planes(mod, p, rows, ws_slot=2 + n_epi)
        phases.insert(0, emit_main(mod, pack, p.g.n * p.g.c, threads, name="tf_pack"))
    if any(p.y_pad):
        border = _emit_border(mod, p, 3 + n_epi + (1 if p.workspace else 0))
        # On the calling thread: a few hundred stores, cheaper than one more fork and join of the pool.
        phases.insert(0, emit_main(mod, border, p.g.n * p.g.oc, 1, name="tf_border"))
    return emit_phases(mod, phases)


@contextmanager
def _loop(b: ir.IRBuilder, start: ir.Value, stop: ir.Value, step: int = 1, name: str = "i") -> Iterator[ir.Value]:
    """`for_range` that LLVM must not unroll: unrolling is the schedule's decision (knobs `unroll`,
    `uk`), and LLVM fully unrolling small constant trip counts around an inlined micro-kernel
    multiplies code size (and compile time) without a knob to undo it."""
    with for_range(b, start, stop, step, name) as idx:
        yield idx
    mod = b.module
    loop_id = mod.add_metadata([ir.MetaDataString(mod, f"tf.loop.{len(mod.metadata)}")])
    loop_id.operands = (loop_id, mod.add_metadata([ir.MetaDataString(mod, "llvm.loop.unroll.disable")]),
                        mod.add_metadata([ir.MetaDataString(mod, "llvm.loop.vectorize.enable"), ir.Constant(I1, 0)]))
    idx.incomings[-1][1].terminator.set_metadata("llvm.loop", loop_id)


def _segments(p: Plan) -> int:
    """Segments per image: the image itself (par=oc), or its row tiles (column tiles of the grid when flat)."""
    if p.par == "oc":
        return 1
    if p.flat:
        return p.w_tiles
    return -(-p.out_h // p.rh)




def _emit_pack_rows(mod: ir.Module, p: Plan) -> ir.Function:
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
            with _loop(b, i64(inner[0]), i64(inner[-1] + ROW_LANES), step=ROW_LANES, name="cpr") as q:
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
            with _loop(b, i64(vlo), i64(full), step=PACK_LANES, name="cpv") as q:
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

    with _loop(b, fn.args[1], fn.args[2], name="plane") as pl:
        src = gep(b, x, mul(b, pl, i64(g.h * g.w)))
        dst = gep(b, ws, mul(b, b.sub(pl, fn.args[1]), i64(p.plane)))
        with _loop(b, fn.args[3], fn.args[4], name="prow") as pr:
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


def _emit_border(mod: ir.Module, p: Plan, n_args: int) -> ir.Function:
    """Zero the borders of Y planes [begin, end): the next conv reads them as its padding (the
    buffer is shared with other tensors between calls, so they are rewritten every call)."""
    fn, b = range_body(mod, "tf_border_range")
    y = body_args(b, fn, n_args)[-1]
    (top, left, bottom, right), g, pitch = p.y_pad, p.g, p.y_pitch
    zero = ir.Constant(F32, 0.0)

    def fill(start: ir.Value, count: int) -> None:
        if count:
            with _loop(b, start, add(b, start, i64(count)), name="z") as q:
                b.store(zero, gep(b, y, q))

    with _loop(b, fn.args[1], fn.args[2], name="plane") as pl:
        base = mul(b, pl, i64(p.y_plane))
        fill(base, top * pitch)
        fill(add(b, base, i64((top + g.oh) * pitch)), bottom * pitch)
        with _loop(b, i64(top), i64(top + g.oh), name="row") as r:
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


def _emit_pack_planes(mod: ir.Module, p: Plan, rows: ir.Function, ws_slot: int) -> ir.Function:
    """Whole planes [begin, end): the separate pack phase, for schedules whose items are not row tiles."""
    fn, b = range_body(mod, "tf_pack_range")
    ws = b.load(b.gep(b.bitcast(fn.args[0], F32P.as_pointer()), [i64(ws_slot)]))
    b.call(rows, [fn.args[0], fn.args[1], fn.args[2], i64(0), i64(p.hq * p.g.sh),
                  gep(b, ws, mul(b, fn.args[1], i64(p.plane))), i64(0)])
    b.ret_void()
    return fn


class _Conv:
    def __init__(self, p: Plan, ops: tuple[EpilogueOp, ...], n_epi: int):
        self.p, self.ops, self.n_epi = p, ops, n_epi
        self.slots = epilogue.operands(ops)
        self.tile_w, self.w_tiles = p.tile_w, p.w_tiles
        self.h_tiles = -(-p.out_h // p.rh)
        self._micro: ir.Function | None = None

    def emit(self, mod: ir.Module, pack: ir.Function | None) -> ir.Function:
        """`tf_conv_range(args, begin, end)`; with `pack` (`tf_pack_rows`), each item first packs the
        planes (`pack_in_item`) or the rows (`pack_rows`) it is first to read."""
        p, g = self.p, self.p.g
        fn, b = range_body(mod, "tf_conv_range")
        ptrs = body_args(b, fn, 3 + self.n_epi + (1 if p.workspace else 0))
        ws = ptrs[-2] if p.workspace else None
        if p.pack_rows:  # this range's own packed rows: no cache line is written by two threads
            x = b.alloca(F32, size=i64(p.stack_floats))
            x.align = 64
        else:
            x = ws if p.workspace else ptrs[0]
        self.b, self.x, self.w, self.epi, self.y = b, x, ptrs[1], ptrs[2:2 + self.n_epi], ptrs[-1]
        segments, tiles = _segments(p), p.tiles
        if p.pack_rows and not p.slab:  # (image, padded rows packed so far) of this range
            image, packed = b.alloca(I64), b.alloca(I64)
            b.store(i64(-1), image)
        begin, end = fn.args[1], fn.args[2]
        # Items are single channel tiles of a segment (an image for par=oc, a row or grid-column tile
        # of one for par=oh), so two threads split any layer within a tile; a range walks each of its
        # segments' tiles in blocks of `ocn`, as one thread would.
        with _loop(b, b.udiv(begin, i64(tiles)), b.udiv(add(b, end, i64(tiles - 1)), i64(tiles)),
                   name="segment") as seg:
            base = mul(b, seg, i64(tiles))
            t_lo = b.select(b.icmp_signed("<", begin, base), i64(0), b.sub(begin, base))
            t_hi = smin(b, b.sub(end, base), i64(tiles))
            n = b.udiv(seg, i64(segments))
            o = b.urem(seg, i64(segments))
            planes = (mul(b, n, i64(g.c)), mul(b, add(b, n, i64(1)), i64(g.c)))  # the image's input planes
            first = mul(b, o, i64(p.rh * g.sh))  # the row tile's first padded row
            if pack is not None and p.slab:
                b.call(pack, [fn.args[0], *planes, first, add(b, first, i64(p.span)), x, first])
            elif pack is not None and p.pack_rows:
                with b.if_then(b.icmp_signed("!=", b.load(image), n)):
                    b.store(n, image)
                    b.store(first, packed)
                need = smin(b, add(b, first, i64(p.span)), i64(p.hq * g.sh))
                with b.if_then(b.icmp_signed("<", b.load(packed), need)):
                    b.call(pack, [fn.args[0], *planes, b.load(packed), need, x, i64(0)])
                    b.store(need, packed)
            with _loop(b, t_lo, t_hi, step=p.ocn, name="block") as t0:
                block = (t0, smin(b, add(b, t0, i64(p.ocn)), t_hi))
                if pack is not None and p.pack_in_item:
                    self._pack_groups(pack, fn.args[0], n, block, ws)
                with _loop(b, i64(0), i64(p.ic_blocks), name="icb") as kb:
                    if p.par == "oc":
                        with _loop(b, i64(0), i64(self.h_tiles), name="ht") as ht:
                            self._w_loop(n, block, kb, ht)
                    elif p.flat:
                        self._w_loop(n, block, kb, i64(0), (o, add(b, o, i64(1))))
                    else:
                        self._w_loop(n, block, kb, o)
        b.ret_void()
        return fn

    def _pack_groups(self, pack: ir.Function, args: ir.Value, n: ir.Value, block: tuple[ir.Value, ir.Value],
                     ws: ir.Value) -> None:
        """Pack the input planes of every group the block's channels touch (a range may start inside a
        group: both threads then pack its planes, identically)."""
        p, g, b = self.p, self.p.g, self.b
        oc0 = mul(b, block[0], i64(p.mr))
        oc1 = smin(b, mul(b, block[1], i64(p.mr)), i64(g.oc))
        base = mul(b, n, i64(g.c))
        c0 = add(b, base, mul(b, b.udiv(oc0, i64(g.ocg)), i64(g.icg)))
        c1 = add(b, base, mul(b, b.udiv(add(b, oc1, i64(g.ocg - 1)), i64(g.ocg)), i64(g.icg)))
        b.call(pack, [args, c0, c1, i64(0), i64(p.hq * g.sh), gep(b, ws, mul(b, c0, i64(p.plane))), i64(0)])

    def _w_loop(self, n: ir.Value, block: tuple[ir.Value, ir.Value], kb: ir.Value, ht: ir.Value,
                wts: tuple[ir.Value, ir.Value] | None = None) -> None:
        b = self.b
        with _loop(b, *(wts or (i64(0), i64(self.w_tiles))), name="wt") as wt:
            with _loop(b, *block, name="t") as t:
                self._dispatch(n, t, kb, ht, wt)

    def _edge(self, idx: ir.Value, count: int, full: int, extent: int) -> ir.Value:
        """How much of a tile along one axis is inside the output (`full`, or the tail on the last tile)."""
        tail = extent - (count - 1) * full
        if tail == full:
            return i64(full)
        return self.b.select(self.b.icmp_signed("==", idx, i64(count - 1)), i64(tail), i64(full))

    def _dispatch(self, n: ir.Value, t: ir.Value, kb: ir.Value, ht: ir.Value, wt: ir.Value) -> None:
        p, g, b = self.p, self.p.g, self.b
        vrows = self._edge(t, p.tiles, p.mr, g.oc)
        vh = self._edge(ht, self.h_tiles, p.rh, p.out_h)
        vcols = self._edge(wt, self.w_tiles, self.tile_w, p.out_w)
        oc0 = mul(b, t, i64(p.mr))
        grp = b.udiv(oc0, i64(g.ocg)) if g.groups > 1 else i64(0)
        ch = add(b, mul(b, n, i64(g.c)), add(b, mul(b, grp, i64(g.icg)), mul(b, kb, i64(p.icb))))
        oh0 = mul(b, ht, i64(p.rh))
        ow0 = mul(b, wt, i64(self.tile_w))
        chan = b.sub(ch, mul(b, n, i64(g.c))) if p.pack_rows else ch  # a stack buffer holds one image's planes
        col = ow0 if p.slab else add(b, mul(b, oh0, i64(p.wq)), ow0)  # a slab starts at the tile's first row
        xoff = add(b, mul(b, chan, i64(p.plane)), col)
        kb_off = mul(b, kb, i64(p.icb * g.kh * g.kw * p.mr))
        woff = add(b, mul(b, t, i64(p.panel)), kb_off)
        if p.segmented:  # the tile starts at grid column col0 of output row oh0
            oh0, col0 = b.udiv(ow0, i64(p.wq)), b.urem(ow0, i64(p.wq))
        else:
            col0 = ow0
        yoff = add(b, mul(b, add(b, mul(b, n, i64(g.oc)), oc0), i64(p.y_plane)),
                   add(b, mul(b, oh0, i64(p.y_pitch)), add(b, col0, i64(p.y_origin))))
        nc = smin(b, i64(p.icb), b.sub(i64(g.icg), mul(b, kb, i64(p.icb))))
        first = b.icmp_signed("==", kb, i64(0))
        last = b.icmp_signed("==", kb, i64(p.ic_blocks - 1))
        epi = [gep(b, ptr, yoff if not s.per_channel else oc0) for ptr, s in zip(self.epi, self.slots, strict=True)]
        if self._micro is None:
            self._micro = _Micro(self.p, self.ops, self.slots).emit(b.module)
        b.call(self._micro, [gep(b, self.x, xoff), gep(b, self.w, woff), gep(b, self.y, yoff), nc, first, last,
                             vrows, vh, vcols, col0, *epi])


class _Micro:
    """Y[tile] (+)= the tile's reduction over one input-channel block, then the epilogue on the last block.

    One function serves every tile: how many channels, rows and columns of the tile lie inside the
    output arrive as arguments and become store masks (edge tiles compute on zero weights or
    masked-off lanes and never write outside Y).
    """

    def __init__(self, p: Plan, ops, slots):
        self.p, self.ops, self.slots = p, ops, slots
        self.cells = [(m, r, j) for m in range(p.mr) for r in range(p.rh) for j in range(p.nw)]

    def emit(self, mod: ir.Module) -> ir.Function:
        p = self.p
        n_epi = len(self.slots)
        fnty = ir.FunctionType(ir.VoidType(), [F32P, F32P, F32P, I64, I1, I1, I64, I64, I64, I64] + [F32P] * n_epi)
        fn = ir.Function(mod, fnty, name="tf_micro")
        fn.linkage = "internal"
        for arg in fn.args[:3]:
            arg.add_attribute("noalias")
        x, w, y, nc, first, last, vrows, vh, vcols, col0, *epi = fn.args
        b = self.b = ir.IRBuilder(fn.append_basic_block("entry"))
        self._masks(vrows, vh, vcols, col0)
        vty = vec(p.vw)
        zero = ir.Constant(vty, [0.0] * p.vw)
        self.acc = {c: b.alloca(vty) for c in self.cells}
        for c in self.cells:
            if p.ic_blocks == 1:
                b.store(zero, self.acc[c])
            else:
                b.store(b.select(first, zero, self._load_y(y, *c)), self.acc[c])
        if p.oc_vectors:
            self.oacc = {(o, r, j, q): b.alloca(vty) for o in range(p.mr // p.vw) for r in range(p.rh)
                         for j in range(p.nw) for q in range(p.vw)}
            for slot in self.oacc.values():
                b.store(zero, slot)
        self._reduce(x, w, nc, vrows)
        if p.oc_vectors:
            self._transpose()
        if p.ic_blocks == 1:
            self._store(y, epi, vrows, True)
        else:
            with b.if_else(last) as (fin, part):
                with fin:
                    self._store(y, epi, vrows, True)
                with part:
                    self._store(y, epi, vrows, False)
        b.ret_void()
        return fn

    def _masks(self, vrows: ir.Value, vh: ir.Value, vcols: ir.Value, col0: ir.Value) -> None:
        """Column masks of the tile's vectors, and the pieces each cell is stored in: (offset from Y's
        tile start, store mask with channel and row edges too). A flat vector spanning output rows has
        one piece per row, its lanes on padding columns in none.

        A mask is built from an integer bit pattern, so it lives in a mask register: built from a
        vector compare it would pin vector registers the tile needs for accumulators."""
        p, g, b = self.p, self.p.g, self.b
        mty = ir.VectorType(I1, p.vw)

        def bits_below(n: ir.Value) -> ir.Value:
            """Lanes [0, n) with n clamped to [0, vw]."""
            n = smin(b, i64(p.vw), b.select(b.icmp_signed("<", n, i64(0)), i64(0), n))
            return b.sub(b.shl(i64(1), n), i64(1))

        def as_mask(bits: ir.Value) -> ir.Value:
            return b.bitcast(b.trunc(bits, ir.IntType(p.vw)), mty)

        col_bits = [bits_below(b.sub(vcols, i64(j * p.vw))) for j in range(p.nw)]
        self.cmask = [as_mask(bits) for bits in col_bits]
        pieces: dict[tuple[int, int], list[tuple[ir.Value, ir.Value]]] = {}
        for r in range(p.rh):
            for j in range(p.nw):
                if not p.segmented:
                    pieces[r, j] = [(i64(r * p.y_pitch + j * p.vw), self.cmask[j])]
                    continue
                pos = add(b, col0, i64(j * p.vw))
                row, col = b.udiv(pos, i64(p.wq)), b.urem(pos, i64(p.wq))
                start = b.sub(add(b, mul(b, row, i64(p.y_pitch)), col), col0)
                pieces[r, j] = []
                for k in range(1 + (p.wq + p.vw - 2) // p.wq):
                    lo = b.sub(i64(k * p.wq), col)
                    lanes = b.and_(col_bits[j], b.xor(bits_below(add(b, lo, i64(g.ow))), bits_below(lo)))
                    pieces[r, j].append((add(b, start, i64(k * (p.y_pitch - p.wq))), as_mask(lanes)))
        none = ir.Constant(mty, [0] * p.vw)
        self.pieces = {}
        for m, r, j in self.cells:
            ok = b.and_(b.icmp_signed("<", i64(m), vrows), b.icmp_signed("<", i64(r), vh))
            self.pieces[m, r, j] = [(add(b, off, i64(m * p.y_plane)), b.select(ok, mask, none))
                                    for off, mask in pieces[r, j]]

    def _load_y(self, ptr: ir.Value, m: int, r: int, j: int) -> ir.Value:
        """One cell's vector of a Y-shaped tensor, gathered from its pieces (zeros elsewhere)."""
        v = None
        for off, mask in self.pieces[m, r, j]:
            piece = load_vec(self.b, self.b.gep(ptr, [off]), self.p.vw, mask)
            v = piece if v is None else self.b.select(mask, piece, v)
        return v

    def _store(self, y: ir.Value, epi: list[ir.Value], vrows: ir.Value, final: bool) -> None:
        p, b = self.p, self.b
        for (m, r, j), slot in self.acc.items():
            v = b.load(slot)
            if final and self.ops:
                row = smin(b, i64(m), b.sub(vrows, i64(1)))

                def load(k: int, cell=(m, r, j), row=row) -> ir.Value:
                    if self.slots[k].per_channel:
                        return splat(b, b.load(gep(b, epi[k], row)), p.vw)
                    return self._load_y(epi[k], *cell)
                v = epilogue.emit(b, self.ops, v, load)
            for off, mask in self.pieces[m, r, j]:
                store_vec(b, v, b.gep(y, [off]), mask)

    def _reduce(self, x: ir.Value, w: ir.Value, nc: ir.Value, vrows: ir.Value) -> None:
        p, g, b = self.p, self.p.g, self.b
        if p.shared:
            self.sets = [i64(0)]
        elif g.oc % p.mr == 0:  # no channel-tail tile: every group of the tile exists
            self.sets = [i64(s * g.icg * p.plane) for s in range(p.mr // g.ocg)]
        else:
            last_set = b.udiv(b.sub(vrows, i64(1)), i64(g.ocg))
            self.sets = [mul(b, smin(b, i64(s), last_set), i64(g.icg * p.plane))
                         for s in range(-(-p.mr // g.ocg))]

        def channels(body) -> None:
            main_end = b.mul(b.udiv(nc, i64(p.uk)), i64(p.uk))
            with _loop(b, i64(0), main_end, step=p.uk, name="c") as c0:
                for u in range(p.uk):
                    body(add(b, c0, i64(u)))
            if p.uk > 1:
                with _loop(b, main_end, nc, name="cr") as cr:
                    body(cr)

        def columns(body, kh: ir.Value) -> None:
            if p.unroll >= 1:
                for kw in range(g.kw):
                    body(kh, i64(kw))
            else:
                with _loop(b, i64(0), i64(g.kw), name="kw") as kw:
                    body(kh, kw)

        def window(body) -> None:
            if p.unroll == 2:
                for kh in range(g.kh):
                    columns(body, i64(kh))
            else:
                with _loop(b, i64(0), i64(g.kh), name="kh") as kh:
                    columns(body, kh)

        if p.order == "chw":
            channels(lambda c: window(lambda kh, kw: self._step(x, w, c, kh, kw)))
        else:
            window(lambda kh, kw: channels(lambda c: self._step(x, w, c, kh, kw)))

    def _step(self, x: ir.Value, w: ir.Value, c: ir.Value, kh: ir.Value, kw: ir.Value) -> None:
        """One (channel, tap): broadcast `mr` weights, load the input vectors, FMA into the tile."""
        p, g, b = self.p, self.p.g, self.b
        xoff = add(b, mul(b, c, i64(p.plane)), self._tap(kh, kw))
        tap = add(b, mul(b, kh, i64(g.kw)), kw)
        if p.order == "chw":
            woff = mul(b, add(b, mul(b, c, i64(g.kh * g.kw)), tap), i64(p.mr))
        else:
            woff = mul(b, add(b, mul(b, tap, i64(p.icb)), c), i64(p.mr))
        if p.oc_vectors:
            self._oc_step(x, w, xoff, woff)
            return
        xv = {}
        for s, set_off in enumerate(self.sets):
            for r in range(p.rh):
                for j in range(p.nw):
                    off = add(b, add(b, xoff, set_off), i64(r * p.wq + j * p.vw))
                    xv[s, r, j] = load_vec(b, gep(b, x, off), p.vw, self.cmask[j])
        for m in range(p.mr):
            wv = splat(b, b.load(gep(b, w, add(b, woff, i64(m)))), p.vw)
            s = 0 if p.shared else m // g.ocg
            for r in range(p.rh):
                for j in range(p.nw):
                    cell = self.acc[m, r, j]
                    b.store(fma(b, wv, xv[s, r, j], b.load(cell)), cell)

    def _tap(self, kh: ir.Value, kw: ir.Value) -> ir.Value:
        """`Plan.tap` for window indices that may be loop variables."""
        p, g, b = self.p, self.p.g, self.b

        def split(v: ir.Value, stride: int) -> tuple[ir.Value, ir.Value]:
            return (b.urem(v, i64(stride)), b.udiv(v, i64(stride))) if stride > 1 else (i64(0), v)

        (ry, y), (rx, x) = split(mul(b, kh, i64(g.dh)), g.sh), split(mul(b, kw, i64(g.dw)), g.sw)
        phase = add(b, mul(b, add(b, mul(b, ry, i64(g.sw)), rx), i64(p.hq)), y)
        return add(b, mul(b, phase, i64(p.wq)), x)

    def _oc_step(self, x: ir.Value, w: ir.Value, xoff: ir.Value, woff: ir.Value) -> None:
        """`mr/vw` weight vectors x each pixel of the tile broadcast (channels along the lanes)."""
        p, b = self.p, self.b
        wv = [load_vec(b, gep(b, w, add(b, woff, i64(o * p.vw))), p.vw) for o in range(p.mr // p.vw)]
        for r in range(p.rh):
            for j in range(p.nw):
                for q in range(p.pixels(j)):
                    px = splat(b, b.load(gep(b, x, add(b, xoff, i64(r * p.wq + j * p.vw + q)))), p.vw)
                    for o, wo in enumerate(wv):
                        cell = self.oacc[o, r, j, q]
                        b.store(fma(b, wo, px, b.load(cell)), cell)

    def _transpose(self) -> None:
        """Each `vw x vw` block (pixel vectors of channels → channel vectors of pixels) by swapping
        off-diagonal sub-blocks of halving size: vw*log2(vw) two-source shuffles."""
        p, b = self.p, self.b
        for o in range(p.mr // p.vw):
            for r in range(p.rh):
                for j in range(p.nw):
                    rows = transpose_square(b, [b.load(self.oacc[o, r, j, q]) for q in range(p.vw)])
                    for m in range(p.vw):
                        b.store(rows[m], self.acc[o * p.vw + m, r, j])
