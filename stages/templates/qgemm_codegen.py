"""The int8 GEMM kernel of `qdense`: `Y[M, N] = requant(X[M, K] . W[N, K] + B')` in LLVM IR, and of `qmatmul`
(`requant` None): int32 `Y = X . W + zx * C[n]`, zx a byte read at run time (DynamicQuantizeLinear's zero point)
and C = -sum_k W[n, k] packed at build time.

X (u8, or s8 flipped to u8 on load) is read in place, row-major: one i32 load is the 4-byte
reduction group a lane needs, broadcast to every lane. W arrives packed in panels of `nr = nv *
lanes` columns ([panel][K/4][nr][4], see `qgemm_pack`). The micro-kernel holds an `mr x nv`
tile of int32 accumulators in registers over the whole K (no K blocks: the sums would need an
int32 scratch, and a K x nr panel of bytes stays in L2 for the shapes of real models), then
requantizes in registers and stores bytes once, masked at the edges. Loops, outermost first:
work items (blocks of the parallel axis), panel blocks of `nc`, row-tile blocks of `mc`, then
panels x row tiles in the schedule's order.
"""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from stages.codegen.harness import add_harness
from stages.codegen.irb import (
    F32,
    I1,
    I32,
    I64,
    VOIDP,
    add,
    for_range,
    gep,
    i64,
    loop_carry,
    mul,
    prefix_mask,
    smin,
    store_ints,
)
from stages.codegen.parallel import emit_main
from stages.templates import qgemm_amx as amx_
from stages.templates import qgemm_isa as isa_
from stages.templates import qgemm_requant as rq_
from stages.templates.qgemm_isa import LANES, PARTS, ivec


@dataclass(frozen=True)
class QGemmSpec:
    m: int
    n: int
    k: int
    x_signed: bool
    requant: rq_.Requant | None  # None: int32 output, the run-time zero point's correction instead


@dataclass(frozen=True)
class QSchedule:
    isa: str
    mr: int
    nv: int
    mc: int
    nc: int
    uk: int
    order: str  # "jr_ir": panels outer, row tiles inner; "ir_jr": the reverse
    par: str  # "n", "m" or "none"

    @property
    def lanes(self) -> int:
        return LANES[self.isa]

    @property
    def nr(self) -> int:
        return self.nv * self.lanes

    @classmethod
    def from_knobs(cls, k: dict) -> QSchedule:
        return cls(isa=str(k["isa"]), mr=int(k["mr"]), nv=int(k["nv"]), mc=int(k["mc"]), nc=int(k["nc"]),
                   uk=int(k["uk"]), order=str(k["order"]), par=str(k["par"]))


def row_mask(b: ir.IRBuilder, ok: ir.Value | None, cols: ir.Value | None, lanes: int) -> ir.Value | None:
    """A store mask: the lanes of `cols` (None: all), none at all when `ok` (an i1) is false."""
    if ok is None:
        return cols
    mty = ir.VectorType(I1, lanes)
    rows = b.select(ok, ir.Constant(mty, [1] * lanes), ir.Constant(mty, [0] * lanes))
    return rows if cols is None else b.and_(cols, rows)


class _Gen:
    def __init__(self, spec: QGemmSpec, s: QSchedule):
        self.g, self.s = spec, s
        self.kg = -(-spec.k // 4)
        self.kfull = spec.k // 4  # groups read with one i32 load; a last partial group is read by bytes
        self.tiles = -(-spec.m // s.mr)
        self.panels = -(-spec.n // s.nr)
        self.ib_count = -(-self.tiles // s.mc)
        self.jb_count = -(-self.panels // s.nc)

    def items(self) -> int:
        return {"n": self.jb_count, "m": self.ib_count}.get(self.s.par, 1)

    def emit(self, mod: ir.Module) -> ir.Function:
        s = self.s
        fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [VOIDP, I64, I64]), name="tf_range")
        fn.linkage = "internal"
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        argv = b.bitcast(fn.args[0], VOIDP.as_pointer())
        x, w, bias, scale, y = (b.load(b.gep(argv, [i64(i)])) for i in range(5))
        micro = self._micro(mod)
        if s.isa == "amx":
            amx_.enter(b)
        with for_range(b, fn.args[1], fn.args[2], name="item", unroll=False) as item:
            jc0, jc1 = (item, add(b, item, i64(1))) if s.par == "n" else (i64(0), i64(self.jb_count))
            ic0, ic1 = (item, add(b, item, i64(1))) if s.par == "m" else (i64(0), i64(self.ib_count))
            with for_range(b, jc0, jc1, name="jc", unroll=False) as jc:
                p0 = mul(b, jc, i64(s.nc))
                p1 = smin(b, add(b, p0, i64(s.nc)), i64(self.panels))
                with for_range(b, ic0, ic1, name="ic", unroll=False) as ic:
                    t0 = mul(b, ic, i64(s.mc))
                    t1 = smin(b, add(b, t0, i64(s.mc)), i64(self.tiles))
                    outer, inner = ((p0, p1), (t0, t1)) if s.order == "jr_ir" else ((t0, t1), (p0, p1))
                    with for_range(b, *outer, name="o", unroll=False) as o:
                        with for_range(b, *inner, name="n", unroll=False) as n:
                            p, t = (o, n) if s.order == "jr_ir" else (n, o)
                            b.call(micro, [x, w, bias, scale, y, t, p])
        if s.isa == "amx":
            amx_.leave(b)
        b.ret_void()
        return fn

    def _micro(self, mod: ir.Module) -> ir.Function:
        g, s = self.g, self.s
        lanes, nv, mr, parts = s.lanes, s.nv, s.mr, PARTS[s.isa]
        fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [VOIDP] * 5 + [I64, I64]), name="micro")
        fn.linkage = "internal"
        x, w, bias, scale, y, t, p = fn.args
        for arg in (x, w, bias, scale, y):
            arg.add_attribute("noalias")
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        row0, col0 = mul(b, t, i64(mr)), mul(b, p, i64(s.nr))
        vec_isa = isa_.vector_isa(s.isa)
        vty = ivec(lanes)
        wbytes = gep(b, w, mul(b, p, i64(self.kg * s.nr * 4)))
        wpanel = b.bitcast(wbytes, vty.as_pointer())
        g0 = 0  # the first reduction group the vector loop sums
        if s.isa == "amx":
            row0 = smin(b, row0, i64(g.m - mr))  # the last tile overlaps the one before: no partial tiles
            sums = amx_.scratch(b, mr, nv)
            amx_.accumulate(b, x, wbytes, sums, row0, g.k, mr, nv, s.uk)
            g0 = amx_.chunks(g.k) * amx_.CHUNK // 4
            sptr = b.bitcast(sums, vty.as_pointer())
            accs = [b.load(b.gep(sptr, [i64(i * nv + j)]), align=64) for i in range(mr) for j in range(nv)]
        else:
            accs = [v for _ in range(mr * nv) for v in isa_.zero_acc(s.isa)]
        rows = smin(b, i64(mr), b.sub(i64(g.m), row0))
        xrow = [gep(b, x, mul(b, smin(b, add(b, row0, i64(i)), i64(g.m - 1)), i64(g.k))) for i in range(mr)]
        flip = ir.Constant(I32, 0x80808080 - (1 << 32)) if g.x_signed else None

        def step(kg: ir.Value, acc: list[ir.Value], group: list[ir.Value]) -> None:
            bvec = [b.load(b.gep(wpanel, [add(b, mul(b, kg, i64(nv)), i64(j))]), align=4) for j in range(nv)]
            for i in range(mr):
                av = isa_.splat_i32(b, group[i], lanes)
                for j in range(nv):
                    at = (i * nv + j) * parts
                    acc[at:at + parts] = isa_.dot4(b, vec_isa, acc[at:at + parts], av, bvec[j])

        def load_group(kg: ir.Value) -> list[ir.Value]:
            out = []
            for i in range(mr):
                a = b.load(b.bitcast(gep(b, xrow[i], mul(b, kg, i64(4))), I32.as_pointer()), align=1)
                out.append(b.xor(a, flip) if flip is not None else a)
            return out

        if self.kfull > g0:
            unroll = min(s.uk, self.kfull - g0) if s.isa != "amx" else 1
            with loop_carry(b, i64(g0), i64(self.kfull), accs, name="k", unroll=unroll if unroll > 1 else False) as kg:
                step(kg, accs, load_group(kg))
        if self.kfull < self.kg:
            step(i64(self.kfull), accs, self._tail_group(b, xrow, flip))
        self._store(b, accs, bias, scale, y, row0, col0, rows)
        b.ret_void()
        return fn

    def _tail_group(self, b: ir.IRBuilder, xrow: list[ir.Value], flip: ir.Value | None) -> list[ir.Value]:
        """The last K % 4 bytes of each row as a zero-padded i32 (never reading past the row)."""
        out = []
        for row in xrow:
            a = ir.Constant(I32, 0)
            for q in range(self.g.k % 4):
                byte = b.zext(b.load(gep(b, row, i64(4 * self.kfull + q))), I32)
                if flip is not None:
                    byte = b.xor(byte, ir.Constant(I32, 0x80))
                a = b.or_(a, b.shl(byte, ir.Constant(I32, 8 * q))) if q else byte
            out.append(a)
        return out

    def _store(self, b, accs, bias, scale, y, row0, col0, rows) -> None:
        """Requantized bytes; or (no `requant`) int32 sums plus the zero point (the `scale` slot's byte) times C."""
        g, s = self.g, self.s
        lanes, nv, mr, parts = s.lanes, s.nv, s.mr, PARTS[s.isa]
        vty, fty = ivec(lanes), ir.VectorType(F32, lanes)
        cols = b.trunc(smin(b, i64(s.nr), b.sub(i64(g.n), col0)), I32)
        bptr = b.bitcast(bias, vty.as_pointer())
        sptr = b.bitcast(scale, fty.as_pointer())
        zx = None
        if g.requant is None:
            zx = isa_.splat_i32(b, b.zext(b.load(b.bitcast(scale, ir.IntType(8).as_pointer())), I32), lanes)
        size = 1 if g.requant is not None else 4  # bytes per output element
        ybase = gep(b, y, mul(b, add(b, mul(b, row0, i64(g.n)), col0), i64(size)))
        for j in range(nv):
            cvec = b.udiv(col0, i64(lanes))
            bj = b.load(b.gep(bptr, [add(b, cvec, i64(j))]), align=4)
            sj = b.load(b.gep(sptr, [add(b, cvec, i64(j))]), align=4) if g.requant is not None else None
            cmask = prefix_mask(b, cols, lanes, j * lanes) if g.n % s.nr else None
            for i in range(mr):
                at = (i * nv + j) * parts
                ok = b.icmp_signed("<", i64(i), rows) if (g.m % mr and i) else None
                mask = row_mask(b, ok, cmask, lanes)
                acc = isa_.finish(b, s.isa, accs[at:at + parts])
                if g.requant is None:
                    store_ints(b, b.add(acc, b.mul(zx, bj)), gep(b, ybase, i64(size * (i * g.n + j * lanes))), mask)
                    continue
                out = rq_.emit(b, g.requant, b.add(acc, bj), sj, s.isa != "generic")
                store_ints(b, out, gep(b, ybase, i64(i * g.n + j * lanes)), mask)


def build_module(name: str, spec: QGemmSpec, s: QSchedule, triple: str, threads: int) -> ir.Module:
    """`tf_main(args)` over the work items on `threads` threads, plus the `tf_bench` harness."""
    mod = ir.Module(name=name)
    mod.triple = triple
    gen = _Gen(spec, s)
    rng = gen.emit(mod)
    main = emit_main(mod, rng, gen.items(), 1 if s.par == "none" else threads)
    if s.isa == "amx":
        amx_.request_permission(main)
    add_harness(mod, main)
    return mod

