"""Tune every task of a model before its build, under one global trial budget.

The task scheduler (`stages/schedule`, gradient-based by default, as in Ansor) picks which task
gets the next batch, weighting each task by how often it occurs in the model. A task's first
trial is its template's default schedule, so apply-best never picks a schedule measured slower. One builder and
one runner serve every task. The budget counts the trials already in the log for these tasks,
so a rerun with the same budget resumes instead of starting over.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from schemas.options import TuningOptions
from schemas.target import Target
from schemas.task import TuningTask
from stages.log import TuningLog
from stages.measure.builder import Builder
from stages.measure.factory import make_runner
from stages.schedule.driver import allocate
from stages.schedule.scheduler import SCHEDULERS
from stages.templates import TEMPLATES
from stages.tune.session import Observer, SessionSummary, TuningSession, measure


def tunable(tasks: list[TuningTask]) -> list[bool]:
    """Which tasks a template can tune (the others build with the generic kernel)."""
    return [t.op in TEMPLATES for t in tasks]


def tune_tasks(tasks: list[TuningTask], weights: list[int], target: Target, options: TuningOptions, log: TuningLog,
               budget: int, scheduler: str = "gradient",
               observers: Callable[[TuningTask], list[Observer]] | None = None) -> list[SessionSummary]:
    """Summaries in task order once `budget` trials (log included) are spent or every space ran out."""
    per_task = options.model_copy(update={"n_trials": budget})
    sessions = [TuningSession(t, target, per_task, log, observers(t) if observers else None) for t in tasks]
    remaining = budget - sum(s.trials for s in sessions)
    with Builder.for_options(options.measure) as builder, \
            make_runner(options.runner, options.measure) as runner:

        def step_for(s: TuningSession):
            def step(n: int) -> tuple[int, float]:
                if s.trials == 0:  # the default schedule is the first trial: the build never picks worse
                    default = s.template.default_config(s.task, target)
                    s.record([default], measure(builder, runner, s.task, [default], target))
                    return 1, s.best.result.median if s.best else math.inf
                configs = [] if s.done else s.propose()[:n]
                if not configs:
                    return 0, math.inf
                s.record(configs, measure(builder, runner, s.task, configs, target))
                return len(configs), s.best.result.median if s.best else math.inf
            return step

        if remaining > 0 and sessions:
            allocate(SCHEDULERS[scheduler](options.seed), [step_for(s) for s in sessions], weights, remaining,
                     options.batch_size)
    return [s.summary() for s in sessions]
