"""ONNX nodes → tunaflow's normalised nodes, whatever the opset (6 to current).

Parameters that later opsets moved from attributes to inputs (Clip min/max, Reshape shape, Split
sizes, Slice starts/ends, Pad pads, Reduce* and Squeeze axes; Tile repeats too) must be constants
after folding; they become attributes, resolved against the static input shapes (see
stages/graph/reference.py for the normalised attributes). A few ops are rewritten on the way:
Squeeze/Unsqueeze become Reshape, opset < 13 Softmax over trailing axes becomes
Reshape-Softmax-Reshape, an opset < 7 PRelu's per-channel slope is reshaped to broadcast over
axis 1, and 1-D Conv and pooling run as 2-D ones on a height of one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from schemas.errors import ModelError
from stages.graph.reference import pool_out

Emit = tuple[str, list[str], list[str], dict]  # op, inputs, outputs, attrs
FLOAT_MAX = float(np.finfo(np.float32).max)


@dataclass
class Ctx:
    """What a normaliser may look at: the opset, static shapes, and folded constants."""

    opset: int
    op: str
    shapes: dict[str, tuple[int, ...]]
    consts: dict[str, np.ndarray]
    dtypes: dict[str, str] = field(default_factory=dict)  # run-time tensors' (constants carry their own)
    node: str = ""
    used: set[str] = field(default_factory=set)
    counter: list[int] = field(default_factory=lambda: [0])
    quantized: dict[str, Emit] = field(default_factory=dict)  # folded DequantizeLinear outputs: their node

    def shape(self, name: str) -> tuple[int, ...]:
        return self.shapes[name]

    def dtype(self, name: str) -> str:
        return self.consts[name].dtype.name if name in self.consts else self.dtypes[name]

    def const(self, name: str, what: str) -> np.ndarray:
        if name not in self.consts:
            raise ModelError(f"{self.op} {self.node!r}: its {what} ({name!r}) must be a constant, but it is "
                             "computed at run time")
        return self.consts[name]

    def opt_const(self, ins: list[str], i: int, what: str) -> np.ndarray | None:
        return self.const(ins[i], what) if len(ins) > i and ins[i] else None

    def extra_outputs_read(self, outs: list[str]) -> bool:
        """Whether a node's secondary outputs (MaxPool indices, training statistics) are read by anyone."""
        return any(o in self.used for o in outs[1:] if o)

    def fresh(self, base: str) -> str:
        self.counter[0] += 1
        return f"{base}__tf{self.counter[0]}"


def _axis(axis: int, rank: int, past_end: bool = False) -> int:
    """`axis` counted from 0; ValueError (the importer names the node) outside [-rank, rank), or up to rank
    inclusive with `past_end` (Flatten's split point): ReduceL2 over axis 7 of a 4-D tensor once built."""
    top = rank + 1 if past_end else rank
    if not -rank <= axis < top:
        raise ValueError(f"axis {axis} is out of range for a rank-{rank} tensor")
    return axis + rank if axis < 0 else axis


def _plain(ins, outs, raw, ctx) -> list[Emit]:
    return [(ctx.op, ins, outs[:1], {})]


def _binary(ins, outs, raw, ctx) -> list[Emit]:
    """Opset < 7 broadcasting with `axis` aligns B at that axis of A: pad B's shape with ones on the right."""
    if ctx.opset >= 7 or "axis" not in raw:
        return _plain(ins, outs, raw, ctx)
    a, b = ctx.shape(ins[0]), ctx.shape(ins[1])
    aligned = [*b, *[1] * (len(a) - _axis(int(raw["axis"]), len(a)) - len(b))]
    b2 = ctx.fresh(ins[1])
    return [("Reshape", [ins[1]], [b2], {"shape": aligned}), (ctx.op, [ins[0], b2], outs[:1], {})]


def _keep(*names_defaults: tuple[str, object]):
    def fn(ins, outs, raw, ctx) -> list[Emit]:
        return [(ctx.op, ins, outs[:1], {n: raw.get(n, d) for n, d in names_defaults})]
    return fn


def _clip(ins, outs, raw, ctx) -> list[Emit]:
    if ctx.opset < 11:
        lo, hi = raw.get("min", -FLOAT_MAX), raw.get("max", FLOAT_MAX)
    else:
        lo_c, hi_c = ctx.opt_const(ins, 1, "min"), ctx.opt_const(ins, 2, "max")
        lo = float(lo_c.reshape(-1)[0]) if lo_c is not None else -FLOAT_MAX
        hi = float(hi_c.reshape(-1)[0]) if hi_c is not None else FLOAT_MAX
    return [("Clip", ins[:1], outs[:1], {"min": float(lo), "max": float(hi)})]


def _resolve_pads(raw: dict, size: tuple[int, ...], kernel, strides, dilations) -> list[int]:
    """Explicit pads (all begins, then all ends) from `pads` or `auto_pad`."""
    auto = raw.get("auto_pad", "NOTSET")
    n = len(kernel)
    if auto in ("NOTSET", ""):
        return list(raw.get("pads", [0] * 2 * n))
    if auto == "VALID":
        return [0] * 2 * n
    begins, ends = [], []
    for x, k, s, d in zip(size, kernel, strides, dilations, strict=True):
        out = -(-x // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - x)
        small, big = total // 2, total - total // 2
        begins.append(small if auto == "SAME_UPPER" else big)
        ends.append(big if auto == "SAME_UPPER" else small)
    return begins + ends


def _windowed(ins, outs, raw, ctx, kernel: list[int]) -> list[Emit]:
    """Conv / MaxPool / AveragePool: explicit 2-D attributes; 1-D runs on a height of one."""
    x_shape = ctx.shape(ins[0])
    n = len(kernel)
    if n not in (1, 2):
        raise ModelError(f"{ctx.op} {ctx.node!r}: only 1-D and 2-D windows are supported, this one is {n}-D")
    strides = list(raw.get("strides", [1] * n))
    dilations = list(raw.get("dilations", [1] * n))
    pads = _resolve_pads(raw, x_shape[2:], kernel, strides, dilations)
    attrs = {"strides": strides, "dilations": dilations, "pads": pads}
    if ctx.op == "Conv":
        attrs["group"] = int(raw.get("group", 1))
    else:
        attrs.update(kernel_shape=list(kernel), ceil_mode=int(raw.get("ceil_mode", 0)),
                     count_include_pad=int(raw.get("count_include_pad", 0)))
        if ctx.extra_outputs_read(outs):
            raise ModelError(f"MaxPool {ctx.node!r}: the Indices output is not supported")
    if n == 2:
        return [(ctx.op, ins, outs[:1], attrs)]
    attrs2 = {**attrs, "strides": [1, strides[0]], "dilations": [1, dilations[0]], "pads": [0, pads[0], 0, pads[1]]}
    if "kernel_shape" in attrs:
        attrs2["kernel_shape"] = [1, kernel[0]]
    x4, y4 = ctx.fresh(ins[0]), ctx.fresh(outs[0])
    new_ins = [x4, *ins[1:]]
    emits: list[Emit] = [("Reshape", [ins[0]], [x4], {"shape": [*x_shape[:2], 1, x_shape[2]]})]
    if ctx.op == "Conv":
        w = ctx.const(ins[1], "weight")
        new_ins[1] = ctx.fresh(ins[1])
        ctx.consts[new_ins[1]] = w.reshape(w.shape[0], w.shape[1], 1, w.shape[2])
        ctx.shapes[new_ins[1]] = ctx.consts[new_ins[1]].shape
    emits.append((ctx.op, new_ins, [y4], attrs2))
    length = pool_out(x_shape[2], kernel[0], strides[0], pads[0], pads[1], dilations[0], attrs.get("ceil_mode", 0))
    channels = ctx.shape(ins[1])[0] if ctx.op == "Conv" else x_shape[1]
    emits.append(("Reshape", [y4], outs[:1], {"shape": [x_shape[0], channels, length]}))
    return emits


def _conv(ins, outs, raw, ctx) -> list[Emit]:
    w = ctx.shape(ins[1])
    return _windowed(ins, outs, raw, ctx, list(raw.get("kernel_shape", w[2:])))


def _conv_transpose(ins, outs, raw, ctx) -> list[Emit]:
    """Explicit 2-D attributes: pads from `pads`, `auto_pad` or `output_shape` (which wins), resolved
    as the ONNX spec does; `output_padding` extends the end of each axis."""
    x, w = ctx.shape(ins[0]), ctx.shape(ins[1])
    kernel = list(raw.get("kernel_shape", w[2:]))
    if len(kernel) != 2 or len(x) != 4:
        raise ModelError(f"ConvTranspose {ctx.node!r}: only 2-D windows are supported, this one is "
                         f"{len(kernel)}-D")
    strides, dilations = list(raw.get("strides", [1, 1])), list(raw.get("dilations", [1, 1]))
    extra = list(raw.get("output_padding", [0, 0]))
    full = [s * (i - 1) + e + (k - 1) * d + 1 for i, k, s, d, e in zip(x[2:], kernel, strides, dilations, extra,
                                                                         strict=True)]
    auto = raw.get("auto_pad", "NOTSET")
    if "output_shape" in raw or auto in ("SAME_UPPER", "SAME_LOWER"):
        wanted = list(raw["output_shape"])[-2:] if "output_shape" in raw else [i * s for i, s in zip(x[2:], strides,
                                                                                                          strict=True)]
        totals = [f - o for f, o in zip(full, wanted, strict=True)]
        if any(t < 0 for t in totals):
            raise ModelError(f"ConvTranspose {ctx.node!r}: output shape {wanted} exceeds the {full} its window, "
                             "strides and output_padding can reach")
        begins = [t // 2 if auto == "SAME_UPPER" else t - t // 2 for t in totals]
        pads = begins + [t - b for t, b in zip(totals, begins, strict=True)]
    else:
        pads = [0] * 4 if auto == "VALID" else list(raw.get("pads", [0] * 4))
    return [("ConvTranspose", ins, outs[:1], {"strides": strides, "dilations": dilations, "pads": pads,
                                               "output_padding": extra, "group": int(raw.get("group", 1))})]


def _pool(ins, outs, raw, ctx) -> list[Emit]:
    return _windowed(ins, outs, raw, ctx, list(raw["kernel_shape"]))


def _reshape(ins, outs, raw, ctx) -> list[Emit]:
    src = ctx.shape(ins[0])
    target = [int(v) for v in (raw["shape"] if ctx.opset < 5 else ctx.const(ins[1], "shape"))]
    if not raw.get("allowzero", 0):
        target = [src[i] if v == 0 else v for i, v in enumerate(target)]
    if -1 in target:
        known = math.prod(v for v in target if v != -1)
        target[target.index(-1)] = math.prod(src) // known if known else 0
    if math.prod(target) != math.prod(src):
        raise ModelError(f"Reshape {ctx.node!r}: cannot reshape {list(src)} into {target}")
    return [("Reshape", ins[:1], outs[:1], {"shape": target})]


def _flatten(ins, outs, raw, ctx) -> list[Emit]:
    src = ctx.shape(ins[0])
    axis = _axis(int(raw.get("axis", 1)), len(src), past_end=True)
    return [("Flatten", ins[:1], outs[:1], {"shape": [math.prod(src[:axis]), math.prod(src[axis:])]})]


def _axes_arg(ins, raw, ctx, opset_input: int) -> list[int] | None:
    if ctx.opset < opset_input:
        return list(raw["axes"]) if "axes" in raw else None
    axes = ctx.opt_const(ins, 1, "axes")
    return None if axes is None else [int(a) for a in axes.reshape(-1)]


def _squeeze(ins, outs, raw, ctx) -> list[Emit]:
    src = ctx.shape(ins[0])
    axes = _axes_arg(ins, raw, ctx, 13)
    drop = {_axis(a, len(src)) for a in axes} if axes else {i for i, d in enumerate(src) if d == 1}
    return [("Reshape", ins[:1], outs[:1], {"shape": [d for i, d in enumerate(src) if i not in drop]})]


def _unsqueeze(ins, outs, raw, ctx) -> list[Emit]:
    shape = list(ctx.shape(ins[0]))
    axes = _axes_arg(ins, raw, ctx, 13) or []
    rank = len(shape) + len(axes)
    new = {_axis(a, rank) for a in axes}
    if len(new) != len(axes) or not all(0 <= a < rank for a in new):
        raise ModelError(f"Unsqueeze {ctx.node!r}: axes {list(axes)[:8]} are not distinct axes of a rank-{rank} output")
    dims = iter(shape)
    return [("Reshape", ins[:1], outs[:1], {"shape": [1 if i in new else next(dims) for i in range(rank)]})]


def _transpose(ins, outs, raw, ctx) -> list[Emit]:
    rank = len(ctx.shape(ins[0]))
    return [("Transpose", ins, outs[:1], {"perm": list(raw.get("perm", range(rank - 1, -1, -1)))})]


def _concat(ins, outs, raw, ctx) -> list[Emit]:
    return [("Concat", ins, outs[:1], {"axis": _axis(int(raw["axis"]), len(ctx.shape(ins[0])))})]


def _split(ins, outs, raw, ctx) -> list[Emit]:
    src = ctx.shape(ins[0])
    axis = _axis(int(raw.get("axis", 0)), len(src))
    sizes = raw.get("split") if ctx.opset < 13 else ctx.opt_const(ins, 1, "split")
    if sizes is None:
        parts = len(outs)
        chunk = -(-src[axis] // parts)
        sizes = [min(chunk, src[axis] - i * chunk) for i in range(parts)]
    sizes = [int(s) for s in np.asarray(sizes).reshape(-1)]
    if sum(sizes) != src[axis]:
        raise ModelError(f"Split {ctx.node!r}: sizes {sizes} do not add up to {src[axis]}")
    return [("Split", ins[:1], outs, {"axis": axis, "split": sizes})]


def _slice(ins, outs, raw, ctx) -> list[Emit]:
    src = ctx.shape(ins[0])
    if ctx.opset < 10:
        starts, ends = raw["starts"], raw["ends"]
        axes, steps = raw.get("axes", range(len(starts))), [1] * len(starts)
    else:
        starts, ends = ctx.const(ins[1], "starts"), ctx.const(ins[2], "ends")
        axes = ctx.opt_const(ins, 3, "axes")
        steps = ctx.opt_const(ins, 4, "steps")
        axes = range(len(starts)) if axes is None else axes
        steps = [1] * len(starts) if steps is None else steps
    st, sp, sz = [0] * len(src), [1] * len(src), list(src)
    for a, b, e, s in zip(axes, starts, ends, steps, strict=True):
        a, b, e, s, dim = _axis(int(a), len(src)), int(b), int(e), int(s), src[_axis(int(a), len(src))]
        b = b + dim if b < 0 else b
        e = e + dim if e < 0 else e
        b = min(max(b, 0), dim) if s > 0 else min(max(b, 0), dim - 1)
        e = min(max(e, 0), dim) if s > 0 else min(max(e, -1), dim - 1)
        st[a], sp[a], sz[a] = b, s, max(0, -(-(e - b) // s))
    return [("Slice", ins[:1], outs[:1], {"starts": st, "steps": sp, "sizes": sz})]


GATHER_MAX_PIECES = 64  # non-contiguous constant indices become this many slices at most


def _gather(ins, outs, raw, ctx) -> list[Emit]:
    """Gather of a run-time tensor by constant indices (ViT's class token, an exporter's as_strided) in at most
    GATHER_MAX_PIECES runs of consecutive indices: Slices of the runs, joined by a Concat, reshaped to
    Gather's output shape (an index out of range is an error here). Any other Gather (an embedding table read
    by run-time token ids, scattered indices) is a Gather node, which checks its indices at run time."""
    src = ctx.shape(ins[0])
    axis = int(raw.get("axis", 0))
    if not -len(src) <= axis < len(src):
        raise ModelError(f"Gather {ctx.node!r}: axis {axis} is out of range for its rank-{len(src)} data")
    axis %= len(src)
    if ctx.dtype(ins[1]) not in ("int64", "int32"):
        raise ModelError(f"Gather {ctx.node!r}: its indices are {ctx.dtype(ins[1])}, not int64 or int32")
    node = [("Gather", ins[:2], outs[:1], {"axis": axis})]
    if ins[0] in ctx.consts or ins[1] not in ctx.consts:
        return node
    idx = np.asarray(ctx.consts[ins[1]])
    flat = idx.reshape(-1).astype(np.int64)
    if ((flat < -src[axis]) | (flat >= src[axis])).any():
        raise ModelError(f"Gather {ctx.node!r}: an index is out of range for axis {axis} of size {src[axis]}")
    flat = np.where(flat < 0, flat + src[axis], flat)
    runs: list[tuple[int, int]] = []  # (start, length)
    for i in flat.tolist():
        if runs and runs[-1][0] + runs[-1][1] == i:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    if len(runs) > GATHER_MAX_PIECES:
        return node
    out_shape = [*src[:axis], *idx.shape, *src[axis + 1:]]
    if runs == [(0, src[axis])]:  # every index in order (an exporter's mask reshuffle): a reshape, no copy
        return [("Reshape", ins[:1], outs[:1], {"shape": out_shape})]
    emits: list[Emit] = []
    pieces = []
    for start, length in runs:
        piece = ctx.fresh(outs[0])
        starts, sizes = [0] * len(src), list(src)
        starts[axis], sizes[axis] = start, length
        emits.append(("Slice", ins[:1], [piece], {"starts": starts, "steps": [1] * len(src), "sizes": sizes}))
        pieces.append(piece)
    joined = pieces[0]
    if len(pieces) > 1:
        joined = ctx.fresh(outs[0])
        emits.append(("Concat", pieces, [joined], {"axis": axis}))
    emits.append(("Reshape", [joined], outs[:1], {"shape": out_shape}))
    return emits


def _pad(ins, outs, raw, ctx) -> list[Emit]:
    rank = len(ctx.shape(ins[0]))
    if ctx.opset < 11:
        pads, value = list(raw["pads"]), float(raw.get("value", 0.0))
    else:
        pads = [int(p) for p in ctx.const(ins[1], "pads")]
        v = ctx.opt_const(ins, 2, "constant value")
        value = float(v.reshape(-1)[0]) if v is not None else 0.0
        axes = ctx.opt_const(ins, 3, "axes")
        if axes is not None:
            full = [0] * 2 * rank
            for i, a in enumerate(int(a) for a in axes):
                full[_axis(a, rank)], full[_axis(a, rank) + rank] = pads[i], pads[i + len(axes)]
            pads = full
    mode = raw.get("mode", "constant")
    if mode not in ("constant", "reflect", "edge"):
        raise ModelError(f"Pad {ctx.node!r}: mode {mode!r} is not supported")
    return [("Pad", ins[:1], outs[:1], {"pads": [int(p) for p in pads], "mode": mode, "value": value})]


def _softmax(ins, outs, raw, ctx) -> list[Emit]:
    src = ctx.shape(ins[0])
    axis = _axis(int(raw.get("axis", 1 if ctx.opset < 13 else -1)), len(src))
    if ctx.opset >= 13 or axis == len(src) - 1:
        return [(ctx.op, ins, outs[:1], {"axis": axis})]
    flat, y2 = ctx.fresh(ins[0]), ctx.fresh(outs[0])
    return [("Reshape", ins, [flat], {"shape": [math.prod(src[:axis]), math.prod(src[axis:])]}),
            (ctx.op, [flat], [y2], {"axis": 1}),
            ("Reshape", [y2], outs[:1], {"shape": list(src)})]


def _layer_norm(ins, outs, raw, ctx) -> list[Emit]:
    if ctx.extra_outputs_read(outs):
        raise ModelError(f"LayerNormalization {ctx.node!r}: the Mean/InvStdDev outputs are not supported")
    axis = _axis(int(raw.get("axis", -1)), len(ctx.shape(ins[0])))
    return [("LayerNormalization", ins, outs[:1], {"axis": axis, "epsilon": float(raw.get("epsilon", 1e-5))})]


def _reduce(opset_input: int):
    """ReduceSum takes its axes as an input from opset 13, the other reductions from opset 18."""
    def fn(ins, outs, raw, ctx) -> list[Emit]:
        rank = len(ctx.shape(ins[0]))
        axes = _axes_arg(ins, raw, ctx, opset_input)
        if not axes and raw.get("noop_with_empty_axes", 0):
            return [("Reshape", ins[:1], outs[:1], {"shape": list(ctx.shape(ins[0]))})]
        axes = sorted(_axis(a, rank) for a in axes) if axes else list(range(rank))
        return [(ctx.op, ins[:1], outs[:1], {"axes": axes, "keepdims": int(raw.get("keepdims", 1))})]
    return fn


def _tile(ins, outs, raw, ctx) -> list[Emit]:
    repeats = ctx.const(ins[1], "repeats").reshape(-1)
    if len(repeats) != len(ctx.shape(ins[0])) or (repeats < 0).any():
        raise ModelError(f"Tile {ctx.node!r}: repeats {repeats.tolist()} must be one non-negative count per axis "
                         f"of its {len(ctx.shape(ins[0]))}-D input")
    return [("Tile", ins[:1], outs[:1], {"repeats": [int(r) for r in repeats]})]


def _prelu(ins, outs, raw, ctx) -> list[Emit]:
    """Before opset 7 a 1-D slope of C values is per channel (axis 1), not numpy-broadcast on the last axis."""
    x, slope = ctx.shape(ins[0]), ctx.shape(ins[1])
    if not (ctx.opset < 7 and len(slope) == 1 and len(x) >= 3 and slope[0] == x[1] != 1):
        return _plain(ins, outs, raw, ctx)
    per_channel = ctx.fresh(ins[1])
    return [("Reshape", [ins[1]], [per_channel], {"shape": [slope[0]] + [1] * (len(x) - 2)}),
            ("PRelu", [ins[0], per_channel], outs[:1], {})]


def _batch_norm(ins, outs, raw, ctx) -> list[Emit]:
    if ctx.extra_outputs_read(outs):
        raise ModelError(f"BatchNormalization {ctx.node!r}: training outputs are not supported")
    for name, what in zip(ins[1:], ("scale", "bias", "mean", "variance"), strict=True):
        ctx.const(name, what)
    return [("BatchNormalization", ins, outs[:1], {"epsilon": float(raw.get("epsilon", 1e-5))})]


def _gemm(ins, outs, raw, ctx) -> list[Emit]:
    attrs = {"alpha": float(raw.get("alpha", 1.0)), "beta": float(raw.get("beta", 1.0)),
             "transA": int(raw.get("transA", 0)), "transB": int(raw.get("transB", 0))}
    return [("Gemm", [i for i in ins if i], outs[:1], attrs)]


def _lrn(ins, outs, raw, ctx) -> list[Emit]:
    return [("LRN", ins, outs[:1], {"size": int(raw["size"]), "alpha": float(raw.get("alpha", 1e-4)),
                                     "beta": float(raw.get("beta", 0.75)), "bias": float(raw.get("bias", 1.0))})]


NORMALIZERS: dict[str, Callable[..., list[Emit]]] = {
    **{op: _plain for op in ("Relu", "Sigmoid", "Tanh", "Erf", "Sqrt", "Sum", "MatMul", "GlobalAveragePool",
                             "GlobalMaxPool", "Abs", "Neg", "Exp", "Log", "Reciprocal", "Floor", "Ceil", "Sign",
                             "Softplus", "Softsign", "Max", "Min", "Mean", "Sin", "Cos", "Tan", "Asin", "Acos",
                             "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh")},
    "Mod": _keep(("fmod", 0)),
    **{op: _binary for op in ("Add", "Sub", "Mul", "Div", "Pow")},
    "LeakyRelu": _keep(("alpha", 0.01)),
    "Elu": _keep(("alpha", 1.0)), "PRelu": _prelu, "Tile": _tile,
    "Selu": _keep(("alpha", 1.67326319217681884765625), ("gamma", 1.05070102214813232421875)),
    "HardSigmoid": _keep(("alpha", 0.2), ("beta", 0.5)),
    "HardSwish": _keep(("alpha", 1 / 6), ("beta", 0.5)),  # x * HardSigmoid(x) at ONNX's fixed alpha and beta
    "Swish": _keep(("alpha", 1.0)),
    "InstanceNormalization": _keep(("epsilon", 1e-5)),
    "Shrink": _keep(("bias", 0.0), ("lambd", 0.5)),
    "ReduceSum": _reduce(13), "ReduceMax": _reduce(18), "ReduceMin": _reduce(18),
    **{op: _reduce(18) for op in ("ReduceProd", "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum",
                                  "ReduceLogSumExp")},
    "Gelu": _keep(("approximate", "none")),
    "Clip": _clip, "Conv": _conv, "ConvTranspose": _conv_transpose, "MaxPool": _pool, "AveragePool": _pool,
    "Gemm": _gemm,
    "BatchNormalization": _batch_norm, "Reshape": _reshape, "Flatten": _flatten, "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze, "Transpose": _transpose, "Concat": _concat, "Split": _split, "Slice": _slice,
    "Pad": _pad, "Softmax": _softmax, "LogSoftmax": _softmax, "LayerNormalization": _layer_norm,
    "ReduceMean": _reduce(18), "LRN": _lrn, "Gather": _gather,
}
