"""End-of-session re-measurement: the top-k candidates are measured again, interleaved, and the
best is chosen from these numbers, so one lucky sample on a noisy machine cannot win.
"""

from __future__ import annotations

from schemas.config import Config
from schemas.measure import MeasureResult
from schemas.record import REMEASURE, TuningRecord
from schemas.target import Target
from schemas.task import TuningTask
from stages.measure.base import Runner
from stages.measure.builder import Builder

ROUNDS = 3


def top_k(records: list[TuningRecord], k: int) -> list[Config]:
    """The k fastest distinct configs among error-free tuning records (re-measurements excluded)."""
    best: dict[int, TuningRecord] = {}
    for r in records:
        if r.result.ok and r.tuner != REMEASURE:
            if r.config.index not in best or r.result.median < best[r.config.index].result.median:
                best[r.config.index] = r
    return [r.config for r in sorted(best.values(), key=lambda r: r.result.median)[:k]]


def remeasure(builder: Builder, runner: Runner, task: TuningTask, target: Target, configs: list[Config],
              rounds: int = ROUNDS) -> list[MeasureResult]:
    """Build once, then measure all configs `rounds` times in turn (A B C A B C ...); each result pools
    every repeat of its config, and a config that fails in any round keeps that failure."""
    builds = builder.build(task, configs, target, runner.options.threads)
    per_config: list[list[MeasureResult]] = [[] for _ in configs]
    for _ in range(rounds):
        for i, result in enumerate(runner.run(builds)):
            per_config[i].append(result)
    return [_pool(results) for results in per_config]


def _pool(results: list[MeasureResult]) -> MeasureResult:
    failed = [r for r in results if not r.ok]
    if failed:
        return failed[0]
    return MeasureResult(costs=tuple(c for r in results for c in r.costs), build_s=results[0].build_s,
                         run_s=sum(r.run_s for r in results), timestamp=results[-1].timestamp)
