"""The schedule space of the int8 GEMM (`qdense`) and its default.

Knobs: `isa` the dot-product path (only those the target runs are valid, see `qgemm_isa`); an
`mr` x `nv` register tile of int32 vectors (with `amx`: 16 or 32 rows of `nv` 16 x 16 tiles,
`qgemm_amx`); `mc` row tiles and `nc` panels per cache block; `uk`
unrolls the reduction loop (in 4-byte groups); `order` puts panels or row tiles innermost; `par`
picks the axis whose blocks threads split (`none`: one thread for tiny work).
"""

from __future__ import annotations

from schemas.config import Config
from schemas.target import Target
from stages.templates import qgemm_amx
from stages.templates.qgemm_isa import ISAS, LANES, PARTS, gemm_paths, registers
from stages.templates.space import ConfigSpace, Knob, Knobs, first_valid

MR = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 32)
NV = (1, 2, 3, 4)
MC = (1, 2, 4, 8, 16, 32, 64)
NC = (1, 2, 4, 8, 16, 32, 64)
UK = (1, 2, 4, 8)
ORDER = ("jr_ir", "ir_jr")
PAR = ("n", "m", "none")
SMALL_OPS = 400_000  # below this (~1 us of int8 work) handing half to a pool worker does not pay


def tile_registers(isa: str, mr: int, nv: int) -> int:
    """Vector registers an `mr x nv` tile needs: accumulators, the nv weight vectors, the broadcast."""
    return mr * nv * PARTS[isa] + nv + 1 + (2 if PARTS[isa] > 1 else 0)


def _amx_rule(m: int, k: int, x_signed: bool, mr: int, nv: int, uk: int) -> str | None:
    if x_signed:
        return "isa=amx multiplies uint8 activations (tdpbusd); int8 ones run the vector paths"
    if k < qgemm_amx.CHUNK:
        return f"isa=amx needs K >= {qgemm_amx.CHUNK} (a whole tile row), K={k}"
    if mr not in (16, 32):
        return f"isa=amx runs tiles of 16 rows: mr must be 16 or 32, got {mr}"
    if qgemm_amx.tiles_used(mr, nv) > qgemm_amx.TILES:
        return f"an {mr}x{nv} amx tile needs {qgemm_amx.tiles_used(mr, nv)} tile registers, there are {qgemm_amx.TILES}"
    if uk > 1 and uk > qgemm_amx.chunks(k):
        return f"uk={uk} exceeds the {qgemm_amx.chunks(k)} 64-byte tile chunks of K={k}"
    return None


def qgemm_space(m: int, n: int, k: int, target: Target, x_signed: bool = False) -> ConfigSpace:
    paths = gemm_paths(target)
    groups = -(-k // 4)

    def rule(c: Knobs) -> str | None:
        isa = str(c["isa"])
        mr, nv, mc, nc, uk = (int(c[x]) for x in ("mr", "nv", "mc", "nc", "uk"))
        lanes = LANES[isa]
        if isa not in paths:
            return f"isa={isa} is not available on {target.name} (it runs {', '.join(paths)})"
        if isa == "amx":
            why = _amx_rule(m, k, x_signed, mr, nv, uk)
            if why:
                return why
        elif tile_registers(isa, mr, nv) > registers(isa, target):
            return (f"an {mr}x{nv} {isa} tile needs {tile_registers(isa, mr, nv)} vector registers, "
                    f"the target has {registers(isa, target)}")
        if mr > m:
            return f"mr={mr} exceeds M={m}"
        if (nv - 1) * lanes >= n:
            return f"nv={nv} vectors of {lanes} leave a whole vector past N={n}"
        if uk > 1 and uk > groups and isa != "amx":
            return f"uk={uk} exceeds the {groups} reduction groups of K={k}"
        if mc > 1 and (mc // 2) * mr >= m:
            return f"mc={mc} row tiles of {mr} cover M={m} more than twice"
        if nc > 1 and (nc // 2) * nv * lanes >= n:
            return f"nc={nc} panels of {nv * lanes} cover N={n} more than twice"
        return None

    knobs = (Knob("isa", ("amx", *ISAS)), Knob("mr", MR), Knob("nv", NV), Knob("mc", MC), Knob("nc", NC),
             Knob("uk", UK), Knob("order", ORDER), Knob("par", PAR))
    return ConfigSpace(knobs=knobs, rule=rule)


def default_qgemm(m: int, n: int, k: int, target: Target, what: str = "", x_signed: bool = False) -> Config:
    """AMX tiles where the target has them and the shape suits (uint8 X, M >= 16, K >= 64): one 16 x 16
    tile, 1.2-4.6x the `vnni512` default on BERT's and ResNet-50's GEMM shapes (Emerald Rapids; the most
    robust single choice there, tuning finds 1.4-2.4x more). Else the fastest vector path (the 256-bit
    one when N fits 8 lanes); a tile 4 vectors wide with 32 registers (2 with 16) and as many rows as
    the rest of the file holds. Either way a panel block whose bytes (K x nr each) fill half of L2 and a
    row block whose rows fill half of L1; threads over panels when there are enough of them, else over
    row tiles. Checked by the space's rule, with fallbacks down to a 1x1 tile (`what` names the task in
    the error if even that failed)."""
    sp = qgemm_space(m, n, k, target, x_signed)
    paths = [p for p in gemm_paths(target) if p != "amx"]
    isa = paths[0]
    if isa == "vnni512" and n <= 8 and "vnni256" in paths:
        isa = "vnni256"
    lanes, regs = LANES[isa], registers(isa, target)
    nv = max(1, min(4 if regs >= 32 else 2, -(-n // lanes)))
    mr = max([r for r in MR if tile_registers(isa, r, nv) <= regs and r <= m] or [1])
    knobs: Knobs = {"isa": isa, "mr": mr, "nv": nv, **_blocking(m, n, k, target, mr, nv * lanes), "uk": 4,
                    "order": "jr_ir"}
    amx: Knobs = {"isa": "amx", "mr": 16, "nv": 1, **_blocking(m, n, k, target, 16, 16), "uk": 1, "order": "jr_ir"}
    smallest: Knobs = {"isa": "generic", "mr": 1, "nv": 1, "mc": 1, "nc": 1, "uk": 1, "order": "jr_ir", "par": "none"}
    candidates = [amx, knobs, {**knobs, "uk": 1}, {**knobs, "mc": 1, "nc": 1, "uk": 1}, {**smallest, "isa": isa},
                  smallest]
    return first_valid(sp, candidates, f"{what or f'int8 GEMM {m}x{n}x{k}'} on {target.name}")


def _blocking(m: int, n: int, k: int, target: Target, mr: int, nr: int) -> Knobs:
    """`mc`, `nc` and `par` for an `mr x nr` tile: panel blocks in half of L2, row blocks in half of L1,
    threads over panels when there are enough of them (none for tiny work)."""
    tiles, panels = -(-m // mr), -(-n // nr)
    nc = _fit(NC, max(1, target.l2_bytes // 2 // max(1, k * nr)), panels)
    mc = _fit(MC, max(1, target.l1_bytes // 2 // max(1, k * mr)), tiles)
    cores = target.cores
    par = "n" if panels >= 2 * cores or panels >= tiles else "m"
    if 2 * m * n * k < SMALL_OPS:
        par = "none"
    if par == "n":
        nc = min(nc, max(c for c in NC if c <= max(1, panels // (2 * cores))))
    elif par == "m":
        mc = min(mc, max(c for c in MC if c <= max(1, tiles // (2 * cores))))
    return {"mc": mc, "nc": nc, "par": par}


def _fit(choices: tuple[int, ...], want: int, extent: int) -> int:
    """The largest choice <= want, but no larger than needed to cover `extent`."""
    fitting = [c for c in choices if c <= want] or [choices[0]]
    covering = [c for c in choices if c >= extent]
    return min(max(fitting), min(covering)) if covering else max(fitting)
