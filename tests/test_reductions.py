"""Every ONNX reduction against onnxruntime: at run time on several axis sets, and folded on constants.

wav2vec2's exported weight norm (`ReduceL2` of a constant weight) was refused as an unsupported operator;
ReduceProd, ReduceL1, ReduceL2, ReduceSumSquare and ReduceLogSum now run as generated kernels and every
reduction, ReduceLogSumExp included, folds where its input is a constant.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from schemas import Target
from schemas.errors import ModelError
from stages.build.library import build_library
from stages.extract import load_model
from stages.graph.passes import optimize
from stages.runtime import load

RUN_TIME = ["ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
            "ReduceSumSquare", "ReduceLogSum"]
AXES = [([1], 1), ([2, 3], 0), ([0, 2], 1), ([3], 0), ([-1, -3], 1)]  # (axes, keepdims)
SHAPE = (2, 3, 4, 5)


def _model(ops: list[str]) -> tuple[onnx.ModelProto, list[str]]:
    nodes, outputs, inits, names = [], [], [], []
    for op in ops:
        for i, (axes, keep) in enumerate(AXES):
            name = f"{op}_{i}"
            inits.append(helper.make_tensor(f"{name}_axes", TensorProto.INT64, (len(axes),), axes))
            nodes.append(helper.make_node(op, ["x", f"{name}_axes"], [name], keepdims=keep))
            outputs.append(helper.make_empty_tensor_value_info(name))
            names.append(name)
    graph = helper.make_graph(nodes, "reductions", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                              outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), names


def _build(model: onnx.ModelProto, work) -> tuple[str, object]:
    path = work / "m.onnx"
    onnx.save(model, path)
    build_library(optimize(load_model(path)), Target.host(), work / "lib", 1, None)
    return str(path), load(work / "lib")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    model, names = _model(RUN_TIME)
    path, lib = _build(model, tmp_path_factory.mktemp("reductions"))
    x = np.random.default_rng(0).uniform(0.5, 1.5, SHAPE).astype(np.float32)  # positive: ReduceLogSum's domain
    x[0, 0, 0, :2] = [-1.0, -0.75]  # signs for L1/L2/SumSquare (ReduceLogSum's sums stay positive)
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(names, {"x": x})
    got = lib.run(x=x)
    return {n: (got[n], w) for n, w in zip(names, want, strict=True)}


@pytest.mark.parametrize("op", RUN_TIME)
def test_each_reduction_matches_onnxruntime_on_every_axis_set(results, op):
    for i in range(len(AXES)):
        got, want = results[f"{op}_{i}"]
        assert got.shape == want.shape, (op, AXES[i])
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6, err_msg=f"{op} axes={AXES[i]}")


def test_weight_norm_of_a_constant_folds_before_the_conv(tmp_path):
    """wav2vec2's positional conv: weight = g * v / ReduceL2(v), all constants, then a Conv."""
    rng = np.random.default_rng(1)
    v = rng.standard_normal((8, 4, 3, 3)).astype(np.float32)
    g = rng.uniform(0.5, 2, (8, 1, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("ReduceL2", ["v", "axes"], ["norm"], keepdims=1),
             helper.make_node("Div", ["v", "norm"], ["unit"]), helper.make_node("Mul", ["unit", "g"], ["w"]),
             helper.make_node("ReduceLogSumExp", ["g", "axes"], ["lse"], keepdims=1),
             helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "lse"], ["y"])]
    inits = [helper.make_tensor("v", TensorProto.FLOAT, v.shape, v.ravel()),
             helper.make_tensor("g", TensorProto.FLOAT, g.shape, g.ravel()),
             helper.make_tensor("axes", TensorProto.INT64, (3,), [1, 2, 3])]
    graph = helper.make_graph(nodes, "wn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 4, 6, 6))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 8, 6, 6))], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.save(model, tmp_path / "wn.onnx")
    assert not any(n.op.startswith("Reduce") for n in optimize(load_model(tmp_path / "wn.onnx")).nodes)
    path, lib = _build(model, tmp_path)
    x = rng.standard_normal((1, 4, 6, 6)).astype(np.float32)
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(lib.run(x=x)["y"], want, rtol=1e-5, atol=1e-5)


def test_a_run_time_log_sum_exp_is_refused_by_name(tmp_path):
    model, _ = _model(["ReduceLogSumExp"])
    onnx.save(model, tmp_path / "m.onnx")
    with pytest.raises(Exception, match=r"ReduceLogSumExp.*ReduceLogSumExp_0"):
        build_library(optimize(load_model(tmp_path / "m.onnx")), Target.host(), tmp_path / "lib", 1, None)


@pytest.mark.parametrize("op,axes", [("ReduceL2", [7]), ("ReduceMean", [-5]), ("ReduceSum", [4])])
def test_an_axis_outside_the_tensor_is_refused_naming_the_node(tmp_path, op, axes):
    """ReduceL2 over axis 7 of a 4-D tensor once built a library (onnxruntime refuses the model)."""
    nodes = [helper.make_node(op, ["x", "axes"], ["y"], name="bad")]
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                              [helper.make_empty_tensor_value_info("y")],
                              [helper.make_tensor("axes", TensorProto.INT64, (1,), axes)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), tmp_path / "m.onnx")
    with pytest.raises(ModelError, match=rf"{op} 'bad' is malformed: axis {axes[0]} is out of range for a rank-4"):
        load_model(tmp_path / "m.onnx")
