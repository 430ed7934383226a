"""Codegen of a 3x3 stride-1 conv as Winograd F(m x m, 3 x 3): fewer multiplies, same output.

Every vector holds `L` channels (the target's float lanes). Work items are `rt` tile rows x `L/m`
tiles (`L` output columns) of one image; each
1. finds X (NCHW) packed zero-padded as `[cb][row][col][L]`, `L` channels per position (one `L x L`
   transpose per `L` columns), so a tile's input is `alpha^2` aligned vector loads. Knob `pack`:
   `phase` packs the whole image first, in a parallel phase of its own, into the workspace; `item`
   makes an item a whole row block, which packs its `rt*m + 2` rows on its stack (two rows packed
   by both neighbours) and stays in L1, with one fork and join less;
2. transforms its tiles' input (`B^T d B`, for every channel block) into a stack buffer
   `V[xi][tile][C]`;
3. for each block of `nk` output-channel vectors: `alpha^2` small GEMMs (`V[xi] @ U[xi]`, tiles
   broadcast, channels on the lanes, over all input channels), the output transform `A^T M A`
   per tile, one `L x L` transpose per output row back to NCHW, the fused epilogue, masked stores.

Weights arrive transformed (`U[xi][C][Kp] = G g G^T`, done once at build time by the template).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from llvmlite import ir

from schemas.task import EpilogueOp
from stages.codegen.irb import (
    F32,
    I32,
    add,
    fconst,
    fma,
    for_range,
    gep,
    i64,
    load_vec,
    loop_carry,
    mul,
    prefix_mask,
    smin,
    splat,
    store_vec,
    transpose_square,
    vec,
)
from stages.codegen.parallel import body_args, emit_main, emit_phases, range_body
from stages.graph.epilogue import operands
from stages.templates import epilogue
from stages.templates.conv2d_shape import ConvGeom

# Lavin & Gray's matrices: Y = A^T [(G g G^T) . (B^T d B)] A.
BT = {2: ((1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1)),
      4: ((4, 0, -5, 0, 1, 0), (0, -4, -4, 1, 1, 0), (0, 4, -4, -1, 1, 0), (0, -2, -1, 2, 1, 0),
          (0, 2, -1, -2, 1, 0), (0, 4, 0, -5, 0, 1))}
G = {2: ((1, 0, 0), (0.5, 0.5, 0.5), (0.5, -0.5, 0.5), (0, 0, 1)),
     4: ((1 / 4, 0, 0), (-1 / 6, -1 / 6, -1 / 6), (-1 / 6, 1 / 6, -1 / 6), (1 / 24, 1 / 12, 1 / 6),
         (1 / 24, -1 / 12, 1 / 6), (0, 0, 1))}
MAX_LANES = 16

AT = {2: ((1, 1, 1, 0), (0, 1, -1, -1)),
      4: ((1, 1, 1, 1, 1, 0), (0, 1, -1, 2, -2, 0), (0, 1, 1, 4, 4, 0), (0, 1, -1, 8, -8, 1))}


@dataclass(frozen=True)
class WinoPlan:
    g: ConvGeom
    lanes: int
    m: int  # output tile edge
    rt: int  # tile rows per item
    nk: int  # output-channel vectors per GEMM block
    cu: int  # input channels per unrolled GEMM step
    pack: str  # "phase" (the image, before the items) or "item" (each item its own rows)

    @property
    def alpha(self) -> int:
        return self.m + 2

    @property
    def a2(self) -> int:
        return self.alpha * self.alpha

    @property
    def nt(self) -> int:
        """Tiles along a row per item: their m*nt = L output columns are one transpose (fewer when the
        output is narrower: an 8-wide output computes 2 tiles of 4, not 4)."""
        return min(self.lanes // self.m, -(-self.g.ow // self.m))

    @property
    def tiles(self) -> int:
        return self.rt * self.nt

    @property
    def cb(self) -> int:
        return -(-self.g.c // self.lanes)

    @property
    def kb(self) -> int:
        return -(-self.g.oc // self.lanes)

    @property
    def tile_rows(self) -> int:
        return -(-self.g.oh // self.m)

    @property
    def row_items(self) -> int:
        return -(-self.tile_rows // self.rt)

    @property
    def col_groups(self) -> int:
        """Groups of `L` output columns (an item's tiles along a row)."""
        return -(-self.g.ow // self.lanes)

    @property
    def u_pitch(self) -> int:
        """Floats per row of U: output channels padded to `MAX_LANES`, so the packed weights suit any lane count."""
        return -(-self.g.oc // MAX_LANES) * MAX_LANES

    @property
    def patch_rows(self) -> int:
        """Input rows an item reads: its tile rows' outputs plus the window's 2."""
        return self.rt * self.m + 2

    @property
    def hp(self) -> int:
        """Rows of the packed image: every item's tiles (`pack=phase`)."""
        return self.row_items * self.rt * self.m + 2

    @property
    def wp(self) -> int:
        """Padded width: every item's tiles, and the pack's whole-vector column chunks."""
        return max(self.col_groups * self.lanes + 2, self.g.pl + -(-self.g.w // self.lanes) * self.lanes)

    @property
    def workspace(self) -> int:
        return self.g.n * self.cb * self.hp * self.wp * self.lanes if self.pack == "phase" else 0

    @property
    def accumulators(self) -> int:
        return self.tiles * self.nk


def build(mod: ir.Module, p: WinoPlan, ops: tuple[EpilogueOp, ...], threads: int) -> ir.Function:
    """`tf_main(ptr args)`; args are `[X, U, *epilogue, (workspace), Y]`."""
    n_epi = len(operands(ops))
    items = p.g.n * p.row_items * (1 if p.pack == "item" else p.col_groups)
    tiles = emit_main(mod, _Tiles(p, ops, n_epi).emit(mod), items, threads, name="tf_wtiles")
    if p.pack == "item":
        return emit_phases(mod, [tiles])
    pack = emit_main(mod, _emit_pack(mod, p, ws_slot=2 + n_epi), p.g.n * p.cb * p.hp, threads, name="tf_wpack")
    return emit_phases(mod, [pack, tiles])


def lincomb(b: ir.IRBuilder, coeffs: Sequence[float], xs: Sequence[ir.Value]) -> ir.Value:
    """sum(c * x) with constant coefficients: zeros skipped, +-1 as adds and subtracts."""
    acc: ir.Value | None = None
    for c, x in zip(coeffs, xs, strict=True):
        if c == 0:
            continue
        if acc is None:
            acc = x if c == 1 else b.fmul(x, fconst(x.type, c))
        elif c == 1:
            acc = b.fadd(acc, x)
        elif c == -1:
            acc = b.fsub(acc, x)
        else:
            acc = fma(b, x, fconst(x.type, c), acc)
    assert acc is not None
    return acc


Transform1D = Callable[[ir.IRBuilder, list[ir.Value]], list[ir.Value]]


def sandwich(b: ir.IRBuilder, apply: Transform1D, d: list[list[ir.Value]]) -> list[list[ir.Value]]:
    """`T @ d @ T^T` on a grid of vectors, `apply` being the 1-D transform `x -> T @ x`."""
    cols = [apply(b, [row[s] for row in d]) for s in range(len(d[0]))]  # cols[s][i] = (T @ d)[i][s]
    return [apply(b, [col[i] for col in cols]) for i in range(len(cols[0]))]


def _by_rows(matrix: Sequence[Sequence[float]]) -> Transform1D:
    return lambda b, xs: [lincomb(b, row, xs) for row in matrix]


def _bt4(b: ir.IRBuilder, d: list[ir.Value]) -> list[ir.Value]:
    """`BT[4] @ d` with shared sums: 14 operations where row by row takes 22."""
    def k(v: float) -> ir.Value:
        return fconst(d[0].type, v)

    s12, s34 = b.fadd(d[1], d[2]), b.fadd(d[3], d[4])
    e12, e43 = b.fsub(d[1], d[2]), b.fsub(d[4], d[3])
    e42, e31 = b.fsub(d[4], d[2]), b.fsub(d[3], d[1])
    return [fma(b, d[0], k(4), fma(b, d[2], k(-5), d[4])), fma(b, s12, k(-4), s34), fma(b, e12, k(4), e43),
            fma(b, e31, k(2), e42), fma(b, e31, k(-2), e42), fma(b, d[1], k(4), fma(b, d[3], k(-5), d[5]))]


def _at4(b: ir.IRBuilder, m: list[ir.Value]) -> list[ir.Value]:
    """`AT[4] @ m` with shared sums: 10 operations where row by row takes 14."""
    c = m[0].type
    s12, s34 = b.fadd(m[1], m[2]), b.fadd(m[3], m[4])
    e12, e34 = b.fsub(m[1], m[2]), b.fsub(m[3], m[4])
    return [b.fadd(b.fadd(m[0], s12), s34), fma(b, e34, fconst(c, 2), e12), fma(b, s34, fconst(c, 4), s12),
            b.fadd(fma(b, e34, fconst(c, 8), e12), m[5])]


INPUT_1D: dict[int, Transform1D] = {2: _by_rows(BT[2]), 4: _bt4}
OUTPUT_1D: dict[int, Transform1D] = {2: _by_rows(AT[2]), 4: _at4}



def _emit_pack(mod: ir.Module, p: WinoPlan, ws_slot: int) -> ir.Function:
    """Rows [begin, end) of the (n, padded row, cb) grid of the packed image (`pack=phase`), stored as
    `[n][cb][row]`. Rows outermost, as the tiles' items: a thread packs about the rows its items
    then read, from the rows of X a row-split layer before wrote on that thread (split by channel
    blocks first, half the image changed cores twice a call; on the whole CNN the two measured
    alike within this VM's noise)."""
    fn, b = range_body(mod, "tf_wpack_rows")
    args = body_args(b, fn, ws_slot + 1)
    with for_range(b, fn.args[1], fn.args[2], name="row") as item:
        ny, cb = b.sdiv(item, i64(p.cb)), b.srem(item, i64(p.cb))
        n, yy = b.sdiv(ny, i64(p.hp)), b.srem(ny, i64(p.hp))
        row = add(b, mul(b, add(b, mul(b, n, i64(p.cb)), cb), i64(p.hp)), yy)
        _pack_row(b, p, args[0], gep(b, args[ws_slot], mul(b, row, i64(p.wp * p.lanes))), n, cb,
                  b.sub(yy, i64(p.g.pt)))
    b.ret_void()
    return fn


def _pack_row(b: ir.IRBuilder, p: WinoPlan, x: ir.Value, dst: ir.Value, n: ir.Value, cb: ir.Value,
              y: ir.Value) -> None:
    """Input row `y` (zeros when outside X) of channel block `cb`, zero-padded, as `wp` positions of
    `L` channels from `dst` on: one `L x L` transpose per `L` columns."""
    g, L = p.g, p.lanes
    zero = ir.Constant(vec(L), None)
    chunks = -(-g.w // L)
    inside = b.and_(b.icmp_signed(">=", y, i64(0)), b.icmp_signed("<", y, i64(g.h)))
    with b.if_else(inside) as (then, other):
        with then:
            with for_range(b, i64(0), i64(g.pl), name="zl") as xx:
                store_vec(b, zero, gep(b, dst, mul(b, xx, i64(L))))
            with for_range(b, i64(g.pl + chunks * L), i64(p.wp), name="zr") as xx:
                store_vec(b, zero, gep(b, dst, mul(b, xx, i64(L))))
            c0 = mul(b, cb, i64(L))
            plane = add(b, mul(b, n, i64(g.c)), c0)
            with for_range(b, i64(0), i64(chunks), name="xc") as xc:
                x0 = mul(b, xc, i64(L))
                valid = b.trunc(b.sub(i64(g.w), x0), I32)
                rows = []
                for i in range(L):
                    src = gep(b, x, add(b, mul(b, add(b, plane, i64(i)), i64(g.h * g.w)),
                                        add(b, mul(b, y, i64(g.w)), x0)))
                    ok = b.icmp_signed("<", add(b, c0, i64(i)), i64(g.c))
                    rows.append(b.select(ok, load_vec(b, src, L, _prefix(b, valid, L, ok)), zero))
                for i, v in enumerate(transpose_square(b, rows)):
                    store_vec(b, v, gep(b, dst, mul(b, add(b, i64(g.pl + i), x0), i64(L))))
        with other:
            with for_range(b, i64(0), i64(p.wp), name="z") as xx:
                store_vec(b, zero, gep(b, dst, mul(b, xx, i64(L))))


def _prefix(b: ir.IRBuilder, valid: ir.Value, lanes: int, ok: ir.Value) -> ir.Value:
    """Mask of the first `valid` lanes (none when `ok` is false: a padding channel reads nothing)."""
    return prefix_mask(b, b.select(ok, valid, ir.Constant(I32, 0)), lanes)


class _Tiles:
    def __init__(self, p: WinoPlan, ops: tuple[EpilogueOp, ...], n_epi: int):
        self.p, self.ops, self.n_epi = p, ops, n_epi
        self.slots = operands(ops)

    def emit(self, mod: ir.Module) -> ir.Function:
        p, L = self.p, self.p.lanes
        fn, b = range_body(mod, "tf_wtiles_items")
        args = body_args(b, fn, 3 + self.n_epi + (p.pack == "phase"))
        self.b = b
        self.x, self.u, self.epi, self.y = args[0], args[1], args[2:2 + self.n_epi], args[-1]
        if p.pack == "item":
            self.xbuf = b.alloca(F32, p.cb * p.patch_rows * p.wp * L, name="X")
            self.xbuf.align = 64
        self.vbuf = b.alloca(F32, p.a2 * p.tiles * p.cb * L, name="V")
        self.mbuf = b.alloca(F32, p.tiles * p.nk * p.a2 * L, name="M")
        self.obuf = b.alloca(F32, p.m * L * L, name="O")
        for buf in (self.vbuf, self.mbuf, self.obuf):
            buf.align = 64
        groups = p.col_groups if p.pack == "item" else 1  # column groups per item
        with for_range(b, fn.args[1], fn.args[2], name="item") as item:
            per_image = p.row_items * p.col_groups // groups
            n = b.sdiv(item, i64(per_image))
            rest = b.srem(item, i64(per_image))
            ty0 = mul(b, b.sdiv(rest, i64(p.col_groups // groups)), i64(p.rt))
            if p.pack == "item":
                with for_range(b, i64(0), i64(p.cb), name="pcb") as cb:
                    with for_range(b, i64(0), i64(p.patch_rows), name="prow") as rr:
                        dst = gep(b, self.xbuf, mul(b, add(b, mul(b, cb, i64(p.patch_rows)), rr), i64(p.wp * L)))
                        _pack_row(b, p, self.x, dst, n, cb, b.sub(add(b, mul(b, ty0, i64(p.m)), rr), i64(p.g.pt)))

                def first_row(cb: ir.Value) -> ir.Value:
                    return mul(b, cb, i64(p.patch_rows))
                src = self.xbuf
            else:
                def first_row(cb: ir.Value) -> ir.Value:
                    return add(b, mul(b, add(b, mul(b, n, i64(p.cb)), cb), i64(p.hp)), mul(b, ty0, i64(p.m)))
                src = args[2 + self.n_epi]
            with for_range(b, i64(0), i64(groups), name="grp") as grp:
                col0 = mul(b, add(b, b.srem(rest, i64(p.col_groups // groups)), grp), i64(L))
                self._input_transform(first_row, src, col0)
                with for_range(b, i64(0), i64(p.kb // p.nk), name="kc") as kc:
                    self._gemm(kc)
                    for j in range(p.nk):
                        self._output(n, ty0, col0, add(b, mul(b, kc, i64(p.nk)), i64(j)), j)
        b.ret_void()
        return fn

    def _input_transform(self, first_row: Callable[[ir.Value], ir.Value], src: ir.Value, col0: ir.Value) -> None:
        """`B^T d B` of every tile and channel block into `vbuf`; `src` holds packed X (`wp` positions
        a row), channel block `cb`'s row of this item's first tile row being `first_row(cb)`."""
        b, p, L = self.b, self.p, self.p.lanes
        cp = p.cb * L
        with for_range(b, i64(0), i64(p.tiles), name="t") as t:
            r, tl = b.sdiv(t, i64(p.nt)), b.srem(t, i64(p.nt))
            y0, x0 = mul(b, r, i64(p.m)), add(b, col0, mul(b, tl, i64(p.m)))
            with for_range(b, i64(0), i64(p.cb), name="cb") as cb:
                corner = add(b, mul(b, add(b, first_row(cb), y0), i64(p.wp)), x0)
                d = [[load_vec(b, gep(b, src, mul(b, add(b, corner, i64(rr * p.wp + s)), i64(L))), L)
                      for s in range(p.alpha)] for rr in range(p.alpha)]
                v = sandwich(b, INPUT_1D[p.m], d)
                for xi in range(p.a2):
                    at = add(b, mul(b, add(b, mul(b, i64(xi), i64(p.tiles)), t), i64(cp)), mul(b, cb, i64(L)))
                    store_vec(b, v[xi // p.alpha][xi % p.alpha], gep(b, self.vbuf, at))

    def _gemm(self, kc: ir.Value) -> None:
        """`M[t][j][xi] = sum_c V[xi][t][c] * U[xi][c][kv]` for the block's tiles and k vectors."""
        b, p, g, L = self.b, self.p, self.p.g, self.p.lanes
        cp, kp = p.cb * L, p.u_pitch
        zero = ir.Constant(vec(L), None)
        with for_range(b, i64(0), i64(p.a2), name="xi") as xi:
            vrow = gep(b, self.vbuf, mul(b, xi, i64(p.tiles * cp)))
            urow = gep(b, self.u, add(b, mul(b, xi, i64(g.c * kp)), mul(b, kc, i64(p.nk * L))))
            accs = [zero] * (p.tiles * p.nk)
            with loop_carry(b, i64(0), i64(g.c), accs, step=p.cu, name="c", unroll=False) as c:
                for cc in range(p.cu):
                    ci = add(b, c, i64(cc))
                    us = [load_vec(b, gep(b, urow, add(b, mul(b, ci, i64(kp)), i64(j * L))), L) for j in range(p.nk)]
                    for t in range(p.tiles):
                        v = splat(b, b.load(gep(b, vrow, add(b, i64(t * cp), ci)), align=4), L)
                        for j in range(p.nk):
                            accs[t * p.nk + j] = fma(b, v, us[j], accs[t * p.nk + j])
            for t in range(p.tiles):
                for j in range(p.nk):
                    at = add(b, mul(b, xi, i64(L)), i64((t * p.nk + j) * p.a2 * L))
                    store_vec(b, accs[t * p.nk + j], gep(b, self.mbuf, at))

    def _output(self, n: ir.Value, ty0: ir.Value, col0: ir.Value, kv: ir.Value, j: int) -> None:
        """Tiles' `A^T M A` for k vector `kv`, transposed back to rows of `L` columns, epilogue, store."""
        b, p, g, L = self.b, self.p, self.p.g, self.p.lanes
        with for_range(b, i64(0), i64(p.rt), name="r") as r:
            with for_range(b, i64(0), i64(p.nt), name="tl") as tl:
                t = add(b, mul(b, r, i64(p.nt)), tl)
                base = mul(b, add(b, mul(b, t, i64(p.nk)), i64(j)), i64(p.a2 * L))
                mt = [[load_vec(b, gep(b, self.mbuf, add(b, base, i64((i * p.alpha + s) * L))), L)
                       for s in range(p.alpha)] for i in range(p.alpha)]
                o = sandwich(b, OUTPUT_1D[p.m], mt)
                for a in range(p.m):
                    for c in range(p.m):
                        at = add(b, i64(a * L * L + c * L), mul(b, tl, i64(p.m * L)))
                        store_vec(b, o[a][c], gep(b, self.obuf, at))
            with for_range(b, i64(0), i64(p.m), name="a") as a:
                row = add(b, mul(b, add(b, ty0, r), i64(p.m)), a)
                with b.if_then(b.icmp_signed("<", row, i64(g.oh))):
                    ob = gep(b, self.obuf, mul(b, a, i64(L * L)))
                    cols = transpose_square(b, [load_vec(b, gep(b, ob, i64(x * L)), L) for x in range(L)])
                    valid = b.trunc(smin(b, b.sub(i64(g.ow), col0), i64(L)), I32)
                    mask = prefix_mask(b, valid, L)
                    for i in range(L):
                        k = add(b, mul(b, kv, i64(L)), i64(i))
                        with b.if_then(b.icmp_signed("<", k, i64(g.oc))):
                            at = add(b, mul(b, add(b, mul(b, n, i64(g.oc)), k), i64(g.oh * g.ow)),
                                     add(b, mul(b, row, i64(g.ow)), col0))
                            out = epilogue.emit(b, self.ops, cols[i], self._loader(k, at, mask))
                            store_vec(b, out, gep(b, self.y, at), mask)

    def _loader(self, k: ir.Value, at: ir.Value, mask: ir.Value) -> Callable[[int], ir.Value]:
        b, L = self.b, self.p.lanes

        def load(slot: int) -> ir.Value:
            if self.slots[slot].per_channel:
                return splat(b, b.load(gep(b, self.epi[slot], k), align=4), L)
            return load_vec(b, gep(b, self.epi[slot], at), L, mask)
        return load
