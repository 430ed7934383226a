"""Static shape inference of normalised nodes: one small function per op, looked up by op type."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from schemas.errors import ModelError
from stages.extract.quant_infer import SHAPES as QUANT_SHAPES
from stages.graph.reference import pool_out

Shape = tuple[int, ...]
MAX_RANK = 32  # numpy's broadcasting takes no more dims; no real model comes near


def _same(s: list[Shape], a: dict) -> list[Shape]:
    return [s[0]]


def _broadcast(s: list[Shape], a: dict) -> list[Shape]:
    return [tuple(np.broadcast_shapes(*s))]


def _conv(s: list[Shape], a: dict) -> list[Shape]:
    (n, c, h, w), (o, cg, kh, kw) = s[0], s[1]
    if len(s[0]) != 4 or c != cg * a["group"] or o % a["group"]:
        raise ValueError(f"input {list(s[0])} and weight {list(s[1])} do not fit group={a['group']}")
    if len(s) > 2 and s[2] != (o,):
        raise ValueError(f"bias {list(s[2])} does not match the {o} output channels")
    (sh, sw), (dh, dw), (pt, pl, pb, pr) = a["strides"], a["dilations"], a["pads"]
    return [(n, o, pool_out(h, kh, sh, pt, pb, dh, 0), pool_out(w, kw, sw, pl, pr, dw, 0))]


def _conv_transpose(s: list[Shape], a: dict) -> list[Shape]:
    (n, c, h, w), (cw, mg, kh, kw) = s[0], s[1]
    g = a["group"]
    if c != cw or c % g:
        raise ValueError(f"input {list(s[0])} and weight {list(s[1])} do not fit group={g}")
    if len(s) > 2 and s[2] != (mg * g,):
        raise ValueError(f"bias {list(s[2])} does not match the {mg * g} output channels")
    (sh, sw), (dh, dw), (pt, pl, pb, pr), (eh, ew) = a["strides"], a["dilations"], a["pads"], a["output_padding"]
    oh = sh * (h - 1) + eh + (kh - 1) * dh + 1 - pt - pb
    return [(n, mg * g, oh, sw * (w - 1) + ew + (kw - 1) * dw + 1 - pl - pr)]


def _pool(s: list[Shape], a: dict) -> list[Shape]:
    *lead, h, w = s[0]
    (kh, kw), (sh, sw), (dh, dw), (pt, pl, pb, pr) = a["kernel_shape"], a["strides"], a["dilations"], a["pads"]
    return [(*lead, pool_out(h, kh, sh, pt, pb, dh, a["ceil_mode"]), pool_out(w, kw, sw, pl, pr, dw, a["ceil_mode"]))]


def _matmul(s: list[Shape], a: dict) -> list[Shape]:
    x, y = s
    xx, yy = (1, *x) if len(x) == 1 else x, (*y, 1) if len(y) == 1 else y
    if xx[-1] != yy[-2]:
        raise ValueError(f"inner dimensions differ: {list(x)} @ {list(y)}")
    out = (*np.broadcast_shapes(xx[:-2], yy[:-2]), xx[-2], yy[-1])
    if len(x) == 1:
        out = out[:-2] + out[-1:]
    if len(y) == 1:
        out = out[:-1]
    return [tuple(out)]


def _gemm(s: list[Shape], a: dict) -> list[Shape]:
    m, k = s[0][::-1] if a["transA"] else s[0]
    k2, n = s[1][::-1] if a["transB"] else s[1]
    if k != k2:
        raise ValueError(f"inner dimensions differ: {list(s[0])} and {list(s[1])}")
    if len(s) > 2 and np.broadcast_shapes(s[2], (m, n)) != (m, n):
        raise ValueError(f"C {list(s[2])} does not broadcast to the output {[m, n]}")
    return [(m, n)]


def _batch_norm(s: list[Shape], a: dict) -> list[Shape]:
    if len(s[0]) < 2 or any(p != (s[0][1],) for p in s[1:]):
        raise ValueError(f"parameters {[list(p) for p in s[1:]]} do not match the {s[0][1:2]} channels of {list(s[0])}")
    return [s[0]]


def _concat(s: list[Shape], a: dict) -> list[Shape]:
    ax = a["axis"]
    out = list(s[0])
    out[ax] = sum(x[ax] for x in s)
    if any(len(x) != len(out) or x[:ax] + x[ax + 1:] != s[0][:ax] + s[0][ax + 1:] for x in s):
        raise ValueError(f"cannot concatenate {[list(x) for x in s]} on axis {ax}")
    return [tuple(out)]


def _split(s: list[Shape], a: dict) -> list[Shape]:
    return [s[0][:a["axis"]] + (n,) + s[0][a["axis"] + 1:] for n in a["split"]]


def _pad(s: list[Shape], a: dict) -> list[Shape]:
    r = len(s[0])
    return [tuple(d + a["pads"][i] + a["pads"][i + r] for i, d in enumerate(s[0]))]


def _reduce(s: list[Shape], a: dict) -> list[Shape]:
    if a["keepdims"]:
        return [tuple(1 if i in a["axes"] else d for i, d in enumerate(s[0]))]
    return [tuple(d for i, d in enumerate(s[0]) if i not in a["axes"])]


def _gather(s: list[Shape], a: dict) -> list[Shape]:
    ax = a["axis"]
    return [s[0][:ax] + s[1] + s[0][ax + 1:]]


def _gather_nd(s: list[Shape], a: dict) -> list[Shape]:
    data, idx, batch = s[0], s[1], a["batch_dims"]
    return [idx[:-1] + data[batch + idx[-1]:]]


SHAPES: dict[str, Callable[[list[Shape], dict], list[Shape]]] = {
    **QUANT_SHAPES,
    **{op: _same for op in ("Relu", "Sigmoid", "Tanh", "Erf", "Sqrt", "LeakyRelu", "Gelu", "Clip", "Softmax",
                            "LogSoftmax", "LRN", "LayerNormalization", "Abs", "Neg", "Exp", "Log", "Reciprocal",
                            "Floor", "Ceil", "Sign", "Softplus", "Softsign", "Elu", "Selu", "HardSigmoid", "Shrink",
                            "HardSwish", "Swish",
                            "InstanceNormalization")},
    **{op: _broadcast for op in ("Add", "Sub", "Mul", "Div", "Pow", "Sum", "Max", "Min", "Mean", "PRelu", "Mod")},
    **{op: _same for op in ("Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh")},
    "Conv": _conv, "ConvTranspose": _conv_transpose, "MaxPool": _pool, "AveragePool": _pool, "MatMul": _matmul,
    "Gemm": _gemm, "BatchNormalization": _batch_norm,
    **{op: (lambda s, a: [s[0][:2] + (1,) * (len(s[0]) - 2)]) for op in ("GlobalAveragePool", "GlobalMaxPool")},
    "Reshape": lambda s, a: [tuple(a["shape"])], "Flatten": lambda s, a: [tuple(a["shape"])],
    "Transpose": lambda s, a: [tuple(s[0][p] for p in a["perm"])],
    "Concat": _concat, "Split": _split, "Pad": _pad,
    **{op: _reduce for op in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
                              "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp")},
    "Slice": lambda s, a: [tuple(a["sizes"])],
    "Tile": lambda s, a: [tuple(d * r for d, r in zip(s[0], a["repeats"], strict=True))],
    **{op: _same for op in ("Not", "IsNaN", "IsInf", "Cast", "Trilu", "CumSum")},
    **{op: _broadcast for op in ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor",
                                 "Where")},
    "Expand": lambda s, a: [tuple(a["shape"])],
    "Resize": lambda s, a: [tuple(a["sizes"])],
    "Gather": _gather, "GatherND": _gather_nd, "GatherElements": lambda s, a: [s[1]],
}


def infer(op: str, node: str, shapes: list[Shape], attrs: dict) -> list[Shape]:
    """Output shapes of one normalised node; a mismatch is a ModelError naming the node."""
    if any(len(s) > MAX_RANK for s in shapes):
        raise ModelError(f"{op} {node!r}: an input has {max(len(s) for s in shapes)} dims; at most {MAX_RANK}")
    try:
        out = SHAPES[op](shapes, attrs)
    except (ValueError, IndexError, KeyError, ArithmeticError) as exc:
        raise ModelError(f"{op} {node!r}: {exc}") from None
    for shape in out:
        if len(shape) > MAX_RANK:
            raise ModelError(f"{op} {node!r}: its output would have {len(shape)} dims; at most {MAX_RANK}")
        if any(d <= 0 for d in shape):
            raise ModelError(f"{op} {node!r}: output shape {list(shape)} has an empty dimension")
    return out
