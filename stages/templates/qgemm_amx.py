"""The int8 GEMM's AMX path: Intel's tile matrix unit (`amx-int8`) for the whole 64-byte chunks of the reduction.

A tile is 16 rows of 64 bytes. One `tdpbusd` adds a 16 x 64 u8 tile of X rows (A) times a 16 x 64 s8
tile of weights in 4-byte groups (B: 16 groups of K, 16 columns of N, exactly `qgemm_pack`'s panel
layout, row stride `nr * 4`) into a 16 x 16 int32 tile (C), in one instruction. A micro-tile of `mr`
= 16 or 32 rows and `nv` 16-column vectors keeps `mr/16 * nv` C tiles, `mr/16` A tiles and `nv` B
tiles in the 8 tile registers; the C tiles go to a stack scratch once per micro-tile, where the
`vnni512` path adds the reduction's last K % 64 bytes and runs the requantize epilogue.

Edges without masks: the last row tile starts at M - mr (rows recomputed, the same values stored
twice), weights are zero-padded to whole panels, and the K tail is the vector path's. Every tile
is configured 16 x 64 once per work range (`ldtilecfg`, then `tilerelease`); Linux needs the
process's permission for tile data first, which `tf_main` asks the runtime for (`tf_amx_request`).
"""

from __future__ import annotations

from llvmlite import ir

from stages.codegen.irb import I32, I64, VOIDP, add, for_range, gep, i64, intrinsic, mul
from stages.codegen.runtime import AMX_REQUEST

I8 = ir.IntType(8)
ROWS = 16  # rows of every tile
CHUNK = 64  # bytes of a tile row: the reduction elements one tdpbusd covers
TILES = 8


def tiles_used(mr: int, nv: int) -> int:
    """Tile registers an `mr x (16 nv)` micro-tile needs: its C tiles, one A tile per 16 rows, one B per 16 columns."""
    mt = mr // ROWS
    return mt * nv + mt + nv


def chunks(k: int) -> int:
    """The reduction's whole 64-byte chunks, the part the tiles take."""
    return k // CHUNK


def _config(module: ir.Module) -> ir.GlobalVariable:
    """The 64-byte tile configuration: palette 1, all 8 tiles 16 rows x 64 bytes."""
    cfg = bytearray(64)
    cfg[0] = 1
    for t in range(TILES):
        cfg[16 + 2 * t] = CHUNK
        cfg[48 + t] = ROWS
    ty = ir.ArrayType(I8, 64)
    g = ir.GlobalVariable(module, ty, name="tf_amx_config")
    g.global_constant, g.linkage, g.align = True, "internal", 64
    g.initializer = ir.Constant(ty, bytearray(cfg))
    return g


def enter(b: ir.IRBuilder) -> None:
    """Load the tile configuration (it zeroes every tile) on this thread."""
    cfg = b.module.globals.get("tf_amx_config") or _config(b.module)
    b.call(intrinsic(b.module, "llvm.x86.ldtilecfg", ir.VoidType(), [VOIDP]), [b.bitcast(cfg, VOIDP)])


def leave(b: ir.IRBuilder) -> None:
    """Release the tiles (the thread's tile state back to its init state: cheap context switches)."""
    b.call(intrinsic(b.module, "llvm.x86.tilerelease", ir.VoidType(), []), [])


def request_permission(main: ir.Function) -> None:
    """Make `main` ask the runtime for the process's tile-data permission before anything else."""
    block = main.entry_basic_block
    b = ir.IRBuilder(block)
    b.position_at_start(block)
    b.call(intrinsic(main.module, AMX_REQUEST, ir.VoidType(), []), [])


class Tiles:
    """The tile instructions on fixed tile registers (`llvm.x86.*` with immediate tile numbers)."""

    def __init__(self, b: ir.IRBuilder):
        mod, void = b.module, ir.VoidType()
        self.b = b
        self._zero = intrinsic(mod, "llvm.x86.tilezero", void, [I8])
        self._load = intrinsic(mod, "llvm.x86.tileloadd64", void, [I8, VOIDP, I64])
        self._store = intrinsic(mod, "llvm.x86.tilestored64", void, [I8, VOIDP, I64])
        self._mod = mod

    def zero(self, t: int) -> None:
        self.b.call(self._zero, [ir.Constant(I8, t)])

    def load(self, t: int, ptr: ir.Value, stride: int) -> None:
        self.b.call(self._load, [ir.Constant(I8, t), ptr, i64(stride)])

    def store(self, t: int, ptr: ir.Value, stride: int) -> None:
        self.b.call(self._store, [ir.Constant(I8, t), ptr, i64(stride)])

    def dot(self, c: int, a: int, bt: int, op: str = "tdpbusd") -> None:
        """C += A . B over 4-byte groups; `tdpbusd`: A u8, B s8; `tdpbsud`: A s8, B u8."""
        fn = intrinsic(self._mod, f"llvm.x86.{op}", ir.VoidType(), [I8, I8, I8])
        self.b.call(fn, [ir.Constant(I8, c), ir.Constant(I8, a), ir.Constant(I8, bt)])


def layout(mt: int, nt: int) -> tuple[list[list[int]], list[int], list[int]]:
    """Tile numbers of an `mt x nt` block: its C tiles, then one A tile per row, one B per column."""
    c = [[i * nt + j for j in range(nt)] for i in range(mt)]
    return c, [mt * nt + i for i in range(mt)], [mt * nt + mt + j for j in range(nt)]


def accumulate(b: ir.IRBuilder, x: ir.Value, wpanel: ir.Value, scratch: ir.Value, row0: ir.Value, k: int,
               mr: int, nv: int, uk: int) -> None:
    """Sums of rows `row0 .. row0+mr` of X (u8, row stride `k`) times a weight panel (`nv` * 16 columns,
    bytes at `wpanel`) over the first `chunks(k) * 64` reduction elements, into `scratch` (int32,
    mr x 16 nv, row-major)."""
    tl = Tiles(b)
    mt, nr = mr // ROWS, nv * ROWS
    c_tile, a_tile, b_tile = layout(mt, nv)
    for row in c_tile:
        for t in row:
            tl.zero(t)
    xrows = [gep(b, x, mul(b, add(b, row0, i64(ROWS * i)), i64(k))) for i in range(mt)]
    panel_row = nr * 4  # bytes of one reduction group across the panel
    n = chunks(k)
    with for_range(b, i64(0), i64(n), name="kc", unroll=min(uk, n) if uk > 1 and n > 1 else False) as kc:
        for i in range(mt):
            tl.load(a_tile[i], gep(b, xrows[i], mul(b, kc, i64(CHUNK))), k)
        for j in range(nv):
            tl.load(b_tile[j], gep(b, wpanel, add(b, mul(b, kc, i64(ROWS * panel_row)), i64(CHUNK * j))), panel_row)
        for i in range(mt):
            for j in range(nv):
                tl.dot(c_tile[i][j], a_tile[i], b_tile[j])
    store_tiles(tl, c_tile, scratch, nr)


def store_tiles(tl: Tiles, c_tile: list[list[int]], scratch: ir.Value, nr: int) -> None:
    """The C tiles into `scratch`, a row-major int32 block `nr` wide."""
    for i, row in enumerate(c_tile):
        for j, t in enumerate(row):
            tl.store(t, gep(tl.b, scratch, i64(4 * (ROWS * i * nr + ROWS * j))), nr * 4)


def scratch(b: ir.IRBuilder, mr: int, nv: int) -> ir.Value:
    """A 64-byte aligned int32 stack buffer for an `mr x 16 nv` tile of sums, as a byte pointer."""
    buf = b.alloca(ir.ArrayType(I32, mr * nv * ROWS))
    buf.align = 64
    return b.bitcast(buf, VOIDP)
