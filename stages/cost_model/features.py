"""Features of configs that carry across shapes of one op kind.

Knob values alone mean different things for different shapes (kc=256 is the whole K of one task
and a quarter of another's), so each op kind has a small function deriving loop-nest facts from
knobs + shape + target: tile extents, bytes per tile level against the cache sizes, vector lane
use, unrolled body size, trip counts, edge waste, arithmetic intensity, parallel chunks per core.
Functions are vectorised over configs (one numpy array per knob) and keyed by op kind; an op
kind without one gets the generic knob-and-shape features.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable

import numpy as np

from schemas.target import Target
from schemas.task import TuningTask

Columns = dict[str, np.ndarray]
FeatureFn = Callable[[TuningTask, Target, int, Columns], Columns]


def _cdiv(a, b):
    return -(-a // b)


def _log2(x) -> np.ndarray:
    return np.log2(np.maximum(np.asarray(x, dtype=np.float64), 1e-9))


def _knob(v: Columns, name: str, default, rows: int) -> np.ndarray:
    return v[name] if name in v else np.full(rows, default, dtype=type(default) if isinstance(default, str) else None)


def gemm_features(m: int, n: int, k: int, target: Target, threads: int, v: Columns) -> Columns:
    """The register-tiled, cache-blocked GEMM nest: `mr x nv*vw` tiles, kc/mc/nc blocks, K unrolled
    by uk, optional packed A, panels or row tiles innermost, threads over N or M blocks."""
    mr, nv, vw, kc, mc, nc, uk = (v[x] for x in ("mr", "nv", "vw", "kc", "mc", "nc", "uk"))
    rows = len(mr)
    pack_a = _knob(v, "pack_a", 0.0, rows).astype(np.float64)
    par_m = _knob(v, "par", "n", rows) == "m"
    ir_inner = _knob(v, "order", "jr_ir", rows) == "ir_jr"
    nr = nv * vw
    kc_eff = np.minimum(kc, k)
    panels = _cdiv(n, nr)
    row_tiles = np.maximum(m // mr, 1)
    k_blocks = _cdiv(k, kc)
    m_blocks = _cdiv(row_tiles, mc)
    n_blocks = _cdiv(panels, nc)
    par_blocks = np.where(par_m, m_blocks, n_blocks)
    f = 4.0
    b_panel = kc_eff * nr * f
    a_block = np.minimum(mc * mr, m) * kc_eff * f
    b_block = np.minimum(nc * nr, n) * kc_eff * f
    return {
        "mr": mr, "nv": nv, "vw": vw, "kc": kc, "mc": mc, "nc": nc, "uk": uk,
        "pack_a": pack_a, "par_m": par_m.astype(np.float64), "ir_inner": ir_inner.astype(np.float64),
        "nr": nr, "tile_elems": mr * nr, "mc_rows": np.minimum(mc * mr, m), "nc_cols": np.minimum(nc * nr, n),
        "kc_over_k": kc_eff / k,
        "lane_use": vw / target.vector_lanes,
        "regs_use": (mr * nv + nv + 1) / target.vector_registers,
        "b_panel_l1": b_panel / target.l1_bytes, "a_block_l2": a_block / target.l2_bytes,
        "b_block_l2": b_block / target.l2_bytes, "b_block_l3": b_block / target.l3_bytes,
        "a_rows_l1": (mr * kc_eff * f + b_panel) / target.l1_bytes,
        "unrolled_fmas": mr * nv * uk,
        "k_trips": kc_eff / uk, "k_blocks": k_blocks, "m_blocks": m_blocks, "n_blocks": n_blocks,
        "micro_calls_log": _log2(m_blocks * mc * panels * k_blocks),
        "n_waste": (panels * nr - n) / n, "m_tail": (m - row_tiles * mr) / m, "k_waste": (k_blocks * kc_eff - k) / k,
        "intensity": 2.0 * mr * nr / ((mr + nr) * f),
        "chunks_per_core": par_blocks / threads,
        "imbalance": _cdiv(par_blocks, threads) * threads / np.maximum(par_blocks, 1),
        "flops_log": np.full(rows, math.log2(2.0 * m * n * k)),
    }


def gemm_task_features(task: TuningTask, target: Target, threads: int, v: Columns) -> Columns:
    """matmul, dense and batch_matmul share the GEMM schedule: read M, N from the output, K from
    the FLOP count (so weight layout and transposes do not matter), the batch as one more feature."""
    *batch, m, n = task.outputs[0].shape
    b = math.prod(batch)
    k = task.flops // (2 * b * m * n)
    out = gemm_features(m, n, k, target, threads, v)
    out["batch_log"] = np.full(len(v["mr"]), math.log2(b))
    return out


def conv2d_features(task: TuningTask, target: Target, threads: int, v: Columns) -> Columns:
    """Direct conv: `mr` output channels x `rh` rows x `nw` vectors of `vw` output columns per
    register tile (`flat`: along the packed grid; `axis=oc`: lanes on channels), input channels in
    blocks of `icb` (K unrolled by `uk`), the window loops unrolled or not, `ocn` channel tiles per
    block, threads over the channel tiles of the image or of each row tile."""
    (_, c, _, _), (oc, icg, kh, kw) = task.inputs[0].shape, task.inputs[1].shape
    _, _, oh, ow = task.outputs[0].shape
    sh, sw = task.attrs.get("strides", (1, 1))
    groups = int(task.attrs.get("group", 1))
    vw, mr, nw, rh, icb, uk, ocn, unroll = (v[x] for x in ("vw", "mr", "nw", "rh", "icb", "uk", "ocn", "unroll"))
    rows = len(vw)
    par_oc = _knob(v, "par", "oc", rows) == "oc"
    hwc = _knob(v, "order", "chw", rows) == "hwc"
    flat = _knob(v, "flat", 0, rows).astype(np.float64) == 1
    axis_oc = _knob(v, "axis", "w", rows) == "oc"
    pads = task.attrs.get("pads", (0, 0, 0, 0))
    wq = -(-(task.inputs[0].shape[3] + pads[1] + pads[3]) // sw)  # the packed grid's row pitch
    extent = np.where(flat, (oh - 1) * wq + ow, ow)
    cols = np.where(axis_oc, _cdiv(extent, _cdiv(extent, nw * vw)), nw * vw)  # channel-vector tiles split evenly
    icb_eff = np.minimum(icb, icg)
    oc_tiles = _cdiv(oc, mr)
    row_tiles = _cdiv(oh, rh)
    grid_tiles = np.where(flat, _cdiv(extent, cols), row_tiles)
    chunks = oc_tiles * np.where(par_oc, 1, grid_tiles)  # threads split single channel tiles of a segment
    window = np.select([unroll == 2, unroll == 1], [kh * kw, kw], 1)
    f = 4.0
    w_block = mr * icb_eff * kh * kw * f
    x_block = icb_eff * ((rh - 1) * sh + kh) * ((cols - 1) * sw + kw) * f
    vregs = np.where(axis_oc, mr // vw * rh * cols + mr // vw + 1, mr * rh * nw + rh * nw + 1)
    return {
        "vw": vw, "mr": mr, "nw": nw, "rh": rh, "icb": icb, "uk": uk, "ocn": ocn, "unroll": unroll,
        "par_oc": par_oc.astype(np.float64), "hwc": hwc.astype(np.float64),
        "flat": flat.astype(np.float64), "axis_oc": axis_oc.astype(np.float64),
        # a flat tile runs along the grid and computes its wq - ow padding columns too
        "grid_waste": np.where(flat, (_cdiv(oh * wq, cols) * cols - oh * ow) / (oh * ow), 0.0),
        "tile_outputs": mr * rh * cols, "lane_use": vw / target.vector_lanes,
        "regs_use": vregs / target.vector_registers,
        "ow_waste": (_cdiv(ow, cols) * cols - ow) / ow, "oh_tail": (row_tiles * rh - oh) / oh,
        "oc_tail": (oc_tiles * mr - oc) / oc, "icb_over_icg": icb_eff / icg, "ic_blocks": _cdiv(icg, icb_eff),
        "w_block_l1": w_block / target.l1_bytes, "w_block_l2": w_block / target.l2_bytes,
        "x_block_l1": x_block / target.l1_bytes, "x_block_l2": x_block / target.l2_bytes,
        "unrolled_fmas": mr * rh * nw * uk * window, "k_trips": icb_eff / uk,
        "intensity": 2.0 * mr * rh * cols / ((mr + rh * cols) * f),
        "chunks_per_core": chunks / threads, "imbalance": _cdiv(chunks, threads) * threads / np.maximum(chunks, 1),
        "window": np.full(rows, float(kh * kw)), "stride": np.full(rows, float(sh * sw)),
        "depthwise": np.full(rows, float(groups == c and groups > 1)),
        "flops_log": np.full(rows, math.log2(task.flops)),
    }


def generic_features(task: TuningTask, target: Target, threads: int, v: Columns) -> Columns:
    """Any template: knob values (log2; strings as a stable code) plus the task's size."""
    rows = len(next(iter(v.values())))
    out = {f"knob_{name}": _code(col) if col.dtype == object else _log2(col + 1) for name, col in v.items()}
    out["out_log"] = np.full(rows, math.log2(task.outputs[0].size))
    out["in_log"] = np.full(rows, math.log2(sum(t.size for t in task.inputs)))
    out["lane_frac"] = np.full(rows, target.vector_lanes / 16)
    return out


def _code(col: np.ndarray) -> np.ndarray:
    return np.array([zlib.crc32(str(x).encode()) % 997 for x in col], dtype=np.float64)


FEATURES: dict[str, FeatureFn] = {"matmul": gemm_task_features, "dense": gemm_task_features,
                                  "batch_matmul": gemm_task_features, "conv2d": conv2d_features}


def featurize(task: TuningTask, target: Target, threads: int, values: Columns) -> np.ndarray:
    """(configs x features) float32 matrix; columns are in the op kind's fixed order."""
    fn = FEATURES.get(task.op, generic_features)
    cols = fn(task, target, threads, {k: _column(c) for k, c in values.items()})
    return np.column_stack([np.asarray(c, dtype=np.float64) for c in cols.values()]).astype(np.float32)


def _column(c) -> np.ndarray:
    arr = np.asarray(c)
    return arr if arr.dtype == object else arr.astype(np.float64)
