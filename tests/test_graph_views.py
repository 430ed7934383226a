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


def _split_model(tmp_path: Path, shape: tuple[int, ...], perm: list[int], squeeze: list[int] | None,
                 ends: list[int]) -> Path:
    """Relu(x), Transpose, an optional Reshape, then Slices of axis 0 at `ends` (ViT's Q/K/V split), each Relu'd."""
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Transpose", ["a"], ["t"], perm=perm)]
    inits, src = [], "t"
    if squeeze is not None:
        inits.append(onnx.numpy_helper.from_array(np.array(squeeze, np.int64), "rs"))
        nodes.append(helper.make_node("Reshape", ["t", "rs"], ["r"]))
        src = "r"
    outs, begin = [], 0
    for i, end in enumerate(ends):
        inits += [onnx.numpy_helper.from_array(np.array([v], np.int64), f"{n}{i}") for n, v in
                  (("b", begin), ("e", end), ("ax", 0))]
        nodes += [helper.make_node("Slice", [src, f"b{i}", f"e{i}", f"ax{i}"], [f"s{i}"]),
                  helper.make_node("Relu", [f"s{i}"], [f"y{i}"])]
        outs.append(f"y{i}")
        begin = end
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    path = tmp_path / "split.onnx"
    onnx.save(m, str(path))
    return path


def _run_split(tmp_path: Path, shape, perm, squeeze, ends) -> list[str]:
    g = optimize(load_model(_split_model(tmp_path, shape, perm, squeeze, ends)))
    build_library(g, Target.host(), tmp_path / "lib")
    lib = load(tmp_path / "lib")
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    t = np.maximum(x, 0).transpose(perm)
    if squeeze is not None:
        t = t.reshape(squeeze)
    got, begin = lib.run(x=x), 0
    for i, end in enumerate(ends):
        np.testing.assert_array_equal(got[f"y{i}"], t[begin:end])
        begin = end
    return [i.op for i in lib.manifest.ops if i.kind != "alias"]


def test_slices_of_a_transpose_slice_its_input_first(tmp_path):
    """ViT's Q/K/V split: [1, S, 1, 3, C] transposed to [3, S, 1, 1, C], squeezed, sliced in three: three
    strided slices, no Transpose kernel."""
    ops = _run_split(tmp_path, (1, 7, 1, 3, 16), [3, 1, 2, 0, 4], [3, 7, 1, 16], [1, 2, 3])
    assert "Transpose" not in ops and ops.count("Slice") == 3


def test_slices_that_would_leave_a_real_transpose_keep_it(tmp_path):
    ops = _run_split(tmp_path, (3, 4, 8), [1, 0, 2], None, [2, 4])
    assert ops.count("Transpose") == 1
