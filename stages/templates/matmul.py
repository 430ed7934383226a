"""float32 matmul C[M,N] = A[M,K] @ B[K,N] as a BLIS-style blocked kernel.

B is packed once (at build time) into panels `Bp[N/nr][K][nr]`, zero-padded on N, so the
micro-kernel reads it as unit-stride vectors. Loops, outermost first: N blocks of `nc` panels,
K blocks of `kc`, M blocks of `mc` row tiles, panels, row tiles; the micro-kernel keeps an
`mr x nr` tile of C in vector registers for the whole K block. All shapes are compile-time
constants, so edges (M % mr rows, N % nr columns) get their own specialised micro-kernels.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from schemas.config import Config
from schemas.target import Target
from schemas.task import TuningTask, matmul_task
from stages.codegen.harness import add_harness
from stages.codegen.irb import (
    F32P,
    I1,
    I64,
    VOIDP,
    add,
    fma,
    for_range,
    gep,
    i64,
    mul,
    smin,
    splat,
    vec,
)
from stages.codegen.parallel import emit_main
from stages.templates.space import ConfigSpace, Knob, Knobs

NAME = "matmul"
VERSION = 1

MR = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 14, 16)
NV = (1, 2, 3, 4)
VW = (4, 8, 16)
KC = (16, 32, 64, 128, 192, 256, 384, 512)
MC = (1, 2, 4, 8, 16, 32, 64)
NC = (1, 2, 4, 8, 16, 32, 64)
UK = (1, 2, 4, 8)

CLI_OPTIONS = ("m", "n", "k")


def task_from_cli(opts: dict) -> TuningTask:
    """The task `tunaflow tune-op matmul --m M --n N --k K` means."""
    missing = [f"--{o}" for o in CLI_OPTIONS if opts.get(o) is None]
    if missing:
        raise ValueError(f"matmul needs {', '.join(missing)}")
    return matmul_task(int(opts["m"]), int(opts["n"]), int(opts["k"]))


def dims(task: TuningTask) -> tuple[int, int, int]:
    (m, k), (k2, n) = task.inputs[0].shape, task.inputs[1].shape
    if k != k2:
        raise ValueError(f"matmul inner dimensions differ: A is {m}x{k}, B is {k2}x{n}")
    return m, n, k

def space(task: TuningTask, target: Target) -> ConfigSpace:
    m, n, k = dims(task)
    regs = target.vector_registers
    lanes = target.vector_lanes

    def rule(c: Knobs) -> str | None:
        mr, nv, vw, kc, mc, nc, uk = (int(c[x]) for x in ("mr", "nv", "vw", "kc", "mc", "nc", "uk"))
        if vw > lanes:
            return f"vw={vw} exceeds the target's {lanes} float lanes"
        if mr * nv + nv + 1 > regs:
            return f"an {mr}x{nv} register tile needs {mr * nv + nv + 1} vector registers, target has {regs}"
        if mr > m:
            return f"mr={mr} exceeds M={m}"
        if (nv - 1) * vw >= n:
            return f"nv={nv} vectors of {vw} leave a whole vector past N={n}"
        if kc // 2 >= k and kc != KC[0]:
            return f"kc={kc} is over twice K={k}"
        if uk > kc:
            return f"uk={uk} exceeds kc={kc}"
        if mc > 1 and (mc // 2) * mr >= m:
            return f"mc={mc} row tiles of {mr} cover M={m} more than twice"
        if nc > 1 and (nc // 2) * nv * vw >= n:
            return f"nc={nc} panels of {nv * vw} cover N={n} more than twice"
        return None

    knobs = (Knob("mr", MR), Knob("nv", NV), Knob("vw", VW), Knob("kc", KC), Knob("mc", MC),
             Knob("nc", NC), Knob("uk", UK))
    return ConfigSpace(knobs=knobs, rule=rule)

def default_config(task: TuningTask, target: Target) -> Config:
    """BLIS-like heuristic: widest vectors, a register tile that fills the register file, the B
    micro-panel in half of L1 and the A block in half of L2."""
    m, n, k = dims(task)
    sp = space(task, target)
    vw = target.vector_lanes
    nv = 2 if n > vw else 1
    mr = min(m, max(r for r in MR if r * nv + nv + 1 <= target.vector_registers))
    mr = max(r for r in MR if r <= mr)
    kc = _fit(KC, max(16, target.l1_bytes // 2 // (nv * vw * 4)), k)
    mc = _fit(MC, max(1, target.l2_bytes // 2 // (kc * 4 * mr)), -(-m // mr))
    nc = _fit(NC, max(1, target.l3_bytes // 4 // (kc * 4 * nv * vw)), -(-n // (nv * vw)))
    knobs: Knobs = {"mr": mr, "nv": nv, "vw": vw, "kc": kc, "mc": mc, "nc": nc, "uk": 4 if kc >= 4 else 1}
    for uk in (4, 2, 1):
        knobs["uk"] = uk
        if sp.reason(knobs) is None:
            return sp.from_knobs(knobs)
    return sp.from_knobs(knobs)

def _fit(choices: tuple[int, ...], want: int, extent: int) -> int:
    """The largest choice <= want, but no larger than needed to cover `extent`."""
    fitting = [c for c in choices if c <= want] or [choices[0]]
    covering = [c for c in choices if c >= extent]
    return min(max(fitting), min(covering)) if covering else max(fitting)

def make_inputs(task: TuningTask, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, size=t.shape).astype(np.float32) for t in task.inputs]

def reference(task: TuningTask, inputs: list[np.ndarray]) -> np.ndarray:
    a, b = inputs
    return (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)

def pack_b(b: np.ndarray, nr: int) -> np.ndarray:
    """B[K,N] → Bp[ceil(N/nr)][K][nr], zero-padded: done once, at build time."""
    k, n = b.shape
    panels = -(-n // nr)
    padded = np.zeros((k, panels * nr), dtype=np.float32)
    padded[:, :n] = b
    return np.ascontiguousarray(padded.reshape(k, panels, nr).transpose(1, 0, 2))

def kernel_args(task: TuningTask, knobs: Knobs, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """The buffers `tf_main` takes, in order: A, packed B, C (the output, last)."""
    m, n, _ = dims(task)
    a, b = inputs
    return [np.ascontiguousarray(a), pack_b(b, int(knobs["nv"]) * int(knobs["vw"])),
            np.zeros((m, n), dtype=np.float32)]

def build_ir(task: TuningTask, knobs: Knobs, target: Target, threads: int = 1) -> ir.Module:
    m, n, k = dims(task)
    g = _Gen(m, n, k, {name: int(v) for name, v in knobs.items()})
    mod = ir.Module(name=f"matmul_{m}x{n}x{k}")
    mod.triple = target.triple
    add_harness(mod, emit_main(mod, g.emit_range(mod), g.n_blocks, threads))
    return mod

class _Gen:
    def __init__(self, m: int, n: int, k: int, c: dict[str, int]):
        self.m, self.n, self.k = m, n, k
        self.mr, self.vw, self.kc, self.uk = c["mr"], c["vw"], c["kc"], c["uk"]
        self.nr = c["nv"] * c["vw"]
        self.nv = c["nv"]
        self.mc, self.nc = c["mc"], c["nc"]
        self.panels = -(-n // self.nr)
        self.full_panels = n // self.nr
        self.tail_cols = n - self.full_panels * self.nr
        self.row_tiles = m // self.mr
        self.tail_rows = m - self.row_tiles * self.mr
        self._micro: dict[tuple[int, int], ir.Function] = {}

    @property
    def n_blocks(self) -> int:
        """Blocks of `nc` panels along N: the parallel axis."""
        return -(-self.panels // self.nc)

    def emit_range(self, mod: ir.Module) -> ir.Function:
        """`tf_range(ptr args, i64 begin, i64 end)`: the N blocks [begin, end)."""
        fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [VOIDP, I64, I64]), name="tf_range")
        fn.linkage = "internal"
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        argv = b.bitcast(fn.args[0], F32P.as_pointer())
        a, bp, c = (b.load(b.gep(argv, [i64(i)])) for i in range(3))
        with for_range(b, fn.args[1], fn.args[2], name="jb") as jb:
            self._n_block(b, a, bp, c, jb)
        b.ret_void()
        return fn

    def _n_block(self, b: ir.IRBuilder, a: ir.Value, bp: ir.Value, c: ir.Value, jb: ir.Value) -> None:
        p0 = mul(b, jb, i64(self.nc))
        p1 = smin(b, add(b, p0, i64(self.nc)), i64(self.panels))
        n_ib = max(1, -(-self.row_tiles // self.mc))
        n_pb = -(-self.k // self.kc)
        with for_range(b, i64(0), i64(n_pb), name="pb") as pb:
            pc = mul(b, pb, i64(self.kc))
            kl = smin(b, i64(self.kc), b.sub(i64(self.k), pc))
            first = b.icmp_signed("==", pb, i64(0))
            with for_range(b, i64(0), i64(n_ib), name="ib") as ib:
                t0 = mul(b, ib, i64(self.mc))
                t1 = smin(b, add(b, t0, i64(self.mc)), i64(self.row_tiles))
                with for_range(b, p0, p1, name="p") as p:
                    bptr = gep(b, bp, add(b, mul(b, p, i64(self.k * self.nr)), mul(b, pc, i64(self.nr))))
                    cols_base = mul(b, p, i64(self.nr))
                    if self.tail_cols:
                        is_tail = b.icmp_signed("==", p, i64(self.full_panels))
                        with b.if_else(is_tail) as (tail, full):
                            with tail:
                                self._row_tiles(b, a, bptr, c, pc, kl, first, cols_base, t0, t1, ib, n_ib, True)
                            with full:
                                self._row_tiles(b, a, bptr, c, pc, kl, first, cols_base, t0, t1, ib, n_ib, False)
                    else:
                        self._row_tiles(b, a, bptr, c, pc, kl, first, cols_base, t0, t1, ib, n_ib, False)

    def _row_tiles(self, b, a, bptr, c, pc, kl, first, cols_base, t0, t1, ib, n_ib, tail_panel) -> None:
        ncols = self.tail_cols if tail_panel else self.nr
        with for_range(b, t0, t1, name="t") as t:
            row = mul(b, t, i64(self.mr))
            self._call_micro(b, self.mr, ncols, a, bptr, c, row, pc, kl, first, cols_base)
        if self.tail_rows:
            last = b.icmp_signed("==", ib, i64(n_ib - 1))
            with b.if_then(last):
                row = i64(self.row_tiles * self.mr)
                self._call_micro(b, self.tail_rows, ncols, a, bptr, c, row, pc, kl, first, cols_base)

    def _call_micro(self, b, rows, ncols, a, bptr, c, row, pc, kl, first, cols_base) -> None:
        fn = self._micro_fn(b.module, rows, ncols)
        aptr = gep(b, a, add(b, mul(b, row, i64(self.k)), pc))
        cptr = gep(b, c, add(b, mul(b, row, i64(self.n)), cols_base))
        b.call(fn, [aptr, bptr, cptr, kl, first])

    def _micro_fn(self, mod: ir.Module, rows: int, ncols: int) -> ir.Function:
        key = (rows, ncols)
        if key not in self._micro:
            self._micro[key] = _micro_kernel(mod, rows, ncols, self.vw, self.nr, self.k, self.n, self.uk)
        return self._micro[key]

def _micro_kernel(mod: ir.Module, rows: int, ncols: int, vw: int, nr: int, lda: int, ldc: int,
                  uk: int) -> ir.Function:
    """C[rows, ncols] (+)= A[rows, kl] @ Bpanel[kl, nr], the tile held in registers."""
    fnty = ir.FunctionType(ir.VoidType(), [F32P, F32P, F32P, I64, I1])
    fn = ir.Function(mod, fnty, name=f"micro_{rows}x{ncols}")
    fn.linkage = "internal"
    for arg in fn.args[:3]:
        arg.add_attribute("noalias")
    a, bp, c, kl, first = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    vty = vec(vw)
    lanes = [min(vw, ncols - j * vw) for j in range(-(-ncols // vw))]
    accs = [[b.alloca(vty) for _ in lanes] for _ in range(rows)]
    zero = ir.Constant(vty, [0.0] * vw)
    for i in range(rows):
        for j, n_l in enumerate(lanes):
            loaded = _load_c(b, gep(b, c, i64(i * ldc + j * vw)), vw, n_l)
            b.store(b.select(first, zero, loaded), accs[i][j])

    def step(kk: ir.Value) -> None:
        brow = gep(b, bp, mul(b, kk, i64(nr)))
        bvec = [b.load(b.bitcast(gep(b, brow, i64(j * vw)), vty.as_pointer()), align=4)
                for j in range(len(lanes))]
        for i in range(rows):
            s = splat(b, b.load(gep(b, a, add(b, kk, i64(i * lda)))), vw)
            for j in range(len(lanes)):
                b.store(fma(b, s, bvec[j], b.load(accs[i][j])), accs[i][j])

    main_end = b.mul(b.udiv(kl, i64(uk)), i64(uk))
    with for_range(b, i64(0), main_end, step=uk, name="k") as k0:
        for u in range(uk):
            step(add(b, k0, i64(u)))
    with for_range(b, main_end, kl, name="kr") as kr:
        step(kr)
    for i in range(rows):
        for j, n_l in enumerate(lanes):
            _store_c(b, b.load(accs[i][j]), gep(b, c, i64(i * ldc + j * vw)), vw, n_l)
    b.ret_void()
    return fn

def _load_c(b: ir.IRBuilder, ptr: ir.Value, vw: int, n_lanes: int) -> ir.Value:
    if n_lanes == vw:
        return b.load(b.bitcast(ptr, vec(vw).as_pointer()), align=4)
    v = ir.Constant(vec(vw), [0.0] * vw)
    for lane in range(n_lanes):
        v = b.insert_element(v, b.load(gep(b, ptr, i64(lane))), ir.Constant(ir.IntType(32), lane))
    return v

def _store_c(b: ir.IRBuilder, value: ir.Value, ptr: ir.Value, vw: int, n_lanes: int) -> None:
    if n_lanes == vw:
        b.store(value, b.bitcast(ptr, vec(vw).as_pointer()), align=4)
        return
    for lane in range(n_lanes):
        b.store(b.extract_element(value, ir.Constant(ir.IntType(32), lane)), gep(b, ptr, i64(lane)))

__all__ = ["CLI_OPTIONS", "NAME", "VERSION", "build_ir", "default_config", "kernel_args", "make_inputs",
           "reference", "space", "task_from_cli"]
