"""Genetic search, the baseline a model must beat: fitness-proportional parents from the best
measured configs (the elites always among them), uniform crossover, per-knob mutation."""

from __future__ import annotations

import numpy as np

from schemas.config import Config
from schemas.measure import MeasureResult
from stages.search.base import TunerContext
from stages.search.codec import SpaceCodec, small_pool

TRIES = 50


class GATuner:
    name = "ga"

    def __init__(self, ctx: TunerContext, population: int = 32, elites: int = 4, mutation: float = 0.15):
        self.codec = SpaceCodec(ctx.space, small_pool(ctx.space))
        self.rng = np.random.default_rng(ctx.seed)
        self.population, self.elites, self.mutation = population, elites, mutation
        self.seen: set[int] = set(ctx.exclude)
        self.rows: list[np.ndarray] = []
        self.fitness: list[float] = []
        self._exhausted = False
        for config, result in ctx.history:
            self._add(config, result)

    def has_next(self) -> bool:
        if self.codec.pool is not None:
            return not set(self.codec.pool.tolist()) <= self.seen
        return not self._exhausted

    def next_batch(self, n: int) -> list[Config]:
        chosen: list[int] = []
        if sum(f > 0 for f in self.fitness) >= 2:
            for _ in range(TRIES):
                for i in self.codec.encode(self._children(n)).tolist():
                    if i not in self.seen and len(chosen) < n:
                        self.seen.add(i)
                        chosen.append(i)
                if len(chosen) == n:
                    break
        extra = self.codec.random_valid(self.rng, n - len(chosen), self.seen)
        chosen += self.codec.encode(extra).tolist() if len(extra) else []
        self.seen.update(chosen)
        if len(chosen) < n:
            self._exhausted = True
        return [self.codec.config(i) for i in chosen]

    def update(self, configs: list[Config], results: list[MeasureResult]) -> None:
        for config, result in zip(configs, results, strict=True):
            self._add(config, result)

    def _add(self, config: Config, result: MeasureResult) -> None:
        self.rows.append(self.codec.decode(np.array([config.index]))[0])
        self.fitness.append(1.0 / result.median if result.ok else 0.0)
        self.seen.add(config.index)

    def _children(self, n: int) -> np.ndarray:
        fit = np.array(self.fitness)
        order = np.argsort(-fit)[: self.population]
        parents, weights = np.array(self.rows)[order], fit[order] / fit[order].max()
        weights[: self.elites] = np.maximum(weights[: self.elites], weights.max())
        p = weights / weights.sum()
        a = parents[self.rng.choice(len(parents), size=n, p=p)]
        b = parents[self.rng.choice(len(parents), size=n, p=p)]
        kids = np.where(self.rng.random(a.shape) < 0.5, a, b)
        flip = self.rng.random(kids.shape) < self.mutation
        kids = np.where(flip, self.rng.integers(0, self.codec.radix, size=kids.shape), kids)
        kids = self.codec.repair(kids, self.rng)
        return kids[kids[:, 0] >= 0]
