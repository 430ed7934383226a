"""float32 conv2d (NCHW activations, OIHW weights) with a fused epilogue, as a direct blocked kernel.

Every stride, dilation, symmetric or asymmetric padding, group count (depthwise included) and
window size runs through one register-tiled kernel (see `conv2d_kernel`); a 1x1 stride-1
unpadded conv becomes a GEMM over the flattened image. Weights are re-laid once, in
`kernel_args`, into per-tile panels `OIHW[icb]i[mr]o` (order `hwc`) or `OIHW[mr]o` (order `chw`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from llvmlite import ir

from schemas.config import Config
from schemas.target import Target
from schemas.task import TuningTask
from stages.codegen.harness import add_harness
from stages.graph import epilogue
from stages.templates.conv2d_kernel import build
from stages.templates.conv2d_plan import Plan
from stages.templates.conv2d_shape import ConvGeom, conv2d_task, conv_cli_args, geom
from stages.templates.conv2d_shape import reference as _reference
from stages.templates.space import ConfigSpace, Knob, Knobs, first_valid

NAME = "conv2d"
VERSION = 6  # 2: input packed in 2-D stride phases, knob `flat`; 3: knob `axis`; 4: equal channel-vector tiles;
# 5: threads split channel tiles, not blocks of `ocn` (or row tiles): any layer splits evenly within a tile;
# 6: channel vectors on 1x1 GEMMs too, channel blocks up to 4096 (they keep a whole reduction in registers)

VW = (4, 8, 16)
MR = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 24, 32, 48, 64)  # 32-64: channel vectors on narrow tiles
NW = (1, 2, 3, 4, 5, 6, 7)
RH = (1, 2, 3, 4)
ICB = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
ORDER = ("chw", "hwc")
UNROLL = (0, 1, 2)  # kernel window loops unrolled: none, kw, kh and kw
UK = (1, 2, 3, 4)
OCN = (1, 2, 4, 8, 16, 32, 64)
PAR = ("oc", "oh")
FLAT = (0, 1)  # 1: tiles run along the flattened grid of output rows `wq` apart (narrow layers)
AXIS = ("w", "oc")  # what the vector lanes hold: output columns, or output channels (pixels broadcast)
OC_AXIS_MIN_IC = 16  # the default puts channels on 16 lanes when the reduction dwarfs the transposes
# ... and on a 1x1 GEMM from this many input channels: 1.6-1.8x the column-vector default from 128 channels on
# 7-28-wide images (672x14x14 -> 112: 143 vs 81 GFLOPS), equal or behind at 64 channels on 56x56 (130 vs 153)
GEMM_OC_MIN_IC = 128
# ... and from this many on images of at most GEMM_OC_SMALL_IMAGE pixels, where column vectors fill the lanes
# badly: Emerald Rapids, 1 thread, against 8-lane column vectors: 64x14x14 -> 384 2.0x, 96x14x14 -> 576 1.5x,
# 32x28x28 -> 192 1.2x (half-width vectors run at half the FMA rate there)
GEMM_OC_SMALL_MIN_IC = 32
GEMM_OC_SMALL_IMAGE = 28 * 28
# ... but not where the image fills whole 32-pixel column tiles (97% of their lanes or more) and is at most this
# many pixels: Emerald Rapids, 1 thread, column tiles of 12 channels x 2 vectors against channel vectors:
# Inception-v3's 8x8 layers 2048 -> 448 159 vs 69 GFLOPS (channel vectors re-stream 3.5 MB of weights per
# output row), 28x28: DenseNet-121's 128-480 -> 128 140-157 vs 101-128, ResNet-50's 512 -> 256 124 vs 105;
# 14x14 (88% of the lanes) and 17x17 (90%) stay on channel vectors, which won there (123-149 vs 100-126).
GEMM_W_MAX_PIXELS = 32 * 32
GEMM_W_MIN_FILL = 0.97

MAX_UNROLLED_FMAS = 512  # keeps a candidate's compile time down
PAR_ITEMS = 8  # the default keeps at least this many channel blocks when it can

CLI_OPTIONS = ("input", "weight", "stride", "pad", "dilation", "groups", "epilogue")


def task_from_cli(opts: dict) -> TuningTask:
    """`tune-op conv2d --input 1x64x56x56 --weight 64x64x3x3 --stride 1 --pad 1 --groups 1 --epilogue bias,relu`."""
    return conv2d_task(*conv_cli_args(opts, "conv2d"))


@dataclass(frozen=True)
class Halo:
    """How a whole-model build stores this conv's activations: X already zero-padded (the conv before
    wrote it so, and this conv skips its pack), Y written inside the next conv's zero borders."""

    x_padded: bool = False
    y_pad: tuple[int, int, int, int] = (0, 0, 0, 0)  # top, left, bottom, right

    @property
    def label(self) -> str:
        """As the manifest shows it: "x padded", "y padded 1,1,1,1", or both."""
        parts = ["x padded"] * self.x_padded + [f"y padded {','.join(map(str, self.y_pad))}"] * any(self.y_pad)
        return "; ".join(parts)


NO_HALO = Halo()


def plan(task: TuningTask, knobs: Knobs, halo: Halo = NO_HALO) -> Plan:
    c = knobs
    return Plan(geom(task), int(c["vw"]), int(c["mr"]), int(c["nw"]), int(c["rh"]), int(c["icb"]), str(c["order"]),
                int(c["unroll"]), int(c["uk"]), int(c["ocn"]), str(c["par"]), int(c["flat"]),
                str(c["axis"]), halo.x_padded, halo.y_pad)


def padded_input(task: TuningTask, knobs: Knobs) -> tuple[tuple[int, int, int, int], int] | None:
    """(pads, floats of the buffer) in which this conv can read its input already padded, or None
    when it reads X in place anyway (1x1 GEMM) or its pack also splits strides."""
    p = plan(task, knobs)
    g = p.g
    if p.gemm or (g.sh, g.sw) != (1, 1):
        return None
    return (g.pt, g.pl, g.pb, g.pr), plan(task, knobs, Halo(x_padded=True)).packed_floats


def space(task: TuningTask, target: Target) -> ConfigSpace:
    g = geom(task)
    regs, lanes = target.vector_registers, target.vector_lanes

    def rule(c: Knobs) -> str | None:
        p = plan(task, c)
        nv = p.rh * p.nw
        if p.vw > lanes:
            return f"vw={p.vw} exceeds the target's {lanes} float lanes"
        if p.oc_vectors and p.mr % p.vw:
            return f"channel vectors need mr={p.mr} to be a multiple of vw={p.vw}"
        need = p.accumulators + (p.mr // p.vw if p.oc_vectors else nv) + 1
        if need > regs:
            return f"a {p.mr}x{p.rh}x{p.nw} tile needs {need} vector registers, target has {regs}"
        if p.oc_vectors:
            if p.pixels(p.nw - 1) == 0:
                return f"nw={p.nw} groups of {p.vw} pixels exceed the tile's {p.tile_w} columns"
            if not p.shared:
                return "channel vectors need an input shared by the tile's channels"
            if p.ic_blocks > 1:
                return f"channel vectors keep the whole reduction in registers: icb={p.icb} < {g.icg} channels"
        if (p.nw - 1) * p.vw >= p.out_w:
            return f"nw={p.nw} vectors of {p.vw} leave a whole vector past the output width {p.out_w}"
        if p.flat and p.rh > 1:
            return f"a flat tile has one row (rh={p.rh}): its rows are the grid's"
        if p.rh > p.out_h:
            return f"rh={p.rh} exceeds the output height {p.out_h}"
        if p.mr > g.oc:
            return f"mr={p.mr} exceeds the {g.oc} output channels"
        if not (p.shared or p.mr % g.ocg == 0):
            return f"mr={p.mr} neither divides nor is a multiple of the {g.ocg} output channels per group"
        if p.icb > 1 and p.icb // 2 >= g.icg:
            return f"icb={p.icb} is over twice the {g.icg} input channels per group"
        if p.uk > 1 and p.uk > min(p.icb, g.icg):
            return f"uk={p.uk} exceeds the channel block {min(p.icb, g.icg)}"
        if p.ocn > 1 and (p.ocn // 2) >= p.tiles:
            return f"ocn={p.ocn} channel tiles cover the {p.tiles} tiles more than twice"
        if p.unroll and g.kh * g.kw == 1:
            return "a 1x1 window has no loop to unroll"
        if p.unroll == 1 and g.kw == 1:
            return "unroll=1 unrolls a window width of 1"
        fmas = p.accumulators * p.uk * (1, g.kw, g.kh * g.kw)[p.unroll]
        if fmas > MAX_UNROLLED_FMAS:
            return f"the unrolled step has {fmas} FMAs (limit {MAX_UNROLLED_FMAS}, compile time)"
        return None

    knobs = (Knob("vw", VW), Knob("mr", MR), Knob("nw", NW), Knob("rh", RH), Knob("icb", ICB),
             Knob("order", ORDER), Knob("unroll", UNROLL), Knob("uk", UK), Knob("ocn", OCN), Knob("par", PAR),
             Knob("flat", FLAT), Knob("axis", AXIS))
    return ConfigSpace(knobs=knobs, rule=rule)


def default_config(task: TuningTask, target: Target) -> Config:
    """Widest vectors; the tile (`mr` channels x `rh*nw` vectors), rows or flat grid, that wastes the
    fewest lanes on the output (a half-width vector counts half its lanes unless the target is
    double-pumped: stems and 1x1 layers 1.6-1.9x on Zen 5 against exactly-fitting 8-lane tiles), holds
    about 24 accumulators and balances broadcasts against loads; the
    input slab of one column tile in half of L1 for a GEMM, in a quarter of L2 for a packed input
    (which streams from L2 anyway: splitting channels adds partial-sum round trips through Y), the
    weights of a channel block in half of L2; the parallel axis is whichever has more items
    (channel blocks of whole groups for grouped convs). On 16-lane targets, a dense conv with enough
    input channels (16 when packed, 128 for a 1x1 GEMM, whose output channels must also fill the
    lanes; not on an image of whole 32-pixel column tiles, `GEMM_W_MAX_PIXELS`; a 1x1 GEMM's column tiles
    are two vectors wide or more) puts output channels on the lanes instead (`axis=oc`, all input channels in one block,
    tile from `_oc_tile`): unlike column tiles it wastes no lanes on 7-, 14- and 28-wide outputs, and
    loads one weight vector per 14-28 FMAs where column tiles broadcast one weight per 4. Each choice
    is checked by the space's rule and falls back to the next (column vectors when no channel block
    holds every input channel, then the smallest tile, which every conv accepts: one channel, one
    4-lane vector, no blocking or unrolling)."""
    g = geom(task)
    regs, lanes = target.vector_registers, target.vector_lanes
    tiles: list[tuple[str, int, int, int, int, int]] = []  # (axis, vw, mr, nw, rh, flat), preferred first
    pixels = g.oh * g.ow
    columns_fill = pixels <= GEMM_W_MAX_PIXELS and pixels / (-(-pixels // (2 * lanes)) * 2 * lanes) >= GEMM_W_MIN_FILL
    gemm_ok = (g.icg >= GEMM_OC_MIN_IC or g.icg >= GEMM_OC_SMALL_MIN_IC and pixels <= GEMM_OC_SMALL_IMAGE) \
        and (g.oc % lanes == 0 or g.oc >= 4 * lanes) and not columns_fill  # 24 channels: 0.59x
    oc_tile = _oc_tile(task, target) if lanes >= 16 and g.groups == 1 and g.oc >= lanes \
        and (gemm_ok if g.is_1x1_gemm else g.icg >= OC_AXIS_MIN_IC) else None
    if oc_tile is not None and g.is_1x1_gemm and oc_tile[1] == lanes and oc_tile[3] > 1:
        # one weight vector per rows x pixels broadcasts: Inception-v3's 192-288x35x35 -> 48 as 16 channels x 2
        # rows x 12 pixels ran 82-104 GFLOPS, as 12-channel x 2-vector column tiles 133-142 (Emerald Rapids)
        oc_tile = None
    if oc_tile is not None:
        tiles.append(("oc", *oc_tile))
    dw_tile = _depthwise_tile(task, target)
    # A 1x1 GEMM's flat grid in one-vector tiles broadcasts a weight per FMA and loads little else: load-bound
    # (EfficientNet-B0's 240x28x28 -> 40: 24 channels x 1 vector 86 GFLOPS, 12 x 2 100, 6 x 4 103).
    best: tuple | None = None
    for flat in FLAT:
        p = plan(task, {**PROBE, "vw": lanes, "flat": flat})
        out_h, out_w = p.out_h, p.out_w
        for vw in (v for v in VW if v in (lanes, lanes // 2)):
            for nw in (n for n in NW if (n - 1) * vw < out_w and not (g.is_1x1_gemm and n == 1 and out_w >= 2 * vw)):
                for rh in (r for r in RH if r <= out_h):
                    nv = rh * nw
                    mrs = [m for m in MR if m * nv + nv + 1 <= regs and m <= g.oc
                           and (g.groups == 1 or g.ocg % m == 0 or m % g.ocg == 0)]
                    if not mrs:
                        continue
                    mr = max(mrs)
                    lane_eff = g.oh * g.ow / (-(-out_w // (nw * vw)) * nw * vw * -(-out_h // rh) * rh)
                    lane_eff *= 1.0 if vw == lanes or target.double_pumped else vw / lanes
                    fill = min(1.0, mr * nv / 24)
                    score = (round(lane_eff * fill, 2), -abs(mr - nv), nw, vw)
                    if best is None or score > best[0]:
                        best = (score, ("w", vw, mr, nw, rh, flat))
    if best is not None:
        tiles.append(best[1])
    candidates = [{**_blocking(task, target, *tile), "unroll": unroll, "uk": uk} for tile in tiles
                  for unroll, uk in ((0, 1),) * (tile[0] == "oc") + ((1, 1), (2, 1), (0, 1), (0, 2), (0, 4))]
    if dw_tile is not None:  # the whole window unrolled: rows of a channel share their input loads
        candidates.insert(0, {**_blocking(task, target, "w", *dw_tile), "unroll": 2, "uk": 1})
    return first_valid(space(task, target), [*candidates, PROBE], f"{task.description} on {target.name}")


PROBE: Knobs = {"vw": VW[0], "mr": 1, "nw": 1, "rh": 1, "icb": 1, "order": "chw", "unroll": 0, "uk": 1, "ocn": 1,
                "par": "oc", "flat": 0, "axis": "w"}  # the smallest tile: every rule of `space` accepts it


def _blocking(task: TuningTask, target: Target, axis: str, vw: int, mr: int, nw: int, rh: int, flat: int) -> Knobs:
    """The cache blocks and parallel axis of a register tile: `icb` (the input slab of a column tile
    in a quarter of L2, half of L1 for a GEMM; every channel for channel vectors), `ocn` (a channel
    block's weights in half of L2) and `par` (the axis with more items, at least PAR_ITEMS channel
    blocks when it can; blocks of whole groups for grouped convs)."""
    g = geom(task)
    p = plan(task, {**PROBE, "vw": vw, "mr": mr, "nw": nw, "rh": rh, "flat": flat, "axis": axis})
    window_in = ((rh - 1) * g.sh + (g.kh - 1) * g.dh + 1) * (nw * vw * g.sw + (g.kw - 1) * g.dw)
    slab = target.l1_bytes // 2 if g.is_1x1_gemm else target.l2_bytes // 4  # a packed slab streams from L2 anyway
    icb = _fit(ICB, max(1, slab // (4 * window_in)) if axis == "w" else ICB[-1], g.icg)
    tiles = -(-g.oc // mr)
    ocn = _fit(OCN, max(1, target.l2_bytes // 2 // (4 * mr * icb * g.kh * g.kw)), tiles)
    oh_items = -(-p.out_w // (nw * vw)) if flat and not g.is_1x1_gemm else -(-p.out_h // rh)  # grid column tiles
    par = "oc" if -(-tiles // ocn) >= oh_items or _rows_restream_weights(g, target, oh_items, -(-tiles // ocn)) \
        else "oh"
    while par == "oc" and ocn > 1 and -(-tiles // ocn) < PAR_ITEMS:  # enough items to balance the cores
        ocn //= 2
    if g.groups > 1 and not g.is_1x1_gemm:  # blocks of whole groups: each thread packs only its own planes
        ocn = min((c for c in OCN if (c * mr) % g.ocg == 0 or c >= tiles), default=ocn)
        par = "oc"
    return {"vw": vw, "mr": mr, "nw": nw, "rh": rh, "icb": icb, "order": "chw", "unroll": 1, "uk": 1,
            "ocn": ocn, "par": par, "flat": flat, "axis": axis}


DW_MR = 2  # channels per depthwise tile: each loads its own input, so more channels share nothing
DW_FLAT_MIN_EFF = 0.6  # a narrow depthwise layer takes the flat grid only if it wastes less than this


def _depthwise_tile(task: TuningTask, target: Target) -> tuple[int, int, int, int, int] | None:
    """The depthwise tile (vw, mr, nw, rh, flat), or None for other convs: full-width vectors, `DW_MR`
    channels, and the window unrolled so the rows of a channel reuse each other's input loads (a
    channel's rows r and r+1 read the same input row at taps kh+1 and kh), over `rh` = 2 rows (3 for
    5x5 and larger windows of one vector: more rows share each load; 3 rows of 2 vectors spilled, 240x28x28
    5x5 2.4x slower than 2 rows on Zen 5) of up to 2 vectors; outputs narrower than
    3/4 of a vector run along the flat grid, 4 vectors of one row, if it fills enough lanes. Measured
    on Emerald Rapids, 1 thread, against the previous default (column vectors of 8 lanes, 6 channels,
    kw unrolled): 14x14x384 3x3 1.55x, 14x14x672 5x5 3.8x, 56x56x144 3x3 1.21x, 7x7x960 3x3 (flat)
    1.27x; 7x7x1152 5x5 keeps the previous default (its flat grid fills 38% of the lanes)."""
    g = geom(task)
    lanes = target.vector_lanes
    if not (g.groups > 1 and g.icg == 1 and g.ocg == 1) or g.oc < DW_MR:
        return None
    if 4 * g.ow >= 3 * lanes:
        nw = min(2, -(-g.ow // lanes))
        return lanes, DW_MR, nw, min(3 if g.kh >= 5 and nw == 1 else 2, g.oh), 0
    p = plan(task, {**PROBE, "vw": lanes, "flat": 1})
    tiles = -(-p.out_w // (4 * lanes))
    if g.oh * g.ow < DW_FLAT_MIN_EFF * tiles * 4 * lanes:
        return None
    return lanes, DW_MR, 4, 1, 1


def _rows_restream_weights(g: ConvGeom, target: Target, row_items: int, blocks: int) -> bool:
    """Whether splitting rows (`par=oh`: every row item walks every channel tile) moves more bytes than splitting
    channel blocks (`par=oc`: every block walks the whole input), with weights too large to stay in L2 from one
    row item to the next, read again by `PAR_ITEMS` row items or more: Inception-v3's 288x35x35 stride-2 -> 384
    read its 4 MB of weights once per output row (Emerald Rapids, interleaved: 1.11x the speed on channel
    blocks, its 192x17x17 stride-2 -> 320 1.47x, 384x8x8 1x3 1.15x, ResNet-50's 512x28x28 1x1 stride-2 1.13x;
    ResNet-50's 256-channel 3x3 layers, 7 row items of 2 rows, measured 0.87-1.05x and stay on rows)."""
    w_bytes = g.oc * g.icg * g.kh * g.kw * 4
    return w_bytes > target.l2_bytes // 2 and row_items >= PAR_ITEMS \
        and w_bytes * row_items > g.c * g.h * g.w * 4 * blocks


def _oc_tile(task: TuningTask, target: Target) -> tuple[int, int, int, int, int] | None:
    """The channel-vector tile (vw, mr, nw, rh, flat), if any fits, that computes the fewest outputs for nothing
    and keeps about 24-28 accumulators; then, for a window, the fewest loads per FMA (a broadcast pixel is a
    load): on ResNet-50's 3x3 layers 32 channels x 14 pixels ran 1.21-1.29x onnxruntime's time where 16 channels x
    2 rows x 14 pixels (one weight vector, 28 broadcasts per 28 FMAs) ran 1.52-1.68x (Emerald Rapids, 1 thread,
    interleaved; 1.11-1.27x against 1.27-1.48x at 2 threads; Zen 5 had them at 0.93-1.05x and 0.99-1.11x), and
    DenseNet-121's 128 -> 32 3x3 layers 0.69-1.01x against 0.91-1.19x. A 1x1 conv keeps one channel vector
    where that suffices and breaks a tie toward one row of up to 32 pixels rather than rows of 16: 1x1
    stride-2 256x56x56 -> 512 1.6x, 256x56x56 -> 64 1.1x on Emerald Rapids."""
    g = geom(task)
    lanes, regs = target.vector_lanes, target.vector_registers
    one_by_one = int(g.kh * g.kw == 1)
    best: tuple | None = None
    for flat in FLAT:
        for nw in (1, 2):
            for rh in RH if not flat else (1,):
                for mr in (m for m in MR if m % lanes == 0 and m <= g.oc):
                    p = plan(task, {**PROBE, "vw": lanes, "mr": mr, "nw": nw, "rh": rh, "flat": flat, "axis": "oc"})
                    if p.pixels(nw - 1) == 0 or rh > g.oh or p.accumulators + mr // lanes + 1 > regs:
                        continue
                    computed = -(-g.oc // mr) * mr * -(-p.out_h // rh) * rh * p.w_tiles * p.tile_w
                    eff = g.oc * g.oh * g.ow / computed
                    fill = min(1.0, p.accumulators / 24)
                    intensity = p.accumulators / (mr // lanes + rh * p.tile_w)
                    lean = (-(mr // lanes), round(intensity, 2))
                    lean = lean if one_by_one else lean[::-1]
                    score = (round(eff * fill, 2), *lean, -rh * one_by_one, -flat)
                    if best is None or score > best[0]:
                        best = (score, (lanes, mr, nw, rh, flat))
    return None if best is None else best[1]


def _fit(choices: tuple[int, ...], want: int, extent: int) -> int:
    """The largest choice <= want, but no larger than needed to cover `extent`."""
    fitting = [c for c in choices if c <= want] or [choices[0]]
    covering = [c for c in choices if c >= extent]
    return min(max(fitting), min(covering)) if covering else max(fitting)


def make_inputs(task: TuningTask, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    x, w = (rng.uniform(-1, 1, size=t.shape).astype(np.float32) for t in task.inputs[:2])
    return [x, w, *epilogue.make_operands(task.epilogue, task.outputs[0].shape, 1, rng)]


def reference(task: TuningTask, inputs: list[np.ndarray]) -> np.ndarray:
    return _reference(task, inputs)


def pack_weights(w: np.ndarray, p: Plan) -> np.ndarray:
    """OIHW → per-tile panels, zero-padded on O (and on I for `hwc`): done once, at build time."""
    g = p.g
    padded = np.zeros((p.tiles * p.mr, p.ic_pad, g.kh, g.kw), dtype=np.float32)
    padded[: g.oc, : g.icg] = w
    t = padded.reshape(p.tiles, p.mr, p.ic_pad, g.kh, g.kw)
    if p.order == "chw":
        return np.ascontiguousarray(t.transpose(0, 2, 3, 4, 1))
    t = t.reshape(p.tiles, p.mr, p.ic_pad // p.icb, p.icb, g.kh, g.kw)
    return np.ascontiguousarray(t.transpose(0, 2, 4, 5, 3, 1))


def kernel_args(task: TuningTask, knobs: Knobs, inputs: list[np.ndarray], halo: Halo = NO_HALO) -> list[np.ndarray]:
    """`[X, packed W, *epilogue tensors, (packed-input workspace), Y]`; the output is last (task-shaped:
    a padded Y is a whole-model build's own buffer)."""
    p = plan(task, knobs, halo)
    x, w, *epi = inputs
    ws = [np.zeros(p.workspace, dtype=np.float32)] if p.workspace else []
    out = np.zeros(task.outputs[0].shape, dtype=np.float32)
    return [np.ascontiguousarray(x), pack_weights(w, p), *(np.ascontiguousarray(e) for e in epi), *ws, out]


def build_ir(task: TuningTask, knobs: Knobs, target: Target, threads: int = 1, halo: Halo = NO_HALO) -> ir.Module:
    p = plan(task, knobs, halo)
    mod = ir.Module(name=f"conv2d_{task.signature}")
    mod.triple = target.triple
    add_harness(mod, build(mod, p, task.epilogue, threads))
    return mod


__all__ = ["CLI_OPTIONS", "NAME", "NO_HALO", "VERSION", "Halo", "build_ir", "conv2d_task", "default_config",
           "kernel_args", "make_inputs", "padded_input", "reference", "space", "task_from_cli"]
