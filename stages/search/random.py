"""Uniform random search without replacement."""

from __future__ import annotations

from schemas.config import Config
from schemas.measure import MeasureResult
from stages.search.valid import ValidSampler
from stages.templates.space import ConfigSpace


class RandomTuner:
    name = "random"

    def __init__(self, space: ConfigSpace, seed: int = 0, exclude: set[int] | frozenset[int] | None = None):
        self.space = space
        self.sampler = ValidSampler(space, seed, set(exclude or ()))

    def has_next(self) -> bool:
        return self.sampler.has_next()

    def next_batch(self, n: int) -> list[Config]:
        return [self.space.config(i) for i in self.sampler.take(n)]

    def update(self, configs: list[Config], results: list[MeasureResult]) -> None:
        """Random search learns nothing."""
