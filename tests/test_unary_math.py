"""Trigonometric and hyperbolic ops at run time, and Mod folded on constants, against onnxruntime.

The classic exporter writes Llama's rotary embedding as run-time Sin and Cos, and Swin's window shifts with
Mod on shape values; both models were refused as using unsupported operators.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from support.onnx_run import build_and_run

DOMAINS = {"Sin": (-20, 20), "Cos": (-20, 20), "Tan": (-1.5, 1.5), "Asin": (-1, 1), "Acos": (-1, 1),
           "Atan": (-50, 50), "Sinh": (-10, 10), "Cosh": (-10, 10), "Asinh": (-50, 50), "Acosh": (1, 50),
           "Atanh": (-0.99, 0.99)}


def test_each_trigonometric_op_matches_onnxruntime_on_its_domain(tmp_path):
    rng = np.random.default_rng(0)
    nodes, inputs, outputs, feeds = [], [], [], {}
    for op, (lo, hi) in DOMAINS.items():
        feeds[f"x_{op}"] = rng.uniform(lo, hi, (3, 37)).astype(np.float32)
        inputs.append(helper.make_tensor_value_info(f"x_{op}", TensorProto.FLOAT, (3, 37)))
        nodes.append(helper.make_node(op, [f"x_{op}"], [f"y_{op}"]))
        outputs.append(helper.make_tensor_value_info(f"y_{op}", TensorProto.FLOAT, (3, 37)))
    names = [f"y_{op}" for op in DOMAINS]
    got, want = build_and_run(tmp_path, helper.make_graph(nodes, "trig", inputs, outputs), feeds, names)
    for name, g, w in zip(names, got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=2e-6, atol=2e-6, err_msg=name)


@pytest.mark.parametrize("fmod,dtype", [(0, np.int64), (1, np.int64), (1, np.float32)])
def test_mod_of_constants_folds_as_onnx_defines_it(tmp_path, fmod, dtype):
    """fmod=0 takes the divisor's sign (Python's %), fmod=1 the dividend's (C's fmod; floats need it)."""
    a = np.array([7, -7, 7, -7, 9, 0], dtype)
    b = np.array([3, 3, -3, -3, 4, 5], dtype)
    tensor = TensorProto.INT64 if dtype == np.int64 else TensorProto.FLOAT
    nodes = [helper.make_node("Mod", ["a", "b"], ["m"], fmod=fmod), helper.make_node("Cast", ["m"], ["mf"], to=1),
             helper.make_node("Add", ["x", "mf"], ["y"])]
    graph = helper.make_graph(nodes, "mod", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (6,))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (6,))],
                              [helper.make_tensor("a", tensor, (6,), a), helper.make_tensor("b", tensor, (6,), b)])
    (got,), (want,) = build_and_run(tmp_path, graph, {"x": np.zeros(6, np.float32)}, ["y"])
    np.testing.assert_array_equal(got, want)
