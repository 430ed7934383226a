"""The pipeline's steps as Prefect task runs: each step of each round shows in the UI under its task's
name. The builder pool and the runner worker outlive task runs, so they are handed to tasks as live
objects with caching off (Prefect never hashes or persists them); the tuning log, not Prefect's
database, is the record of truth. The task runs call the very functions the direct path calls.

Every argument goes in `quote`d: otherwise Prefect walks each one looking for futures (a round's
configs, the candidates' object code, the session with its log) and a task run costs about 46 ms
instead of 8 (measured on this machine); the price is that the UI draws no data edges between the
steps, which run in sequence anyway."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from prefect import Task, task, unmapped
from prefect.cache_policies import NO_CACHE
from prefect.utilities.annotations import quote

from schemas.config import Config
from schemas.measure import MeasureResult
from schemas.options import MeasureOptions
from schemas.target import Target
from schemas.task import TuningTask
from stages.measure.artifact import BuildResult
from stages.measure.base import Runner
from stages.measure.builder import Builder, build_isolated
from stages.pipeline import model
from stages.tune.loop import DIRECT
from stages.tune.session import TuningSession


@task(name="propose", task_run_name="propose {session.task.description}", cache_policy=NO_CACHE)
def propose(session: TuningSession) -> list[Config]:
    return DIRECT.propose(session)


@task(name="build", task_run_name="build {op.description}", cache_policy=NO_CACHE)
def build(builder: Builder, op: TuningTask, configs: list[Config], target: Target, threads: int) -> list[BuildResult]:
    return DIRECT.build(builder, op, configs, target, threads)


@task(name="build-candidate", task_run_name="build {op.description} #{config.index}", cache_policy=NO_CACHE)
def build_candidate(op: TuningTask, config: Config, target: Target, threads: int,
                    options: MeasureOptions) -> BuildResult:
    return build_isolated(op, config, target, threads, options)


def build_distributed(builder: Builder, op: TuningTask, configs: list[Config], target: Target,
                      threads: int) -> list[BuildResult]:
    """Each candidate built by its own task run (a Dask task runner spreads them over a cluster), with the
    builder's timeout and fault options."""
    return build_candidate.map(unmapped(op), configs, unmapped(target), unmapped(threads),
                               unmapped(builder.options)).result()


@task(name="measure", task_run_name="measure {builds[0].task.description}", cache_policy=NO_CACHE)
def run(runner: Runner, builds: list[BuildResult]) -> list[MeasureResult]:
    return DIRECT.run(runner, builds)


@task(name="record", task_run_name="record {session.task.description}", cache_policy=NO_CACHE)
def record(session: TuningSession, configs: list[Config], results: list[MeasureResult]) -> object:
    return DIRECT.record(session, configs, results)


@task(name="remeasure", task_run_name="remeasure {sessions[0].task.description}", cache_policy=NO_CACHE)
def remeasure(sessions: list[TuningSession], builder: Builder, runner: Runner) -> object:
    return DIRECT.remeasure(sessions, builder, runner)


@task(name="extract", task_run_name="extract {model_path}", cache_policy=NO_CACHE)
def extract(model_path: str, input_shapes: dict, limits) -> tuple:
    return model.DIRECT.extract(model_path, input_shapes, limits)


@task(name="refine", task_run_name="refine in the model", cache_policy=NO_CACHE)
def refine(graph, target: Target, threads: int, log: str, top_k: int) -> object:
    return model.DIRECT.refine(graph, target, threads, log, top_k)


@task(name="build-library", task_run_name="build-library {out}", cache_policy=NO_CACHE)
def build_library(model_path: str, graph, target: Target, out: str, threads: int, log: str | None,
                  verify: bool = True) -> tuple:
    return model.DIRECT.build_library(model_path, graph, target, out, threads, log, verify)


@task(name="charts", cache_policy=NO_CACHE)
def charts(log: str, out_dir: str, target_key: str, threads: int) -> list[str]:
    return model.DIRECT.charts(log, out_dir, target_key, threads)


@task(name="latency", task_run_name="latency tuned vs default", cache_policy=NO_CACHE)
def latency(model_path: str, tuned: str, default: str, threads: int) -> dict[str, dict]:
    return model.DIRECT.latency(model_path, tuned, default, threads)


def quoted(step: Task) -> Callable[..., Any]:
    """`step` called as a task run with its arguments passed through untouched."""
    @functools.wraps(step.fn)
    def call(*args: Any) -> Any:
        return step(*map(quote, args))
    return call


STEPS = model.ModelSteps(propose=quoted(propose), build=quoted(build), run=quoted(run), record=quoted(record),
                         remeasure=quoted(remeasure), extract=quoted(extract), refine=quoted(refine),
                         build_library=quoted(build_library),
                         charts=quoted(charts), latency=quoted(latency))
DISTRIBUTED = replace(STEPS, build=build_distributed)
