"""The int8 MatMulInteger template (`qmatmul`, what `quantize_dynamic` writes for transformers): exact equality
with its int64 reference on every instruction path this machine runs, with the activation zero point read at run
time; and a dynamically quantized model whose MatMulIntegers build as qmatmul anchors, equal to the library of
generated loop kernels and to onnxruntime."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from schemas.target import Target, preset
from stages.build.library import build_library
from stages.codegen.compile import compile_ir
from stages.codegen.jit import LoadedKernel
from stages.extract import load_model
from stages.graph.passes import optimize
from stages.runtime import load
from stages.templates import TEMPLATES, qmatmul
from stages.templates.qgemm_isa import available
from testing.quantize import onnxruntime_run, quantize_dynamic

HOST = Target.host()
AVX2 = preset("x86-64-avx2")
NO_AVX = Target.parse("llvm -mtriple=x86_64-unknown-linux-gnu -mcpu=x86-64 -mattr=-avx,-avx2 -name=sse2")
PATHS = [(HOST, isa) for isa in available(HOST) if isa != "generic"] + [(AVX2, "avx2"), (NO_AVX, "generic")]
ROOT = Path(__file__).resolve().parent.parent


def _run(task, target: Target, knobs: dict, inputs: list[np.ndarray], threads: int = 1) -> np.ndarray:
    args = qmatmul.kernel_args(task, knobs, inputs)
    args[-1][...] = 0x5A5A5A5A
    LoadedKernel(compile_ir(qmatmul.build_ir(task, knobs, target, threads), target).data, HOST)(args)
    return args[-1]


def _on(target: Target, isa: str, task) -> dict:
    """The default schedule of `task` on `target`, moved to `isa` (a smaller tile when the path needs it)."""
    knobs = {**qmatmul.default_config(task, target).knobs, "isa": isa}
    sp = qmatmul.space(task, target)
    for mr, nv in ((knobs["mr"], knobs["nv"]), (4, 2), (3, 1), (1, 1)):
        cand = {**knobs, "mr": min(mr, task.inputs[0].shape[0]), "nv": nv}
        if sp.reason(cand) is None:
            return cand
    raise AssertionError(sp.reason(knobs))


@pytest.mark.parametrize(("target", "isa"), PATHS, ids=[f"{t.name}-{i}" for t, i in PATHS])
@pytest.mark.parametrize(("m", "n", "k", "zx"), [(37, 45, 29, 131), (1, 1, 1, 255), (5, 70, 8, 0), (13, 16, 130, 7),
                                                 (64, 96, 768, 128)])
def test_exact_on_every_path(target, isa, m, n, k, zx):
    task = qmatmul.task(m, n, k)
    inputs = qmatmul.make_inputs(task, seed=m + n + k)
    inputs[2][0] = zx
    np.testing.assert_array_equal(_run(task, target, _on(target, isa, task), inputs), qmatmul.reference(task, inputs))


def test_extremes_and_random_valid_schedules_are_exact_threaded():
    """X all 255 against W all -128 (the largest sums), zero points 0 and 255; then sampled schedules."""
    task = qmatmul.task(29, 67, 301)
    knobs = qmatmul.default_config(task, HOST).knobs
    for xv, wv, zx in ((255, -128, 0), (0, -128, 255), (255, 127, 255)):
        inputs = [np.full((29, 301), xv, np.uint8), np.full((301, 67), wv, np.int8), np.array([zx], np.uint8),
                  np.zeros(1, np.int8)]
        np.testing.assert_array_equal(_run(task, HOST, knobs, inputs, threads=2), qmatmul.reference(task, inputs))
    sp = qmatmul.space(task, HOST)
    inputs = qmatmul.make_inputs(task, seed=3)
    rng = np.random.default_rng(0)
    valid = [sp.knobs_at(i) for i in (int(x) for x in rng.integers(0, sp.size, 4000)) if sp.is_valid(i)][:8]
    assert len(valid) == 8
    for knobs in valid:
        np.testing.assert_array_equal(_run(task, HOST, knobs, inputs, threads=2), qmatmul.reference(task, inputs),
                                      err_msg=str(knobs))


def test_a_weight_zero_point_other_than_zero_is_refused():
    task = qmatmul.task(2, 3, 4)
    inputs = qmatmul.make_inputs(task)
    inputs[3][0] = 5
    with pytest.raises(ValueError, match="zero point 0, got 5"):
        qmatmul.kernel_args(task, qmatmul.default_config(task, HOST).knobs, inputs)


def _mlp() -> onnx.ModelProto:
    rng = np.random.default_rng(11)
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.2).astype(np.float32), n)
             for n, s in (("w1", (40, 72)), ("b1", (72,)), ("w2", (72, 24)))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 6, 40))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 6, 24))], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_dynamically_quantized_model_runs_its_matmul_integers_as_qmatmul(tmp_path):
    proto = quantize_dynamic(_mlp())
    graph = optimize(load_model(proto))
    mms = [n for n in graph.nodes if n.op == "MatMulInteger"]
    assert len(mms) == 2 and all(n.task is not None and n.task.op == "qmatmul" for n in mms)
    feeds = {"x": (np.random.default_rng(2).standard_normal((1, 6, 40)) * 2).astype(np.float32)}
    manifest = build_library(graph, HOST, tmp_path / "lib")
    assert sorted(i.kind for i in manifest.ops if i.op == "MatMulInteger") == ["default", "default"]
    build_library(replace(graph, nodes=[replace(n, task=None) for n in graph.nodes]), HOST, tmp_path / "loops")
    got, loops = (load(tmp_path / d).run(**feeds)["y"] for d in ("lib", "loops"))
    np.testing.assert_array_equal(got, loops)  # same integers, same float ops after them
    want = onnxruntime_run(proto, feeds)["y"]
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


def test_registered_and_tune_op_runs_error_free(tmp_path):
    assert TEMPLATES["qmatmul"] is qmatmul
    r = subprocess.run([sys.executable, "-m", "tunaflow", "tune-op", "qmatmul", "--m", "24", "--n", "40", "--k", "52",
                        "--trials", "6", "--batch-size", "3", "--log", str(tmp_path / "log"), "--no-prefect", "--json",
                        "--remeasure-top-k", "0"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["trials"] == 6 and out["best_gflops"] > 0 and not out["errors"], out
