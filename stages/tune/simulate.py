"""Simulation mode: replay a tuner against a recorded sample of a space (no compile, no timing).

A sample is a tuning log holding many measured configs of one task (recorded once, by random
search). The replayed tuner sees the space restricted to the sampled configs, and every config
it proposes is answered with its recorded result, so policies are compared quickly, on the same
numbers, without measurement noise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from schemas.measure import MeasureResult
from schemas.record import TuningRecord
from schemas.target import Target
from schemas.task import TuningTask
from stages.log import TuningLog
from stages.search import make_tuner
from stages.search.base import Tuner, TunerContext
from stages.templates.space import ConfigSpace, Knob, Knobs


@dataclass(frozen=True)
class SampleSpace(ConfigSpace):
    """The space a sample spans: each knob's recorded values, valid only at the recorded configs.

    Built from the records alone, so a sample stays usable after its template's knobs change.
    """

    members: frozenset[int] = frozenset()
    enumerable: bool = True

    def is_valid(self, index: int) -> bool:
        return index in self.members

    def valid_indices(self) -> Iterator[int]:
        return iter(sorted(self.members))


def sample_space(knobs: list[Knobs]) -> SampleSpace:
    names = list(dict.fromkeys(name for kd in knobs for name in kd))
    axes = tuple(Knob(name, tuple(sorted({kd[name] for kd in knobs}, key=lambda v: (isinstance(v, str), v))))
                 for name in names)
    base = ConfigSpace(knobs=axes, rule=lambda _: None)
    members = frozenset(base.index_of(kd) for kd in knobs)

    def rule(kd: Knobs) -> str | None:
        return None if base.index_of(kd) in members else "not in the recorded sample"

    return SampleSpace(knobs=axes, rule=rule, members=members)


@dataclass
class Sample:
    """One task's recorded configs and results, indexed in the sample's own space."""

    task: TuningTask
    target_key: str
    threads: int
    space: SampleSpace
    records: dict[int, TuningRecord] = field(default_factory=dict)

    @staticmethod
    def of(records: list[TuningRecord]) -> Sample:
        first: dict[str, TuningRecord] = {}
        for r in records:
            first.setdefault(r.config.key(), r)
        space = sample_space([r.config.knobs for r in first.values()])
        r0 = records[0]
        return Sample(r0.task, r0.target_key, r0.threads, space,
                      {space.index_of(r.config.knobs): r for r in first.values()})

    @property
    def best_gflops(self) -> float:
        return max(r.gflops for r in self.records.values())

    def measure(self, indices: list[int]) -> list[MeasureResult]:
        return [self.records[i].result for i in indices]

    def gflops(self, indices: list[int]) -> np.ndarray:
        return np.array([self.records[i].gflops for i in indices])


def load_samples(path: str) -> list[Sample]:
    """Every (task, target, threads) in a log as a Sample, the first record of a config kept."""
    groups: dict[tuple, list[TuningRecord]] = {}
    for r in TuningLog(path).records():
        groups.setdefault((r.task_signature, r.target_key, r.threads), []).append(r)
    return [Sample.of(recs) for recs in groups.values()]


def replay_tuner(tuner: Tuner, sample: Sample, n_trials: int, batch_size: int = 16,
                 stop_gflops: float | None = None) -> np.ndarray:
    """GFLOPS of each trial in order (0 for failures), until the budget, exhaustion or `stop_gflops`."""
    trace: list[float] = []
    while len(trace) < n_trials and tuner.has_next():
        configs = tuner.next_batch(min(batch_size, n_trials - len(trace)))
        if not configs:
            break
        idx = [c.index for c in configs]
        tuner.update(configs, sample.measure(idx))
        trace += sample.gflops(idx).tolist()
        if stop_gflops is not None and max(trace) >= stop_gflops:
            break
    return np.array(trace)


def replay(name: str, sample: Sample, target: Target, seed: int, n_trials: int, batch_size: int = 16,
           transfer: tuple[TuningRecord, ...] = (), stop_gflops: float | None = None) -> tuple[np.ndarray, Tuner]:
    """Build tuner `name` over the sample's space and replay it; returns the trace and the tuner."""
    ctx = TunerContext(space=sample.space, task=sample.task, target=target, seed=seed,
                       threads=sample.threads, transfer=transfer)
    tuner = make_tuner(name, ctx)
    return replay_tuner(tuner, sample, n_trials, batch_size, stop_gflops), tuner


def trials_to(trace: np.ndarray, gflops: float) -> int | None:
    """1-based trial at which the trace first reaches `gflops` (None if never)."""
    hit = np.flatnonzero(np.asarray(trace) >= gflops)
    return int(hit[0]) + 1 if len(hit) else None


def replay_step(name: str, sample: Sample, target: Target, seed: int) -> Callable[[int], tuple[int, float]]:
    """One task of a multi-task schedule in simulation: each call runs up to n trials of tuner `name`
    and returns (trials run, best latency so far in seconds)."""
    ctx = TunerContext(space=sample.space, task=sample.task, target=target, seed=seed, threads=sample.threads)
    tuner = make_tuner(name, ctx)
    best = [0.0]

    def step(n: int) -> tuple[int, float]:
        configs = tuner.next_batch(n) if tuner.has_next() else []
        if configs:
            idx = [c.index for c in configs]
            tuner.update(configs, sample.measure(idx))
            best[0] = max(best[0], float(sample.gflops(idx).max()))
        latency = sample.task.flops / (best[0] * 1e9) if best[0] > 0 else float("inf")
        return len(configs), latency

    return step
