"""The schedule space of the int8 direct conv (`qconv2d`) and its default.

Knobs: `isa` the dot-product path (only those the target runs are valid); a register tile of
`mr` output channels x `rh` output rows x `nv` vectors of output columns; `uk` unrolls the
channel-block loop; `order` walks the row tiles of one channel tile (its weights stay in L1) or
the channel tiles of one row tile (its input rows stay in L1).
"""

from __future__ import annotations

from schemas.config import Config
from schemas.target import Target
from stages.templates import qgemm_amx
from stages.templates.conv2d_shape import ConvGeom
from stages.templates.qgemm_isa import ISAS, LANES, PARTS, available, gemm_paths, registers
from stages.templates.space import ConfigSpace, Knob, Knobs, first_valid

MR = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 32)
RH = (1, 2, 3, 4)
NV = (1, 2, 3, 4)
UK = (1, 2, 4)
ORDER = ("ot_rt", "rt_ot")
AXIS = ("w", "oc", "dw")
MAX_UNROLLED_DOTS = 1024  # taps x tile: keeps a candidate's compile time down
AMX_MIN_BLOCKS = 8  # channel blocks of 4 a group needs for AMX tiles (16 a tile): half of each used
# Lanes on output channels by default for narrow layers with channels enough (measured on ResNet-50's
# 14x14 and 7x7 layers: 1.3-3.8x the column-lanes tile, which leaves lanes idle past 7 or 14 columns); for
# windows up to 28 columns (ResNet-50's 28x28 3x3 convs: 0.90-0.92x the two-vector column tile, Zen 5)
OC_AXIS_MAX_OW, OC_AXIS_MAX_OW_WINDOW, OC_AXIS_MIN_OC = 14, 28, 64
# Pixels a 1x1 lanes-on-channels tile takes: the most of these whose last tile idles at most 1% more of the
# pixels than the best of them (7x7 outputs: 10 wastes 1 of 50, 12 wastes 11 of 60; 0.85x on ResNet-50's)
OC_POINTWISE_MR = (12, 10, 8)


def tile_registers(isa: str, mr: int, rh: int, nv: int) -> int:
    """Accumulators, the rh x nv vectors of a tap, the broadcast (+ avx2 temporaries)."""
    return mr * rh * nv * PARTS[isa] + rh * nv + 1 + (2 if PARTS[isa] > 1 else 0)


def qconv_space(g: ConvGeom, target: Target) -> ConfigSpace:
    paths = gemm_paths(target)
    blocks = -(-g.icg // 4)

    def rule(c: Knobs) -> str | None:
        isa, axis = str(c["isa"]), str(c["axis"])
        mr, rh, nv, uk = (int(c[x]) for x in ("mr", "rh", "nv", "uk"))
        lanes = LANES[isa]
        if isa not in paths:
            return f"isa={isa} is not available on {target.name} (it runs {', '.join(paths)})"
        if isa == "amx" and axis != "w":
            return f"isa=amx tiles output channels x columns: axis must be w, got {axis}"
        if axis == "dw":
            return _dw_rule(g, isa, mr, rh, nv, uk, c["order"], registers(isa, target))
        if axis == "oc":
            return _oc_rule(g, isa, mr, rh, nv, uk, blocks, registers(isa, target))
        need = tile_registers(isa, mr, rh, nv)
        if isa == "amx":
            why = _amx_rule(g, mr, rh, nv, uk, blocks)
            if why:
                return why
        elif need > registers(isa, target):
            regs = registers(isa, target)
            return f"an {mr}x{rh}x{nv} {isa} tile needs {need} vector registers, the target has {regs}"
        if mr > 1 and (mr // 2) >= g.ocg:
            return f"mr={mr} covers the {g.ocg} output channels of a group more than twice"
        if rh > g.oh:
            return f"rh={rh} exceeds the {g.oh} output rows"
        if (nv - 1) * lanes >= g.ow:
            return f"nv={nv} vectors of {lanes} leave a whole vector past the {g.ow} output columns"
        if uk > 1 and uk > blocks:
            return f"uk={uk} exceeds the {blocks} channel blocks of 4"
        if isa != "amx" and mr * rh * nv * g.kh * g.kw * uk > MAX_UNROLLED_DOTS:
            return f"{mr * rh * nv * g.kh * g.kw * uk} unrolled dot products exceed {MAX_UNROLLED_DOTS}"
        return None

    knobs = (Knob("isa", ("amx", *ISAS)), Knob("mr", MR), Knob("rh", RH), Knob("nv", NV), Knob("uk", UK),
             Knob("order", ORDER), Knob("axis", AXIS))
    return ConfigSpace(knobs=knobs, rule=rule)


def _amx_rule(g: ConvGeom, mr: int, rh: int, nv: int, uk: int, blocks: int) -> str | None:
    """AMX tiles (`qconv2d_amx`): `mr` = 16 or 32 output channels x `nv` 16-column tiles of one row."""
    if rh != 1:
        return "isa=amx tiles one output row: rh must be 1"
    if mr not in (16, 32):
        return f"isa=amx runs tiles of 16 output channels: mr must be 16 or 32, got {mr}"
    if qgemm_amx.tiles_used(mr, nv) > qgemm_amx.TILES:
        return f"an {mr}x{nv} amx tile needs {qgemm_amx.tiles_used(mr, nv)} tile registers, there are {qgemm_amx.TILES}"
    if blocks < AMX_MIN_BLOCKS:
        return (f"isa=amx reads 16 channel blocks of 4 a tile; the {g.icg} channels of a group would leave "
                f"{16 - blocks} of 16 idle")
    chunks = -(-blocks // qgemm_amx.ROWS)
    if uk > 1 and uk > chunks:
        return f"uk={uk} exceeds the {chunks} 64-channel chunks"
    if g.kh * g.kw * (mr // 16) * nv * uk > MAX_UNROLLED_DOTS // 16:
        return f"{g.kh * g.kw * (mr // 16) * nv * uk} unrolled tile products exceed {MAX_UNROLLED_DOTS // 16}"
    return None


def _oc_rule(g: ConvGeom, isa: str, mr: int, rh: int, nv: int, uk: int, blocks: int, regs: int) -> str | None:
    """Lanes on output channels: `mr` pixels x `nv` channel vectors; `rh` has no meaning there."""
    lanes = LANES[isa]
    if rh != 1:
        return "rh must be 1 when the lanes hold output channels (tiles are mr flattened pixels)"
    if tile_registers(isa, mr, 1, nv) > regs:
        return f"an {mr}x{nv} {isa} channel tile needs {tile_registers(isa, mr, 1, nv)} vector registers, {regs} exist"
    if mr > g.oh * g.ow:
        return f"mr={mr} exceeds the {g.oh * g.ow} output pixels"
    if (nv - 1) * lanes >= g.ocg:
        return f"nv={nv} vectors of {lanes} leave a whole vector past the {g.ocg} output channels of a group"
    if uk > 1 and uk > blocks:
        return f"uk={uk} exceeds the {blocks} channel blocks of 4"
    if mr * nv * g.kh * g.kw * uk > MAX_UNROLLED_DOTS:
        return f"{mr * nv * g.kh * g.kw * uk} unrolled dot products exceed {MAX_UNROLLED_DOTS}"
    return None


def _dw_rule(g: ConvGeom, isa: str, mr: int, rh: int, nv: int, uk: int, order: object, regs: int) -> str | None:
    """Depthwise path (one input channel a group): an `rh` rows x `nv` column vectors tile of one channel."""
    if g.icg != 1:
        return f"axis=dw needs one input channel a group, the conv has {g.icg}"
    if mr != 1 or uk != 1 or order != "ot_rt":
        return "axis=dw has one channel a tile and no channel loop: mr=1, uk=1, order=ot_rt"
    if 2 * rh * nv + 2 > regs:
        return f"a {rh}x{nv} depthwise tile needs {2 * rh * nv + 2} vector registers, {regs} exist"
    if rh > g.oh:
        return f"rh={rh} exceeds the {g.oh} output rows"
    if (nv - 1) * LANES[isa] >= g.ow:
        return f"nv={nv} vectors of {LANES[isa]} leave a whole vector past the {g.ow} output columns"
    return None


def _pointwise_pixels(pixels: int) -> int:
    waste = {m: -(-pixels // m) * m / pixels for m in OC_POINTWISE_MR}
    return next(m for m in OC_POINTWISE_MR if waste[m] <= min(waste.values()) + 0.01)


def default_qconv(g: ConvGeom, target: Target, what: str = "", image_ow: int | None = None) -> Config:
    """AMX tiles where the target has them and a group has 32+ channels (`qconv2d_amx`). Else: narrow layers
    with many channels (OW <= 14, or 28 with a window; 64+ channels a group): lanes on output channels, a
    6 pixels x 4 vectors tile (for 1x1 windows 2 vectors x 8-12 pixels, the count that idles the fewest
    pixels in the last tile). Otherwise lanes on output columns: the fastest path the target runs, or its
    256-bit one when 16 lanes would waste a third of the columns; vectors to cover a row (up to 4), rows
    to make the tile 4 vectors; as many output channels as the registers left hold; the channel-block
    loop unrolled twice for 1x1 windows. Checked by the space's rule, with fallbacks down to a 1x1x1
    tile. `image_ow`: the image's output width where `g` is a flattened 1x1 conv (qconv2d.qgeom), which
    the narrow-layer choice reads."""
    sp = qconv_space(g, target)
    paths = available(target)
    isa = paths[0]
    if isa == "vnni512" and "vnni256" in paths and -(-g.ow // 16) * 16 >= 1.5 * (-(-g.ow // 8) * 8):
        isa = "vnni256"
    lanes, regs = LANES[isa], registers(isa, target)
    nv = max(1, min(4 if regs >= 32 else 2, -(-g.ow // lanes)))
    rh = max(1, min(max(RH), g.oh, (4 if regs >= 32 else 2) // nv))
    mr = max([m for m in MR if tile_registers(isa, m, rh, nv) <= regs and (m == 1 or m // 2 < g.ocg)] or [1])
    uk = 2 if g.kh * g.kw == 1 and g.icg > 4 else 1
    knobs: Knobs = {"isa": isa, "mr": mr, "rh": rh, "nv": nv, "uk": uk, "order": "ot_rt", "axis": "w"}
    wide = paths[0]
    oc_tiles = []
    if g.icg == 1 and g.kh * g.kw > 1:
        # depthwise: the direct kernel would use 1 of each 4-byte group; 16 columns a vector unless
        # that wastes a third of them, rows and vectors to hold about 8 accumulators
        dnv = max(1, min(NV[-1], -(-g.ow // lanes)))
        oc_tiles.append({"isa": isa, "mr": 1, "rh": max(1, min(max(RH), g.oh, 8 // dnv)), "nv": dnv, "uk": 1,
                         "order": "ot_rt", "axis": "dw"})
    ow = image_ow or g.ow
    narrow = ow <= (OC_AXIS_MAX_OW_WINDOW if g.kh * g.kw > 1 else OC_AXIS_MAX_OW)
    if narrow and g.ocg >= OC_AXIS_MIN_OC and wide != "generic":
        # 1x1 windows: a narrower panel (2 vectors) stays in L1 over the whole reduction
        onv, omr = (4, 6) if g.kh * g.kw > 1 else (2, _pointwise_pixels(g.oh * g.ow))
        oc_tiles = [{**knobs, "isa": wide, "axis": "oc", "rh": 1, "nv": onv, "mr": omr}]
    # AMX where the target has it: 1.4-3.3x the vector default on every ResNet-50 conv (Emerald Rapids, 1 thread),
    # 32 output channels x 2 column tiles the best or within 10% of it on most
    amx = {"isa": "amx", "mr": 32 if g.ocg > 16 else 16, "rh": 1, "nv": 2 if g.ow > 16 else 1, "uk": 1,
           "order": "ot_rt", "axis": "w"}
    candidates = [amx, *oc_tiles, knobs, {**knobs, "uk": 1}, {**knobs, "mr": max(1, mr // 2), "uk": 1},
                  {**knobs, "mr": 1, "rh": 1, "nv": 1, "uk": 1},
                  {"isa": "generic", "mr": 1, "rh": 1, "nv": 1, "uk": 1, "order": "ot_rt", "axis": "w"}]
    return first_valid(sp, candidates, f"{what or 'int8 conv'} on {target.name}")
