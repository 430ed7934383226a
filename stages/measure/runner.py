"""Local runner: one candidate at a time in a persistent worker process, restarted when it dies.

A crash is `runtime_error` naming the signal; a run past `timeout` is killed (`run_timeout`).
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import time
from datetime import UTC, datetime

from schemas.measure import MeasureErrorNo, MeasureResult
from schemas.options import MeasureOptions
from stages.measure import worker
from stages.measure.artifact import BuildResult


class LocalRunner:
    def __init__(self, options: MeasureOptions):
        self.options = options
        self._ctx = mp.get_context("spawn")
        self._proc: mp.process.BaseProcess | None = None
        self._conn = None
        self.restarts = 0
        self._warm = False

    def _ensure_worker(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            return
        if self._proc is not None:
            self.restarts += 1
        parent, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=worker.serve, args=(child,), daemon=True, name="tunaflow-runner")
        self._proc.start()
        child.close()
        self._conn = parent
        self._warm = False

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(5)
        self._proc = None
        self._conn = None

    def run(self, builds: list[BuildResult]) -> list[MeasureResult]:
        return [self.run_one(b) for b in builds]

    def run_one(self, build: BuildResult) -> MeasureResult:
        if not build.ok:
            return MeasureResult(error_no=build.error_no, error_msg=build.error_msg, build_s=build.build_s)
        self._ensure_worker()
        assert self._conn is not None and self._proc is not None
        req = worker.RunRequest(build.task, build.target, dict(build.config.knobs), build.obj, self.options)
        start = time.perf_counter()
        # The worker's first request also pays for its imports; allow for that once.
        grace = 0.0 if self._warm else 30.0
        try:
            self._conn.send(req)
            ready = self._conn.poll(self.options.timeout + grace)
            reply = self._conn.recv() if ready else None
        except (EOFError, BrokenPipeError, ConnectionResetError):
            reply = None
            ready = True
        elapsed = time.perf_counter() - start
        if reply is None:
            if not ready:
                self._kill()
                return self._result(MeasureErrorNo.run_timeout,
                                    f"run did not finish within {self.options.timeout:.1f} s; worker killed",
                                    (), build.build_s, elapsed)
            self._proc.join(5)
            code = self._proc.exitcode
            self._kill()
            return self._result(MeasureErrorNo.runtime_error, _death(code), (), build.build_s, elapsed)
        self._warm = True
        return self._result(reply.error_no, reply.error_msg, reply.costs, build.build_s, reply.run_s)

    @staticmethod
    def _result(error_no, msg, costs, build_s, run_s) -> MeasureResult:
        return MeasureResult(error_no=error_no, error_msg=msg, costs=tuple(costs), build_s=build_s,
                             run_s=run_s, timestamp=datetime.now(UTC))

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        if self._proc is not None:
            self._proc.join(2)
            if self._proc.is_alive():
                self._proc.kill()
        self._proc = None
        self._conn = None

    def __enter__(self) -> LocalRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _death(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"kernel crashed the worker: killed by {name}"
    return f"worker exited unexpectedly with code {exitcode}"
