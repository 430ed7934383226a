"""Configs as rows of knob-choice positions, so search operators work on numpy arrays.

Row `[p0, p1, ...]` holds, for each knob, the position of its value among the knob's choices;
the config index is the mixed-radix number those positions spell (the space's enumeration).
When the space's valid configs are few (a recorded sample, a small task), the codec keeps them
as a pool and `repair` moves an invalid row to its nearest valid one, so mutation-based search
still has neighbours to walk to.
"""

from __future__ import annotations

import numpy as np

from schemas.config import Config
from stages.templates.space import ConfigSpace, Knobs

POOL_LIMIT = 20_000


def small_pool(space: ConfigSpace) -> np.ndarray | None:
    """All valid indices when that is cheap to know: a small space, or one that lists its members."""
    if space.size <= POOL_LIMIT or getattr(space, "enumerable", False):
        return np.fromiter(space.valid_indices(), dtype=np.int64)
    return None


class SpaceCodec:
    def __init__(self, space: ConfigSpace, pool: np.ndarray | None = None):
        self.space = space
        self.radix = np.array([len(k.choices) for k in space.knobs], dtype=np.int64)
        self.stride = np.array([int(np.prod(self.radix[i + 1:])) for i in range(len(self.radix))], dtype=np.int64)
        self.pool = None if pool is None or len(pool) > POOL_LIMIT else np.sort(np.asarray(pool, dtype=np.int64))
        self._pool_rows = None if self.pool is None else self.decode(self.pool)
        self._numeric = [all(isinstance(c, int) for c in k.choices) for k in space.knobs]
        self._values = [np.array(k.choices, dtype=np.float64 if num else object)
                        for k, num in zip(space.knobs, self._numeric, strict=True)]

    @property
    def width(self) -> int:
        return len(self.radix)

    def decode(self, indices: np.ndarray) -> np.ndarray:
        idx = np.asarray(indices, dtype=np.int64)
        return (idx[:, None] // self.stride[None, :]) % self.radix[None, :]

    def encode(self, rows: np.ndarray) -> np.ndarray:
        return np.asarray(rows, dtype=np.int64) @ self.stride

    def values(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """Knob name → value per row (float, or object for string knobs)."""
        knobs = zip(self.space.knobs, self._values, strict=True)
        return {k.name: vals[rows[:, j]] for j, (k, vals) in enumerate(knobs)}

    def knobs(self, row: np.ndarray) -> Knobs:
        return {k.name: k.choices[int(p)] for k, p in zip(self.space.knobs, row, strict=True)}

    def config(self, index: int) -> Config:
        return Config(index=int(index), knobs=self.knobs(self.decode(np.array([index]))[0]))

    def valid(self, rows: np.ndarray) -> np.ndarray:
        if self.pool is not None:
            return np.isin(self.encode(rows), self.pool)
        return np.array([self.space.rule(self.knobs(r)) is None for r in rows], dtype=bool)

    def repair(self, rows: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Rows made valid: unchanged if valid; with a pool, the nearest pool row (ties at random);
        without one, -1 marks a row that stays invalid."""
        ok = self.valid(rows)
        out = np.asarray(rows, dtype=np.int64).copy()
        bad = np.flatnonzero(~ok)
        if not len(bad):
            return out
        if self._pool_rows is None:
            out[bad] = -1
            return out
        dist = (out[bad][:, None, :] != self._pool_rows[None, :, :]).sum(axis=2).astype(np.float64)
        dist += rng.random(dist.shape) * 0.5
        out[bad] = self._pool_rows[dist.argmin(axis=1)]
        return out

    def random_valid(self, rng: np.random.Generator, n: int, exclude: set[int], tries: int = 50) -> np.ndarray:
        """Up to n distinct valid rows whose index is not in `exclude`."""
        if n <= 0:
            return np.zeros((0, self.width), dtype=np.int64)
        if self.pool is not None:
            free = np.array([i for i in self.pool if int(i) not in exclude], dtype=np.int64)
            pick = rng.choice(free, size=min(n, len(free)), replace=False) if len(free) else free
            return self.decode(pick)
        rows: list[np.ndarray] = []
        taken = set(exclude)
        for _ in range(tries):
            cand = rng.integers(0, self.radix, size=(max(4 * n, 64), self.width))
            for r in cand[self.valid(cand)]:
                i = int(self.encode(r[None, :])[0])
                if i not in taken:
                    taken.add(i)
                    rows.append(r)
                    if len(rows) == n:
                        return np.array(rows, dtype=np.int64)
        return np.array(rows, dtype=np.int64).reshape(-1, self.width)
