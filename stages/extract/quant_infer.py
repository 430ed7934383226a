"""Output shapes and element types of the quantized ops, normalised (stages/extract/quant.py) or canonical
(`qconv2d`, `qdense`, ...: stages/graph/passes_quant*.py), for the importer's static inference."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from stages.graph.reference import pool_out
from stages.graph.reference_quant import pool_shape

Shape = tuple[int, ...]
INT8_TYPES = ("uint8", "int8")


def _conv_shape(s: list[Shape], a: dict) -> list[Shape]:
    (n, c, h, w), (o, cg, kh, kw) = s[0], s[1]
    if len(s[0]) != 4 or c != cg * a["group"] or o % a["group"]:
        raise ValueError(f"input {list(s[0])} and weight {list(s[1])} do not fit group={a['group']}")
    (sh, sw), (dh, dw), (pt, pl, pb, pr) = a["strides"], a["dilations"], a["pads"]
    return [(n, o, pool_out(h, kh, sh, pt, pb, dh, 0), pool_out(w, kw, sw, pl, pr, dw, 0))]


def _matmul_shape(s: list[Shape], a: dict) -> list[Shape]:
    x, w = s[0], s[1]
    if len(w) != 2 or len(x) < 2 or x[-1] != w[0]:
        raise ValueError(f"{list(x)} @ {list(w)}: a 2-D right operand with matching inner dimension is supported")
    return [(*x[:-1], w[1])]


def _qdense_shape(s: list[Shape], a: dict) -> list[Shape]:
    x, w = s[0], s[1]
    if x[-1] != w[1]:
        raise ValueError(f"inner dimensions differ: {list(x)} and weight {list(w)}")
    return [(*x[:-1], w[0])]


SHAPES: dict[str, Callable[[list[Shape], dict], list[Shape]]] = {
    "QuantizeLinear": lambda s, a: [s[0]],
    "DequantizeLinear": lambda s, a: [s[0]],
    "DynamicQuantizeLinear": lambda s, a: [s[0], (), ()],
    "ConvInteger": _conv_shape,
    "MatMulInteger": _matmul_shape,
    "qconv2d": _conv_shape,
    "qdense": _qdense_shape,
    "qadd": lambda s, a: [s[0]],
    "qavgpool": lambda s, a: [(*s[0][:-2], *pool_shape(*s[0][-2:], a))],
    "qlut": lambda s, a: [s[0]],
    "qmul": lambda s, a: [tuple(int(d) for d in np.broadcast_shapes(s[0], s[1]))],
    "qmean": lambda s, a: [(*s[0][:2], 1, 1)],
    "qbatchnorm": lambda s, a: [s[0]],
    "qconcat": lambda s, a: [(s[0][0], sum(x[1] for x in s[:-1]), *s[0][2:])],
}

DTYPES: dict[str, Callable[[list[str], dict], list[str]]] = {
    "QuantizeLinear": lambda ins, a: [a["dtype"]],
    "DequantizeLinear": lambda ins, a: ["float32"],
    "DynamicQuantizeLinear": lambda ins, a: ["uint8", "float32", "uint8"],
    "ConvInteger": lambda ins, a: ["int32"],
    "MatMulInteger": lambda ins, a: ["int32"],
    "qconv2d": lambda ins, a: [a["y_dtype"]],
    "qdense": lambda ins, a: [a["y_dtype"]],
    "qadd": lambda ins, a: [a["y_dtype"]],
    "qavgpool": lambda ins, a: [a["y_dtype"]],
    **{op: (lambda ins, a: [a["y_dtype"]]) for op in ("qlut", "qmul", "qmean", "qbatchnorm", "qconcat")},
}
