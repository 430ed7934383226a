"""Valid configs of a space in a seeded random order, without replacement.

Small spaces are enumerated once and shuffled (exact: the tuner knows when it is exhausted);
large ones are sampled by rejection.
"""

from __future__ import annotations

import numpy as np

from stages.templates.space import ConfigSpace

ENUMERATE_LIMIT = 500_000
MAX_REJECTIONS = 200_000


class ValidSampler:
    def __init__(self, space: ConfigSpace, seed: int, exclude: set[int]):
        self.space = space
        self.rng = np.random.default_rng(seed)
        self.seen = set(exclude)
        self._order: list[int] | None = None
        if space.size <= ENUMERATE_LIMIT or getattr(space, "enumerable", False):
            valid = np.fromiter((i for i in space.valid_indices() if i not in self.seen), dtype=np.int64)
            self._order = self.rng.permutation(valid).tolist()[::-1]

    def has_next(self) -> bool:
        return bool(self._order) if self._order is not None else True

    def take(self, n: int) -> list[int]:
        out: list[int] = []
        if self._order is not None:
            while self._order and len(out) < n:
                idx = self._order.pop()
                if idx not in self.seen:
                    self.seen.add(idx)
                    out.append(idx)
            return out
        for _ in range(MAX_REJECTIONS):
            if len(out) == n:
                break
            idx = int(self.rng.integers(self.space.size))
            if idx not in self.seen and self.space.is_valid(idx):
                self.seen.add(idx)
                out.append(idx)
        return out
