"""numpy's speed on the same workload, as the fixed reference a tuned kernel is judged against."""

from __future__ import annotations

import statistics
import time

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

from schemas.task import CONV_OPS, QUANT_OPS, TuningTask
from stages.templates import template_for


def numpy_gflops(task: TuningTask, threads: int = 1, repeats: int = 15) -> float:
    """Median GFLOPS of numpy computing the task (BLAS limited to `threads`)."""
    inputs = template_for(task).make_inputs(task, seed=0)
    fn = _numpy_fn(task)
    with threadpool_limits(limits=threads):
        fn(inputs)
        costs = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn(inputs)
            costs.append(time.perf_counter() - start)
    return task.flops / statistics.median(costs) / 1e9


def blas_kernel() -> str:
    """Which BLAS and which of its kernels numpy runs here (e.g. 'openblas SkylakeX')."""
    infos = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    return ", ".join(f"{i['internal_api']} {i.get('architecture', '?')}" for i in infos) or "unknown"


def _numpy_fn(task: TuningTask):
    if task.op == "dense":
        ta, tb = bool(task.attrs.get("trans_a", False)), bool(task.attrs.get("trans_b", True))
        return lambda xs: (xs[0].T if ta else xs[0]) @ (xs[1].T if tb else xs[1])
    if task.op in ("matmul", "batch_matmul"):
        return lambda xs: np.matmul(xs[0], xs[1])
    if task.op in CONV_OPS:
        from stages.templates.conv2d_shape import numpy_conv

        return lambda xs: numpy_conv(task, xs)
    if task.op in QUANT_OPS:  # numpy has no int8 kernels: its int64 reference of the spec is what it does
        return lambda xs: template_for(task).reference(task, xs)
    raise ValueError(f"no numpy reference for op {task.op!r}")
