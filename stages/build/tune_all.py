"""Tune every task of a model before its build: one builder and runner, tasks taken round-robin.

Each task gets `options.n_trials` trials in the log (so a rerun resumes where the last one
stopped), a batch at a time in turn, so an interrupted run leaves every task partly tuned
rather than the first fully and the rest not at all.
"""

from __future__ import annotations

from collections.abc import Callable

from schemas.options import TuningOptions
from schemas.target import Target
from schemas.task import TuningTask
from stages.log import TuningLog
from stages.measure.builder import Builder
from stages.measure.runner import LocalRunner
from stages.tune.session import Observer, SessionSummary, TuningSession, measure


def tune_round_robin(tasks: list[TuningTask], target: Target, options: TuningOptions, log: TuningLog,
                     observers: Callable[[TuningTask], list[Observer]] | None = None) -> list[SessionSummary]:
    """Summaries in task order, after every task reached its budget (or its space ran out)."""
    sessions = [TuningSession(t, target, options, log, observers(t) if observers else None) for t in tasks]
    active = [s for s in sessions if not s.done]
    with Builder(options.measure.n_parallel, options.measure.build_timeout) as builder, \
            LocalRunner(options.measure) as runner:
        while active:
            for s in list(active):
                configs = s.propose()
                if configs:
                    s.record(configs, measure(builder, runner, s.task, configs, target))
                if not configs or s.done:
                    active.remove(s)
    return [s.summary() for s in sessions]
