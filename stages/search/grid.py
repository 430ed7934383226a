"""Every valid config in index order."""

from __future__ import annotations

from schemas.config import Config
from schemas.measure import MeasureResult
from stages.templates.space import ConfigSpace


class GridTuner:
    name = "grid"

    def __init__(self, space: ConfigSpace, seed: int = 0, exclude: set[int] | frozenset[int] | None = None):
        self.space = space
        self.exclude = exclude or set()
        self.cursor = 0

    def has_next(self) -> bool:
        return self.cursor < self.space.size

    def next_batch(self, n: int) -> list[Config]:
        out: list[Config] = []
        while len(out) < n and self.cursor < self.space.size:
            i = self.cursor
            self.cursor += 1
            if i not in self.exclude and self.space.is_valid(i):
                out.append(self.space.config(i))
        return out

    def update(self, configs: list[Config], results: list[MeasureResult]) -> None:
        """Grid search learns nothing."""
