"""The direct conv2d's register-tiled micro-kernel `tf_micro`: one tile's reduction over one
input-channel block, and the epilogue and stores on the last.

Vectors run along the output width (so activations stay NCHW and the output is stored as it is,
no layout transform): a register tile holds `mr` output channels x `rh` output rows x `nw`
vectors of `vw` output columns. Each reduction step broadcasts `mr` weights and loads `rh*nw`
input vectors, like a GEMM micro-kernel whose A panel is the packed weights. With `axis=oc` the
lanes hold output channels instead (weight vectors, input pixels broadcast, as NCHWc kernels do)
and each `vw x vw` block is transposed in registers before the epilogue, so Y stays NCHW.
Group convolutions tile the global output-channel axis: a tile inside one group shares its
input vectors; a tile spanning whole groups (depthwise) loads each group's own input.
"""

from __future__ import annotations

from llvmlite import ir

from schemas.task import EpilogueOp
from stages.codegen.irb import (
    F32P,
    I1,
    I64,
    add,
    fma,
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
from stages.graph.epilogue import Operand
from stages.templates import epilogue
from stages.templates.conv2d_loop import loop
from stages.templates.conv2d_plan import Plan


def prefetch(b: ir.IRBuilder, ptr: ir.Value) -> None:
    """A read prefetch of `ptr`'s line into every cache level (never faults, even past a buffer's end)."""
    i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
    fn = b.module.globals.get("llvm.prefetch.p0")
    if fn is None:
        fn = ir.Function(b.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]), name="llvm.prefetch.p0")
    b.call(fn, [b.bitcast(ptr, i8p), ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])


class Micro:
    """Y[tile] (+)= the tile's reduction over one input-channel block, then the epilogue on the last block.

    One function serves every tile: how many channels, rows and columns of the tile lie inside the
    output arrive as arguments and become store masks (edge tiles compute on zero weights or
    masked-off lanes and never write outside Y).
    """

    def __init__(self, p: Plan, ops: tuple[EpilogueOp, ...], slots: tuple[Operand, ...]) -> None:
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
            with loop(b, i64(0), main_end, step=p.uk, name="c") as c0:
                for u in range(p.uk):
                    body(add(b, c0, i64(u)))
            if p.uk > 1:
                with loop(b, main_end, nc, name="cr") as cr:
                    body(cr)

        def columns(body, kh: ir.Value) -> None:
            if p.unroll >= 1:
                for kw in range(g.kw):
                    body(kh, i64(kw))
            else:
                with loop(b, i64(0), i64(g.kw), name="kw") as kw:
                    body(kh, kw)

        def window(body) -> None:
            if p.unroll == 2:
                for kh in range(g.kh):
                    columns(body, i64(kh))
            else:
                with loop(b, i64(0), i64(g.kh), name="kh") as kh:
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
        """`mr/vw` weight vectors x each pixel of the tile broadcast (channels along the lanes). Each weight
        vector's place in the next tile's panel (the next call's) is prefetched: a layer's weights stream from
        memory once per call, too few FMAs per line for the hardware prefetcher to hide (1x1 192x7x7 -> 1152:
        36% of its samples on the weight load)."""
        p, b = self.p, self.b
        for o in range(p.mr // p.vw):
            prefetch(b, gep(b, w, add(b, woff, i64(o * p.vw + p.panel))))
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
