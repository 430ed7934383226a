"""LightGBM cost models: regression on squared normalised throughput, or lambdarank on bucketed relevance.

Small and quick on purpose (it is retrained after every batch): few shallow trees, one thread.
"""

from __future__ import annotations

import lightgbm as lgb
import numpy as np

LEVELS = 31
PARAMS = {"learning_rate": 0.05, "num_leaves": 15, "min_data_in_leaf": 2, "feature_fraction": 0.9,
          "bagging_fraction": 0.9, "bagging_freq": 1, "lambda_l2": 1.0, "num_threads": 1, "verbose": -1,
          "deterministic": True, "force_row_wise": True}


class LGBMModel:
    def __init__(self, objective: str = "regression", rounds: int = 120, seed: int = 0):
        if objective not in ("regression", "lambdarank"):
            raise ValueError(f"objective must be regression or lambdarank, got {objective!r}")
        self.name = f"lgbm-{objective}"
        self.objective, self.rounds, self.seed = objective, rounds, seed
        self.booster: lgb.Booster | None = None

    def fit(self, x: np.ndarray, y: np.ndarray, groups: np.ndarray, weights: np.ndarray) -> None:
        params = {**PARAMS, "objective": self.objective, "seed": self.seed}
        if self.objective == "lambdarank":
            label = relevance(y)
            params |= {"label_gain": list(range(LEVELS)), "lambdarank_truncation_level": 30}
            data = lgb.Dataset(x, label, weight=weights, group=np.bincount(groups), free_raw_data=False)
        else:  # squared: the fast end of the range is what the search needs told apart
            data = lgb.Dataset(x, np.square(y), weight=weights, free_raw_data=False)
        self.booster = lgb.train(params, data, num_boost_round=self.rounds)

    def predict(self, x: np.ndarray) -> np.ndarray:
        if self.booster is None:
            return np.zeros(len(x))
        return self.booster.predict(x, num_threads=1)


def relevance(y: np.ndarray) -> np.ndarray:
    """Normalised throughput in [0, 1] → integer relevance 0..30 (lambdarank needs levels)."""
    return np.clip(np.floor(np.asarray(y) * (LEVELS - 1) + 0.5), 0, LEVELS - 1).astype(np.int32)
