"""Tuning time = deployed time (issue 24): `run --profile` compares each tuned anchor's time inside a real
built library with the time its chosen record says, and flags one more than 5% off with the reason."""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from schemas import MeasureOptions, TuningOptions
from schemas.manifest import Manifest
from stages.build.library import build_library
from stages.extract import load_model
from stages.graph.passes import optimize
from stages.graph.tasks import extract_tasks
from stages.log import TuningLog
from stages.runtime import load
from stages.runtime.compare import random_feeds
from stages.runtime.deployed import TOLERANCE, Alone, anchor_times, chosen_records, reasons, round_figure
from stages.tune.loop import default_record, tune_task
from testing.cli import tunaflow

RNG = np.random.default_rng(5)
RUNS = 2000  # ~15 us each: more rounds' medians, a steadier fastest one


def two_matmuls(path):
    """x[48,96] @ W1[96,128] -> Relu -> @ W2[128,64]: two anchors (the Relu fuses) of two different tasks."""
    w1 = helper.make_tensor("w1", TensorProto.FLOAT, [96, 128], RNG.uniform(-1, 1, (96, 128)).astype(np.float32))
    w2 = helper.make_tensor("w2", TensorProto.FLOAT, [128, 64], RNG.uniform(-1, 1, (128, 64)).astype(np.float32))
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="first"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="second")]
    graph = helper.make_graph(nodes, "two", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [48, 96])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [48, 64])], [w1, w2])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def anchor_figures(lib) -> dict[str, float]:
    """Node -> the fastest round median of its calls in the library, as `run --profile` takes it."""
    model = load(lib)
    ops, samples = model.profile_samples(RUNS, **random_feeds(model))
    return {op.node: round_figure(samples[:, i])[0] for i, op in enumerate(ops) if op.kind != "generated"}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The graph, its default-schedule library and a real log holding each task's default-schedule trial."""
    from schemas import Target

    host = Target.host()
    root = tmp_path_factory.mktemp("deployed")
    graph = optimize(load_model(two_matmuls(root / "two.onnx")))
    tasks = [t.task for t in extract_tasks(graph)]
    anchors = [n for n in graph.nodes if n.task is not None]
    assert len(tasks) == len(anchors) == 2
    build_library(graph, host, root / "default")
    log = TuningLog(root / "log")
    for task in tasks:
        tune_task(task, host, TuningOptions(n_trials=1, top_k_remeasure=0, measure=MeasureOptions(threads=1)), log)
    return host, root, graph, anchors


def forged_library(setup, name: str) -> tuple:
    """A library whose two anchors run their default schedule under records of that config: `first`'s record
    says what the kernel takes in the default library just now, `second`'s half of it (wrong by 2x)."""
    host, root, graph, anchors = setup
    took = anchor_figures(root / "default")
    log = TuningLog(root / name / "log")
    forged = []
    for node, factor in zip(anchors, (1.0, 0.5), strict=True):
        record = default_record(TuningLog(root / "log"), node.task, host, 1)
        seconds = took[node.name] * factor
        forged.append(record.model_copy(update={"trial": 7, "result": record.result.model_copy(
            update={"costs": (seconds,) * 3}), "gflops": node.task.flops / seconds / 1e9}))
    log.append(forged)
    manifest = build_library(graph, host, root / name / "lib", log=root / name / "log")
    by_node = {op.node: op for op in manifest.ops}
    assert all(by_node[n.name].kind == "tuned" and by_node[n.name].record["trial"] == 7 for n in anchors)
    return root / name / "lib", [by_node[n.name] for n in anchors]


@pytest.fixture(scope="module")
def built(setup):
    return forged_library(setup, "forged")


def test_the_anchor_whose_record_is_wrong_by_2x_is_flagged_and_the_right_one_is_not(setup):
    """The wrong record is flagged; the right one is measured near its record and flagged exactly when it lands
    more than 5% off (on a machine as busy as CI, a single profile can, so the 5% itself is not asserted: that
    is a timing claim, and benchmarks/deployed.py measures it)."""
    lib, (first, second) = forged_library(setup, "try")
    done = tunaflow("run", lib, "--profile", str(RUNS), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    rows = {r["node"]: r for r in report["profile"]}
    right, wrong = rows[first.node], rows[second.node]
    assert 1.5 < wrong["ratio"] < 3 and wrong["off"] and wrong["reasons"]
    assert 0.67 < right["ratio"] < 1.5
    assert right["off"] == (abs(right["ratio"] - 1) > TOLERANCE) == bool(right["reasons"])
    assert report["deployed"]["worst"]["node"] == second.node and report["deployed"]["records_found"] == 2
    assert report["deployed"]["off"] == 1 + right["off"]


def test_timed_alone_the_kernel_is_measured_the_tuners_way_and_per_call(built):
    lib, (_, second) = built
    done = tunaflow("run", lib, "--profile", str(RUNS), "--alone", "--json")
    assert done.returncode == 0, done.stderr
    wrong = {r["node"]: r for r in json.loads(done.stdout)["profile"]}[second.node]
    assert wrong["off"] and wrong["alone_us"] is not None and wrong["alone_call_us"] is not None
    assert wrong["alone_us"] / wrong["tuned_us"] > 1.5  # its record says half what the kernel takes
    assert wrong["reasons"][0].startswith("alone it")


def test_the_table_flags_the_anchor_off_and_says_why(built):
    lib, (_, second) = built
    done = tunaflow("run", lib, "--profile", str(RUNS), env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    assert "off by more than 5%" in done.stdout and " off │" in done.stdout
    line = next(t for t in done.stdout.splitlines() if t.strip().startswith(second.node + " ("))
    assert "when tuned): " in line


def test_a_record_measured_on_another_thread_count_is_named(built):
    lib, _ = built
    manifest = Manifest.model_validate_json((lib / "manifest.json").read_text())
    records = chosen_records(manifest, lib.parent / "log")
    assert len(records) == 2
    records = {n: r.model_copy(update={"threads": 2}) for n, r in records.items()}
    samples = np.array([[o.record["median_s"] * 2 if o.record else 1e-6 for o in manifest.ops if o.kind != "alias"]])
    ops_list = [o for o in manifest.ops if o.kind != "alias"]
    verdicts = anchor_times(manifest, ops_list, np.repeat(samples, 10, axis=0), records)
    assert all(v.off and v.reasons[0] == "the record was measured on 2 thread(s), the library runs 1" for v in verdicts)


def test_records_are_timed_with_their_weights_flushed_and_a_cache_reason_names_the_state(built):
    """Tuning's default state is recorded on each record, and the verdict on an anchor slower in the model than hot
    but no slower than cold says which state its record was timed in (hot: the tuner's loop kept it cached)."""
    lib, _ = built
    manifest = Manifest.model_validate_json((lib / "manifest.json").read_text())
    records = chosen_records(manifest, lib.parent / "log")
    assert {r.cache for r in records.values()} == {"weights"}
    node, record = next(iter(records.items()))
    op = next(o for o in manifest.ops if o.node == node)
    alone = Alone(loop=1e-5, call=1e-5, cold=3e-5, hot=1e-5)
    for state, says in (("weights", "its record was timed in the 'weights' state"),
                        ("hot", "in the tuner's loop they stay in cache")):
        why = reasons(manifest, op, (2e-5, 1e-5), 0.0, record.model_copy(update={"cache": state}), alone, None)
        assert why[0].startswith("alone it takes") and says in why[0]
