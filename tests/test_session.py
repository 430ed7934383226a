"""The tuning loop end to end on a small matmul: real compile, real timing, real log."""

import pytest

from schemas import MeasureOptions, TuningOptions, matmul_task
from stages.log import TuningLog
from stages.templates import matmul
from stages.tune.loop import default_record, tune_task
from stages.tune.session import TuningSession

TASK = matmul_task(24, 40, 16)
FAST = MeasureOptions(number=1, repeat=2, min_repeat_ms=1, n_parallel=1)


def options(**kw) -> TuningOptions:
    return TuningOptions(**{"n_trials": 6, "batch_size": 3, "tuner": "random", "measure": FAST, "top_k_remeasure": 0,
                            **kw})


def test_session_logs_every_trial_and_finds_a_best(tmp_path, host):
    events = []
    log = TuningLog(tmp_path / "log")
    summary = tune_task(TASK, host, options(), log, [events.append])
    default = default_record(log, TASK, host, 1)
    records = log.records()
    assert summary.trials == summary.new_trials == len(records) == 6
    assert [e.trial for e in events] == [1, 2, 3, 4, 5, 6]
    assert len({r.config.index for r in records}) == 6
    assert default is not None and default.trial == 0 and default.result.median > 0  # the first trial
    assert summary.best is not None and summary.best.result.ok
    assert summary.best.gflops == max(r.gflops for r in records)
    assert all(r.task_signature == TASK.signature and r.target_key == host.key for r in records)
    assert all(len(r.result.costs) == 2 for r in records if r.result.ok)


def test_resume_skips_measured_configs_and_stops_at_budget(tmp_path, host):
    log = TuningLog(tmp_path / "log")
    tune_task(TASK, host, options(n_trials=4), log)
    first = {r.config.index for r in log.records()}
    summary = tune_task(TASK, host, options(n_trials=7, seed=1), log)
    records = log.records()
    assert len(records) == 7 and summary.new_trials == 3
    assert len({r.config.index for r in records}) == 7
    assert first < {r.config.index for r in records}
    again = tune_task(TASK, host, options(n_trials=7), log)
    assert again.new_trials == 0 and len(log.records()) == 7


def test_a_resumed_log_without_the_current_default_measures_it_first(tmp_path, host):
    """A log written when the template's default was another schedule: its best may lose to today's
    default, which the resumed session measures before the tuner's proposals."""
    full = TuningLog(tmp_path / "full")
    tune_task(TASK, host, options(n_trials=4), full)
    default_index = default_record(full, TASK, host, 1).config.index
    log = TuningLog(tmp_path / "log")
    log.append([r for r in full.records() if r.config.index != default_index])
    assert default_record(log, TASK, host, 1) is None
    old_sessions = {r.session_id for r in log.records()}
    summary = tune_task(TASK, host, options(n_trials=4), log)
    added = [r for r in log.records() if r.session_id not in old_sessions]
    assert summary.new_trials == 1 and [r.config.index for r in added] == [default_index]
    assert default_record(log, TASK, host, 1) is not None


def test_records_of_an_older_template_version_are_not_trials(tmp_path, host):
    old_log = TuningLog(tmp_path / "old")
    tune_task(TASK, host, options(n_trials=3), old_log)
    log = TuningLog(tmp_path / "log")
    log.append([r.model_copy(update={"template_version": r.template_version - 1}) for r in old_log.records()])
    summary = tune_task(TASK, host, options(n_trials=3), log)
    assert summary.new_trials == 3 and summary.trials == 3
    assert summary.best is not None and summary.best.template_version == matmul.VERSION
    assert sum(r.template_version == matmul.VERSION for r in log.records()) == 3


def test_other_thread_count_is_a_separate_budget(tmp_path, host):
    log = TuningLog(tmp_path / "log")
    tune_task(TASK, host, options(n_trials=3), log)
    two = FAST.model_copy(update={"threads": 2})
    summary = tune_task(TASK, host, options(n_trials=3, measure=two), log)
    assert summary.new_trials == 3
    assert sorted(r.threads for r in log.records()) == [1, 1, 1, 2, 2, 2]


def test_early_stopping_stops_without_new_best(tmp_path, host):
    session = TuningSession(TASK, host, options(n_trials=50, early_stopping=2), TuningLog(tmp_path / "log"))
    from schemas import MeasureResult

    configs = session.propose()
    session.record(configs, [MeasureResult(costs=(1.0,)), MeasureResult(costs=(2.0,)), MeasureResult(costs=(3.0,))])
    assert session.done
    assert session.best is not None and session.best.config == configs[0]


@pytest.mark.parametrize("tuner", ["grid", "random"])
def test_tuners_never_repeat_a_config(tmp_path, host, tuner):
    session = TuningSession(TASK, host, options(n_trials=40, tuner=tuner), TuningLog(tmp_path / "log"))
    seen = []
    for _ in range(5):
        batch = session.propose()
        assert batch
        seen += [c.index for c in batch]
    assert len(seen) == len(set(seen)) == 15
    assert all(session.space.is_valid(i) for i in seen)
