"""The numpy meaning of the fused transformer nodes (stages/graph/passes_transformer.py), for the interpreter."""

from __future__ import annotations

import numpy as np


def attention_softmax(args: list[np.ndarray], a: dict) -> list[np.ndarray]:
    """softmax(scale * S + mask) over the last axis, NaN replaced by `nan_to` when that is set."""
    z = args[0].astype(np.float64) * a.get("scale", 1.0)
    if len(args) > 1:
        z = z + args[1]
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    p = e / e.sum(axis=-1, keepdims=True)
    if a.get("nan_to") is not None:
        p = np.where(np.isnan(p), a["nan_to"], p)
    return [p.astype(args[0].dtype)]


def add_layer_norm(args: list[np.ndarray], a: dict) -> list[np.ndarray]:
    """LayerNormalization of the sum of the first `terms` inputs (left to right); with `with_sum`, the sum is the
    second output."""
    terms = int(a["terms"])
    total = args[0]
    for t in args[1:terms]:
        total = total + t
    scale, bias = args[terms], (args[terms + 1] if len(args) > terms + 1 else 0.0)
    axes = tuple(range(a["axis"] % total.ndim, total.ndim))
    mean = total.mean(axis=axes, keepdims=True)
    var = ((total - mean) ** 2).mean(axis=axes, keepdims=True)
    y = ((total - mean) / np.sqrt(var + a.get("epsilon", 1e-5)) * scale + bias).astype(np.float32)
    return [y, total.astype(np.float32)] if a.get("with_sum") else [y]


TRANSFORMER_OPS = {"AttentionSoftmax": attention_softmax, "AddLayerNormalization": add_layer_norm}
