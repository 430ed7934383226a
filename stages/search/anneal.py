"""Simulated annealing over a space with persistent walkers: the model-based tuner's optimiser.

Walkers survive between rounds (the model changes a little per batch, so yesterday's good
region is today's starting point), and a few are reset to the best measured configs so the
search keeps refining what is known to be fast. A step changes one knob of each walker.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from stages.search.codec import SpaceCodec

Score = Callable[[np.ndarray], np.ndarray]


class Annealer:
    def __init__(self, codec: SpaceCodec, rng: np.random.Generator, walkers: int = 96, steps: int = 40,
                 patience: int = 6, t0: float = 1.0):
        self.codec, self.rng = codec, rng
        self.walkers, self.steps, self.patience, self.t0 = walkers, steps, patience, t0
        self.points: np.ndarray | None = None

    def find_maximums(self, score: Score, n: int, exclude: set[int], starts: np.ndarray | None = None) -> np.ndarray:
        """Up to n distinct rows not in `exclude`, best predicted first."""
        pts = self._start(starts)
        s = score(pts)
        scale = float(np.std(s)) or 1.0
        best: dict[int, float] = {}
        self._keep(best, pts, s, exclude)
        stale = 0
        for step in range(self.steps):
            cand = self.codec.repair(self._mutate(pts), self.rng)
            ok = cand[:, 0] >= 0
            cs = np.full(len(cand), -np.inf)
            if ok.any():
                cs[ok] = score(cand[ok])
            temp = self.t0 * scale * (1 - step / self.steps) + 1e-12
            accept = ok & (self.rng.random(len(pts)) < np.exp(np.minimum(0, (cs - s) / temp)))
            pts[accept], s[accept] = cand[accept], cs[accept]
            floor = min(best.values()) if len(best) >= n else -np.inf
            stale = 0 if self._keep(best, cand[ok], cs[ok], exclude, n) > floor else stale + 1
            if stale >= self.patience:
                break
        self.points = pts
        top = sorted(best, key=best.get, reverse=True)[:n]
        return self.codec.decode(np.array(top, dtype=np.int64)) if top else np.zeros((0, self.codec.width), np.int64)

    def _start(self, starts: np.ndarray | None) -> np.ndarray:
        if self.points is None or len(self.points) == 0:
            self.points = self.codec.random_valid(self.rng, self.walkers, set())
        pts = self.points.copy()
        if starts is not None and len(starts):
            k = min(len(starts), max(1, self.walkers // 8), len(pts))
            pts[self.rng.choice(len(pts), size=k, replace=False)] = starts[:k]
        return pts

    def _mutate(self, pts: np.ndarray) -> np.ndarray:
        out = pts.copy()
        rows = np.arange(len(pts))
        cols = self.rng.integers(0, self.codec.width, size=len(pts))
        radix = self.codec.radix[cols]
        shift = self.rng.integers(1, np.maximum(radix, 2))
        out[rows, cols] = (out[rows, cols] + shift) % radix
        return out

    def _keep(self, best: dict[int, float], rows: np.ndarray, scores: np.ndarray, exclude: set[int],
              n: int | None = None) -> float:
        """Merge rows into the best-n table; returns the best score merged (-inf if none)."""
        top = -np.inf
        for i, sc in zip(self.codec.encode(rows).tolist(), scores.tolist(), strict=True):
            if i in exclude or i in best:
                continue
            best[i] = sc
            top = max(top, sc)
        if n is not None and len(best) > 4 * n:
            for i in sorted(best, key=best.get)[: len(best) - 4 * n]:
                del best[i]
        return top
