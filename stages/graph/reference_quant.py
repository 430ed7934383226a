"""The numpy reference of the quantized ops (normalised as stages/extract/quant.py says), of the canonical int8
anchors `qconv2d` / `qdense`, of the int8 `qadd` / `qavgpool` (stages/graph/passes_quant.py) and of the islands
`qlut` / `qmul` / `qmean` / `qbatchnorm` (passes_quant_islands.py), with ONNX's arithmetic: float32 division by
the scale, round half to even, saturation; integer products accumulated exactly; and where onnxruntime's
kernels round otherwise, their float32 operations in their order.

Canonical anchors: inputs [X (uint8|int8), W (int8), B (int32, [N]), S (float32, [N])], attrs `x_zero_point`,
`y_zero_point`, `x_dtype`, `y_dtype`, `epilogue` (a list of {"kind": "relu"} / {"kind": "clip", "min": q,
"max": q}, bounds in the quantized domain); qconv2d also `strides`, `pads`, `dilations`, `group` as conv2d.
    y = clamp(saturate(round_half_even(float32(acc_i32) * S[n]) + zy))
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

OpFn = Callable[[list[np.ndarray], dict], list[np.ndarray]]


def limits(dtype: str) -> tuple[int, int]:
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def per_axis(p: np.ndarray, rank: int, axis: int | None) -> np.ndarray:
    """A scale or zero point shaped to broadcast against a rank-`rank` tensor along `axis` (None: a scalar)."""
    flat = np.asarray(p).reshape(-1)
    if axis is None:
        return flat[0]
    return flat.reshape((-1,) + (1,) * (rank - axis - 1))


def quantize(x: np.ndarray, scale: np.ndarray, zp: np.ndarray, axis: int | None, dtype: str) -> np.ndarray:
    lo, hi = limits(dtype)
    s = per_axis(scale, x.ndim, axis).astype(np.float32)
    z = per_axis(zp, x.ndim, axis).astype(np.float32)
    with np.errstate(invalid="ignore", divide="ignore"):
        q = np.rint(x.astype(np.float32) / s) + z
    return np.clip(np.nan_to_num(q, nan=0.0), lo, hi).astype(dtype)


def dequantize(x: np.ndarray, scale: np.ndarray, zp: np.ndarray, axis: int | None) -> np.ndarray:
    s = per_axis(scale, x.ndim, axis).astype(np.float32)
    z = per_axis(zp, x.ndim, axis).astype(np.int64)
    return (x.astype(np.int64) - z).astype(np.float32) * s


def dynamic_params(x: np.ndarray) -> tuple[np.float32, np.uint8]:
    """DynamicQuantizeLinear's scale and zero point: the range of x widened to hold 0, over uint8's 255 steps."""
    lo = np.float32(min(float(x.min()), 0.0)) if x.size else np.float32(0)
    hi = np.float32(max(float(x.max()), 0.0)) if x.size else np.float32(0)
    scale = np.float32((hi - lo) / np.float32(255))
    if scale == 0:
        return scale, np.uint8(0)
    return scale, np.uint8(np.clip(np.rint(np.float32(0) - lo / scale), 0, 255))


def _dynamic_quantize(args: list[np.ndarray], a: dict) -> list[np.ndarray]:
    x = args[0]
    scale, zp = dynamic_params(x)
    y = quantize(x, np.array(scale), np.array(zp), None, "uint8") if scale > 0 else np.zeros(x.shape, np.uint8)
    return [y, np.array(scale, np.float32), np.array(zp, np.uint8)]


def int_conv(x: np.ndarray, w: np.ndarray, strides, pads, dilations, group: int) -> np.ndarray:
    """Exact NCHW x OIHW convolution of integer arrays (zero padding), as int64."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    (sh, sw), (dh, dw), (pt, pl, pb, pr) = strides, dilations, pads
    oh = (h + pt + pb - (dh * (kh - 1) + 1)) // sh + 1
    ow = (wd + pl + pr - (dw * (kw - 1) + 1)) // sw + 1
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    xp = xp.reshape(n, group, cg, h + pt + pb, wd + pl + pr)
    wg = w.astype(np.int64).reshape(group, o // group, cg, kh, kw)
    out = np.zeros((n, group, o // group, oh, ow), dtype=np.int64)
    for i in range(kh):
        for j in range(kw):
            patch = xp[..., i * dh: i * dh + sh * (oh - 1) + 1: sh, j * dw: j * dw + sw * (ow - 1) + 1: sw]
            out += np.einsum("ngchw,goc->ngohw", patch, wg[..., i, j])
    return out.reshape(n, o, oh, ow)


def requantize(acc: np.ndarray, multiplier: np.ndarray, a: dict, axis: int) -> np.ndarray:
    """saturate(round_half_even(float32(acc) * S) + zy), then the epilogue's clamps."""
    lo, hi = limits(a["y_dtype"])
    for op in a.get("epilogue", ()):
        if op["kind"] == "relu":
            lo = max(lo, int(a["y_zero_point"]))
        else:
            lo, hi = max(lo, int(op["min"])), min(hi, int(op["max"]))
    s = per_axis(multiplier, acc.ndim, axis).astype(np.float32)
    y = np.rint(acc.astype(np.int32).astype(np.float32) * s) + np.float32(a["y_zero_point"])
    return np.clip(y, lo, hi).astype(a["y_dtype"])


def _qconv2d(args: list[np.ndarray], a: dict) -> list[np.ndarray]:
    x, w, bias, mult = args
    xs = x.astype(np.int64) - int(a["x_zero_point"])
    acc = int_conv(xs, w, a["strides"], a["pads"], a["dilations"], int(a["group"])) + bias.reshape(1, -1, 1, 1)
    return [requantize(acc, mult, a, 1)]


def _qdense(args: list[np.ndarray], a: dict) -> list[np.ndarray]:
    x, w, bias, mult = args
    acc = (x.astype(np.int64) - int(a["x_zero_point"])) @ w.astype(np.int64).T + bias.astype(np.int64)
    return [requantize(acc, mult, a, acc.ndim - 1)]


def _conv_integer(args: list[np.ndarray], a: dict) -> list[np.ndarray]:
    x, w, xz, wz = args
    ws = w.astype(np.int64) - per_axis(wz, 4, 0 if np.asarray(wz).size > 1 else None).astype(np.int64)
    acc = int_conv(x.astype(np.int64) - int(np.asarray(xz).reshape(-1)[0]), ws, a["strides"], a["pads"],
                   a["dilations"], int(a["group"]))
    return [acc.astype(np.int32)]


def _matmul_integer(args: list[np.ndarray], a: dict) -> list[np.ndarray]:
    x, w, xz, wz = args
    xz64 = np.asarray(xz, dtype=np.int64)
    xs = x.astype(np.int64) - (xz64.reshape(-1, 1) if xz64.size > 1 else xz64.reshape(()))
    ws = w.astype(np.int64) - np.asarray(wz, dtype=np.int64).reshape(-1)
    return [np.matmul(xs, ws).astype(np.int32)]


def _qadd(args: list[np.ndarray], a: dict) -> list[np.ndarray]:
    """saturate(round(fma(A, ra, fma(B, rb, offset)))) in float32, or fma(A, ra, offset) with one input (a
    constant scalar operand folded into the offset) (passes_quant.py derives the constants; int8
    operands and the offset shifted into uint8 by the `*_shift` attributes, as onnxruntime runs them). Each
    fused multiply-add is exact in float64 before its one rounding: an 8-bit integer times a float32, plus a
    float32 of like magnitude, spans well under 53 bits."""
    f, shift = np.float32, a.get("y_shift", 0)
    x, *y = (v.astype(np.float64) + a.get(k, 0) for v, k in zip(args, ("a_shift", "b_shift")[:len(args)], strict=True))
    inner = (y[0] * f(a["b_ratio"]) + f(a["offset"])).astype(np.float32) if y else f(a["offset"])
    total = (x * f(a["a_ratio"]) + inner).astype(np.float32)
    lo, hi = limits(a["y_dtype"])
    return [np.clip(np.rint(total) - shift, lo, hi).astype(a["y_dtype"])]


def _qavgpool(args: list[np.ndarray], a: dict) -> list[np.ndarray]:
    """Average of dequantized values over each window (float32 sum in row-major tap order, padding left out; the
    count excludes padding unless `count_include_pad`, and never counts the end padding), requantized as
    onnxruntime's QLinearAveragePool does: saturate(round(avg / sy + zy)), in float32 (zy shifted by `y_shift`)."""
    x, f = args[0], np.float32
    kh, kw = a["kernel_shape"]
    (sh, sw), (pt, pl) = a["strides"], a["pads"][:2]
    h, w = x.shape[-2:]
    oh, ow = pool_shape(h, w, a)
    xf = (f(a["x_scale"]) * (x.astype(np.int32) - int(a["x_zero_point"])).astype(f)).astype(f)
    eh, ew = max(0, (oh - 1) * sh + kh - (h + pt)), max(0, (ow - 1) * sw + kw - (w + pl))
    xp = np.pad(xf, ((0, 0),) * (x.ndim - 2) + ((pt, eh), (pl, ew)))
    acc = np.zeros(x.shape[:-2] + (oh, ow), f)
    for i in range(kh):
        for j in range(kw):
            acc = acc + xp[..., i: i + sh * (oh - 1) + 1: sh, j: j + sw * (ow - 1) + 1: sw]
    rows = np.arange(oh) * sh - pt
    cols = np.arange(ow) * sw - pl
    if a.get("count_include_pad", 0):
        count = np.full((oh, ow), kh * kw)
    else:
        count = np.outer(np.minimum(rows + kh, h) - np.maximum(rows, 0), np.minimum(cols + kw, w) - np.maximum(cols, 0))
    shift = a.get("y_shift", 0)
    y = np.rint(((acc / count.astype(f)).astype(f) / f(a["y_scale"])).astype(f) + f(a["y_zero_point"] + shift))
    lo, hi = limits(a["y_dtype"])
    return [np.clip(y - shift, lo, hi).astype(a["y_dtype"])]


def pool_shape(h: int, w: int, a: dict) -> tuple[int, int]:
    from stages.graph.reference import pool_out  # reference.py imports this module's ops

    (kh, kw), (sh, sw), (pt, pl, pb, pr) = a["kernel_shape"], a["strides"], a["pads"]
    ceil = a.get("ceil_mode", 0)
    return pool_out(h, kh, sh, pt, pb, 1, ceil), pool_out(w, kw, sw, pl, pr, 1, ceil)


# --- float islands between DQ and Q, as onnxruntime computes them (passes_quant_islands.py) ------------------

_LOGISTIC = {k: np.float32(v) for k, v in (
    ("lo", -18.0), ("hi", 18.0), ("a9", 4.37031012579801e-11), ("a7", 1.15627324459942e-07),
    ("a5", 6.08574864600143e-05), ("a3", 8.51377133304701e-03), ("a1", 2.48287947061529e-01),
    ("b10", 6.10247389755681e-13), ("b8", 5.76102136993427e-09), ("b6", 6.29106785017040e-06),
    ("b4", 1.70198817374094e-03), ("b2", 1.16817656904453e-01), ("b0", 9.93151921023180e-01))}


def fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 fused multiply-add rounded once: a * b is exact in float64, TwoSum gives the error of adding c,
    and a float64 sum that lands on a float32 tie is moved toward the exact value before the final rounding."""
    a, b, c = (np.asarray(v, np.float32).astype(np.float64) for v in (a, b, c))
    p = a * b
    s = p + c
    t = s - p
    err = (p - (s - t)) + (c - t)
    r = s.astype(np.float32)
    up, down = np.nextafter(r, np.float32(np.inf)), np.nextafter(r, np.float32(-np.inf))
    tie_up = (s == (r.astype(np.float64) + up) / 2) & (err > 0)
    tie_down = (s == (r.astype(np.float64) + down) / 2) & (err < 0)
    return np.where(tie_up, up, np.where(tie_down, down, r)).astype(np.float32)


def mlas_logistic(x: np.ndarray) -> np.ndarray:
    """onnxruntime's MlasComputeLogistic (its x86-64 FMA3 kernel): x clamped to [-18, 18], the odd/even rational
    polynomial of Eigen's logistic evaluated by fused multiply-adds, p / q + 0.5, clamped at 0."""
    c = _LOGISTIC
    x = np.minimum(np.maximum(np.asarray(x, np.float32), c["lo"]), c["hi"])
    x2 = x * x
    p = fma32(x2, c["a9"], c["a7"])
    for k in ("a5", "a3", "a1"):
        p = fma32(x2, p, c[k])
    q = fma32(x2, c["b10"], c["b8"])
    for k in ("b6", "b4", "b2", "b0"):
        q = fma32(x2, q, c[k])
    return np.maximum((x * p) / q + np.float32(0.5), np.float32(0))


LUT_FUNCTIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {"Sigmoid": mlas_logistic}


def lookup_table(fn: str, sx: float, zx: int, sy: float, zy: int, dtype: str) -> np.ndarray:
    """The 256 outputs (as uint8 bytes, indexed by the input's byte) of onnxruntime's QLinear lookup-table kernel:
    every input value dequantized as float32 sx * (q - zx), `fn` applied, quantized by sy, zy."""
    q = np.arange(256, dtype=np.uint8).view(dtype).astype(np.int32)
    y = LUT_FUNCTIONS[fn](np.float32(sx) * (q - int(zx)).astype(np.float32))
    return quantize(y, np.array(sy), np.array(zy), None, dtype).view(np.uint8)


def _qlut(args: list[np.ndarray], a: dict) -> list[np.ndarray]:
    x, table = args
    return [table[x.view(np.uint8)].view(a["y_dtype"])]


def _qmul(args: list[np.ndarray], a: dict) -> list[np.ndarray]:
    """onnxruntime's QLinearMul: y = saturate(round(float32((a - za) * (b - zb)) * ratio + zy)), float32 each step,
    ratio = sa * sb / sy, zy shifted by `y_shift`."""
    x, y = args
    shift = a.get("y_shift", 0)
    prod = ((x.astype(np.int32) - int(a["a_zero_point"])) * (y.astype(np.int32) - int(a["b_zero_point"])))
    total = prod.astype(np.float32) * np.float32(a["ratio"]) + np.float32(a["y_zero_point"] + shift)
    lo, hi = limits(a["y_dtype"])
    return [np.clip(np.rint(total) - shift, lo, hi).astype(a["y_dtype"])]


def eigen_sum(v: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Eigen's vectorised float32 sum (SSE, 4 lanes) of each column of v [K, M], column m starting `offsets[m]`
    floats past a 64-byte boundary: scalar head up to 16-byte alignment, two packet accumulators over pairs of
    packets, one more packet, the lanes added as (l0 + l2) + (l1 + l3), then the head and the tail in order."""
    k = v.shape[0]
    out = np.empty(v.shape[1:], np.float32)
    for m in range(v.shape[1]):
        col = v[:, m]
        start = (-int(offsets[m])) % 4 if k >= 4 else k
        packets = (k - start) // 4
        if packets == 0:
            acc = col[0]
            for i in range(1, k):
                acc = np.float32(acc + col[i])
            out[m] = acc
            continue
        end2, end = start + (packets // 2) * 8, start + packets * 4
        p0 = col[start:start + 4].copy()
        if packets > 1:
            p1 = col[start + 4:start + 8].copy()
            for i in range(start + 8, end2, 8):
                p0, p1 = p0 + col[i:i + 4], p1 + col[i + 4:i + 8]
            p0 = p0 + p1
            if end > end2:
                p0 = p0 + col[end2:end2 + 4]
        acc = np.float32(np.float32(p0[0] + p0[2]) + np.float32(p0[1] + p0[3]))
        for i in (*range(start), *range(end, k)):
            acc = np.float32(acc + col[i])
        out[m] = acc
    return out


def sum_by_fours(v: np.ndarray) -> np.ndarray:
    """MLAS's M=1 SGEMM kernel summing the rows of v [K, M]: each group of four rows added in order, the group
    then added to the total; the last two rows, then the last one, likewise."""
    k, total, i = v.shape[0], None, 0
    for size in [4] * (v.shape[0] // 4) + [2] * ((k % 4) // 2) + [1] * (k % 2):
        group = v[i].copy()
        for j in range(i + 1, i + size):
            group = group + v[j]
        total = group if total is None else group + total
        i += size
    return total


def _qmean(args: list[np.ndarray], a: dict) -> list[np.ndarray]:
    """DQ -> ReduceMean over the two spatial axes -> Q as onnxruntime runs it: the dequantized values summed in
    float32 in its order (`nhwc`: a product with a ones vector, which sums each channel over the positions in
    order for one image and by fours (sum_by_fours, its M=1 SGEMM kernel) for a batch; `nchw`: Eigen's
    vectorised sum of each plane, eigen_sum), divided by the count, quantized."""
    x = args[0]
    n, c, h, w = x.shape
    xf = np.float32(a["x_scale"]) * (x.astype(np.int32) - int(a["x_zero_point"])).astype(np.float32)
    planes = xf.reshape(n * c, h * w).T
    if a["order"] == "nhwc" and n == 1:
        acc = planes[0].copy()
        for i in range(1, h * w):
            acc = acc + planes[i]
    elif a["order"] == "nhwc":
        acc = sum_by_fours(planes)
    else:
        acc = eigen_sum(planes, np.arange(n * c) * (h * w))
    mean = (acc / np.float32(h * w)).reshape(n, c, 1, 1)
    return [quantize(mean, np.array(a["y_scale"]), np.array(a["y_zero_point"]), None, a["y_dtype"])]


def _qbatchnorm(args: list[np.ndarray], a: dict) -> list[np.ndarray]:
    """DQ -> BatchNormalization -> [Relu] -> Q as onnxruntime runs it: y = float32(x * scale[c]) + bias[c] (its
    folded scale and bias, passes_quant_islands.py), quantized, then the Relu as a clamp at the zero point."""
    x, scale, bias = args
    shape = (1, -1) + (1,) * (x.ndim - 2)
    xf = np.float32(a["x_scale"]) * (x.astype(np.int32) - int(a["x_zero_point"])).astype(np.float32)
    y = xf * scale.reshape(shape) + bias.reshape(shape)
    q = quantize(y, np.array(a["y_scale"]), np.array(a["y_zero_point"]), None, a["y_dtype"])
    return [np.maximum(q, q.dtype.type(a["y_zero_point"])) if a["relu"] else q]


def _qconcat(args: list[np.ndarray], a: dict) -> list[np.ndarray]:
    """DQ(x_0) ... DQ(x_k) -> Concat over channels -> Q: input i's bytes through row i of the [k, 256] table of
    quantize(dequantize_i(byte)) (passes_quant_islands.py builds it with quantize and dequantize above)."""
    *xs, table = args
    return [np.concatenate([table[i][x.view(np.uint8)] for i, x in enumerate(xs)], axis=1).view(a["y_dtype"])]


QUANT_OPS: dict[str, OpFn] = {
    "qavgpool": _qavgpool,
    "qlut": _qlut,
    "qmul": _qmul,
    "qmean": _qmean,
    "qbatchnorm": _qbatchnorm,
    "qconcat": _qconcat,
    "qadd": _qadd,
    "QuantizeLinear": lambda args, a: [quantize(args[0], args[1], args[2], a["axis"], a["dtype"])],
    "DequantizeLinear": lambda args, a: [dequantize(args[0], args[1], args[2], a["axis"])],
    "DynamicQuantizeLinear": _dynamic_quantize,
    "ConvInteger": _conv_integer,
    "MatMulInteger": _matmul_integer,
    "qconv2d": _qconv2d,
    "qdense": _qdense,
}
