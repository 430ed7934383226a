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


TRANSFORMER_OPS = {"AttentionSoftmax": attention_softmax}
