"""`tunaflow build / run / tune` as a user runs them (real subprocesses), and the tune-model Prefect flow."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parent.parent
RNG = np.random.default_rng(5)


def tunaflow(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tunaflow", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def _init(name, arr):
    return helper.make_tensor(name, TensorProto.FLOAT, arr.shape, arr.astype(np.float32).ravel())


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """x[1,3,8,8] → Conv(4, 3x3, pad 1) → Relu → MaxPool → GlobalAveragePool → Flatten → Gemm(5) → Softmax."""
    path = tmp_path_factory.mktemp("m") / "tiny.onnx"
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("GlobalAveragePool", ["p"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Gemm", ["f", "fw", "fb"], ["l"], transB=1),
             helper.make_node("Softmax", ["l"], ["y"], axis=1)]
    inits = [_init("w", RNG.standard_normal((4, 3, 3, 3))), _init("b", RNG.standard_normal(4)),
             _init("fw", RNG.standard_normal((5, 4))), _init("fb", RNG.standard_normal(5))]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _ort(model: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    return ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_build_then_run_with_inputs_outputs_and_bench(model, tmp_path):
    lib = tmp_path / "lib"
    r = tunaflow("build", str(model), "-o", str(lib), "--json")
    assert r.returncode == 0, r.stderr
    built = json.loads(r.stdout)
    assert built["ops"]["default"] == 2 and built["ops"]["generated"] >= 3 and built["log_digest"] is None
    assert built["padded_hand_offs"] == 0  # its only conv reads the graph input
    assert "use the default schedule" in built["fallback"]
    manifest = json.loads((lib / "manifest.json").read_text())
    assert manifest["inputs"] == [{"name": "x", "shape": [1, 3, 8, 8], "dtype": "float32", "bound": None}]
    assert set(manifest["files"]) == {"model.so", "weights.bin"}

    x = RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    r = tunaflow("run", str(lib), "--inputs", str(tmp_path / "in.npz"), "--output", str(tmp_path / "out.npz"),
                 "--bench", "10", "--profile", "10", "--json")
    assert r.returncode == 0, r.stderr
    ran = json.loads(r.stdout)
    assert ran["outputs"] == {"y": [1, 5]} and 0 < ran["latency"]["median_ms"] <= ran["latency"]["p90_ms"]
    calls = [op for op in manifest["ops"] if op["kind"] != "alias"]
    assert [(p["node"], p["kind"]) for p in ran["profile"]] == [(op["node"], op["kind"]) for op in calls]
    assert all(p["median_us"] > 0 for p in ran["profile"])
    assert sum(p["median_us"] for p in ran["profile"]) < 2e3 * ran["latency"]["p90_ms"]
    r = tunaflow("run", str(lib), "--profile", "5")
    assert r.returncode == 0 and "per-op time, median of 5 runs" in r.stdout and calls[0]["node"] in r.stdout
    np.testing.assert_allclose(np.load(tmp_path / "out.npz")["y"], _ort(model, x), rtol=1e-3, atol=1e-5)

    np.savez(tmp_path / "bad.npz", x=np.zeros((1, 3, 8, 9), np.float32))
    r = tunaflow("run", str(lib), "--inputs", str(tmp_path / "bad.npz"))
    assert r.returncode == 2 and "must have shape [1, 3, 8, 8]" in r.stderr
    r = tunaflow("run", str(lib), "--threads", "2")
    assert r.returncode == 2 and "built for 1 thread" in r.stderr
    with open(lib / "model.so", "ab") as fh:
        fh.write(b"\0")
    r = tunaflow("run", str(lib))
    assert r.returncode == 2 and "model.so does not match the manifest" in r.stderr


def test_tune_resumes_from_its_log_and_builds_the_tuned_library(model, tmp_path):
    args = ["tune", str(model), "--log", str(tmp_path / "log"), "-o", str(tmp_path / "lib"), "--trials", "6",
            "--batch-size", "3", "--tuner", "random", "--no-prefect", "--json", "--refine-top-k", "0"]
    r = tunaflow(*args)  # without the in-model refinement the build follows the rank alone (test_refine.py)
    assert r.returncode == 0, r.stderr
    first = json.loads(r.stdout)
    conv, winograd, dense = first["tasks"]  # the 3x3 conv is tuned as both of its implementations
    assert conv["task"].startswith("conv2d(1x3x8x8") and dense["task"].startswith("dense(1x4")
    assert winograd["task"].startswith("conv2d_winograd(1x3x8x8")
    assert dense["built"] and conv["built"] != winograd["built"]  # the build runs one of the two
    assert sum(t["trials"] for t in first["tasks"]) == 6 and min(t["best_gflops"] for t in first["tasks"]) > 0
    assert first["ops"]["tuned"] == 2 and first["log_digest"]
    assert first["templates"]["dense"] == 1 and sum(first["templates"].values()) == 2
    assert len(first["charts"]) == 3 and all(Path(c).stat().st_size > 5000 for c in first["charts"])
    again = json.loads(tunaflow(*args).stdout)
    assert [t["new_trials"] for t in again["tasks"]] == [0, 0, 0] and again["log_digest"] == first["log_digest"]
    ops = json.loads((tmp_path / "lib" / "manifest.json").read_text())["ops"]
    tuned = next(op for op in ops if op["kind"] == "tuned" and op["task"].startswith("conv2d"))
    faster = max((conv, winograd), key=lambda t: t["best_gflops"])
    assert tuned["task"].split("(")[0] == faster["task"].split("(")[0] and faster["built"]
    assert tuned["record"]["gflops"] == pytest.approx(faster["best_gflops"], rel=0.01)

    x = RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)
    from stages.runtime import load

    np.testing.assert_allclose(load(tmp_path / "lib")(x), _ort(model, x), rtol=1e-3, atol=1e-5)


def test_tune_model_flow(model, tmp_path, prefect_server):
    from flows.tune_model import tune_model
    from schemas import MeasureOptions, Target, TuningOptions

    options = TuningOptions(n_trials=4, batch_size=2, tuner="random", measure=MeasureOptions(threads=1))
    result = tune_model(str(model), Target.host(), options, str(tmp_path / "log"), str(tmp_path / "lib"), budget=4)
    trials = [t.trials for t in result.tasks]
    assert sum(trials) == 4 and min(trials) >= 1
    assert set(result.build["ops"]) == {"tuned", "generated", "alias"}
    assert (tmp_path / "lib" / "model.so").is_file() and len(result.charts) == 3


def test_tune_budget_defaults_to_a_fixed_number_of_trials_per_tunable_task(model):
    from stages.pipeline.model import TRIALS_PER_TASK, default_budget, load_graph, tunable_tasks

    assert default_budget(tunable_tasks(load_graph(model))) == 3 * TRIALS_PER_TASK  # the conv, its twin, the gemm
    cnn = Path(__file__).parents[1] / "data" / "models" / "cnn.onnx"
    assert default_budget(tunable_tasks(load_graph(cnn))) == 960
