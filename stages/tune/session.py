"""The tuning loop for one task, outside any search policy: budget, resume, log, observers.

`TuningSession` is driven step by step (propose → build → measure → record) by the one tuning loop,
`stages/tune/loop.py`, which a Prefect flow hands its task-run versions of each step. A session holds its
log's writer lock from its start (before it reads what the budget counts) until `close()` or
until it is garbage, so two sessions on one log cannot both spend the budget. Records of
`unknown` errors (the measuring infrastructure failed, e.g. a tracker outage) say nothing about
their configs: a resumed session does not count them toward its trials and proposes their
configs first, so a rerun measures them again.
"""

from __future__ import annotations

import statistics
import time
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

from schemas.config import Config
from schemas.measure import MeasureErrorNo, MeasureResult, Noise
from schemas.options import TuningOptions
from schemas.record import REMEASURE, TuningRecord
from schemas.target import Target
from schemas.task import TuningTask
from schemas.version import VERSION
from stages.log import TuningLog
from stages.log.store import rank_key
from stages.measure.artifact import BuildResult
from stages.measure.base import Runner
from stages.measure.builder import Builder
from stages.measure.cache import resolve
from stages.measure.remeasure import Candidate, Remeasured, history, remeasure, top_k
from stages.search import make_tuner
from stages.search.base import TunerContext
from stages.templates import template_for
from stages.tune.transfer import load_transfer


@dataclass(frozen=True)
class TrialEvent:
    """What observers see after each trial."""

    task: TuningTask
    trial: int
    budget: int
    config: Config
    result: MeasureResult
    gflops: float
    best_gflops: float


Observer = Callable[[TrialEvent], None]


@dataclass
class SessionSummary:
    task: TuningTask
    target_key: str
    trials: int
    new_trials: int
    wall_s: float
    best: TuningRecord | None  # by the log's rank (`rank_key`), as the build chooses
    errors: dict[str, int] = field(default_factory=dict)
    repeat_cv: float | None = None  # median CV of the repeats of this session's trials
    rounds: int = 0                 # interleaved rounds of its re-measurement (0: none this session)
    noise: Noise | None = None      # the machine's load during that re-measurement

    @property
    def best_gflops(self) -> float:
        return self.best.gflops if self.best else 0.0


class TuningSession:
    def __init__(self, task: TuningTask, target: Target, options: TuningOptions, log: TuningLog,
                 observers: list[Observer] | None = None):
        self.task, self.target, self.options, self.log = task, target, options, log
        self.observers = observers or []
        self.session_id = uuid.uuid4().hex[:12]
        self._release = weakref.finalize(self, log.writer().release)
        try:
            self._start(task, target, options, log)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Release the log's writer lock (idempotent; also done when the session is garbage)."""
        self._release()

    def __enter__(self) -> TuningSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self, task: TuningTask, target: Target, options: TuningOptions, log: TuningLog) -> None:
        self.template = template_for(task)
        self.space = self.template.space(task, target)
        transfer = load_transfer(options.transfer_from, task, target.key, options.measure.threads)
        # Re-measurements are not trials; records of another template version measured other code;
        # an `unknown` error is the infrastructure's, not the config's.
        mine = [r for r in log.for_task(task.signature, target.key, options.measure.threads)
                if r.tuner != REMEASURE and r.template_version == self.template.VERSION]
        previous = [r for r in mine if _informative(r)]
        known = {r.config.index for r in previous}
        copied = [r for r in _first_per_config(tuple(filter(_informative, transfer.exact)))
                  if r.config.index not in known and r.template_version == self.template.VERSION]
        log.append(copied)
        previous += copied
        known |= {r.config.index for r in copied}
        # Configs whose every record is an `unknown` error go first, before the tuner's proposals.
        self._retry = list({r.config.index: r.config for r in mine if r.config.index not in known}.values())
        self._measured = set(known)
        self.start_trials = len(previous)
        self.trials = len(previous)
        self.best: TuningRecord | None = min((r for r in previous if r.result.ok),
                                             key=lambda r: r.result.median, default=None)
        self._since_best = 0
        self.tuner = make_tuner(options.tuner, TunerContext(
            space=self.space, task=task, target=target, seed=options.seed,
            exclude=frozenset(known | {c.index for c in self._retry}), threads=options.measure.threads,
            history=tuple((r.config, r.result) for r in previous), transfer=transfer.related,
            epsilon=options.epsilon))
        self._started = time.monotonic()
        self.errors: dict[str, int] = {}
        self._spreads: list[float] = []
        self._rounds = 0
        self._noise: Noise | None = None

    def measured(self, config: Config) -> bool:
        """Whether the log held a trial of `config` when the session started (a resumed log may predate
        the current default schedule)."""
        return config.index in self._measured

    @property
    def retrying(self) -> bool:
        """Whether configs of an earlier run that lost their measurement wait to be measured first."""
        return bool(self._retry)

    @property
    def remaining(self) -> int:
        return max(0, self.options.n_trials - self.trials)

    @property
    def done(self) -> bool:
        if self.remaining == 0 or not (self._retry or self.tuner.has_next()):
            return True
        if self.options.early_stopping is not None and self._since_best >= self.options.early_stopping:
            return True
        return self.options.timeout_s is not None and time.monotonic() - self._started >= self.options.timeout_s

    def propose(self) -> list[Config]:
        """The next batch: configs a rerun must retry first, then the tuner's."""
        n = min(self.options.batch_size, self.remaining)
        batch, self._retry = self._retry[:n], self._retry[n:]
        return batch + self.tuner.next_batch(n - len(batch)) if len(batch) < n else batch

    def record(self, configs: list[Config], results: list[MeasureResult]) -> list[TuningRecord]:
        """Append the batch to the log (atomically), update the tuner, notify observers."""
        records = []
        for config, result in zip(configs, results, strict=True):
            gflops = self.task.flops / result.median / 1e9 if result.ok else 0.0
            records.append(TuningRecord(
                tunaflow_version=VERSION, session_id=self.session_id, trial=self.trials + len(records),
                tuner=self.tuner.name, target_key=self.target.key, task_signature=self.task.signature,
                task=self.task, template_version=self.template.VERSION, threads=self.options.measure.threads,
                cache=resolve(self.options.measure, self.task, self.target),
                config=config, result=result,
                gflops=gflops,
            ))
        self.log.append(records)
        self.tuner.update(configs, results)
        measured = {c.index for c in configs}
        self._retry = [c for c in self._retry if c.index not in measured]
        for rec in records:
            self.trials += 1
            if rec.result.ok and (self.best is None or rec.result.median < self.best.result.median):
                self.best = rec
                self._since_best = 0
            else:
                self._since_best += 1
            if rec.result.ok:
                self._spreads.append(rec.result.spread)
            else:
                name = rec.result.error_no.name
                self.errors[name] = self.errors.get(name, 0) + 1
            event = TrialEvent(self.task, rec.trial + 1, self.options.n_trials, rec.config, rec.result, rec.gflops,
                               self.best.gflops if self.best else 0.0)
            for observe in self.observers:
                observe(event)
        return records

    @property
    def measured_new(self) -> bool:
        return self.trials > self.start_trials

    def candidates(self) -> list[Candidate]:
        """The top-k configs (k = options.top_k_remeasure) with their history in the log, to re-measure."""
        mine = self._mine() if self.options.top_k_remeasure else []
        return [Candidate(self.task, c, history(mine, c)) for c in top_k(mine, self.options.top_k_remeasure)]

    def record_remeasurement(self, remeasured: list[Remeasured], rounds: int,
                             noise: Noise | None) -> list[TuningRecord]:
        """Log the re-measurement (not counted as trials): each config's pooled repeats, round medians and
        combined figure, which its `gflops` is computed from."""
        records = [TuningRecord(
            tunaflow_version=VERSION, session_id=self.session_id, trial=self.trials + i, tuner=REMEASURE,
            target_key=self.target.key, task_signature=self.task.signature, task=self.task,
            template_version=self.template.VERSION, threads=self.options.measure.threads, config=m.candidate.config,
            cache=resolve(self.options.measure, self.task, self.target),
            result=m.result, gflops=self.task.flops / m.combined_s / 1e9 if m.combined_s else 0.0,
            rounds=m.rounds, combined_s=m.combined_s, unstable=m.unstable,
        ) for i, m in enumerate(remeasured)]
        self.log.append(records)
        self._rounds, self._noise = rounds, noise
        return records

    def summary(self) -> SessionSummary:
        """The session's figures, its best by the log's rank among records of this template version."""
        best = min((r for r in self._mine() if r.result.ok), key=rank_key, default=None)
        return SessionSummary(self.task, self.target.key, self.trials, self.trials - self.start_trials,
                              time.monotonic() - self._started, best, dict(self.errors),
                              statistics.median(self._spreads) if self._spreads else None, self._rounds, self._noise)

    def _mine(self) -> list[TuningRecord]:
        return [r for r in self.log.for_task(self.task.signature, self.target.key, self.options.measure.threads)
                if r.template_version == self.template.VERSION]


def _informative(record: TuningRecord) -> bool:
    """Whether a record tells anything about its config (an `unknown` error does not: retry it)."""
    return record.result.error_no != MeasureErrorNo.unknown


def _first_per_config(records: tuple[TuningRecord, ...]) -> list[TuningRecord]:
    """One record per config (another log may hold re-measurements)."""
    out: dict[int, TuningRecord] = {}
    for r in records:
        out.setdefault(r.config.index, r)
    return list(out.values())


def measure(builder: Builder, runner: Runner, task: TuningTask, configs: list[Config],
            target: Target) -> list[MeasureResult]:
    """Build then run: the only way a candidate gets a result."""
    builds: list[BuildResult] = builder.build(task, configs, target, runner.options.threads)
    return runner.run(builds)


def remeasure_group(sessions: list[TuningSession], builder: Builder, runner: Runner) -> list[TuningRecord]:
    """Re-measure the top configs of these sessions (a task and its alternative implementations) in the same
    interleaved rounds, so the build's choice among them comes from the same moments of the machine. A group
    none of whose sessions measured anything new has nothing to re-decide."""
    candidates = [c for s in sessions for c in s.candidates()] if any(s.measured_new for s in sessions) else []
    if not candidates:
        return []
    done = remeasure(builder, runner, sessions[0].target, candidates)
    records = []
    for s in sessions:
        mine = [m for m in done.results if m.candidate.task.signature == s.task.signature]
        if mine:
            records += s.record_remeasurement(mine, done.rounds, done.noise)
    return records
