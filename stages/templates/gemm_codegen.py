"""BLIS-style float32 GEMM code generator shared by matmul, dense and batch matmul.

`C[b] = alpha * A[b] @ B[b]`, then the fused epilogue, for every output batch `b`. Loops,
outermost first: parallel work items (batch x blocks of the parallel axis), N blocks of `nc`
panels, K blocks of `kc`, M blocks of `mc` row tiles (A optionally packed per block into an
`mr`-interleaved panel, so the micro-kernel streams it), then panels x row tiles in the
schedule's order. The micro-kernel keeps an `mr x nv*vw` tile of C in vector registers over a
whole K block; on the last K block it scales by alpha, applies the epilogue in registers and
stores once. Edges are handled at run time by masked loads/stores. Where N leaves a part panel
that fewer vectors cover, that panel gets a micro-kernel of its own, only as wide as it (`nv_edge`):
ViT's 197-token score batch matmul computed 256 columns for 197 with one kernel for every panel.

B is either packed at build time into panels `Bp[ceil(N/nr)][K][nr]` (zero-padded on N, by
`gemm_operands`), or read in place as row-major `(K, N)` (activations, e.g. attention's batch matmul).
Rows of A, of an unpacked B and of C may sit further apart than their length (`lda`, `ldb`, `ldc`) and
each batch at its own offsets: a batch matmul built to read its operands and write its result where
attention's head transposes would have copied them (`stages/build/gemm_views.py`).
With packed B walked panel by panel (`jr_ir`), each micro call prefetches its share of the B block the
next K block (or the next panel block) reads, spread over the block's row tiles: a model's weights come
from memory cold (ViT-B/16's dense kernels ran 240 GFLOPS hot, 231 in the model; the whole model 0.97-0.99x
the time without, BERT-2L 0.98x, GPT-2-2L 0.94x, Zen 5).
Kernel arguments: `[A, B, *epilogue tensors, C]` (see `epilogue`).
"""

from __future__ import annotations

from dataclasses import dataclass

from llvmlite import ir

from schemas.task import EpilogueOp
from stages.codegen.harness import add_harness
from stages.codegen.irb import (
    F32,
    F32P,
    I1,
    I32,
    I64,
    VOIDP,
    add,
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
    vec,
)
from stages.codegen.parallel import emit_main
from stages.graph.epilogue import operands
from stages.templates import epilogue
from stages.templates.conv2d_micro import prefetch

PACK_A_LIMIT = 1 << 20  # bytes of stack scratch per thread for a packed A block


@dataclass(frozen=True)
class GemmSpec:
    """What to compute. Offsets and strides are in float elements."""

    m: int
    n: int
    k: int
    batch_offsets: tuple[tuple[int, int, int], ...] = ((0, 0, 0),)  # per output batch: (A, B, C) offsets
    a_trans: bool = False  # A stored as (K, M)
    b_packed: bool = True
    alpha: float = 1.0
    epilogue: tuple[EpilogueOp, ...] = ()
    lda: int = 0  # row strides of A (not transposed), of an unpacked B and of C; 0: the row length
    ldb: int = 0
    ldc: int = 0

    def __post_init__(self) -> None:
        dense_c = all(c == i * self.m * self.n for i, (_, _, c) in enumerate(self.batch_offsets))
        if (self.ldc not in (0, self.n) or not dense_c) and any(not s.per_channel for s in operands(self.epilogue)):
            raise ValueError("an epilogue tensor shaped like C is read at C's offsets: C must be contiguous")

    @property
    def batch(self) -> int:
        return len(self.batch_offsets)


@dataclass(frozen=True)
class Schedule:
    mr: int
    nv: int
    vw: int
    kc: int
    mc: int
    nc: int
    uk: int
    order: str  # "jr_ir": panels outer, row tiles inner (B micro-panel stays in L1); "ir_jr": the reverse
    pack_a: bool
    par: str  # "m" or "n": the axis whose blocks threads split; "none": one thread (small work)

    @property
    def nr(self) -> int:
        return self.nv * self.vw

    @classmethod
    def from_knobs(cls, k: dict) -> Schedule:
        ints = {x: int(k[x]) for x in ("mr", "nv", "vw", "kc", "mc", "nc", "uk")}
        return cls(**ints, order=str(k["order"]), pack_a=bool(int(k["pack_a"])), par=str(k["par"]))


def work_items(spec: GemmSpec, s: Schedule) -> int:
    """Independent items the parallel loop runs over: batch x blocks of the parallel axis."""
    tiles = -(-spec.m // s.mr)
    panels = -(-spec.n // s.nr)
    per = {"m": -(-tiles // s.mc), "n": -(-panels // s.nc)}.get(s.par, 1)
    return spec.batch * per


def emit_range(mod: ir.Module, spec: GemmSpec, s: Schedule) -> ir.Function:
    """`tf_range(ptr args, i64 begin, i64 end)`: work items [begin, end)."""
    return _Gen(spec, s).emit(mod)


class _Gen:
    def __init__(self, spec: GemmSpec, s: Schedule):
        self.g, self.s = spec, s
        self.tiles = -(-spec.m // s.mr)
        self.panels = -(-spec.n // s.nr)
        self.ib_count = -(-self.tiles // s.mc)
        self.jb_count = -(-self.panels // s.nc)
        self.kb_count = -(-spec.k // s.kc)
        self.n_epi = len(operands(spec.epilogue))
        # A element (row i, reduction k) lives at i * ars + k * aks
        self.ars, self.aks = (1, spec.m) if spec.a_trans else (spec.lda or spec.k, 1)
        self.ldb, self.ldc = spec.ldb or spec.n, spec.ldc or spec.n
        self.nv_edge = -(-(spec.n - (self.panels - 1) * s.nr) // s.vw)  # vectors the last panel needs

    def emit(self, mod: ir.Module) -> ir.Function:
        g, s = self.g, self.s
        fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [VOIDP, I64, I64]), name="tf_range")
        fn.linkage = "internal"
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        argv = b.bitcast(fn.args[0], F32P.as_pointer())
        ptrs = [b.load(b.gep(argv, [i64(i)])) for i in range(3 + self.n_epi)]
        a, bm, c, epi = ptrs[0], ptrs[1], ptrs[-1], ptrs[2:-1]
        buf = None
        if s.pack_a:
            buf = b.alloca(F32, size=i64(s.mc * s.mr * s.kc))
            buf.align = 64
        micro = self._micro_fn(mod, s.nv, "micro", edge_cols=self.nv_edge == s.nv and g.n % s.nr != 0)
        micro_edge = self._micro_fn(mod, self.nv_edge, "micro_edge", True) if self.nv_edge < s.nv else None
        per = {"m": self.ib_count, "n": self.jb_count}.get(s.par, 1)
        offsets = self._offsets_table(mod)
        with for_range(b, fn.args[1], fn.args[2], name="item", unroll=False) as item:
            if g.batch == 1:
                blk = item
                aoff, boff, c_base = (i64(o) for o in g.batch_offsets[0])
            else:
                bi, blk = b.sdiv(item, i64(per)), b.srem(item, i64(per))
                aoff, boff, c_base = (b.load(b.gep(offsets, [i64(0), add(b, mul(b, bi, i64(3)), i64(j))]))
                                      for j in range(3))
            a_b, b_b = gep(b, a, aoff), gep(b, bm, boff)
            jc0, jc1 = (blk, add(b, blk, i64(1))) if s.par == "n" else (i64(0), i64(self.jb_count))
            ic0, ic1 = (blk, add(b, blk, i64(1))) if s.par == "m" else (i64(0), i64(self.ib_count))
            with for_range(b, jc0, jc1, name="jc", unroll=False) as jc:
                p0 = mul(b, jc, i64(s.nc))
                p1 = smin(b, add(b, p0, i64(s.nc)), i64(self.panels))
                with for_range(b, i64(0), i64(self.kb_count), name="pb", unroll=False) as pb:
                    pc = mul(b, pb, i64(s.kc))
                    kl = smin(b, i64(s.kc), b.sub(i64(g.k), pc))
                    first = b.icmp_signed("==", pb, i64(0))
                    last = b.icmp_signed("==", pb, i64(self.kb_count - 1))
                    with for_range(b, ic0, ic1, name="ic", unroll=False) as ic:
                        t0 = mul(b, ic, i64(s.mc))
                        t1 = smin(b, add(b, t0, i64(s.mc)), i64(self.tiles))
                        if buf is not None:
                            self._pack_a(b, a_b, buf, t0, t1, pc, kl)
                        ctx = dict(a=a_b, buf=buf, bm=b_b, c=c, epi=epi, c_base=c_base, pc=pc, kl=kl,
                                   first=first, last=last, t0=t0, micro=micro, micro_edge=micro_edge)
                        outer, inner = ((p0, p1), (t0, t1)) if s.order == "jr_ir" else ((t0, t1), (p0, p1))
                        with for_range(b, *outer, name="o", unroll=False) as o:
                            with for_range(b, *inner, name="n", unroll=False) as n:
                                p, t = (o, n) if s.order == "jr_ir" else (n, o)
                                self._call(b, ctx, t, p)
        b.ret_void()
        return fn

    def _offsets_table(self, mod: ir.Module) -> ir.GlobalVariable | None:
        if self.g.batch == 1:
            return None
        flat = [v for pair in self.g.batch_offsets for v in pair]
        ty = ir.ArrayType(I64, len(flat))
        gv = ir.GlobalVariable(mod, ty, name="batch_offsets")
        gv.global_constant = True
        gv.linkage = "internal"
        gv.initializer = ir.Constant(ty, flat)
        return gv

    def _pack_a(self, b: ir.IRBuilder, a: ir.Value, buf: ir.Value, t0, t1, pc, kl) -> None:
        """buf[t - t0][kk][i] = A[t*mr + i, pc + kk], rows past M as zeros."""
        g, s = self.g, self.s
        with for_range(b, t0, t1, name="pt", unroll=False) as t:
            row0 = mul(b, t, i64(s.mr))
            dst = gep(b, buf, mul(b, b.sub(t, t0), i64(s.kc * s.mr)))
            srcs, valid = [], []
            for i in range(s.mr):
                row = add(b, row0, i64(i))
                valid.append(b.icmp_signed("<", row, i64(g.m)))
                row = smin(b, row, i64(g.m - 1))
                srcs.append(gep(b, a, add(b, mul(b, row, i64(self.ars)), mul(b, pc, i64(self.aks)))))
            with for_range(b, i64(0), kl, name="pk", unroll=False) as kk:
                koff = mul(b, kk, i64(self.aks))
                drow = gep(b, dst, mul(b, kk, i64(s.mr)))
                for i in range(s.mr):
                    x = b.load(gep(b, srcs[i], koff))
                    if s.mr * (self.tiles - 1) + i >= g.m:
                        x = b.select(valid[i], x, ir.Constant(F32, 0.0))
                    b.store(x, gep(b, drow, i64(i)))

    def _call(self, b: ir.IRBuilder, ctx: dict, t: ir.Value, p: ir.Value) -> None:
        g, s = self.g, self.s
        row0 = mul(b, t, i64(s.mr))
        col0 = mul(b, p, i64(s.nr))
        rows = smin(b, i64(s.mr), b.sub(i64(g.m), row0))
        cols = smin(b, i64(s.nr), b.sub(i64(g.n), col0))
        if ctx["buf"] is not None:
            aptr = gep(b, ctx["buf"], mul(b, b.sub(t, ctx["t0"]), i64(s.kc * s.mr)))
        else:
            aptr = gep(b, ctx["a"], add(b, mul(b, row0, i64(self.ars)), mul(b, ctx["pc"], i64(self.aks))))
        if g.b_packed:
            bptr = gep(b, ctx["bm"], add(b, mul(b, p, i64(g.k * s.nr)), mul(b, ctx["pc"], i64(s.nr))))
        else:
            bptr = gep(b, ctx["bm"], add(b, mul(b, ctx["pc"], i64(self.ldb)), col0))
        c_off = add(b, ctx["c_base"], add(b, mul(b, row0, i64(self.ldc)), col0))
        args = [aptr, bptr, ctx["c"], c_off, col0, ctx["kl"], ctx["first"], ctx["last"], rows, cols,
                self._pf_ptr(b, ctx, t, p, bptr), *ctx["epi"]]
        if ctx["micro_edge"] is None:
            b.call(ctx["micro"], args)
            return
        with b.if_else(b.icmp_signed("==", p, i64(self.panels - 1))) as (edge, full):
            with edge:
                b.call(ctx["micro_edge"], args)
            with full:
                b.call(ctx["micro"], args)

    def _pf_lines(self) -> int:
        """Lines of the next B block each micro call prefetches (0: none)."""
        g, s = self.g, self.s
        if not (g.b_packed and s.order == "jr_ir") or self.tiles < 2:
            return 0
        return -(-(s.kc * s.nr // 16) // self.tiles)

    def _pf_ptr(self, b: ir.IRBuilder, ctx: dict, t: ir.Value, p: ir.Value, bptr: ir.Value) -> ir.Value:
        """Tile t's slice of the B block panel p reads next: its next K block, or after the last one
        panel p + nc's first (the next panel block's)."""
        g, s = self.g, self.s
        lines = self._pf_lines()
        if not lines:
            return bptr
        same = gep(b, bptr, i64(s.kc * s.nr))
        nxt = gep(b, ctx["bm"], mul(b, add(b, p, i64(s.nc)), i64(g.k * s.nr)))
        base = b.select(ctx["last"], nxt, same)
        return gep(b, base, mul(b, t, i64(lines * 16)))

    def _micro_fn(self, mod: ir.Module, nv: int, name: str, edge_cols: bool) -> ir.Function:
        """C tile (+)= A tile @ B micro-panel over one K block, `nv` vectors wide (columns masked at run
        time where `edge_cols`); epilogue and store on the last."""
        g, s = self.g, self.s
        vw, mr = s.vw, s.mr
        argty = [F32P, F32P, F32P, I64, I64, I64, I1, I1, I64, I64, F32P] + [F32P] * self.n_epi
        fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), argty), name=name)
        fn.linkage = "internal"
        a, bp, c, c_off, col0, kl, first, last, rows, cols, pf, *epi = fn.args
        for arg in (a, bp, c, *epi):
            arg.add_attribute("noalias")
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        vty = vec(vw)
        tile = b.alloca(ir.ArrayType(vty, mr * nv))
        edge_rows = g.m % mr != 0
        col_mask = [self._mask(b, cols, j * vw, vw) if edge_cols else None for j in range(nv)]
        row_ok = [b.icmp_signed("<", i64(i), rows) if (edge_rows and i) else None for i in range(mr)]
        masks = [[_and_mask(b, col_mask[j], row_ok[i], vw) for j in range(nv)] for i in range(mr)]
        cptr = gep(b, c, c_off)
        crow = [gep(b, cptr, i64(i * self.ldc)) for i in range(mr)]
        zero = ir.Constant(vty, None)
        if self.kb_count == 1:
            accs: list[ir.Value] = [zero] * (mr * nv)
        else:
            accs = [b.select(first, zero, load_vec(b, gep(b, crow[i], i64(j * vw)), vw, masks[i][j]))
                    for i in range(mr) for j in range(nv)]
        if s.pack_a:
            arow = [gep(b, a, i64(i)) for i in range(mr)]
            a_step = mr
        else:
            arow = [gep(b, a, mul(b, smin(b, i64(i), b.sub(rows, i64(1))), i64(self.ars))) for i in range(mr)]
            a_step = self.aks
        b_step = s.nr if g.b_packed else self.ldb
        bmask = col_mask if not g.b_packed else [None] * nv

        pf_lines = self._pf_lines()

        def step(kk: ir.Value, acc: list[ir.Value]) -> None:
            if pf_lines:
                prefetch(b, gep(b, pf, mul(b, smin(b, kk, i64(pf_lines - 1)), i64(16))))
            brow = gep(b, bp, mul(b, kk, i64(b_step)))
            bvec = [load_vec(b, gep(b, brow, i64(j * vw)), vw, bmask[j]) for j in range(nv)]
            koff = mul(b, kk, i64(a_step))
            for i in range(mr):
                sv = splat(b, b.load(gep(b, arow[i], koff)), vw)
                for j in range(nv):
                    acc[i * nv + j] = fma(b, sv, bvec[j], acc[i * nv + j])

        # K unrolled by `uk` through loop metadata: LLVM unrolls late (remainder included), so its
        # earlier passes clean up one step instead of `uk` (a quarter less compile time, same code).
        with loop_carry(b, i64(0), kl, accs, name="k", unroll=s.uk if s.uk > 1 else False) as k0:
            step(k0, accs)

        def store() -> None:
            for i in range(mr):
                for j in range(nv):
                    store_vec(b, accs[i * nv + j], gep(b, crow[i], i64(j * vw)), masks[i][j])

        if not (g.epilogue or g.alpha != 1.0):
            store()
        elif self.kb_count == 1:
            self._finish_rows(b, accs, tile, cptr, epi, c_off, col0, rows, col_mask, nv)
        else:
            with b.if_else(last) as (then, other):
                with then:
                    self._finish_rows(b, accs, tile, cptr, epi, c_off, col0, rows, col_mask, nv)
                with other:
                    store()
        b.ret_void()
        return fn

    def _finish_rows(self, b, accs, tile, cptr, epi, c_off, col0, rows, col_mask, nv: int) -> None:
        """Alpha and the epilogue, applied row by row in a loop (one copy of the chain per vector
        column, not per tile element: long chains stay cheap to compile), then the store."""
        g, vw = self.g, self.s.vw
        for idx, v in enumerate(accs):
            b.store(v, b.gep(tile, [ir.Constant(I32, 0), ir.Constant(I32, idx)]))
        slots = operands(g.epilogue)
        with for_range(b, i64(0), rows, name="er", unroll=False) as i:
            roff = mul(b, i, i64(self.ldc))
            for j in range(nv):
                v = b.load(b.gep(tile, [i64(0), add(b, mul(b, i, i64(nv)), i64(j))]))
                if g.alpha != 1.0:
                    v = b.fmul(v, ir.Constant(vec(vw), [g.alpha] * vw))

                def load(slot: int, j=j) -> ir.Value:
                    if slots[slot].per_channel:
                        return load_vec(b, gep(b, epi[slot], add(b, col0, i64(j * vw))), vw, col_mask[j])
                    off = add(b, c_off, add(b, roff, i64(j * vw)))
                    return load_vec(b, gep(b, epi[slot], off), vw, col_mask[j])

                v = epilogue.emit(b, g.epilogue, v, load)
                store_vec(b, v, gep(b, cptr, add(b, roff, i64(j * vw))), col_mask[j])

    @staticmethod
    def _mask(b: ir.IRBuilder, cols: ir.Value, first_lane: int, vw: int) -> ir.Value:
        """Lanes `first_lane + l < cols` as an <vw x i1> mask."""
        return prefix_mask(b, b.trunc(cols, I32), vw, first_lane)


def _and_mask(b: ir.IRBuilder, cols: ir.Value | None, row_ok: ir.Value | None, vw: int) -> ir.Value | None:
    if row_ok is None:
        return cols
    mty = ir.VectorType(I1, vw)
    rows = b.select(row_ok, ir.Constant(mty, [1] * vw), ir.Constant(mty, [0] * vw))
    return rows if cols is None else b.and_(cols, rows)


def build_module(name: str, spec: GemmSpec, s: Schedule, triple: str, threads: int) -> ir.Module:
    """The whole kernel: `tf_main` over the work items on `threads` threads, plus `tf_bench`."""
    mod = ir.Module(name=name)
    mod.triple = triple
    threads = 1 if s.par == "none" else threads
    add_harness(mod, emit_main(mod, emit_range(mod, spec, s), work_items(spec, s), threads))
    return mod
