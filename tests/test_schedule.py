"""Task scheduler: round-robin order, Ansor-style gradient allocation, the global budget."""

import math

import pytest

from stages.tune.allocate import allocate, weighted_latency
from stages.tune.task_scheduler import GradientScheduler, RoundRobin, TaskState


def curve_step(start: float, floor: float, rate: float, limit: int = 10_000):
    """A task whose best latency decays from `start` towards `floor` as it gets trials."""
    done = [0]

    def step(n: int):
        n = min(n, limit - done[0])
        done[0] += n
        return n, floor + (start - floor) * math.exp(-rate * done[0])

    return step


def test_round_robin_cycles_and_skips_exhausted_tasks():
    rr = RoundRobin()
    states = [TaskState(1), TaskState(1), TaskState(1)]
    assert [rr.pick(states) for _ in range(4)] == [0, 1, 2, 0]
    states[1].exhausted = True
    assert [rr.pick(states) for _ in range(3)] == [2, 0, 2]


def test_gradient_warms_up_every_task_then_follows_weighted_gradient():
    g = GradientScheduler(epsilon=0.0)
    states = [TaskState(1), TaskState(5)]
    assert g.pick(states) == 0
    states[0].record(16, 1.0)
    assert g.pick(states) == 1
    states[1].record(16, 1.0)
    assert g.pick(states) == 1  # same progress, five times the weight
    states[1].weight = 0.01
    assert g.pick(states) == 0


def test_gradient_prefers_the_task_still_improving():
    g = GradientScheduler(epsilon=0.0, window=2)
    flat, improving = TaskState(1), TaskState(1)
    for t in range(1, 6):
        flat.record(16, 0.2)
        improving.record(16, 1.0 / t)
    assert g.gradient(improving) < g.gradient(flat) < 0
    assert g.pick([flat, improving]) == 1


def test_allocate_spends_exactly_the_budget_and_stops_on_exhaustion():
    steps = [curve_step(1.0, 0.5, 0.1), curve_step(1.0, 0.5, 0.1)]
    states, curve = allocate(RoundRobin(), steps, [1, 1], budget=50, batch_size=16)
    assert sum(s.trials for s in states) == 50 == curve[-1][0]
    assert [s.trials for s in states] == [32, 18]
    states, _ = allocate(RoundRobin(), [curve_step(1, 0.5, 0.1, limit=20)] * 1, [1], budget=100)
    assert states[0].trials == 20 and states[0].exhausted
    assert weighted_latency(states) == pytest.approx(states[0].best)


def test_gradient_allocation_beats_round_robin_on_unequal_tasks():
    def tasks():
        return [curve_step(1.0, 0.9, 0.05), curve_step(10.0, 1.0, 0.02), curve_step(1.0, 0.95, 0.2)]

    weights = [1, 4, 1]
    rr, _ = allocate(RoundRobin(), tasks(), weights, budget=192)
    gr, _ = allocate(GradientScheduler(seed=0), tasks(), weights, budget=192)
    assert weighted_latency(gr) < weighted_latency(rr)
    assert gr[1].trials > rr[1].trials


def test_a_member_far_slower_than_its_alternative_stops_getting_batches():
    """Tasks 0 and 1 implement one op (1 is twice as fast, like a Winograd twin); 2 is another op.
    Soon the slow member gets nothing more: the model would not run it."""
    def tasks():
        return [curve_step(2.0, 1.9, 0.05), curve_step(1.0, 0.5, 0.02), curve_step(1.0, 0.5, 0.02)]

    grouped, _ = allocate(GradientScheduler(seed=0, epsilon=0.0), tasks(), [1, 1, 1], budget=160, batch_size=8,
                          groups=[0, 0, 2])
    alone, _ = allocate(GradientScheduler(seed=0, epsilon=0.0), tasks(), [1, 1, 1], budget=160, batch_size=8)
    # Two batches while its optimistic guess (latency falling like 1/trials) still reaches its twin.
    assert grouped[0].trials == 16 < alone[0].trials
    assert weighted_latency(grouped) == pytest.approx(grouped[1].best + grouped[2].best)
    assert grouped[1].best + grouped[2].best < alone[1].best + alone[2].best


def test_with_every_other_task_exhausted_the_slow_member_gets_the_rest_of_the_budget():
    tasks = [curve_step(2.0, 1.9, 0.05), curve_step(1.0, 0.5, 0.02, limit=24), curve_step(1.0, 0.5, 0.02, limit=24)]
    states, _ = allocate(GradientScheduler(seed=0, epsilon=0.0), tasks, [1, 1, 1], budget=100, batch_size=8,
                         groups=[0, 0, 2])
    assert [s.trials for s in states] == [52, 24, 24]


def test_tune_tasks_groups_a_conv_with_its_winograd_twin():
    from schemas.task import parse_epilogue
    from stages.graph.twins import winograd_twin
    from stages.templates.conv2d_shape import conv2d_task
    from stages.tune.loop import alternative_groups

    conv = conv2d_task((1, 16, 8, 8), (16, 16, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, parse_epilogue("bias"))
    strided = conv2d_task((1, 16, 8, 8), (16, 16, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1, parse_epilogue("bias"))
    assert alternative_groups([strided, conv, winograd_twin(conv)]) == [0, 1, 1]


def test_a_task_new_to_a_resumed_log_gets_its_default_before_the_older_tasks_go_on(tmp_path):
    """A twin added after its sibling was tuned (or whose template version changed) must be measured
    at least once, or the build cannot compare the two."""
    from schemas import MeasureOptions, Target, TuningOptions, matmul_task
    from stages.log import TuningLog
    from stages.templates import matmul
    from stages.tune.loop import tune_tasks

    host, log = Target.host(), TuningLog(tmp_path / "log")
    old, new = matmul_task(24, 32, 16), matmul_task(16, 24, 32)
    options = TuningOptions(n_trials=4, batch_size=4, tuner="random", measure=MeasureOptions(threads=1))
    tune_tasks([old], [1], host, options, log, budget=4, scheduler="round-robin")
    summaries = tune_tasks([old, new], [1, 1], host, options, log, budget=5, scheduler="round-robin")
    assert [s.trials for s in summaries] == [4, 1]
    (first,) = [r for r in log.records() if r.task_signature == new.signature and r.tuner != "remeasure"]
    assert first.config.knobs == matmul.default_config(new, host).knobs


def test_a_task_no_schedule_serves_gets_no_trials_and_the_others_tune_on(monkeypatch, tmp_path):
    """NoValidConfig for one task of a model must not stop `tune`: that task builds with the generic kernel."""
    from schemas import MeasureOptions, Target, TuningOptions, matmul_task
    from stages.log import TuningLog
    from stages.templates import matmul
    from stages.templates.space import NoValidConfig
    from stages.tune.loop import tune_tasks

    host, log = Target.host(), TuningLog(tmp_path / "log")
    good, bad = matmul_task(24, 32, 16), matmul_task(16, 24, 32)
    default = matmul.default_config

    def none_for_bad(task, target):
        if task.signature == bad.signature:
            raise NoValidConfig(f"no schedule of the space fits {task.description}: for this test")
        return default(task, target)

    monkeypatch.setattr(matmul, "default_config", none_for_bad)
    options = TuningOptions(n_trials=4, batch_size=2, tuner="random", measure=MeasureOptions(threads=1))
    summaries = tune_tasks([good, bad], [1, 1], host, options, log, budget=4, scheduler="round-robin")
    assert [s.trials for s in summaries] == [4, 0]
    assert {r.task_signature for r in log.records()} == {good.signature}
