"""The cache state kernels are timed in (issue 24): the rule that picks it, the flush of a kernel's own weights,
the state recorded on each log row, and logs written before the field existed."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
from support.log_records import rec
from test_measure import run_in_process
from test_measure_kernels import TASK, build_of

from schemas import MeasureOptions, Target
from schemas.task import EpilogueOp, TensorSpec, TuningTask
from stages.codegen.jit import LoadedKernel
from stages.log import TuningLog
from stages.measure.cache import resolve, weight_args, weight_bytes
from stages.measure.check import compare, reduction_size
from stages.measure.evict import Evictor, supported
from stages.templates import template_for

CONV = TuningTask(op="conv2d", inputs=(TensorSpec(shape=(1, 96, 28, 28)), TensorSpec(shape=(24, 96, 1, 1)),
                                       TensorSpec(shape=(24,)), TensorSpec(shape=(1, 24, 28, 28))),
                  outputs=(TensorSpec(shape=(1, 24, 28, 28)),), attrs={"strides": (1, 1)},
                  epilogue=(EpilogueOp(kind="bias"), EpilogueOp(kind="residual_add")))
ATTENTION = TuningTask(op="batch_matmul", inputs=(TensorSpec(shape=(12, 64, 64)), TensorSpec(shape=(12, 64, 64))),
                       outputs=(TensorSpec(shape=(12, 64, 64)),))
ARM = Target.parse("llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-n1")


def test_auto_flushes_the_weights_of_a_kernel_that_has_them_and_keeps_activation_only_kernels_hot(host):
    auto = MeasureOptions()
    assert auto.cache == "auto"
    assert weight_bytes(CONV) == (24 * 96 + 24) * 4 and weight_bytes(ATTENTION) == 0  # the residual is no weight
    assert resolve(auto, CONV, host) == "weights" and resolve(auto, ATTENTION, host) == "hot"
    for state in ("hot", "weights", "cold"):
        assert resolve(MeasureOptions(cache=state), ATTENTION, host) == state
    assert resolve(auto, CONV, ARM) == "hot"  # no per-line flush there: auto keeps the hot loop
    assert resolve(MeasureOptions(cache="weights"), CONV, ARM) == "cold"  # and weights flush everything
    x, w, bias, residual, workspace, y = (np.zeros(n) for n in range(1, 7))
    assert [id(a) for a in weight_args(CONV, [x, w, bias, residual, workspace, y])] == [id(w), id(bias)]
    assert weight_args(ATTENTION, [x, w, y]) == []


@pytest.mark.skipif(not supported(), reason="the per-line flush is x86-only")
def test_the_evicting_loop_runs_the_kernel_on_its_flushed_weights_and_leaves_them_intact(host):
    build = build_of("ok", host)
    tpl = template_for(build.task)
    inputs = tpl.make_inputs(build.task, seed=0)
    args = tpl.kernel_args(build.task, dict(build.config.knobs), inputs)
    before = [a.copy() for a in args[:-1]]
    kernel = LoadedKernel(build.obj, host)
    evictor = Evictor()
    evictor.aim(kernel.main_address, args, weight_args(build.task, args))
    assert evictor.time(5) > 0
    assert all(np.array_equal(a, b) for a, b in zip(args, before, strict=False))
    assert compare(args[-1], tpl.reference(build.task, inputs), reduction_size(build.task))[0]
    flushed = run_in_process(build, number=1, repeat=3, min_repeat_ms=2, cache="weights")
    assert len(flushed.costs) == 3 and all(c > 0 for c in flushed.costs)
    assert flushed.number > 1  # min_repeat_ms still raises the calls per repeat


def test_the_state_a_record_was_timed_in_survives_the_log_and_old_logs_read_hot(tmp_path):
    log = TuningLog(tmp_path / "log")
    log.append([rec(0, 1e-3).model_copy(update={"cache": "weights"}), rec(1, 2e-3)])
    assert [r.cache for r in log.records()] == ["weights", "hot"]
    old = TuningLog(tmp_path / "old")
    part = old.append([rec(0, 1e-3).model_copy(update={"cache": "cold"})])
    table = pq.read_table(part)
    pq.write_table(table.drop_columns(["cache"]).replace_schema_metadata(table.schema.metadata), part)
    assert [r.cache for r in old.records()] == ["hot"]


def test_a_tuned_task_records_the_state_its_trials_were_timed_in(tmp_path, host):
    from schemas import TuningOptions
    from stages.tune.loop import tune_task

    fast = MeasureOptions(number=1, repeat=2, min_repeat_ms=1, n_parallel=1)
    for state, want in (("auto", "weights"), ("hot", "hot")):
        options = TuningOptions(n_trials=2, batch_size=2, tuner="random", top_k_remeasure=1,
                                measure=fast.model_copy(update={"cache": state}))
        log = TuningLog(tmp_path / state)
        tune_task(TASK, host, options, log)
        assert {r.cache for r in log.records()} == {want} and len(log.records()) == 3
