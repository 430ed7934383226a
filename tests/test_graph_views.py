"""A Transpose that only moves unit dims (ViT's [1, S, C] -> [S, 1, C]) runs as an alias of its input, not a
copy kernel; one that reorders real dims is still a copy; both match numpy through a built library."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from schemas import Target
from stages.build.library import build_library
from stages.extract import load_model
from stages.graph.passes import optimize
from stages.runtime import load


def _model(tmp_path: Path, perm: list[int], shape: tuple[int, ...]) -> Path:
    """y = Relu(Transpose(Relu(x))): the Transpose sits between two kernels, as inside a model."""
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Transpose", ["a"], ["t"], perm=perm),
             helper.make_node("Relu", ["t"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    return path


def _built(tmp_path: Path, perm: list[int], shape: tuple[int, ...]) -> tuple[list[tuple[str, str]], np.ndarray,
                                                                          np.ndarray]:
    g = optimize(load_model(_model(tmp_path, perm, shape)))
    build_library(g, Target.host(), tmp_path / "lib")
    lib = load(tmp_path / "lib")
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    want = np.maximum(np.maximum(x, 0).transpose(perm), 0)
    return [(i.op, i.kind) for i in lib.manifest.ops], lib.run(x=x)["y"], want


def test_a_transpose_of_unit_dims_is_an_alias(tmp_path):
    ops, got, want = _built(tmp_path, [1, 0, 2], (1, 197, 24))
    assert ("Reshape", "alias") in ops and not any(op == "Transpose" for op, _ in ops)
    assert got.shape == (197, 1, 24)
    np.testing.assert_array_equal(got, want)


def test_a_transpose_that_reorders_dims_is_still_a_copy(tmp_path):
    ops, got, want = _built(tmp_path, [0, 2, 1, 3], (1, 5, 3, 8))
    assert ("Transpose", "generated") in ops
    np.testing.assert_array_equal(got, want)
