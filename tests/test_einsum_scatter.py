"""Einsum (MaxViT's attention) and constant ScatterND (Swin's attention mask) against onnxruntime.

Both exports were refused as unsupported operators. Einsum becomes Transposes, Reshapes and MatMuls at
import (`stages/extract/normalize_einsum.py`); ScatterND folds when its inputs are constants.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from support.onnx_run import build_and_run

from schemas.errors import ModelError
from stages.extract import load_model
from stages.graph.passes import optimize

RNG = np.random.default_rng(0)


def _run(tmp_path, nodes, inputs: dict[str, np.ndarray], consts: dict[str, np.ndarray], outputs: list[str]):
    """(tunaflow's outputs, onnxruntime's) for a model of `nodes`."""
    graph = helper.make_graph(
        nodes, "m", [helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape) for k, v in inputs.items()],
        [helper.make_empty_tensor_value_info(o) for o in outputs],
        [onnx.numpy_helper.from_array(v, k) for k, v in consts.items()])
    return build_and_run(tmp_path, graph, inputs, outputs)


def _f(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


CASES = [  # equation, operand shapes, which operands are constants
    ("B G H I D, B G H J D -> B G H I J", [(1, 2, 3, 5, 8), (1, 2, 3, 7, 8)], ()),  # MaxViT's Q K^T
    ("B G H I J, B G H J D -> B G H I D", [(1, 2, 3, 5, 7), (1, 2, 3, 7, 8)], ()),
    ("ij,jk->ik", [(5, 6), (6, 20)], (1,)),  # a dense layer
    ("bij,bkj->bki", [(3, 4, 6), (3, 5, 6)], ()),  # output order differs from the product's
    ("ij->ji", [(4, 7)], ()),
    ("ijk->ki", [(3, 4, 5)], ()),  # a sum and a transpose
    ("ij,j->i", [(6, 9), (9,)], ()),
    ("bn,anm,bm->ba", [(2, 4), (3, 4, 5), (2, 5)], (1,)),  # three operands: a bilinear form
    ("ab,cd->abcd", [(2, 3), (4, 5)], ()),  # an outer product
    ("ij,ij->i", [(4, 6), (4, 6)], ()),  # a row-wise dot product
    ("ij,jk", [(3, 4), (4, 5)], ()),  # implicit output: ik
]


@pytest.mark.parametrize("equation,shapes,consts", CASES, ids=[c[0] for c in CASES])
def test_einsum_matches_onnxruntime(tmp_path, equation, shapes, consts):
    names = [f"x{i}" for i in range(len(shapes))]
    values = {n: _f(*s) for n, s in zip(names, shapes, strict=True)}
    inputs = {n: v for i, (n, v) in enumerate(values.items()) if i not in consts}
    constant = {n: v for i, (n, v) in enumerate(values.items()) if i in consts}
    (got,), (want,) = _run(tmp_path, [helper.make_node("Einsum", names, ["y"], equation=equation)], inputs, constant,
                           ["y"])
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("equation,shapes,match", [
    ("ii->i", [(4, 4)], "repeats a letter"),
    ("...ij->...ji", [(2, 4, 5)], "ellipses"),
    ("ij,jk->ik", [(3, 4), (5, 6)], "letter 'j' is 4 in one operand and 5"),
])
def test_einsum_it_cannot_run_is_refused_by_node_and_reason(tmp_path, equation, shapes, match):
    names = [f"x{i}" for i in range(len(shapes))]
    nodes = [helper.make_node("Einsum", names, ["y"], equation=equation, name="the_einsum")]
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
                                           for n, s in zip(names, shapes, strict=True)],
                              [helper.make_empty_tensor_value_info("y")])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    with pytest.raises(ModelError, match=rf"Einsum 'the_einsum'.*{match}"):
        load_model(path)


def test_constant_scatter_nd_folds_as_onnx_defines_it(tmp_path):
    """Swin's shifted-window mask: regions of a zero tensor set by slice assignment, then used at run time;
    `add` accumulates repeated indices."""
    data = np.zeros((4, 6), np.float32)
    idx = np.array([[1], [3]], np.int64)
    rows = np.arange(12, dtype=np.float32).reshape(2, 6)
    pts = np.array([[0, 0], [0, 0], [2, 5]], np.int64)
    nodes = [helper.make_node("ScatterND", ["data", "idx", "rows"], ["mask"]),
             helper.make_node("ScatterND", ["mask", "pts", "ones"], ["mask2"], reduction="add"),
             helper.make_node("Add", ["x", "mask2"], ["y"])]
    consts = {"data": data, "idx": idx, "rows": rows, "pts": pts, "ones": np.ones(3, np.float32)}
    (got,), (want,) = _run(tmp_path, nodes, {"x": _f(4, 6)}, consts, ["y"])
    np.testing.assert_allclose(got, want, rtol=1e-6)
    graph = optimize(load_model(tmp_path / "m.onnx"))
    assert [n.op for n in graph.nodes] == ["Add"]


def test_a_run_time_scatter_nd_is_refused_naming_the_op(tmp_path):
    nodes = [helper.make_node("ScatterND", ["x", "idx", "rows"], ["y"], name="sc")]
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (4, 6))],
                              [helper.make_empty_tensor_value_info("y")],
                              [onnx.numpy_helper.from_array(np.array([[1]], np.int64), "idx"),
                               onnx.numpy_helper.from_array(np.ones((1, 6), np.float32), "rows")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), tmp_path / "m.onnx")
    with pytest.raises(ModelError, match="ScatterND 'sc'.*must be a constant"):
        load_model(tmp_path / "m.onnx")


@pytest.mark.parametrize("reduction", ["none", "add", "max"])
def test_constant_scatter_elements_folds_as_onnx_defines_it(tmp_path, reduction):
    """BEiT's relative position index (select_scatter), along axis 1, negative indices included."""
    data = _f(3, 5)
    idx = np.array([[0, -1], [2, 4], [1, 1 if reduction == "none" else 3]], np.int64)
    updates = _f(3, 2)
    nodes = [helper.make_node("ScatterElements", ["data", "idx", "upd"], ["s"], axis=1, reduction=reduction),
             helper.make_node("Add", ["x", "s"], ["y"])]
    (got,), (want,) = _run(tmp_path, nodes, {"x": _f(3, 5)}, {"data": data, "idx": idx, "upd": updates}, ["y"])
    np.testing.assert_allclose(got, want, rtol=1e-6)
