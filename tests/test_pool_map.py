"""Element-wise ops on the worker pool (stages/memops/pool_map.py): every broadcast pattern the split by leading
indices meets gives the bytes of the one-thread build and of onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from schemas import Target
from stages.build.library import build_library
from stages.extract import load_model
from stages.graph.passes import optimize
from stages.runtime import load
from testing.quantize import onnxruntime_run


def _model(shape_a: tuple[int, ...], shape_b: tuple[int, ...]) -> onnx.ModelProto:
    rng = np.random.default_rng(4)
    b = rng.standard_normal(shape_b).astype(np.float32)
    nodes = [helper.make_node("Mul", ["a", "b"], ["m"]), helper.make_node("Sigmoid", ["m"], ["s"]),
             helper.make_node("Add", ["s", "a"], ["y"])]
    graph = helper.make_graph(nodes, "pool", [helper.make_tensor_value_info("a", TensorProto.FLOAT, shape_a)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(b, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(("shape_a", "shape_b"), [
    ((1, 128, 768), (768,)),  # a transformer's bias over rows: the split takes the first two dims
    ((1, 40, 56, 56), (1, 40, 1, 1)),  # a squeeze-excite gate: one item per channel plane
    ((3, 5, 7, 300), (3, 1, 7, 1)),  # odd extents, broadcast in the middle
    ((70000,), (1,)),  # one dim: nothing to split, one thread
])
def test_elementwise_ops_split_over_the_pool_equal_one_thread_and_onnxruntime(tmp_path, shape_a, shape_b):
    model = _model(shape_a, shape_b)
    feeds = {"a": np.random.default_rng(9).standard_normal(shape_a).astype(np.float32)}
    got = {}
    for threads in (1, 2):
        build_library(optimize(load_model(model)), Target.host(), tmp_path / f"t{threads}", threads)
        got[threads] = load(tmp_path / f"t{threads}").run(**feeds)["y"]
    np.testing.assert_array_equal(got[2], got[1])
    np.testing.assert_allclose(got[2], onnxruntime_run(model, feeds)["y"], rtol=1e-5, atol=1e-6)
