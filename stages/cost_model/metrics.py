"""How well a model ranks: recall of the true top-k among its predicted top-k."""

from __future__ import annotations

import numpy as np


def topk_recall(predicted: np.ndarray, actual: np.ndarray, k: int) -> float:
    """|true top-k ∩ predicted top-k| / k (k clipped to the number of rows)."""
    k = min(k, len(actual))
    if k == 0:
        return float("nan")
    true_top = set(np.argsort(-np.asarray(actual), kind="stable")[:k].tolist())
    pred_top = set(np.argsort(-np.asarray(predicted), kind="stable")[:k].tolist())
    return len(true_top & pred_top) / k
