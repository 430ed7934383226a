"""LLVM IR of the direct conv2d: an input pack (a phase of its own, or inside the compute loop),
then register-tiled micro-kernels.

Phases, in order: the zeroing of a padded Y's borders (`conv2d_pack`), a separate parallel input
pack unless the compute items pack their own rows or planes (`conv2d_pack`), then the compute
phase, whose items walk output-channel tiles and call the micro-kernel (`conv2d_micro`) once per
tile and input-channel block; the plan (`conv2d_plan`) says which. Threads split single
output-channel tiles, so any layer splits evenly within a tile.
In a whole-model build a stride-1 conv may get X already in its packed layout (`x_padded`: the
conv before wrote its output inside this conv's zero padding, `y_pad`) and skip the pack.
A 1x1, stride-1, unpadded conv skips the pack: its grid is the image itself (`wq == ow`), so
flat it is a GEMM over the flattened image (weights packed into panels, the image read in place).
"""

from __future__ import annotations

from llvmlite import ir

from schemas.task import EpilogueOp
from stages.codegen.irb import F32, I64, add, gep, i64, mul, smin
from stages.codegen.parallel import body_args, emit_main, emit_phases, range_body
from stages.graph.epilogue import operands
from stages.templates.conv2d_loop import loop
from stages.templates.conv2d_micro import Micro
from stages.templates.conv2d_pack import emit_border, emit_pack_planes, emit_pack_rows
from stages.templates.conv2d_plan import Plan


def build(mod: ir.Module, p: Plan, ops: tuple[EpilogueOp, ...], threads: int) -> ir.Function:
    """Emit the phases and return `tf_main(ptr args)`; args are `[X, Wp, *epilogue, (workspace), Y]`."""
    n_epi = len(operands(ops))
    if any(p.y_pad) and not all(s.per_channel for s in operands(ops)):
        raise ValueError("a padded Y would misplace Y-shaped epilogue operands")
    rows = None if p.in_place else emit_pack_rows(mod, p)
    conv = _Conv(p, ops, n_epi).emit(mod, rows if p.pack_in_item or p.pack_rows else None)
    phases = [emit_main(mod, conv, p.g.n * p.segments * p.tiles, threads, name="tf_conv")]
    if rows is not None and not (p.pack_in_item or p.pack_rows):
        pack = emit_pack_planes(mod, p, rows, ws_slot=2 + n_epi)
        phases.insert(0, emit_main(mod, pack, p.g.n * p.g.c, threads, name="tf_pack"))
    if any(p.y_pad):
        border = emit_border(mod, p, 3 + n_epi + (1 if p.workspace else 0))
        # On the calling thread: a few hundred stores, cheaper than one more fork and join of the pool.
        phases.insert(0, emit_main(mod, border, p.g.n * p.g.oc, 1, name="tf_border"))
    return emit_phases(mod, phases)


class _Conv:
    """The compute phase's range body: segments x output-channel tiles, one micro-kernel call per tile
    and input-channel block."""

    def __init__(self, p: Plan, ops: tuple[EpilogueOp, ...], n_epi: int):
        self.p, self.ops, self.n_epi = p, ops, n_epi
        self.slots = operands(ops)
        self._micro: ir.Function | None = None
        self.c0: ir.Value | None = None  # the first channel a block packed into its stack buffer (item_stack)

    def emit(self, mod: ir.Module, pack: ir.Function | None) -> ir.Function:
        """`tf_conv_range(args, begin, end)`; with `pack` (`tf_pack_rows`), each item first packs the
        planes (`pack_in_item`) or the rows (`pack_rows`) it is first to read."""
        p, g = self.p, self.p.g
        fn, b = range_body(mod, "tf_conv_range")
        ptrs = body_args(b, fn, 3 + self.n_epi + (1 if p.workspace else 0))
        ws = ptrs[-2] if p.workspace else None
        if p.pack_rows or p.item_stack:  # this range's own packed rows or block planes: hot, written by one core
            x = b.alloca(F32, size=i64(p.stack_floats if p.pack_rows else p.item_floats))
            x.align = 64
        else:
            x = ws if p.workspace else ptrs[0]
        self.b, self.x, self.w, self.epi, self.y = b, x, ptrs[1], ptrs[2:2 + self.n_epi], ptrs[-1]
        segments, tiles = p.segments, p.tiles
        if p.pack_rows and not p.slab:  # (image, padded rows packed so far) of this range
            image, packed = b.alloca(I64), b.alloca(I64)
            b.store(i64(-1), image)
        begin, end = fn.args[1], fn.args[2]
        # Items are single channel tiles of a segment (an image for par=oc, a row or grid-column tile
        # of one for par=oh), so two threads split any layer within a tile; a range walks each of its
        # segments' tiles in blocks of `ocn`, as one thread would.
        with loop(b, b.udiv(begin, i64(tiles)), b.udiv(add(b, end, i64(tiles - 1)), i64(tiles)),
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
            with loop(b, t_lo, t_hi, step=p.ocn, name="block") as t0:
                block = (t0, smin(b, add(b, t0, i64(p.ocn)), t_hi))
                if pack is not None and p.pack_in_item:
                    self.c0 = self._pack_groups(pack, fn.args[0], n, block, x if p.item_stack else ws)
                with loop(b, i64(0), i64(p.ic_blocks), name="icb") as kb:
                    if p.par == "oc":
                        with loop(b, i64(0), i64(p.h_tiles), name="ht") as ht:
                            self._w_loop(n, block, kb, ht)
                    elif p.flat:
                        self._w_loop(n, block, kb, i64(0), (o, add(b, o, i64(1))))
                    else:
                        self._w_loop(n, block, kb, o)
        b.ret_void()
        return fn

    def _pack_groups(self, pack: ir.Function, args: ir.Value, n: ir.Value, block: tuple[ir.Value, ir.Value],
                     ws: ir.Value) -> ir.Value:
        """Pack the input planes of every group the block's channels touch (a range may start inside a
        group: both threads then pack its planes, identically), at their place in the workspace or, with
        `item_stack`, from the start of the block's stack buffer; return the first plane's channel."""
        p, g, b = self.p, self.p.g, self.b
        oc0 = mul(b, block[0], i64(p.mr))
        oc1 = smin(b, mul(b, block[1], i64(p.mr)), i64(g.oc))
        base = mul(b, n, i64(g.c))
        c0 = add(b, base, mul(b, b.udiv(oc0, i64(g.ocg)), i64(g.icg)))
        c1 = add(b, base, mul(b, b.udiv(add(b, oc1, i64(g.ocg - 1)), i64(g.ocg)), i64(g.icg)))
        dst = ws if p.item_stack else gep(b, ws, mul(b, c0, i64(p.plane)))
        b.call(pack, [args, c0, c1, i64(0), i64(p.hq * g.sh), dst, i64(0)])
        return c0

    def _w_loop(self, n: ir.Value, block: tuple[ir.Value, ir.Value], kb: ir.Value, ht: ir.Value,
                wts: tuple[ir.Value, ir.Value] | None = None) -> None:
        p, b = self.p, self.b
        with loop(b, *(wts or (i64(0), i64(p.w_tiles))), name="wt") as wt:
            with loop(b, *block, name="t") as t:
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
        vh = self._edge(ht, p.h_tiles, p.rh, p.out_h)
        vcols = self._edge(wt, p.w_tiles, p.tile_w, p.out_w)
        oc0 = mul(b, t, i64(p.mr))
        grp = b.udiv(oc0, i64(g.ocg)) if g.groups > 1 else i64(0)
        ch = add(b, mul(b, n, i64(g.c)), add(b, mul(b, grp, i64(g.icg)), mul(b, kb, i64(p.icb))))
        oh0 = mul(b, ht, i64(p.rh))
        ow0 = mul(b, wt, i64(p.tile_w))
        if p.pack_rows:  # a stack buffer holds one image's planes
            chan = b.sub(ch, mul(b, n, i64(g.c)))
        elif p.item_stack:  # ... or the block's own, from its first
            chan = b.sub(ch, self.c0)
        else:
            chan = ch
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
            self._micro = Micro(self.p, self.ops, self.slots).emit(b.module)
        b.call(self._micro, [gep(b, self.x, xoff), gep(b, self.w, woff), gep(b, self.y, yoff), nc, first, last,
                             vrows, vh, vcols, col0, *epi])
