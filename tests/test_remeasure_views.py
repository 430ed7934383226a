"""One answer to "which config is best": `log show`, `tune-op --json` and the build agree on a log holding
re-measure rows, and a conv and its Winograd twin are re-measured in the same rounds."""

from __future__ import annotations

import json
import os

from schemas import MeasureOptions, MeasureResult, TuningOptions
from schemas.record import REMEASURE
from stages.build.apply_best import choose
from stages.graph.twins import alternatives
from stages.log import TuningLog
from stages.measure.runner import LocalRunner
from stages.templates import conv2d
from stages.tune.loop import tune_tasks
from testing.cli import tunaflow


def test_log_show_tune_op_json_and_the_build_name_the_same_best(tmp_path, host):
    """Two forged re-measure rows where the re-measurement's own median and the combined figure disagree: X
    measured a tenth of the real best once and ten times it under load twice, Y half of it three times. Every
    view must name X."""
    log = tmp_path / "log"
    args = ["tune-op", "matmul", "--m", "32", "--n", "48", "--k", "40", "--trials", "6", "--batch-size", "3",
            "--tuner", "random", "--seed", "1", "--remeasure-top-k", "2", "--log", log, "--no-prefect", "--json"]
    first = tunaflow(*args)
    assert first.returncode == 0, first.stderr
    records = TuningLog(log).records()
    assert sum(r.tuner == REMEASURE for r in records) == 2
    trials = sorted((r for r in records if r.tuner != REMEASURE and r.result.ok), key=lambda r: r.result.median)
    y, x = trials[0], trials[1]

    def remeasured(r, rounds):
        pooled = MeasureResult(costs=tuple(c for m in rounds for c in (m, m, m)))
        return r.model_copy(update={"tuner": REMEASURE, "trial": 50, "result": pooled, "rounds": rounds,
                                    "combined_s": min(rounds), "gflops": r.task.flops / min(rounds) / 1e9})

    fastest = min(r.cost_s for r in records if r.result.ok)
    TuningLog(log).append([remeasured(x, (fastest / 10, fastest * 10, fastest * 10)),
                           remeasured(y, (fastest / 2,) * 3)])

    again = tunaflow(*args)  # the budget is spent: nothing new measured, nothing re-measured
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert report["new_trials"] == 0 and report["best_config"] == x.config.knobs
    assert report["best_gflops"] == round(x.task.flops / (fastest / 10) / 1e9, 2) and report["remeasured"]

    shown = tunaflow("log", "show", log, "--top", "1", env={**os.environ, "COLUMNS": "400"})
    assert shown.returncode == 0, shown.stderr
    rank1 = next(line for line in shown.stdout.splitlines() if line.strip("│ ").startswith("1 "))
    assert x.config.short() in rank1 and "re-measured" in rank1

    chosen = choose([x.task], TuningLog(log), host, 1)[x.task.signature]
    assert chosen.record is not None and chosen.config.knobs == x.config.knobs


class SpyRunner(LocalRunner):
    """The real local runner, noting which tasks each call measured together."""

    def __init__(self, options: MeasureOptions):
        super().__init__(options)
        self.calls: list[set[str]] = []

    def run(self, builds):
        self.calls.append({b.task.signature for b in builds})
        return super().run(builds)


def test_a_conv_and_its_winograd_twin_are_remeasured_in_the_same_rounds(tmp_path, host):
    task = conv2d.conv2d_task((1, 8, 8, 8), (8, 8, 3, 3), (1, 1), (1, 1, 1, 1))
    (twin,) = alternatives(task)
    measure = MeasureOptions(number=1, repeat=2, min_repeat_ms=1, n_parallel=1)
    options = TuningOptions(n_trials=4, batch_size=2, tuner="random", top_k_remeasure=2, measure=measure)
    log = TuningLog(tmp_path / "log")
    with SpyRunner(measure) as runner:
        tune_tasks([task, twin], [1, 1], host, options, log, runner=runner)
    together = [c for c in runner.calls if c == {task.signature, twin.signature}]
    again = [r for r in log.records() if r.tuner == REMEASURE]
    rounds = {len(r.rounds) for r in again}
    assert {r.task_signature for r in again} == {task.signature, twin.signature}
    assert len(rounds) == 1 and len(together) == rounds.pop() >= 3
