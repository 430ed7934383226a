"""The measuring side: load an object, check its output, time it in native code.

Runs inside an isolated process (the local runner's worker, or an RPC agent), so a kernel
that crashes takes down only this process. Inputs and the numpy reference are computed once
per task and kept for the next candidates of the same task.
"""

from __future__ import annotations

import math
import resource
import signal
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection

import numpy as np
from threadpoolctl import threadpool_limits

from schemas.measure import MeasureErrorNo
from schemas.options import MeasureOptions
from schemas.target import Target
from schemas.task import TuningTask
from stages.codegen.jit import LoadedKernel
from stages.measure.cache import resolve, weight_args
from stages.measure.check import compare, reduction_size
from stages.measure.evict import Evictor
from stages.templates import template_for

FLUSH_BYTES = 64 * 1024 * 1024
READY = "ready"


@dataclass(frozen=True)
class RunRequest:
    task: TuningTask
    target: Target
    knobs: dict
    obj: bytes
    options: MeasureOptions


@dataclass(frozen=True)
class RunReply:
    error_no: MeasureErrorNo
    error_msg: str
    costs: tuple[float, ...]
    run_s: float
    number: int = 0


class _TaskData:
    """Inputs and reference for the current task (one task at a time is the common case), and the flush buffer."""

    def __init__(self) -> None:
        self.signature: str | None = None
        self.inputs: list[np.ndarray] = []
        self.ref: np.ndarray | None = None
        self._flush: np.ndarray | None = None
        self._evictor: Evictor | None = None

    def flush_buffer(self) -> np.ndarray:
        """Written before each timed call to evict the caches; allocated (and paged in) once."""
        if self._flush is None:
            self._flush = np.zeros(FLUSH_BYTES // 4, dtype=np.float32)
        return self._flush

    def evictor(self) -> Evictor:
        """Times a kernel with its weight lines flushed before each call; compiled once."""
        if self._evictor is None:
            self._evictor = Evictor()
        return self._evictor

    def get(self, task: TuningTask) -> tuple[list[np.ndarray], np.ndarray]:
        if task.signature != self.signature:
            tpl = template_for(task)
            self.inputs = tpl.make_inputs(task, seed=0)
            self.ref = tpl.reference(task, self.inputs)
            self.signature = task.signature
        assert self.ref is not None
        return self.inputs, self.ref


def run(req: RunRequest, cache: _TaskData) -> RunReply:
    start = time.perf_counter()
    opts = req.options
    _limit_memory(opts.memory_limit_mb)
    tpl = template_for(req.task)
    inputs, ref = cache.get(req.task)
    args = tpl.kernel_args(req.task, req.knobs, inputs)
    kernel = LoadedKernel(req.obj, req.target)
    first = kernel.time(args, 1)  # the discarded warm-up call, whose output is checked
    ok, err = compare(args[-1], ref, reduction_size(req.task))
    if not ok:
        return RunReply(MeasureErrorNo.wrong_answer, f"output differs from numpy reference: max abs error {err:.3g}",
                        (), time.perf_counter() - start)
    state = resolve(opts, req.task, req.target)
    flush = cache.flush_buffer() if state == "cold" else None
    evictor = cache.evictor() if state == "weights" else None
    if evictor is not None:
        evictor.aim(kernel.main_address, args, weight_args(req.task, args))
    number = opts.number
    if opts.min_repeat_ms > 0 and first * opts.number < opts.min_repeat_ms / 1000.0:
        # The cold first call overstates later ones: estimate from about a millisecond of warm calls (in the
        # weights-flushed state, calls as the repeats will time them).
        calls = max(1, min(1000, int(1e-3 / max(first, 1e-9))))
        warm = kernel.time(args, calls) if evictor is None else evictor.time(calls)
        if warm > 0:
            number = max(number, math.ceil(opts.min_repeat_ms / 1000.0 / warm))
    costs = []
    for i in range(opts.repeat):
        if i and opts.cooldown_ms:
            time.sleep(opts.cooldown_ms / 1000.0)
        costs.append(kernel.time(args, number, flush) if evictor is None else evictor.time(number))
    return RunReply(MeasureErrorNo.no_error, "", tuple(costs), time.perf_counter() - start, number)


def _limit_memory(megabytes: int) -> None:
    """Bound the data a kernel may allocate: past it malloc fails instead of the machine swapping."""
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    soft = megabytes << 20
    resource.setrlimit(resource.RLIMIT_DATA, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))


def serve(conn: Connection) -> None:
    """Worker loop: one RunRequest in, one RunReply out, until the pipe closes.

    BLAS runs on one thread here: after computing a reference, OpenBLAS's pool threads spin for
    up to a second and take the cores from the kernel being timed (a 2-thread kernel measured
    1.9x slower than the same object in a quiet process).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the runner's to handle: it kills us
    threadpool_limits(limits=1)
    cache = _TaskData()
    try:
        conn.send(READY)  # imports are done: the runner's timeouts start counting from here
    except BrokenPipeError:
        return  # the runner closed before we were up (a session with nothing left to measure)
    while True:
        try:
            req = conn.recv()
        except EOFError:
            return
        try:
            reply = run(req, cache)
        except Exception as exc:
            reply = RunReply(MeasureErrorNo.runtime_error, f"{type(exc).__name__}: {exc}", (), 0.0)
        try:
            conn.send(reply)
        except BrokenPipeError:
            return  # the runner stopped waiting (closed or interrupted)
