"""Local runner: one candidate at a time in a persistent worker process, restarted when it dies.

A crash is `runtime_error` naming the signal; a run past `timeout` is killed (`run_timeout`).
The worker says when its imports are done, so `timeout` counts only loading, checking and
timing; a task the worker has not seen yet gets extra time for its numpy reference.
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

START_TIMEOUT_S = 60.0


class LocalRunner:
    def __init__(self, options: MeasureOptions):
        self.options = options
        self._ctx = mp.get_context("spawn")
        self._proc: mp.process.BaseProcess | None = None
        self._conn = None
        self._seen: set[str] = set()
        self._ready = False
        self._starts = 0
        self.restarts = 0
        self._spawn()  # its imports overlap with the first builds

    def _spawn(self) -> None:
        if self._starts:
            self.restarts += 1
        self._starts += 1
        parent, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=worker.serve, args=(child,), daemon=True, name="tunaflow-runner")
        self._proc.start()
        child.close()
        self._conn, self._ready, self._seen = parent, False, set()

    def start(self) -> None:
        """Start the worker (if it is not running) and wait until it is ready to measure."""
        if self._proc is None or not self._proc.is_alive():
            self._kill()
            self._spawn()
        if self._ready:
            return
        assert self._conn is not None
        if not (self._conn.poll(START_TIMEOUT_S) and self._conn.recv() == worker.READY):
            self._kill()
            raise RuntimeError(f"measurement worker did not start within {START_TIMEOUT_S:.0f} s")
        self._ready = True

    @property
    def pid(self) -> int | None:
        """The measuring worker's process id (to pin it to a core, say), once started."""
        return self._proc.pid if self._proc is not None else None

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(5)
        self._proc = None
        self._conn = None

    def run(self, builds: list[BuildResult]) -> list[MeasureResult]:
        return [self.run_one(b) for b in builds]

    def run_one(self, build: BuildResult, options: MeasureOptions | None = None) -> MeasureResult:
        """Measure one build with `options` (default: the runner's); never raises for a bad kernel."""
        opts = options or self.options
        if not build.ok:
            return MeasureResult(error_no=build.error_no, error_msg=build.error_msg, build_s=build.build_s)
        try:
            self.start()
        except (RuntimeError, OSError) as exc:
            return self._result(MeasureErrorNo.runtime_error, str(exc), (), build.build_s, 0.0)
        assert self._conn is not None and self._proc is not None
        req = worker.RunRequest(build.task, build.target, dict(build.config.knobs), build.obj, opts)
        grace = 0.0 if build.task.signature in self._seen else 5.0 + build.task.flops / 2e9
        start = time.perf_counter()
        try:
            self._conn.send(req)
            ready = self._conn.poll(opts.timeout + grace)
            reply = self._conn.recv() if ready else None
        except (EOFError, BrokenPipeError, ConnectionResetError):
            reply, ready = None, True
        elapsed = time.perf_counter() - start
        if reply is None:
            if not ready:
                self._kill()
                return self._result(MeasureErrorNo.run_timeout,
                                    f"run did not finish within {opts.timeout:.1f} s; worker killed",
                                    (), build.build_s, elapsed)
            self._proc.join(5)
            code = self._proc.exitcode
            self._kill()
            return self._result(MeasureErrorNo.runtime_error, _death(code), (), build.build_s, elapsed)
        self._seen.add(build.task.signature)
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
                self._proc.join(2)
        self._proc = None
        self._conn = None

    def __enter__(self) -> LocalRunner:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
            self._kill()  # Ctrl-C: the candidate being timed is not waited for
        self.close()


def _death(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"kernel crashed the worker: killed by {name}"
    return f"worker exited unexpectedly with code {exitcode}"
