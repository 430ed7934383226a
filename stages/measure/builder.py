"""Compile a batch of candidates in parallel worker processes, each build with a timeout.

A failing or hanging build becomes a BuildResult carrying its error code; the pool is replaced
after a timeout so a stuck compile cannot hold a worker.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
import traceback
from multiprocessing.pool import Pool

from schemas.config import Config
from schemas.measure import MeasureErrorNo
from schemas.options import MeasureOptions
from schemas.target import Target
from schemas.task import TuningTask
from stages.codegen.compile import compile_ir
from stages.measure.artifact import BuildResult
from stages.measure.inject import fault_for, inject
from stages.templates import template_for


def build_one(task: TuningTask, config: Config, target: Target, threads: int = 1, fault_rate: float = 0.0,
              fault_seed: int = 0) -> BuildResult:
    """Build in this process; errors are returned, never raised. With `fault_rate`, chosen
    candidates get a real fault compiled in (stages/measure/inject.py), to test what survives them."""
    start = time.perf_counter()
    tpl = template_for(task)
    why = tpl.space(task, target).reason(config.knobs)
    if why:
        return BuildResult(task, target, config, None, 0.0, MeasureErrorNo.instantiation_error, why)
    try:
        module = tpl.build_ir(task, config.knobs, target, threads)
        fault = fault_for(config.index, fault_rate, fault_seed)
        obj = compile_ir(inject(str(module), fault, len(task.inputs)) if fault else module, target).data
    except Exception as exc:  # a template or LLVM bug must not stop the session
        msg = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}"
        return BuildResult(task, target, config, None, time.perf_counter() - start,
                           MeasureErrorNo.compile_error, msg[:2000])
    return BuildResult(task, target, config, obj, time.perf_counter() - start)


def _ignore_sigint() -> None:
    """A terminal's Ctrl-C reaches the workers too; the session stops them (a worker killed by it while
    holding the pool's queue lock hangs Pool.terminate)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class Builder:
    """Owns a pool of `n_parallel` spawn processes for the life of a session."""

    def __init__(self, options: MeasureOptions | None = None):
        self.options = options or MeasureOptions()
        self.n_parallel = self.options.n_parallel or len(os.sched_getaffinity(0))
        self._pool: Pool | None = None

    @property
    def faults(self) -> tuple[float, int]:
        return self.options.fault_rate, self.options.fault_seed

    def _get_pool(self) -> Pool:
        if self._pool is None:
            self._pool = mp.get_context("spawn").Pool(self.n_parallel, initializer=_ignore_sigint)
        return self._pool

    def build(self, task: TuningTask, configs: list[Config], target: Target, threads: int = 1) -> list[BuildResult]:
        if not configs:
            return []
        if self.n_parallel == 1:
            return [build_one(task, c, target, threads, *self.faults) for c in configs]
        pool = self._get_pool()
        pending = [(c, pool.apply_async(build_one, (task, c, target, threads, *self.faults))) for c in configs]
        results = [_collect(handle, task, target, config, self.options.build_timeout) for config, handle in pending]
        stuck = any(r.error_no == MeasureErrorNo.build_timeout for r in results)
        if stuck:
            self.close()
        return results

    def close(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None

    def __enter__(self) -> Builder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _collect(handle, task: TuningTask, target: Target, config: Config, timeout: float) -> BuildResult:
    """A worker's build, or the error that stands for it (a timeout, a worker that died)."""
    try:
        return handle.get(timeout=timeout)
    except mp.TimeoutError:
        return BuildResult(task, target, config, None, timeout, MeasureErrorNo.build_timeout,
                           f"build did not finish within {timeout:.1f} s")
    except Exception as exc:
        return BuildResult(task, target, config, None, 0.0, MeasureErrorNo.compile_error,
                           f"build worker failed: {type(exc).__name__}: {exc}")


def build_isolated(task: TuningTask, config: Config, target: Target, threads: int,
                   options: MeasureOptions) -> BuildResult:
    """One candidate built in a fresh worker process under `options`' timeout and faults, as a distributed
    build's task run does it on whichever machine runs it. A daemon process (a Dask worker left at its
    default) cannot start one: there the build runs in-process, without the timeout."""
    if mp.current_process().daemon:
        return build_one(task, config, target, threads, options.fault_rate, options.fault_seed)
    with mp.get_context("spawn").Pool(1, initializer=_ignore_sigint) as pool:
        handle = pool.apply_async(build_one, (task, config, target, threads, options.fault_rate, options.fault_seed))
        return _collect(handle, task, target, config, options.build_timeout)
