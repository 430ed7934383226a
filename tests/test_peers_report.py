"""The pure helpers of benchmarks/peers.py: peer workload specs, goal verdicts, table rows (no TVM here)."""

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "peers_report", Path(__file__).resolve().parents[1] / "benchmarks" / "peers_report.py")
pr = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pr)


def test_matmul_spec_with_epilogue():
    s = pr.peer_spec("d", "matmul", {"m": 128, "n": 1024, "k": 512, "epilogue": "bias,relu"})
    assert s == {"name": "d", "kind": "matmul", "bias": True, "relu": True, "m": 128, "n": 1024, "k": 512}


def test_conv_spec_parses_shapes_and_defaults():
    s = pr.peer_spec("c", "conv2d", {"input": "1x64x56x56", "weight": "64x64x3x3", "pad": "1"})
    assert (s["x"], s["w"], s["stride"], s["pad"], s["bias"], s["relu"]) == (
        [1, 64, 56, 56], [64, 64, 3, 3], 1, 1, False, False)


@pytest.mark.parametrize(("op", "opts", "match"), [
    ("matmul", {"m": 2, "n": 2, "k": 2, "epilogue": "relu,bias"}, "epilogue"),
    ("matmul", {"m": 2, "n": 2, "k": 2, "epilogue": "sigmoid"}, "epilogue"),
    ("conv2d", {"input": "2x8x4x4", "weight": "8x8x3x3"}, "batch-1"),
    ("conv2d", {"input": "1x8x4x4", "weight": "8x4x3x3"}, "groups 1"),
    ("pool", {}, "no peer workload"),
])
def test_spec_refuses_what_a_peer_cannot_compute(op, opts, match):
    with pytest.raises(ValueError, match=match):
        pr.peer_spec("w", op, opts)


def test_verdicts_say_by_how_much():
    assert pr.verdict(1.12, 1.0, True) == "met (1.12x, goal >= 1x)"
    assert pr.verdict(0.75, 1.0, True) == "missed by 25% (0.75x, goal >= 1x)"
    assert pr.verdict(0.5, 0.25, False) == "missed by 100% (0.50x, goal <= 0.25x)"
    assert pr.verdict(0.2, 0.25, False).startswith("met")
    assert pr.verdict(None, 1.0, True) == "not measured (goal >= 1x)"
    assert pr.ratio(1.0, 0.0) is None and pr.ratio(None, 2.0) is None


def test_rows_and_goals_from_a_run():
    harness = {"results": {"numpy": {"gflops": 200.0}, "onnxruntime": {"gflops": 150.0},
                           "tunaflow@256": {"gflops": 180.0}, "tvm@256": {"gflops": 240.0},
                           "tvm@64": {"error": "wrong output"}}}
    tuned = {("tunaflow", 256): {"wall_s": 100.0, "trials": 256}, ("tvm", 256): {"wall_s": 400.0, "trials": 256},
             ("tunaflow", 64): {"error": "boom"}, ("tvm", 64): {"wall_s": 90.0, "trials": 64}}
    rows = pr.op_rows("mm", [64, 256], tuned, harness)
    assert rows[0][:4] == ["mm", "64", "-", "-"]
    assert rows[1] == ["mm", "256", "180.0", "240.0", "200.0", "150.0", "0.75", "0.90", "100", "400", "0.25",
                       "2.56 / 0.64"]
    goals = "\n".join(pr.goal_lines("mm", [64, 256], tuned, harness))
    assert "mm @ 64: GFLOPS vs TVM not measured" in goals
    assert "mm @ 256: GFLOPS vs TVM missed by 25%" in goals
    assert "tuning wall time vs TVM met (0.25x" in goals
    assert "mm @ 256: GFLOPS vs numpy missed by 10%" in goals
    table = pr.markdown_table(["a", "b"], [["1", "2"]])
    assert table == ["| a | b |", "|---|---|", "| 1 | 2 |"]
