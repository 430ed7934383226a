"""Issue 24's "one rank": `log show`, `tune-op --json`, the results artifact's table and a real library build
agree on the best config of one log holding re-measure rows."""

from __future__ import annotations

import json
import os

import numpy as np

from flows.artifacts import results_markdown
from schemas import MeasureResult
from schemas.record import REMEASURE
from stages.build.library import build_library
from stages.graph.ir import Graph, Node, Value
from stages.log import TuningLog
from stages.runtime import load
from testing.cli import tunaflow


def one_matmul(task, rng) -> tuple[Graph, np.ndarray, np.ndarray]:
    """x[32,40] @ W[40,48]: a graph whose one anchor is `task` (matmul 32x48x40)."""
    x, w = rng.standard_normal((32, 40)).astype(np.float32), rng.standard_normal((40, 48)).astype(np.float32)
    values = {"x": Value("x", (32, 40)), "w": Value("w", (40, 48)), "y": Value("y", (32, 48))}
    node = Node("mm", "MatMul", ["x", "w"], ["y"], {}, task)
    return Graph("one", [values["x"]], [values["y"]], [node], values, {"w": w}), x, w


def test_log_show_tune_op_json_the_artifact_table_and_the_build_agree(tmp_path, host):
    """X's re-measurement measured a tenth of the fastest trial once and ten times it twice (its own median
    says slow, its combined figure fast); Y's half of it three times. By the one rank, X is best everywhere."""
    log = tmp_path / "log"
    args = ["tune-op", "matmul", "--m", "32", "--n", "48", "--k", "40", "--trials", "6", "--batch-size", "3",
            "--tuner", "random", "--seed", "2", "--remeasure-top-k", "2", "--log", log, "--no-prefect", "--json"]
    first = tunaflow(*args)
    assert first.returncode == 0, first.stderr
    records = TuningLog(log).records()
    trials = sorted((r for r in records if r.tuner != REMEASURE and r.result.ok), key=lambda r: r.result.median)
    y, x = trials[0], trials[1]
    fastest = min(r.cost_s for r in records if r.result.ok)

    def remeasured(r, rounds):
        return r.model_copy(update={"tuner": REMEASURE, "trial": 60, "rounds": rounds, "combined_s": min(rounds),
                                    "result": MeasureResult(costs=tuple(c for m in rounds for c in (m, m, m))),
                                    "gflops": r.task.flops / min(rounds) / 1e9})

    TuningLog(log).append([remeasured(x, (fastest / 10, fastest * 10, fastest * 10)),
                           remeasured(y, (fastest / 2,) * 3)])
    x_gflops = x.task.flops / (fastest / 10) / 1e9

    again = tunaflow(*args)  # the budget is spent: nothing new is measured or re-measured
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert report["new_trials"] == 0 and report["best_config"] == x.config.knobs
    assert abs(report["best_gflops"] - x_gflops) < 0.01

    row = results_markdown([report]).splitlines()[2]  # what the flow publishes: the same report's table
    assert row.split("|")[3].strip() == f"{report['best_gflops']:.1f}"  # one figure (the report's is x's, above)

    shown = tunaflow("log", "show", log, "--top", "2", env={**os.environ, "COLUMNS": "400"})
    assert shown.returncode == 0, shown.stderr
    lines = [t.strip("│ ") for t in shown.stdout.splitlines()]
    rank1 = next(t for t in lines if t.startswith("1 "))
    rank2 = next(t for t in lines if t.startswith("2 "))
    assert x.config.short() in rank1 and "re-measured" in rank1 and y.config.short() in rank2

    graph, xs, w = one_matmul(x.task, np.random.default_rng(0))
    manifest = build_library(graph, host, tmp_path / "lib", log=log)
    (op,) = manifest.ops
    assert op.kind == "tuned" and op.knobs == x.config.knobs
    assert op.record["trial"] == 60 and op.record["session_id"] == x.session_id
    np.testing.assert_allclose(load(tmp_path / "lib").run(x=xs)["y"], xs @ w, rtol=1e-4, atol=1e-4)
