"""The int8 conv's AMX path: the packed input (`qconv2d_plan`) read as tiles, weights as the other operand.

The pack already lays each channel block out as 4 channels interleaved per column, so 16 consecutive
output columns of one tap are 64 contiguous bytes in every block, and the same bytes one block on are
one plane further: a B tile (16 channel blocks x 16 columns, row stride = the plane) loads straight
from the workspace. The weights, packed at build time per tap as 16 output channels x 64 channels (A,
`pack_weights_amx`), are the signed operand: `tdpbsud` (s8 A x u8 B), whatever the activations' type
(the pack flips int8 ones to u8). An `mr` (16 or 32) output channels x `nv` 16-column tile of one
output row sums every 64-channel chunk and tap in tiles, then goes through a stack scratch to the
direct kernel's requantize store. The last chunk's missing channels are zero weights; the blocks
past them are read (the workspace is padded to whole chunks) and add nothing.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from stages.codegen.irb import VOIDP, add, gep, i64, loop_carry, mul
from stages.templates import qgemm_amx as amx
from stages.templates.qconv2d_plan import QConvPlan
from stages.templates.qgemm_pack import aligned


def pack_weights_amx(w: np.ndarray, p: QConvPlan) -> np.ndarray:
    """OIHW int8 -> [group][channel tile][chunk][kh][kw][tile's channels][64 channels], zero-padded."""
    g, mr, ch = p.g, p.oc_tile, p.chunks
    full = np.zeros((g.groups, p.ot * mr, ch * amx.CHUNK, g.kh, g.kw), dtype=np.int8)
    full[:, :g.ocg, :g.icg] = w.reshape(g.groups, g.ocg, g.icg, g.kh, g.kw)
    out = aligned((g.groups, p.ot, ch, g.kh, g.kw, mr, amx.CHUNK), "int8")
    out[...] = full.reshape(g.groups, p.ot, mr, ch, amx.CHUNK, g.kh, g.kw).transpose(0, 1, 3, 5, 6, 2, 4)
    return out


def accumulate(b: ir.IRBuilder, p: QConvPlan, wtile: ir.Value, block: ir.Value, col: ir.Value,
               scratch: ir.Value) -> None:
    """Sums of one tile into `scratch` (int32, mr x 16 nv): `wtile` the channel tile's packed weights,
    `block` its image and group's first packed channel block, `col` the 4-byte column (in the block)
    of the tile's first output column at tap (0, 0)."""
    g, s = p.g, p.s
    tl = amx.Tiles(b)
    mt, nv = s.mr // amx.ROWS, s.nv
    c_tile, a_tile, b_tile = amx.layout(mt, nv)
    for row in c_tile:
        for t in row:
            tl.zero(t)
    taps = g.kh * g.kw
    chunk_w, chunk_x = taps * s.mr * amx.CHUNK, amx.ROWS * p.plane
    with loop_carry(b, i64(0), i64(p.chunks), [], name="kc", unroll=s.uk if s.uk > 1 else False) as kc:
        wc = gep(b, wtile, mul(b, kc, i64(chunk_w)))
        xc = gep(b, block, add(b, mul(b, kc, i64(chunk_x)), mul(b, col, i64(4))))
        for kh in range(g.kh):
            for kw in range(g.kw):
                off = (kh * g.dh * g.sw + (kw * g.dw) % g.sw) * p.wq + (kw * g.dw) // g.sw
                tap = kh * g.kw + kw
                for i in range(mt):
                    tl.load(a_tile[i], gep(b, wc, i64((tap * s.mr + amx.ROWS * i) * amx.CHUNK)), amx.CHUNK)
                for j in range(nv):
                    tl.load(b_tile[j], gep(b, xc, i64(4 * (off + amx.ROWS * j))), p.plane)
                for i in range(mt):
                    for j in range(nv):
                        tl.dot(c_tile[i][j], a_tile[i], b_tile[j], op="tdpbsud")
    amx.store_tiles(tl, c_tile, scratch, nv * amx.ROWS)


def tile_weights(b: ir.IRBuilder, p: QConvPlan, w: ir.Value, tile: ir.Value) -> ir.Value:
    """Byte pointer to channel tile `tile`'s (among all groups') packed weights."""
    return gep(b, b.bitcast(w, VOIDP), mul(b, tile, i64(p.chunks * p.g.kh * p.g.kw * p.s.mr * amx.CHUNK)))

