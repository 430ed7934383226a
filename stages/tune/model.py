"""Tune every task of a model before its build, under one global trial budget.

The task scheduler (`stages/tune/task_scheduler.py`, gradient-based by default, as in Ansor) picks which task
gets the next batch, weighting each task by how often it occurs in the model and treating a task
and its alternative implementations (`stages.templates.alternatives`) as one op, of which the build
runs the fastest. A task's first
trial is its template's default schedule, so apply-best never picks a schedule measured slower;
every task without trials gets that one before the scheduler starts. One builder and one runner
serve every task. The budget counts the trials already in the log for these tasks,
so a rerun with the same budget resumes instead of starting over.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from schemas.config import Config
from schemas.measure import MeasureResult
from schemas.options import TuningOptions
from schemas.target import Target
from schemas.task import TuningTask
from stages.log import TuningLog
from stages.measure.artifact import BuildResult
from stages.measure.base import Runner
from stages.measure.builder import Builder
from stages.templates import TEMPLATES, alternatives
from stages.templates.space import NoValidConfig
from stages.tune.allocate import allocate
from stages.tune.runners import make_runner
from stages.tune.session import Observer, SessionSummary, TuningSession, remeasure_top
from stages.tune.task_scheduler import SCHEDULERS


@dataclass(frozen=True)
class RoundSteps:
    """The steps of one round for one task. A Prefect flow passes its task-run versions, so each
    step of each round shows in the UI under the task's name; the default calls them directly."""

    propose: Callable[[TuningSession], list[Config]] = TuningSession.propose
    build: Callable[[Builder, TuningTask, list[Config], Target, int], list[BuildResult]] = Builder.build
    run: Callable[[Runner, list[BuildResult]], list[MeasureResult]] = lambda runner, builds: runner.run(builds)
    record: Callable[[TuningSession, list[Config], list[MeasureResult]], object] = TuningSession.record
    remeasure: Callable[[TuningSession, Builder, Runner], object] = remeasure_top


def tunable(tasks: list[TuningTask]) -> list[bool]:
    """Which tasks a template can tune (the others build with the generic kernel)."""
    return [t.op in TEMPLATES for t in tasks]


def alternative_groups(tasks: list[TuningTask]) -> list[int]:
    """For each task, the index of the task it is an implementation of (its own for an op's task)."""
    index = {t.signature: i for i, t in enumerate(tasks)}
    groups = list(range(len(tasks)))
    for i, task in enumerate(tasks):
        for alt in alternatives(task):
            if alt.signature in index:
                groups[index[alt.signature]] = groups[i]
    return groups


def tune_tasks(tasks: list[TuningTask], weights: list[int], target: Target, options: TuningOptions, log: TuningLog,
               budget: int, scheduler: str = "gradient",
               observers: Callable[[TuningTask], list[Observer]] | None = None,
               steps: RoundSteps = RoundSteps()) -> list[SessionSummary]:
    """Summaries in task order once `budget` trials (log included) are spent or every space ran out."""
    per_task = options.model_copy(update={"n_trials": budget})
    sessions = [TuningSession(t, target, per_task, log, observers(t) if observers else None) for t in tasks]
    remaining = budget - sum(s.trials for s in sessions)
    with Builder.for_options(options.measure) as builder, \
            make_runner(options.runner, options.measure) as runner:

        def measure_and_record(s: TuningSession, configs: list[Config]) -> tuple[int, float]:
            builds = steps.build(builder, s.task, configs, target, options.measure.threads)
            steps.record(s, configs, steps.run(runner, builds))
            return len(configs), s.best.result.median if s.best else math.inf

        def step_for(s: TuningSession):
            def step(n: int) -> tuple[int, float]:
                configs = [] if s.done or s in unservable else steps.propose(s)[:n]
                if not configs:
                    return 0, math.inf
                return measure_and_record(s, configs)
            return step

        # Each new task's first trial is its default schedule, so the build never picks worse, and
        # all of them run before the scheduler spends the rest: a task new to a resumed log (a twin
        # whose template version changed) would otherwise wait behind the older tasks' batches.
        # A task no schedule of its template serves (NoValidConfig) gets no trials: its build runs the
        # generic kernel, and the other tasks tune on.
        unservable: set[TuningSession] = set()
        for s in sessions:
            try:
                default = s.template.default_config(s.task, target)
            except NoValidConfig:
                unservable.add(s)
                continue
            if remaining > 0 and s.trials == 0:
                remaining -= measure_and_record(s, [default])[0]
        if remaining > 0 and sessions:
            allocate(SCHEDULERS[scheduler](options.seed), [step_for(s) for s in sessions], weights, remaining,
                     options.batch_size, alternative_groups(tasks))
        for s in sessions:
            if s not in unservable:
                steps.remeasure(s, builder, runner)
    return [s.summary() for s in sessions]
