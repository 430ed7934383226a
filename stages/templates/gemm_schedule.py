"""The schedule space of the GEMM family (knobs, validity rule with reasons) and its default.

Knobs: register tile `mr` rows x `nv` vectors of `vw` lanes; cache blocks `kc` (K), `mc` row
tiles (M) and `nc` panels (N) — BLIS's KC/MC/NC; `uk` unrolls the K loop; `order` puts panels
or row tiles innermost; `pack_a` packs A per `mc x kc` block; `par` picks the axis whose blocks
the threads split, or `none` to run on one thread (work too small to pay for starting threads).
The default has two rules: the general one, and one for a packed weight with few rows of A (a
transformer's dense layers), which reads the weight once (`_weight_blocks`).
"""

from __future__ import annotations

from schemas.config import Config
from schemas.target import Target
from stages.templates.gemm_codegen import PACK_A_LIMIT
from stages.templates.space import ConfigSpace, Knob, Knobs, first_valid

MR = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16)
NV = (1, 2, 3, 4)
VW = (4, 8, 16)
KC = (16, 32, 64, 128, 192, 256, 384, 512)
MC = (1, 2, 4, 8, 16, 32, 64)
NC = (1, 2, 4, 8, 16, 32, 64)
UK = (1, 2, 4, 8)
ORDER = ("jr_ir", "ir_jr")
PACK_A = (0, 1)
PAR = ("n", "m", "none")
SMALL_FLOPS = 200_000  # below this (~2 us of work) handing half to a pool worker does not pay


def gemm_space(m: int, n: int, k: int, target: Target) -> ConfigSpace:
    regs, lanes = target.vector_registers, target.vector_lanes

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
        if int(c["pack_a"]) and mc * mr * kc * 4 > PACK_A_LIMIT:
            return f"a packed A block of {mc}x{mr} rows x {kc} is {mc * mr * kc * 4} bytes, over {PACK_A_LIMIT}"
        if int(c["pack_a"]) and m <= mr:
            return f"packing A does not pay when one row tile covers M={m}"
        return None

    knobs = (Knob("mr", MR), Knob("nv", NV), Knob("vw", VW), Knob("kc", KC), Knob("mc", MC), Knob("nc", NC),
             Knob("uk", UK), Knob("order", ORDER), Knob("pack_a", PACK_A), Knob("par", PAR))
    return ConfigSpace(knobs=knobs, rule=rule)


def default_gemm(m: int, n: int, k: int, target: Target, batch: int = 1, what: str = "",
                 packed_b: bool = False) -> Config:
    """BLIS-like heuristic: widest vectors; a register tile wide on N (4 vectors with 32 registers,
    2 with 16) and as many rows as the rest of the register file holds (6x4 of 16 lanes on AVX-512:
    fewer loads per FMA than 14x2). A packed weight B with few rows of A (`_weight_blocks`: a
    transformer's dense layers) streams B once: all of M in one block, threads split N, A read in place
    (packing it would copy all of A again for every N block). Otherwise a
    K block of up to 256 (the B micro-panel streams from L2, the A micro-panel stays in L1); the
    packed A block in half of L2 (mc); the B block in a quarter of L3 (nc); threads split M when it
    has tiles enough, else N, in two blocks per core or more (balance). Work under SMALL_FLOPS runs
    on one thread (the pool's handshake costs a few microseconds). Checked by the space's rule, with
    fallbacks: less K unrolling, then the smallest schedule (`what` names the task in the error if
    even that failed)."""
    sp = gemm_space(m, n, k, target)
    vw = target.vector_lanes
    while vw > VW[0] and vw // 2 >= n:
        vw //= 2
    nv = max(1, min(4 if target.vector_registers >= 32 else 2, -(-n // vw)))
    mr = max(r for r in MR if r * nv + nv + 1 <= target.vector_registers and r <= m)
    nr = nv * vw
    tiles, panels = -(-m // mr), -(-n // nr)
    cores = target.cores
    blocks = _weight_blocks(m, k, mr, nr, tiles, panels, target) if packed_b else None
    if blocks is not None:
        kc, mc, nc = blocks
        par = "n"
    else:
        kc = _fit(KC, 256, k)
        mc = _fit(MC, max(1, min(target.l2_bytes // 2, PACK_A_LIMIT) // (kc * 4 * mr)), tiles)
        nc = _fit(NC, max(1, target.l3_bytes // 4 // (kc * 4 * nr)), panels)
        par = "m" if tiles >= 2 * cores else "n"
        if par == "m":
            mc = min(mc, max(c for c in MC if c <= max(1, tiles // (2 * cores))))
        else:
            nc = min(nc, max(c for c in NC if c <= max(1, panels // (2 * cores))))
    if 2 * m * n * k * batch < SMALL_FLOPS:
        par = "none"
    knobs: Knobs = {"mr": mr, "nv": nv, "vw": vw, "kc": kc, "mc": mc, "nc": nc, "uk": 4, "order": "jr_ir",
                    "pack_a": int(blocks is None and m > 4 * mr), "par": par}
    candidates = [{**knobs, "uk": uk} for uk in (4, 2, 1)]
    return first_valid(sp, [*candidates, SMALLEST], f"{what or f'GEMM {m}x{n}x{k}'} on {target.name}")


def _weight_blocks(m: int, k: int, mr: int, nr: int, tiles: int, panels: int,
                   target: Target) -> tuple[int, int, int] | None:
    """(kc, mc, nc) that read a packed weight B exactly once, or None where that does not fit (or, for a
    matrix-vector product, does not pay).

    A model's weights do not stay in cache from one run to the next (ViT-B/16 holds 340 MB of them),
    so B comes from memory, and the general rule, whose threads split M, streams all of B once per M
    block: ViT-B/16's 3072- and 2304-wide layers ran at 84 GFLOPS in the model against 160-230 alone
    with hot caches (Zen 5, 1 thread). Here one M block holds all of A (a K block of it in half of
    L2), threads split N into blocks of `nc` panels, and each B micro-panel is read once and used
    by every row tile. K blocks: as few as fit, of even size (K=768 -> 2 x 384, not 512 + 256). The
    C block an item revisits on each K block stays within a quarter of L2; among the `nc` that keep
    it there, the one that gives the busiest thread the fewest panels (then the largest, for fewer
    A packings)."""
    cores = target.cores
    if not 2 <= tiles <= MC[-1] or panels < 2 * cores:  # one row tile: the general rule (measured 0.87x cold)
        return None
    mc = _fit(MC, MC[-1], tiles)
    room = min(target.l2_bytes // 2, PACK_A_LIMIT)
    fitting = [c for c in KC if tiles * mr * c * 4 <= room and mc * mr * c * 4 <= PACK_A_LIMIT]
    if not fitting:
        return None
    fewest = -(-k // max(fitting))
    kc = min(c for c in fitting if -(-k // c) == fewest)
    allowed = [c for c in NC if c == 1 or (c <= panels and tiles * mr * c * nr * 4 <= target.l2_bytes // 4)]
    nc = min(allowed, key=lambda c: (_busiest(panels, c, cores), -c))
    return kc, mc, nc


# One row, one 4-lane vector, the smallest blocks, one thread: every rule of `gemm_space` accepts it.
SMALLEST: Knobs = {"mr": 1, "nv": 1, "vw": VW[0], "kc": KC[0], "mc": 1, "nc": 1, "uk": 1, "order": "jr_ir",
                   "pack_a": 0, "par": "none"}


def _busiest(panels: int, nc: int, cores: int) -> int:
    """Panels the busiest thread computes when blocks of `nc` panels are dealt out to `cores` threads."""
    blocks = -(-panels // nc)
    return -(-blocks // cores) * nc


def _fit(choices: tuple[int, ...], want: int, extent: int) -> int:
    """The largest choice <= want, but no larger than needed to cover `extent`."""
    fitting = [c for c in choices if c <= want] or [choices[0]]
    covering = [c for c in choices if c >= extent]
    return min(max(fitting), min(covering)) if covering else max(fitting)
