"""The tuning loop: one implementation that `tune-op`, `tune`, both flows and the demo call.

Tasks are tuned under one global trial budget (one task for `tune-op`). The task scheduler
(`stages/tune/task_scheduler.py`, gradient-based by default, as in Ansor) picks which task gets the
next batch, weighting each task by how often it occurs in the model and treating a task and its
alternative implementations (`stages.graph.twins.alternatives`) as one op, of which the build runs
the fastest. A task's first trial is its template's default schedule, so apply-best never picks a
schedule measured slower and every report can say what tuning gained; every task without trials
gets that one before the scheduler starts. One builder and one runner serve every task. The
budget counts the trials already in the log for these tasks, so a rerun resumes.

At the end, each task's top configs are re-measured (`stages/measure/remeasure.py`) together with its
alternative implementations' in the same interleaved rounds, so the build's choice between a conv and
its Winograd twin comes from one stretch of the machine's time.

Each step (propose, build, run, record, remeasure) goes through `Steps`: the direct path calls the
stage functions, a Prefect flow passes its task-run versions so every step shows in the UI, and
nothing else differs between the two.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass

from schemas.config import Config
from schemas.measure import MeasureResult
from schemas.options import TuningOptions
from schemas.record import TuningRecord
from schemas.target import Target
from schemas.task import TuningTask
from stages.graph.twins import alternatives
from stages.log import TuningLog
from stages.log.store import rank_key
from stages.measure.artifact import BuildResult
from stages.measure.base import Runner
from stages.measure.builder import Builder
from stages.templates import TEMPLATES, template_for
from stages.templates.space import NoValidConfig
from stages.tune.allocate import allocate
from stages.tune.runners import make_runner
from stages.tune.session import Observer, SessionSummary, TuningSession, remeasure_group
from stages.tune.task_scheduler import SCHEDULERS


def _run(runner: Runner, builds: list[BuildResult]) -> list[MeasureResult]:
    return runner.run(builds)


@dataclass(frozen=True)
class Steps:
    """The steps of one round for one task, as the loop calls them."""

    propose: Callable[[TuningSession], list[Config]] = TuningSession.propose
    build: Callable[[Builder, TuningTask, list[Config], Target, int], list[BuildResult]] = Builder.build
    run: Callable[[Runner, list[BuildResult]], list[MeasureResult]] = _run
    record: Callable[[TuningSession, list[Config], list[MeasureResult]], object] = TuningSession.record
    remeasure: Callable[[list[TuningSession], Builder, Runner], object] = remeasure_group


DIRECT = Steps()


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
               budget: int | None = None, scheduler: str = "gradient",
               observers: Callable[[TuningTask], list[Observer]] | None = None,
               steps: Steps = DIRECT, runner: Runner | None = None) -> list[SessionSummary]:
    """Summaries in task order once `budget` trials (log included; default `options.n_trials`) are spent,
    every space ran out, or every session stopped early (`early_stopping`, `timeout_s`). `runner`: one the
    caller keeps open across calls (default: one made from `options.runner` and closed at the end)."""
    budget = options.n_trials if budget is None else budget
    per_task = options.model_copy(update={"n_trials": budget})
    sessions: list[TuningSession] = []
    try:
        for t in tasks:
            sessions.append(TuningSession(t, target, per_task, log, observers(t) if observers else None))
        with contextlib.nullcontext(runner) if runner else make_runner(options.runner, options.measure) as live:
            _drive(sessions, weights, target, options, budget, scheduler, steps, alternative_groups(tasks), live)
    finally:
        for s in sessions:
            s.close()
    return [s.summary() for s in sessions]


def _drive(sessions: list[TuningSession], weights: list[int], target: Target, options: TuningOptions, budget: int,
           scheduler: str, steps: Steps, groups: list[int], runner: Runner) -> None:
    remaining = budget - sum(s.trials for s in sessions)
    with Builder(options.measure) as builder:

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

        # A task new to a resumed log (a twin whose template version changed) would otherwise wait behind
        # the older tasks' batches. A task no schedule of its template serves (NoValidConfig) gets no
        # trials: its build runs the generic kernel, and the other tasks tune on.
        unservable: set[TuningSession] = set()
        for s in sessions:
            try:
                default = s.template.default_config(s.task, target)
            except NoValidConfig:
                unservable.add(s)
                continue
            # First the default, unless the log has it: a log from an older tunaflow may predate this default
            # (which can beat its best); a rerun after an outage retries its own configs first.
            if remaining > 0 and not s.measured(default) and not s.retrying:
                remaining -= measure_and_record(s, [default])[0]
        if remaining > 0 and sessions:
            allocate(SCHEDULERS[scheduler](options.seed), [step_for(s) for s in sessions], weights, remaining,
                     options.batch_size, groups)
        # A task and its alternative implementations are re-measured in the same rounds (one op, one choice).
        by_group: dict[int, list[TuningSession]] = {}
        for s, g in zip(sessions, groups, strict=True):
            if s not in unservable:
                by_group.setdefault(g, []).append(s)
        for group in by_group.values():
            steps.remeasure(group, builder, runner)


def tune_task(task: TuningTask, target: Target, options: TuningOptions, log: TuningLog,
              observers: list[Observer] | None = None, steps: Steps = DIRECT,
              runner: Runner | None = None) -> SessionSummary:
    """One task until the log holds `options.n_trials` trials of it (the loop above, with one task)."""
    return tune_tasks([task], [1], target, options, log, observers=(lambda _: observers or []), steps=steps,
                      runner=runner)[0]


def default_record(log: TuningLog, task: TuningTask, target: Target, threads: int) -> TuningRecord | None:
    """The task's default schedule's best record by the log's rank (`rank_key`: its re-measurement when it
    was re-measured with the best, as the best was), what every speed-up is relative to."""
    try:
        knobs = template_for(task).default_config(task, target).knobs
    except NoValidConfig:
        return None
    runs = [r for r in log.for_task(task.signature, target.key, threads) if r.result.ok and r.config.knobs == knobs]
    return min(runs, key=rank_key, default=None)
