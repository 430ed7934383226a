"""Model-based search: a LightGBM cost model ranks configs, simulated annealing proposes its best.

Each batch: a share `epsilon` is uniform exploration, the rest the annealer's best predicted
unmeasured configs, skipping near-duplicates (closer than `min_distance` knobs to one already
in the batch). Until the model has data, the template's default config and the configs most like
it take the model's place (`prior.py`): a hand-written heuristic beats uniform draws, and the
model then learns where the fast region is rather than starting blind. The model is retrained after
every batch on this task's results plus, when given, records of other tasks of the same op kind,
whose weight falls as this task's own data grows. Before each retrain, the model's ranking of the
batch it proposed is scored (recall of the true top-k among the predicted top-k) and kept in
`rounds`, with the time spent fitting and proposing.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import lightgbm as lgb
import numpy as np

from schemas.config import Config
from schemas.measure import MeasureResult
from stages.cost_model.dataset import Rows, speed, task_rows, transfer_rows
from stages.cost_model.features import featurize
from stages.cost_model.lgbm import LGBMModel
from stages.cost_model.metrics import topk_recall
from stages.search.anneal import Annealer
from stages.search.base import TunerContext
from stages.search.codec import SpaceCodec, small_pool
from stages.search.prior import near_default

log = logging.getLogger("tunaflow.search")

RECALL_K = 4
# The objective `lgbm` uses: the better of the two in benchmarks/RESULTS.md (search section).
DEFAULT_OBJECTIVE = "regression"


@dataclass(frozen=True)
class RoundStat:
    round: int
    trained_on: int
    recall: float
    fit_s: float
    propose_s: float


class ModelTuner:
    name = "lgbm"

    def __init__(self, ctx: TunerContext, objective: str = DEFAULT_OBJECTIVE, min_distance: int = 2,
                 transfer_half_life: int = 64, prior: bool = True):
        self.ctx = ctx
        self.codec = SpaceCodec(ctx.space, small_pool(ctx.space))
        self.rng = np.random.default_rng(ctx.seed)
        self.model = LGBMModel(objective, seed=ctx.seed)
        self.annealer = Annealer(self.codec, self.rng)
        self.min_distance, self.half_life, self.prior = min_distance, transfer_half_life, prior
        self.seen: set[int] = set(ctx.exclude)
        self.knobs: list[dict] = []
        self.throughput: list[float] = []
        self.indices: list[int] = []
        self.rounds: list[RoundStat] = []
        self._transfer = self._transfer_rows()
        self._fit_s = self._propose_s = 0.0
        self._exhausted = False
        self._trained = False
        if ctx.history:
            self._add([c for c, _ in ctx.history], [r for _, r in ctx.history])
            self._fit()
        elif len(self._transfer.y):
            self._fit()

    def has_next(self) -> bool:
        if self.codec.pool is not None:
            return not set(self.codec.pool.tolist()) <= self.seen
        return not self._exhausted

    def next_batch(self, n: int) -> list[Config]:
        start = time.perf_counter()
        explore = int(np.floor(self.ctx.epsilon * n + self.rng.random()))
        if self._trained:
            rows = self._exploit(n - explore) if explore < n else np.zeros((0, self.codec.width), np.int64)
        else:  # no model yet: the template's default and the configs most like it stand in for one
            take = n - explore if self.prior else 0
            rows = near_default(self.ctx, self.codec, self.rng, take, self.seen, self.min_distance)
        chosen = self.codec.encode(rows).tolist() if len(rows) else []
        self.seen.update(chosen)
        extra = self.codec.random_valid(self.rng, n - len(chosen), self.seen)
        chosen += self.codec.encode(extra).tolist() if len(extra) else []
        self.seen.update(chosen)
        if len(chosen) < n:
            self._exhausted = True
        self._propose_s = time.perf_counter() - start
        return [self.codec.config(i) for i in chosen]

    def update(self, configs: list[Config], results: list[MeasureResult]) -> None:
        if not configs:
            return
        recall = float("nan")
        if self._trained:
            pred = self.model.predict(self._features([c.knobs for c in configs]))
            actual = np.array([1.0 / r.median if r.ok else 0.0 for r in results])
            recall = topk_recall(pred, actual, RECALL_K)
        self._add(configs, results)
        self._fit()
        stat = RoundStat(len(self.rounds) + 1, len(self.throughput), recall, self._fit_s, self._propose_s)
        self.rounds.append(stat)
        log.info("lgbm round %d: recall@%d %.2f, fit %.3f s, propose %.3f s on %d configs", stat.round, RECALL_K,
                 stat.recall, stat.fit_s, stat.propose_s, stat.trained_on)

    def _add(self, configs: list[Config], results: list[MeasureResult]) -> None:
        for c, r in zip(configs, results, strict=True):
            self.knobs.append(dict(c.knobs))
            self.indices.append(c.index)
            self.throughput.append(speed(r))
            self.seen.add(c.index)

    def _features(self, knobs: list[dict]) -> np.ndarray:
        ctx = self.ctx
        return task_rows(ctx.task, ctx.target, ctx.threads, knobs, np.zeros(len(knobs))).x

    def _fit(self) -> None:
        start = time.perf_counter()
        ctx = self.ctx
        own = task_rows(ctx.task, ctx.target, ctx.threads, self.knobs, np.array(self.throughput))
        w = self.half_life / (self.half_life + len(own.y))
        t = self._transfer
        data = Rows.concat([own, Rows(t.x, t.y, t.groups, t.weights * w)])
        if len(data.y) >= 2 and np.ptp(data.y) > 0:
            try:
                self.model.fit(data.x, data.y, data.groups, data.weights)
                self._trained = True
            except lgb.basic.LightGBMError as exc:  # a degenerate training set must not end the session
                log.warning("lgbm fit failed, keeping the previous model: %s", exc)
        self._fit_s = time.perf_counter() - start

    def _transfer_rows(self) -> Rows:
        ctx = self.ctx
        if not ctx.transfer:
            return Rows.concat([])
        return transfer_rows(ctx.transfer, ctx.target)

    def _exploit(self, n: int) -> np.ndarray:
        """The best predicted unmeasured rows, at least `min_distance` knobs apart."""
        def score(rows: np.ndarray) -> np.ndarray:
            return self.model.predict(self._features_of_rows(rows))

        starts = None
        if self.throughput:
            order = np.argsort(-np.array(self.throughput))[:16]
            starts = self.codec.decode(np.array(self.indices)[order])
        if self.codec.pool is not None:
            free = self.codec.pool[~np.isin(self.codec.pool, np.fromiter(self.seen, dtype=np.int64))]
            rows = self.codec.decode(free)
            cand = rows[np.argsort(-score(rows), kind="stable")[: 4 * n]]
        else:
            cand = self.annealer.find_maximums(score, 4 * n, self.seen, starts)
        picked: list[np.ndarray] = []
        for row in cand:
            if all(int((row != p).sum()) >= self.min_distance for p in picked):
                picked.append(row)
                if len(picked) == n:
                    break
        return np.array(picked, dtype=np.int64).reshape(-1, self.codec.width)

    def _features_of_rows(self, rows: np.ndarray) -> np.ndarray:
        return featurize(self.ctx.task, self.ctx.target, self.ctx.threads, self.codec.values(rows))
