"""Real faults compiled into candidates: each is recorded with the right code and the runner goes on."""

import pytest

from schemas import MeasureErrorNo, MeasureOptions, matmul_task
from stages.measure.builder import build_one
from stages.measure.inject import EXPECTED, KINDS, fault_for, inject
from stages.measure.runner import LocalRunner
from stages.templates import template_for

TASK = matmul_task(16, 32, 16)


def test_fault_choice_is_deterministic_and_near_the_rate():
    picks = [fault_for(i, 0.1, seed=3) for i in range(5000)]
    assert picks == [fault_for(i, 0.1, seed=3) for i in range(5000)]
    share = sum(p is not None for p in picks) / len(picks)
    assert 0.08 < share < 0.12
    assert {p for p in picks if p} == set(KINDS)
    assert fault_for(1, 0.0, 3) is None


def test_each_fault_is_recorded_with_its_code_and_a_good_kernel_still_measures(host):
    options = MeasureOptions(number=1, repeat=2, min_repeat_ms=1, timeout=2.0, memory_limit_mb=512)
    config = template_for(TASK).default_config(TASK, host)
    good = build_one(TASK, config, host)
    with LocalRunner(options) as runner:
        for kind in KINDS:
            idx = next(i for i in range(100_000) if fault_for(i, 0.5, 11) == kind)
            bad = build_one(TASK, config.model_copy(update={"index": idx}), host, 1, 0.5, 11)
            result = runner.run_one(bad)
            assert result.error_no == EXPECTED[kind], (kind, result.error_msg)
            assert not result.ok and result.median == float("inf")
            after = runner.run_one(good)
            assert after.ok, (kind, after.error_msg)
        assert runner.restarts >= 3
    assert "SIGSEGV" in _msg(host, "segfault") and "SIGABRT" in _msg(host, "alloc")


def _msg(host, kind: str) -> str:
    options = MeasureOptions(number=1, repeat=1, min_repeat_ms=1, timeout=2.0, memory_limit_mb=512)
    config = template_for(TASK).default_config(TASK, host)
    idx = next(i for i in range(100_000) if fault_for(i, 0.5, 11) == kind)
    with LocalRunner(options) as runner:
        return runner.run_one(build_one(TASK, config.model_copy(update={"index": idx}), host, 1, 0.5, 11)).error_msg


def test_inject_refuses_unknown_fault_and_foreign_ir():
    with pytest.raises(ValueError, match="unknown fault 'melt'"):
        inject('define void @"tf_main"(i8* %a) {\nret void\n}', "melt", 2)
    with pytest.raises(ValueError, match="no tf_main"):
        inject("", "hang", 2)
    assert MeasureErrorNo.run_timeout == EXPECTED["hang"]
