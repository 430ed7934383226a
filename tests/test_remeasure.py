"""Re-measurement that cannot be worse than none: the stable-rounds rule, the combined figure, the flag for an
unstable result, old logs without these fields, and a real burst of load during the rounds."""

from __future__ import annotations

import os
from collections.abc import Callable

import pyarrow.parquet as pq
import pytest
from support.log_records import TASK, rec

from schemas import Config, MeasureErrorNo, MeasureOptions, MeasureResult
from schemas.record import REMEASURE
from stages.log import TuningLog
from stages.log.store import rank_key
from stages.measure.artifact import BuildResult
from stages.measure.builder import Builder
from stages.measure.remeasure import MAX_ROUNDS, MIN_ROUNDS, Candidate, remeasure
from stages.measure.runner import LocalRunner
from stages.templates import matmul
from testing.burner import burning

MS = 1e-3


class ScriptedRunner:
    """A runner whose timings follow a script, (config index, round) -> median seconds (None: a failure),
    so the rule's decisions can be checked against known numbers."""

    def __init__(self, script: Callable[[int, int], float | None], n_configs: int):
        self.options = MeasureOptions()
        self.script, self.n, self.calls = script, n_configs, 0

    def run(self, builds: list[BuildResult]) -> list[MeasureResult]:
        out = []
        for b in builds:
            cost = self.script(b.config.index, self.calls // self.n)
            out.append(MeasureResult(error_no=MeasureErrorNo.runtime_error, error_msg="boom") if cost is None
                       else MeasureResult(costs=(cost, cost * 1.001, cost * 0.999)))
            self.calls += 1
        return out


@pytest.fixture(scope="module")
def builder():
    with Builder(MeasureOptions(n_parallel=1)) as b:
        yield b


def two_configs(host) -> list[Config]:
    default = matmul.default_config(TASK, host)
    return [Config(index=0, knobs=default.knobs), Config(index=1, knobs={**default.knobs, "uk": 1})]


def run_script(builder, host, script, history=((), ())):
    a, b = two_configs(host)
    runner = ScriptedRunner(script, 2)
    return remeasure(builder, runner, host, [Candidate(TASK, a, history[0]), Candidate(TASK, b, history[1])])


def test_a_steady_leader_stops_after_the_minimum_rounds(builder, host):
    done = run_script(builder, host, lambda i, r: (1.0 if i == 0 else 1.5) * MS)
    assert done.rounds == MIN_ROUNDS
    assert [m.rounds for m in done.results] == [(1.0 * MS,) * 3, (1.5 * MS,) * 3]
    assert not any(m.unstable for m in done.results)


def test_a_leader_disturbed_once_is_measured_until_its_last_rounds_agree(builder, host):
    done = run_script(builder, host, lambda i, r: (1.4 if r == 1 else 1.0) * MS * (1 if i == 0 else 1.5))
    assert done.rounds == 5  # rounds 1-3 and 2-4 hold the disturbed round 2; rounds 3-5 agree
    assert not done.results[0].unstable and done.results[0].combined_s == pytest.approx(1.0 * MS)


def test_a_leader_that_never_settles_stops_at_the_limit_and_is_flagged(builder, host):
    done = run_script(builder, host, lambda i, r: (1.0 if r % 2 else 1.6) * MS * (1 if i == 0 else 2))
    assert done.rounds == MAX_ROUNDS
    assert done.results[0].unstable and len(done.results[0].rounds) == MAX_ROUNDS


def test_load_during_the_rounds_cannot_demote_a_config_that_measured_consistently_fast(builder, host, tmp_path):
    """A's trials said 1.0 ms three times; the rounds happened to meet load whenever A ran (2.0 ms) while B,
    1.2 ms in its trials, ran at 1.25: A keeps winning, in the log's rank too."""
    done = run_script(builder, host, lambda i, r: (2.0 if i == 0 else 1.25) * MS,
                      history=((1.0 * MS,) * 3, (1.2 * MS,)))
    fast, slow = done.results
    assert fast.combined_s == pytest.approx(1.0 * MS) and slow.combined_s == pytest.approx(1.2 * MS)
    assert fast.result.median > slow.result.median  # what ranking the re-measurement's own median would pick
    log = TuningLog(tmp_path / "log")
    log.append([rec(0, m.result.median, index=m.candidate.config.index).model_copy(update={
        "tuner": REMEASURE, "result": m.result, "rounds": m.rounds, "combined_s": m.combined_s}) for m in done.results])
    assert log.best(TASK.signature, "tk").config.index == 0


def test_a_failure_in_any_round_is_kept(builder, host):
    done = run_script(builder, host, lambda i, r: None if (i, r) == (1, 1) else MS)
    assert done.results[0].result.ok and not done.results[1].result.ok
    assert done.results[1].combined_s is None and done.results[1].rounds == ()


def test_a_part_written_before_the_remeasure_fields_reads_them_as_defaults(tmp_path):
    log = TuningLog(tmp_path / "log")
    part = log.append([rec(0, 2 * MS), rec(1, MS)])
    table = pq.read_table(part)
    pq.write_table(table.drop_columns(["rounds", "combined_s", "unstable"]).replace_schema_metadata(
        table.schema.metadata), part)
    old = log.records()
    assert [(r.rounds, r.combined_s, r.unstable) for r in old] == [((), None, False)] * 2
    assert min(old, key=rank_key).trial == 1 and old[1].cost_s == old[1].result.median


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity (Linux)")
def test_a_core_burning_during_the_rounds_does_not_demote_the_fast_config(host):
    """Real kernels, a real worker and a real competing process on the worker's core for a bounded 1.5 s,
    started as the rounds start: the config whose quiet trials were fastest still wins, with a figure no
    worse than its trials', and the machine is reported busy."""
    cpu = sorted(os.sched_getaffinity(0))[0]
    before = os.sched_getaffinity(0)
    opts = MeasureOptions(number=1, repeat=3, min_repeat_ms=5, n_parallel=1)
    default = matmul.default_config(TASK, host)
    fast, slow = Config(index=0, knobs=default.knobs), Config(index=1, knobs={**default.knobs, "vw": 4, "nv": 1,
                                                                              "mr": 1, "uk": 1})
    os.sched_setaffinity(0, {cpu})  # the worker and the burner share one core
    try:
        with Builder(opts) as builder, LocalRunner(opts) as runner:
            trials = runner.run(builder.build(TASK, [fast, slow], host))
            assert all(t.ok for t in trials) and trials[0].median < trials[1].median
            with burning(1.5, cpu):  # detached: the probe must see it as another process's load
                done = remeasure(builder, runner, host, [Candidate(TASK, fast, (trials[0].median,)),
                                                         Candidate(TASK, slow, (trials[1].median,))])
    finally:
        os.sched_setaffinity(0, before)
    won, lost = done.results
    assert won.combined_s < lost.combined_s
    assert won.combined_s <= trials[0].median and lost.combined_s <= trials[1].median
    assert done.noise is not None and done.noise.busy and done.noise.other_cores > 0.3
