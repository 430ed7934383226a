"""The cost-model interface: learn relative speed from measured configs, score unmeasured ones."""

from __future__ import annotations

from typing import Protocol

import numpy as np


class CostModel(Protocol):
    name: str

    def fit(self, x: np.ndarray, y: np.ndarray, groups: np.ndarray, weights: np.ndarray) -> None:
        """x: features; y: throughput / best throughput of the row's task (0 for failures);
        groups: task id per row, 0, 1, ... in order, each task's rows contiguous; weights: per row."""

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Scores, higher is faster; only their order matters."""
