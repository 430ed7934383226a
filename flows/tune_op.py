"""Tune one operator: propose → build → measure → record, one task run per step and batch.

The builder pool and the runner worker outlive task runs, so they are handed to tasks as
live objects with caching off (Prefect never hashes or persists them); the tuning log, not
Prefect's database, is the record of truth. With `distributed_builds` each candidate is
built by its own task run, so a Dask task runner spreads compilation over a cluster.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow, task, unmapped
from prefect.cache_policies import NO_CACHE

from flows.artifacts import ProgressArtifact, artifact_key, publish_chart, publish_results
from schemas.config import Config
from schemas.measure import MeasureResult
from schemas.options import TuningOptions
from schemas.record import REMEASURE
from schemas.target import Target
from schemas.task import TuningTask
from stages.log import TuningLog
from stages.measure.artifact import BuildResult
from stages.measure.base import Runner
from stages.measure.builder import Builder, build_one
from stages.measure.numpy_ref import numpy_gflops
from stages.report.charts import convergence_chart
from stages.report.progress import TerminalProgress
from stages.report.summary import op_report
from stages.tune.runners import make_runner
from stages.tune.session import TuningSession, measure_default_config, remeasure_top


@task(name="propose", task_run_name="propose {session.task.description}", cache_policy=NO_CACHE)
def propose(session: TuningSession) -> list[Config]:
    return session.propose()


@task(name="build", task_run_name="build {op.description}", cache_policy=NO_CACHE)
def build(builder: Builder, op: TuningTask, configs: list[Config], target: Target, threads: int) -> list[BuildResult]:
    return builder.build(op, configs, target, threads)


@task(name="build-candidate", task_run_name="build {op.description} #{config.index}", cache_policy=NO_CACHE)
def build_candidate(op: TuningTask, config: Config, target: Target, threads: int) -> BuildResult:
    return build_one(op, config, target, threads)


@task(name="measure", task_run_name="measure {builds[0].task.description}", cache_policy=NO_CACHE)
def run(runner: Runner, builds: list[BuildResult]) -> list[MeasureResult]:
    return runner.run(builds)


@task(name="record", task_run_name="record {session.task.description}", cache_policy=NO_CACHE)
def record(session: TuningSession, configs: list[Config], results: list[MeasureResult]) -> int:
    return len(session.record(configs, results))


@task(name="measure-default", task_run_name="measure-default {op.description}", cache_policy=NO_CACHE)
def measure_default(builder: Builder, runner: Runner, op: TuningTask, target: Target) -> MeasureResult:
    return measure_default_config(builder, runner, op, target)


@task(name="remeasure", task_run_name="remeasure {session.task.description}", cache_policy=NO_CACHE)
def remeasure(session: TuningSession, builder: Builder, runner: Runner) -> int:
    return len(remeasure_top(session, builder, runner))


@task(name="numpy-reference", task_run_name="numpy-reference {op.description}", cache_policy=NO_CACHE)
def numpy_reference(op: TuningTask, threads: int) -> float:
    return numpy_gflops(op, threads)


@flow(name="tune-op", flow_run_name="tune-op {op.op} on {target_name}", log_prints=True)
def tune_op(op: TuningTask, target_name: str, options: TuningOptions, log_path: str,
            progress: bool = True, distributed_builds: bool = False) -> dict:
    """Tune `op` for `target_name` until the log holds `options.n_trials` trials for it."""
    target = Target.parse(target_name)
    log = TuningLog(log_path)
    session = TuningSession(op, target, options, log)
    threads = options.measure.threads
    session.observers.append(ProgressArtifact(artifact_key("progress", op.op, op.signature),
                                              f"{op.description} on {target.name}", options.batch_size))
    with Builder.for_options(options.measure) as builder, \
            make_runner(options.runner, options.measure) as runner, \
            TerminalProgress(op.description, options.n_trials, every=options.batch_size) as bar:
        if progress:
            session.observers.append(bar)
        default = measure_default(builder, runner, op, target)
        while not session.done:
            configs = propose(session)
            if not configs:
                break
            if distributed_builds:
                builds = build_candidate.map(unmapped(op), configs, unmapped(target), unmapped(threads)).result()
            else:
                builds = build(builder, op, configs, target, threads)
            record(session, configs, run(runner, builds))
        remeasure(session, builder, runner)
    report = op_report(session.summary(), default, numpy_reference(op, threads), log_path)
    publish_results(artifact_key("results", op.op, op.signature), [report])
    records = [r for r in log.for_task(op.signature, target.key, threads) if r.tuner != REMEASURE]
    if records:
        png = convergence_chart(records, op.description, Path(log_path) / "charts" / f"{op.signature}_t{threads}.png")
        publish_chart(artifact_key("convergence", op.op, op.signature), png, op.description)
        report["chart"] = str(png)
    return report
