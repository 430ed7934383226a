"""Attention's head transposes are read and written in place by the batch matmuls around them
(stages/build/gemm_views.py): the built library matches numpy, only K^T (strided along its last dim) stays a
copy, and a copy something else reads, or a result an epilogue tensor is added to, is left alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from schemas import Target
from stages.build.library import build_library
from stages.extract import load_model
from stages.graph.passes import optimize
from stages.runtime import load


def _attention(tmp_path: Path, s: int, heads: int, d: int, *, packed: bool, extra_reader: bool = False,
               residual: bool = False) -> Path:
    """Relu'd Q, K, V of [1, S, H*D] (three inputs, or slices of one packed [1, S, 3*H*D] projection as ViT's),
    heads split and transposed, softmax(Q K^T) V, heads merged back, Relu. `extra_reader`: Q's head transpose
    is also an output; `residual`: the product gets a tensor added before its head merge."""
    c = heads * d
    nodes, inits = [], [onnx.numpy_helper.from_array(np.array([1, s, heads, d], np.int64), "heads"),
                        onnx.numpy_helper.from_array(np.array([1, s, c], np.int64), "merged")]
    if packed:
        nodes += [helper.make_node("Relu", ["x"], ["xr"]),
                  helper.make_node("Reshape", ["xr", "qkv"], ["x5"]),
                  helper.make_node("Transpose", ["x5"], ["x5t"], perm=[2, 0, 1, 3])]
        inits.append(onnx.numpy_helper.from_array(np.array([1, s, 3, c], np.int64), "qkv"))
        for i, t in enumerate("qkv"):
            inits += [onnx.numpy_helper.from_array(np.array([v], np.int64), f"{n}{t}")
                      for n, v in (("b", i), ("e", i + 1), ("ax", 0))]
            nodes += [helper.make_node("Slice", ["x5t", f"b{t}", f"e{t}", f"ax{t}"], [f"{t}s"]),
                      helper.make_node("Reshape", [f"{t}s", "heads"], [f"{t}h"])]
        inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, s, 3 * c])]
    else:
        for t in "qkv":
            nodes += [helper.make_node("Relu", [t], [f"{t}r"]), helper.make_node("Reshape", [f"{t}r", "heads"],
                                                                                [f"{t}h"])]
        inputs = [helper.make_tensor_value_info(t, TensorProto.FLOAT, [1, s, c]) for t in "qkv"]
    nodes += [helper.make_node("Transpose", ["qh"], ["qt"], perm=[0, 2, 1, 3]),
              helper.make_node("Transpose", ["kh"], ["kT"], perm=[0, 2, 3, 1]),
              helper.make_node("Transpose", ["vh"], ["vt"], perm=[0, 2, 1, 3]),
              helper.make_node("MatMul", ["qt", "kT"], ["scores"]),
              helper.make_node("Softmax", ["scores"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "vt"], ["o"])]
    if residual:
        inits.append(onnx.numpy_helper.from_array(
            np.random.default_rng(9).standard_normal((1, heads, s, d)).astype(np.float32), "res"))
        nodes.append(helper.make_node("Add", ["o", "res"], ["o2"]))
    nodes += [helper.make_node("Transpose", ["o2" if residual else "o"], ["ot"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ot", "merged"], ["om"]),
              helper.make_node("Relu", ["om"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if extra_reader:
        nodes.append(helper.make_node("Relu", ["qt"], ["q_out"]))
        outputs.append(helper.make_tensor_value_info("q_out", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "attn", inputs, outputs, inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    path = tmp_path / "attn.onnx"
    onnx.save(m, str(path))
    return path


def _numpy(feeds: dict[str, np.ndarray], s: int, heads: int, d: int, packed: bool, residual: bool) -> np.ndarray:
    c = heads * d
    if packed:
        x = np.maximum(feeds["x"], 0).reshape(1, s, 3, c)
        q, k, v = (x[:, :, i].reshape(1, s, heads, d) for i in range(3))
    else:
        q, k, v = (np.maximum(feeds[t], 0).reshape(1, s, heads, d) for t in "qkv")
    q, k, v = (t.transpose(0, 2, 1, 3).astype(np.float64) for t in (q, k, v))
    z = q @ k.transpose(0, 1, 3, 2)
    p = np.exp(z - z.max(-1, keepdims=True))
    o = (p / p.sum(-1, keepdims=True)) @ v
    if residual:
        o = o + np.random.default_rng(9).standard_normal((1, heads, s, d)).astype(np.float32)
    return np.maximum(o.transpose(0, 2, 1, 3).reshape(1, s, c), 0)


def _build(tmp_path: Path, threads: int = 1, **kw):
    s, heads, d = kw.pop("s"), kw.pop("heads"), kw.pop("d")
    path = _attention(tmp_path, s, heads, d, **kw)
    build_library(optimize(load_model(path)), Target.host(), tmp_path / "lib", threads)
    lib = load(tmp_path / "lib")
    rng = np.random.default_rng(3)
    feeds = {i.name: rng.standard_normal(i.shape).astype(np.float32) for i in lib.manifest.inputs}
    got = lib.run(**feeds)
    want = _numpy(feeds, s, heads, d, kw["packed"], kw.get("residual", False))
    np.testing.assert_allclose(got["y"], want, rtol=1e-4, atol=1e-5)
    copies = [i.op for i in lib.manifest.ops if i.op in ("Transpose", "StridedCopy", "Slice")]
    layouts = {i.node: i.layout for i in lib.manifest.ops if i.op == "batch_matmul"}
    return got, copies, sorted(layouts.values(), key=str)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("s", "heads", "d"), [(7, 3, 5), (33, 2, 16), (20, 4, 64)])
def test_bert_s_head_transposes_go_and_k_transposed_stays_one_copy(tmp_path, s, heads, d, threads):
    _, copies, layouts = _build(tmp_path, threads, s=s, heads=heads, d=d, packed=False)
    assert copies == ["Transpose"]  # K^T: its last dim steps by H*D
    assert layouts == ["A read strided", "B read strided; C written strided"]


@pytest.mark.parametrize(("s", "heads", "d"), [(9, 3, 8), (197, 2, 64)])
def test_vit_s_packed_projection_is_read_in_place(tmp_path, s, heads, d):
    _, copies, layouts = _build(tmp_path, 2, s=s, heads=heads, d=d, packed=True)
    assert copies == ["StridedCopy"]  # K^T, straight from the packed projection
    assert layouts == ["A read strided", "B read strided; C written strided"]


def test_a_copy_read_elsewhere_stays_and_a_residual_keeps_c_contiguous(tmp_path):
    got, copies, layouts = _build(tmp_path, s=6, heads=2, d=4, packed=False, extra_reader=True, residual=True)
    assert sorted(copies) == ["Transpose"] * 3  # Q's (also an output), K^T, and the head merge after the add
    assert layouts == ["B read strided", None]
    assert got["q_out"].shape == (1, 2, 6, 4)
