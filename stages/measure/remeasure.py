"""End-of-session re-measurement: the top candidates (of one task, or of a task and its alternative
implementations) are measured again in interleaved rounds until the leader's round medians agree, and
each config's figure combines its whole history robustly, so the choice cannot get worse for it.

Load only ever slows a kernel down: a busy core, an interrupt storm or a stolen time slice adds time,
nothing subtracts it. So the fastest of a config's repeated medians (its trial medians and its round
medians) estimates its speed on a quiet machine, and a burst of load during the last rounds raises a
few of them without demoting a config that measured fast before (`combined`). Rounds go on past
`MIN_ROUNDS` until the leader's last `MIN_ROUNDS` round medians vary less than `STABLE_CV`, or
`MAX_ROUNDS` is reached; a config whose last rounds still vary more is flagged `unstable`.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from schemas.config import Config
from schemas.measure import MeasureResult, Noise
from schemas.record import REMEASURE, TuningRecord
from schemas.target import Target
from schemas.task import TuningTask
from stages.measure import noise
from stages.measure.base import Runner
from stages.measure.builder import Builder

MIN_ROUNDS = 3
MAX_ROUNDS = 8
STABLE_CV = 0.03


@dataclass(frozen=True)
class Candidate:
    task: TuningTask
    config: Config
    history: tuple[float, ...] = ()  # median seconds of its earlier error-free measurements


@dataclass(frozen=True)
class Remeasured:
    candidate: Candidate
    result: MeasureResult       # every repeat of every round pooled (or the first failure)
    rounds: tuple[float, ...]   # the median of each round (empty when it failed)
    combined_s: float | None    # min(history + rounds); None when it failed
    unstable: bool


@dataclass(frozen=True)
class Remeasurement:
    results: list[Remeasured]
    rounds: int
    noise: Noise | None


def top_k(records: list[TuningRecord], k: int) -> list[Config]:
    """The k fastest distinct configs among error-free tuning records (re-measurements excluded)."""
    best: dict[int, TuningRecord] = {}
    for r in records:
        if r.result.ok and r.tuner != REMEASURE:
            if r.config.index not in best or r.result.median < best[r.config.index].result.median:
                best[r.config.index] = r
    return [r.config for r in sorted(best.values(), key=lambda r: r.result.median)[:k]]


def history(records: list[TuningRecord], config: Config) -> tuple[float, ...]:
    """The config's error-free medians in these records, trials and earlier round medians alike."""
    out: list[float] = []
    for r in records:
        if r.result.ok and r.config.key() == config.key():
            out += r.rounds if r.tuner == REMEASURE else (r.result.median,)
    return tuple(out)


def cv(values: tuple[float, ...] | list[float]) -> float:
    """Coefficient of variation (0 for fewer than two values)."""
    return statistics.stdev(values) / statistics.mean(values) if len(values) > 1 else 0.0


def remeasure(builder: Builder, runner: Runner, target: Target, candidates: list[Candidate],
              min_rounds: int = MIN_ROUNDS, max_rounds: int = MAX_ROUNDS,
              stable_cv: float = STABLE_CV) -> Remeasurement:
    """Build once, then run every candidate once per round (each round starts one further along the list, so
    none always runs first) until the leader is stable or `max_rounds`; a failure in any round is kept."""
    builds = []
    tasks = {c.task.signature: c.task for c in candidates}
    for sig, task in tasks.items():
        configs = [c.config for c in candidates if c.task.signature == sig]
        built = iter(builder.build(task, configs, target, runner.options.threads))
        builds += [(i, next(built)) for i, c in enumerate(candidates) if c.task.signature == sig]
    builds.sort(key=lambda ib: ib[0])
    per: list[list[MeasureResult]] = [[] for _ in candidates]
    start = noise.sample()
    rounds = 0
    while rounds < max(max_rounds, min_rounds):
        shift = rounds % len(builds) if builds else 0
        order = builds[shift:] + builds[:shift]
        for (i, _), result in zip(order, runner.run([b for _, b in order]), strict=True):
            per[i].append(result)
        rounds += 1
        if rounds >= min_rounds and _stable(candidates, per, min_rounds, stable_cv):
            break
    done = [_combine(c, results, min_rounds, stable_cv) for c, results in zip(candidates, per, strict=True)]
    return Remeasurement(done, rounds, noise.between(start, noise.sample()))


def _stable(candidates: list[Candidate], per: list[list[MeasureResult]], window: int, stable_cv: float) -> bool:
    """Whether the leader (lowest combined figure) has `window` last round medians within `stable_cv`."""
    live = [(min(c.history + tuple(r.median for r in rs)), rs) for c, rs in zip(candidates, per, strict=True)
            if all(r.ok for r in rs)]
    if not live:
        return True
    _, leader = min(live, key=lambda lr: lr[0])
    return cv([r.median for r in leader[-window:]]) < stable_cv


def _combine(candidate: Candidate, results: list[MeasureResult], window: int, stable_cv: float) -> Remeasured:
    failed = [r for r in results if not r.ok]
    if failed:
        return Remeasured(candidate, failed[0], (), None, False)
    rounds = tuple(r.median for r in results)
    pooled = MeasureResult(costs=tuple(c for r in results for c in r.costs), build_s=results[0].build_s,
                           run_s=sum(r.run_s for r in results), timestamp=results[-1].timestamp)
    return Remeasured(candidate, pooled, rounds, min(candidate.history + rounds),
                      cv(rounds[-window:]) >= stable_cv)
