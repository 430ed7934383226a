"""Gather of a run-time tensor by constant indices (ViT's class token, ConvNeXt's exported as_strided): built
from Slices, a Concat and a Reshape (more than 64 runs of indices: a Gather kernel), and checked against
onnxruntime end to end."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from schemas import Target
from stages.build.library import build_library
from stages.extract import ModelError, load_model
from stages.graph.passes import optimize
from stages.runtime import load


def _model(shape, axis, indices) -> onnx.ModelProto:
    idx = np.asarray(indices, dtype=np.int64)
    out_shape = [*shape[:axis], *idx.shape, *shape[axis + 1:]]
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Gather", ["r", "idx"], ["g"], name="pick", axis=axis),
             helper.make_node("Sigmoid", ["g"], ["y"], name="sig")]
    graph = helper.make_graph(nodes, "gather", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
                              [numpy_helper.from_array(idx, "idx")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


CASES = {
    "class token (scalar index)": ((1, 197, 32), 1, 0),
    "last token, negative index": ((1, 9, 16), 1, -1),
    "contiguous run as a 4-D index": ((768,), 0, np.arange(768).reshape(1, 768, 1, 1)),
    "scattered and repeated indices": ((2, 7, 5), 1, [[6, 0], [0, 3]]),
    "innermost axis": ((3, 4, 10), 2, [9, 8, 7, 1, 2, 3]),
    "100 scattered indices, some negative": ((1, 200, 4), 1, np.arange(0, 200, 2) - 100),
}


@pytest.mark.parametrize("case", CASES)
def test_gather_of_a_run_time_tensor_matches_onnxruntime(tmp_path, case):
    shape, axis, indices = CASES[case]
    model = _model(shape, axis, indices)
    graph = optimize(load_model(model))
    runs = len(np.flatnonzero(np.diff(np.asarray(indices).reshape(-1) % shape[axis]) != 1)) + 1
    assert any(n.op == "Gather" for n in graph.nodes) == (runs > 64)
    build_library(graph, Target.host(), tmp_path / "lib")
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = load(tmp_path / "lib").run(x=x)["y"]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_out_of_range_constant_indices_are_named():
    with pytest.raises(ModelError, match="Gather 'pick': an index is out of range for axis 1 of size 9"):
        load_model(_model((1, 9, 16), 1, [9]))
