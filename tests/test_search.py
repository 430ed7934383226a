"""Tuner contracts: no repeats, budget, exhaustion, determinism, resume, early stopping.

Most tests replay tuners over a small recorded sample (simulation mode: the recorded results
stand in for measurements); the big-space tests use the real matmul space of the template.
"""

from pathlib import Path

import numpy as np
import pytest

from schemas import MeasureOptions, MeasureResult, TuningOptions, matmul_task
from stages.log import TuningLog
from stages.search import TUNERS, make_tuner
from stages.search.base import TunerContext
from stages.search.codec import SpaceCodec, small_pool
from stages.search.lgbm import ModelTuner
from stages.search.prior import default_knobs, near_default
from stages.templates import template_for
from stages.tune.session import TuningSession
from stages.tune.simulate import load_samples, replay, replay_tuner, sample_space, trials_to

SAMPLES = Path(__file__).resolve().parents[1] / "data" / "samples"
NAMES = sorted(TUNERS)


@pytest.fixture(scope="module")
def sample():
    (s,) = load_samples(str(SAMPLES / "matmul_24x40x16"))
    return s


def proposed(name, sample, host, seed, n_trials, batch=8):
    ctx = TunerContext(space=sample.space, task=sample.task, target=host, seed=seed, threads=sample.threads)
    tuner = make_tuner(name, ctx)
    seen = []
    while len(seen) < n_trials and tuner.has_next():
        batch_configs = tuner.next_batch(min(batch, n_trials - len(seen)))
        if not batch_configs:
            break
        seen += [c.index for c in batch_configs]
        tuner.update(batch_configs, sample.measure([c.index for c in batch_configs]))
    return seen


@pytest.mark.parametrize("name", NAMES)
def test_tuner_proposes_distinct_sampled_configs_within_budget(sample, host, name):
    seen = proposed(name, sample, host, seed=0, n_trials=40)
    assert len(seen) == len(set(seen)) == 40
    assert set(seen) <= set(sample.records)


@pytest.mark.parametrize("name", NAMES)
def test_tuner_exhausts_the_space_without_repeating(sample, host, name):
    seen = proposed(name, sample, host, seed=1, n_trials=10_000, batch=16)
    assert sorted(seen) == sorted(sample.records)


@pytest.mark.parametrize("name", ["random", "ga", "lgbm", "lgbm-rank"])
def test_tuner_is_deterministic_under_a_seed(sample, host, name):
    a = proposed(name, sample, host, seed=3, n_trials=32)
    assert a == proposed(name, sample, host, seed=3, n_trials=32)
    assert a != proposed(name, sample, host, seed=4, n_trials=32)


def test_model_tuner_logs_ranking_quality_and_time_per_round(sample, host):
    trace, tuner = replay("lgbm", sample, host, seed=0, n_trials=48, batch_size=8)
    assert len(trace) == 48 and len(tuner.rounds) == 6
    assert np.isnan(tuner.rounds[0].recall)
    assert all(0 <= r.recall <= 1 for r in tuner.rounds[1:])
    assert all(r.fit_s > 0 and r.propose_s > 0 for r in tuner.rounds)
    assert [r.trained_on for r in tuner.rounds] == [8, 16, 24, 32, 40, 48]


def test_model_tuner_reaches_95_percent_sooner_than_random(host):
    (big,) = load_samples(str(SAMPLES / "matmul_512"))
    goal = 0.95 * big.best_gflops

    def median_trials(name):
        return np.median([trials_to(replay(name, big, host, s, 300, 16, stop_gflops=goal)[0], goal) or 301
                          for s in range(5)])

    assert median_trials("lgbm") < median_trials("random")


def test_epsilon_one_makes_every_proposal_random_exploration(sample, host):
    ctx = TunerContext(space=sample.space, task=sample.task, target=host, seed=0, epsilon=1.0)
    tuner = make_tuner("lgbm", ctx)
    first = tuner.next_batch(8)
    tuner.update(first, sample.measure([c.index for c in first]))
    assert len(tuner.next_batch(8)) == 8 and tuner._trained


def test_replay_stops_at_the_target_throughput(sample, host):
    trace, _ = replay("random", sample, host, seed=0, n_trials=10_000, stop_gflops=sample.best_gflops)
    assert trace.max() == sample.best_gflops and len(trace) < len(sample.records) + 16


def _synthetic(configs):
    """A smooth made-up cost over the knobs: big register tiles and kc=64 are fast."""
    return [MeasureResult(costs=(1.0 / (int(c.knobs["mr"]) * int(c.knobs["nv"]) + 10 - abs(int(c.knobs["kc"]) - 64)
                                        / 64),)) for c in configs]


@pytest.mark.parametrize("name", ["ga", "lgbm"])
def test_tuner_on_a_large_real_space_stays_valid_and_distinct(host, name):
    task = matmul_task(100, 72, 48)
    space = template_for(task).space(task, host)
    assert SpaceCodec(space).pool is None
    tuner = make_tuner(name, TunerContext(space=space, task=task, target=host, seed=0))
    seen = []
    for _ in range(5):
        configs = tuner.next_batch(12)
        assert len(configs) == 12
        tuner.update(configs, _synthetic(configs))
        seen += [c.index for c in configs]
    assert len(set(seen)) == 60 and all(space.is_valid(i) for i in seen)


def fast(**kw):
    return TuningOptions(**{"n_trials": 30, "batch_size": 6, "tuner": "lgbm",
                            "measure": MeasureOptions(number=1, repeat=1, min_repeat_ms=0), **kw})


def test_session_with_lgbm_honours_early_stopping(tmp_path, host):
    task = matmul_task(24, 40, 16)
    session = TuningSession(task, host, fast(early_stopping=4), TuningLog(tmp_path / "log"))
    configs = session.propose()
    session.record(configs, [MeasureResult(costs=(1.0 + i,)) for i in range(6)])
    assert session.done and session.trials == 6


def test_resumed_lgbm_session_learns_from_and_skips_the_log(tmp_path, host):
    task = matmul_task(24, 40, 16)
    log = TuningLog(tmp_path / "log")
    first = TuningSession(task, host, fast(n_trials=12), log)
    while not first.done:
        configs = first.propose()
        first.record(configs, _synthetic(configs))
    again = TuningSession(task, host, fast(n_trials=24), log)
    assert again.trials == 12 and again.tuner._trained
    before = {r.config.index for r in log.records()}
    configs = again.propose()
    assert len(configs) == 6 and not before & {c.index for c in configs}


def test_replay_tuner_honours_the_budget(sample, host):
    ctx = TunerContext(space=sample.space, task=sample.task, target=host, seed=0)
    assert len(replay_tuner(make_tuner("ga", ctx), sample, n_trials=13, batch_size=5)) == 13


@pytest.mark.parametrize("name", NAMES)
def test_tuner_never_returns_more_than_asked(host, name):
    task = matmul_task(32, 32, 32)
    space = template_for(task).space(task, host)
    tuner = make_tuner(name, TunerContext(space=space, task=task, target=host, seed=3))
    for n in (4, 2, 1):
        configs = tuner.next_batch(n)
        assert len(configs) == n
        tuner.update(configs, _synthetic(configs))


def test_prior_starts_at_the_default_config_of_a_real_space(host):
    task = matmul_task(100, 72, 48)
    space = template_for(task).space(task, host)
    ctx = TunerContext(space=space, task=task, target=host, seed=0)
    codec = SpaceCodec(space)
    rows = near_default(ctx, codec, np.random.default_rng(0), 8, set())
    indices = codec.encode(rows).tolist()
    assert indices[0] == space.index_of(default_knobs(ctx))
    assert len(set(indices)) == 8 and all(space.is_valid(i) for i in indices)
    assert all(int((a != b).sum()) >= 2 for i, a in enumerate(rows) for b in rows[:i])
    again = near_default(ctx, codec, np.random.default_rng(0), 8, set(indices[:1]))
    assert indices[0] not in codec.encode(again).tolist()


def test_first_lgbm_batch_beats_a_random_one_on_a_recorded_sample(host):
    (big,) = load_samples(str(SAMPLES / "matmul_512"))
    ctx = TunerContext(space=big.space, task=big.task, target=host, seed=0)
    prior = make_tuner("lgbm", ctx).next_batch(16)
    blind = ModelTuner(ctx, prior=False).next_batch(16)
    mean = lambda configs: big.gflops([c.index for c in configs]).mean()  # noqa: E731
    assert len({c.index for c in prior}) == 16 and set(c.index for c in prior) <= set(big.records)
    assert mean(prior) > 1.3 * mean(blind)


def test_an_op_without_a_template_gets_no_prior(sample, host):
    task = sample.task.model_copy(update={"op": "no_such_op"})
    ctx = TunerContext(space=sample.space, task=task, target=host, seed=0)
    assert default_knobs(ctx) is None
    assert len(near_default(ctx, SpaceCodec(sample.space), np.random.default_rng(0), 4, set())) == 0
    assert len(make_tuner("lgbm", ctx).next_batch(8)) == 8


def test_prior_ignores_a_knob_the_recorded_sample_predates(sample, host):
    knobs = [{k: v for k, v in r.config.knobs.items() if k != "order"} for r in sample.records.values()]
    space = sample_space(knobs)
    ctx = TunerContext(space=space, task=sample.task, target=host, seed=0)
    assert "order" in default_knobs(ctx)
    rows = near_default(ctx, SpaceCodec(space, small_pool(space)), np.random.default_rng(0), 4, set())
    assert len(rows) == 4
