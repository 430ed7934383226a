"""Transformer fusions as the exporters write the blocks: attention's scale, mask add, softmax and NaN guard
become one AttentionSoftmax row kernel; a dense's Gelu and residual Add behind a Reshape (GPT-2) fuse into its
epilogue. Each model is built into a library and must match onnxruntime and the unfused graph's numpy
reference, and the fused node must be in the built graph."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from schemas import Target
from stages.build.library import build_library
from stages.extract import load_model
from stages.graph import reference
from stages.graph.ir import Node
from stages.graph.passes import optimize
from stages.graph.passes_transformer import OP
from stages.runtime import load

RNG = np.random.default_rng(5)
H, S, D = 4, 24, 16  # heads, sequence (not a multiple of the kernel's 16 lanes), head width


def _save(tmp_path: Path, nodes, inits, inputs: dict[str, tuple[int, ...]], outputs=("y",)) -> Path:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v))
                                           for k, v in inputs.items()],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    return path


def _c(name: str, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, np.float32), name)


def attention(tmp_path: Path, mask_shape: tuple[int, ...] | None, guard: bool, scale_after: bool = False) -> Path:
    """softmax((Q * s) @ (K^T * s) + mask) [NaN -> 0] @ V, as torch's dynamo exporter writes it (or with one
    Div of the product by sqrt(D), as the classic one does)."""
    s = D ** -0.25
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2])]
    if scale_after:
        nodes += [helper.make_node("MatMul", ["q", "kt"], ["qk"]), helper.make_node("Div", ["qk", "sqrt_d"], ["sc"])]
    else:
        nodes += [helper.make_node("Mul", ["q", "s"], ["qs"]), helper.make_node("Mul", ["kt", "s"], ["ks"]),
                  helper.make_node("MatMul", ["qs", "ks"], ["sc"])]
    inputs = {"q": (1, H, S, D), "k": (1, H, S, D), "v": (1, H, S, D)}
    x = "sc"
    if mask_shape is not None:
        nodes.append(helper.make_node("Add", ["sc", "mask"], ["masked"]))
        inputs["mask"] = mask_shape
        x = "masked"
    nodes.append(helper.make_node("Softmax", [x], ["p"], axis=-1))
    if guard:
        nodes += [helper.make_node("IsNaN", ["p"], ["nan"]), helper.make_node("Where", ["nan", "zero", "p"], ["pg"])]
    nodes.append(helper.make_node("MatMul", ["pg" if guard else "p", "v"], ["y"]))
    return _save(tmp_path, nodes, [_c("s", s), _c("sqrt_d", math.sqrt(D)), _c("zero", 0.0)], inputs)


def _feeds(path: Path) -> dict[str, np.ndarray]:
    model = onnx.load(path)
    feeds = {}
    for i in model.graph.input:
        shape = [d.dim_value for d in i.type.tensor_type.shape.dim]
        feeds[i.name] = (2 * RNG.standard_normal(shape)).astype(np.float32)
    if "mask" in feeds:
        mask = np.zeros(feeds["mask"].shape, np.float32)
        mask[..., -S // 4:] = -np.finfo(np.float32).max  # padding: the last quarter of the keys
        if mask.shape[-2] == S:
            mask[..., 3, :] = -np.inf  # a query that sees no key: softmax is NaN, the guard makes it 0
        feeds["mask"] = mask
    return feeds


def _check(tmp_path: Path, path: Path):
    """The optimised graph, after its library, onnxruntime and the unfused reference agree on it."""
    graph = load_model(path)
    opt = optimize(graph)
    build_library(opt, Target.host(), tmp_path / "lib")
    feeds = _feeds(path)
    got = load(tmp_path / "lib").run(**feeds)["y"]
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    unfused = reference.run(graph, feeds)["y"]
    fused = reference.run(opt, feeds)["y"]
    for name, ref in (("onnxruntime", want), ("unfused reference", unfused), ("fused reference", fused)):
        assert np.isnan(got).sum() == np.isnan(ref).sum(), name
        ok = ~np.isnan(ref)
        err = np.abs(got[ok] - ref[ok]).max()
        assert err <= 1e-4 * np.abs(ref[ok]).max(), f"{name}: max abs error {err}"
    return opt, got


@pytest.mark.parametrize(("mask", "guard"), [((1, 1, S, S), True), ((1, 1, 1, S), False), (None, False)])
def test_the_attention_chain_is_one_row_kernel_and_matches(tmp_path, mask, guard):
    opt, got = _check(tmp_path, attention(tmp_path, mask, guard))
    ops = [n.op for n in opt.nodes]
    assert ops.count(OP) == 1
    assert not {"Softmax", "Mul", "Add", "IsNaN", "Where"} & set(ops), ops
    fused = next(n for n in opt.nodes if n.op == OP)
    assert math.isclose(fused.attrs["scale"], D ** -0.5, rel_tol=1e-6)
    assert fused.attrs["nan_to"] == (0.0 if guard else None)
    qk = next(n for n in opt.nodes if n.task is not None and n.outputs[0] == fused.inputs[0])
    assert qk.op == "batch_matmul" and [n.op for n in opt.nodes].count("batch_matmul") == 2
    if guard:  # the query that sees no key: NaN rows became zeros, so its output row is zero
        assert np.all(got[0, :, 3] == 0) and np.isfinite(got).all()


def test_a_scale_after_the_product_fuses_too(tmp_path):
    opt, _ = _check(tmp_path, attention(tmp_path, (1, 1, 1, S), True, scale_after=True))
    fused = next(n for n in opt.nodes if n.op == OP)
    assert math.isclose(fused.attrs["scale"], D ** -0.5, rel_tol=1e-6) and "Div" not in [n.op for n in opt.nodes]


def test_without_its_guard_an_unmasked_row_of_minus_infinity_stays_nan(tmp_path):
    path = attention(tmp_path, (1, 1, S, S), False)
    opt, got = _check(tmp_path, path)
    assert OP in [n.op for n in opt.nodes]
    assert np.isnan(got[0, :, 3]).all() and np.isfinite(np.delete(got, 3, axis=2)).all()


def test_a_softmax_output_read_elsewhere_is_not_fused(tmp_path):
    path = attention(tmp_path, (1, 1, 1, S), False)
    model = onnx.load(path)
    model.graph.output.append(helper.make_tensor_value_info("masked", TensorProto.FLOAT, None))
    onnx.save(model, str(path))
    opt = optimize(load_model(path))
    assert OP not in [n.op for n in opt.nodes] and "Softmax" in [n.op for n in opt.nodes]


def gpt2_mlp(tmp_path: Path) -> Path:
    """GPT-2's block as its dynamo export writes it: Gemm on [S, K] rows, a Reshape to [1, S, N], then the
    written-out tanh Gelu; the next Gemm's output reshaped back and added to the residual stream."""
    k, n = 32, 48
    c = math.sqrt(2 / math.pi)
    nodes = [helper.make_node("Reshape", ["x", "rows"], ["x2"]),
             helper.make_node("Gemm", ["x2", "w1"], ["h"]),
             helper.make_node("Reshape", ["h", "seq_n"], ["h3"]),
             helper.make_node("Mul", ["h3", "half"], ["a"]),
             helper.make_node("Pow", ["h3", "three"], ["cube"]),
             helper.make_node("Mul", ["cube", "coef"], ["cube_c"]),
             helper.make_node("Add", ["h3", "cube_c"], ["inner"]),
             helper.make_node("Mul", ["inner", "sqrt2pi"], ["arg"]),
             helper.make_node("Tanh", ["arg"], ["t"]),
             helper.make_node("Add", ["t", "one"], ["t1"]),
             helper.make_node("Mul", ["a", "t1"], ["g"]),
             helper.make_node("Reshape", ["g", "rows_n"], ["g2"]),
             helper.make_node("Gemm", ["g2", "w2"], ["o"]),
             helper.make_node("Reshape", ["o", "seq_k"], ["o3"]),
             helper.make_node("Add", ["x", "o3"], ["y"])]
    ints = {"rows": [S, k], "seq_n": [1, S, n], "rows_n": [S, n], "seq_k": [1, S, k]}
    inits = [numpy_helper.from_array(np.array(v, np.int64), name) for name, v in ints.items()]
    inits += [_c("w1", RNG.uniform(-0.3, 0.3, (k, n))), _c("w2", RNG.uniform(-0.3, 0.3, (n, k))), _c("half", 0.5),
              _c("three", 3.0), _c("coef", 0.044715), _c("sqrt2pi", c), _c("one", 1.0)]
    return _save(tmp_path, nodes, inits, {"x": (1, S, k)})


def test_gelu_and_the_residual_add_behind_a_reshape_fuse_into_the_dense(tmp_path):
    opt, _ = _check(tmp_path, gpt2_mlp(tmp_path))
    assert [(n.op, [e.kind for e in n.task.epilogue]) for n in opt.nodes if n.task is not None] == [
        ("dense", ["gelu_tanh"]), ("dense", ["residual_add"])]
    assert not {"Gelu", "Tanh", "Add"} & {n.op for n in opt.nodes}
    built = load(tmp_path / "lib")
    assert [i.op for i in built.manifest.ops if i.kind != "alias"] == ["dense", "dense"]


@pytest.mark.parametrize("sum_read", [False, True])
def test_the_embedding_sum_and_its_layernorm_are_one_kernel(tmp_path, sum_read):
    """word + position (a constant) + type embeddings, then LayerNormalization (BERT); with `sum_read` the sum
    is also read elsewhere (GPT-2's residual stream), so the fused node writes it too."""
    w = 40
    nodes = [helper.make_node("Add", ["x", "pos"], ["xp"]), helper.make_node("Add", ["xp", "r"], ["s"]),
             helper.make_node("LayerNormalization", ["s", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-5)]
    if sum_read:
        nodes.append(helper.make_node("Mul", ["s", "r"], ["z"]))
    inits = [_c("pos", RNG.standard_normal((S, w))), _c("gamma", RNG.uniform(0.5, 1.5, w)),
             _c("beta", RNG.standard_normal(w))]
    path = _save(tmp_path, nodes, inits, {"x": (1, S, w), "r": (1, S, w)}, ("y", "z") if sum_read else ("y",))
    opt, _ = _check(tmp_path, path)
    fused = [n for n in opt.nodes if n.op == "AddLayerNormalization"]
    assert len(fused) == 1 and fused[0].inputs[:3] == ["x", "pos", "r"]
    assert not {"Add", "LayerNormalization"} & {n.op for n in opt.nodes}
    assert fused[0].outputs == (["y", "s"] if sum_read else ["y"])
    if sum_read:
        feeds = _feeds(path)
        got = load(tmp_path / "lib").run(**feeds)["z"]
        want = (feeds["x"] + inits_value(inits, "pos") + feeds["r"]) * feeds["r"]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def inits_value(inits, name: str) -> np.ndarray:
    return next(numpy_helper.to_array(t) for t in inits if t.name == name)


def test_a_residual_add_behind_a_reshape_and_a_unit_transpose_fuses_into_the_dense(tmp_path):
    """ViT's attention output: Gemm [S, K] rows, Reshape to [S, 1, K], Transpose to [1, S, K], residual Add."""
    k = 32
    nodes = [helper.make_node("Reshape", ["x", "rows"], ["x2"]), helper.make_node("Gemm", ["x2", "w"], ["o"]),
             helper.make_node("Reshape", ["o", "s1k"], ["o3"]),
             helper.make_node("Transpose", ["o3"], ["ot"], perm=[1, 0, 2]), helper.make_node("Add", ["ot", "x"], ["y"])]
    inits = [numpy_helper.from_array(np.array([S, k], np.int64), "rows"),
             numpy_helper.from_array(np.array([S, 1, k], np.int64), "s1k"), _c("w", RNG.uniform(-0.3, 0.3, (k, k)))]
    opt, _ = _check(tmp_path, _save(tmp_path, nodes, inits, {"x": (1, S, k)}))
    assert [(n.op, [e.kind for e in n.task.epilogue]) for n in opt.nodes if n.task is not None] == [
        ("dense", ["residual_add"])]
    assert "Add" not in {n.op for n in opt.nodes}


def test_a_classifier_softmax_keeps_its_dense_and_bias(tmp_path):
    """softmax(x @ W + b): a constant weight is no attention; its bias stays in the dense's epilogue."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["logits"]),
             helper.make_node("Softmax", ["logits"], ["y"], axis=-1)]
    path = _save(tmp_path, nodes, [_c("w", RNG.standard_normal((D, S))), _c("b", RNG.standard_normal(S))],
                 {"x": (H, D)})
    opt, _ = _check(tmp_path, path)
    assert [n.op for n in opt.nodes] == ["dense", "Softmax"]
    assert [e.kind for e in opt.nodes[0].task.epilogue] == ["bias"]


@pytest.mark.parametrize("axis", [1, -2, 2, -1])
def test_the_interpreter_normalises_layernorm_over_a_negative_axis_too(axis):
    """Hand-built nodes (passes, fuzzers) may carry ONNX's negative axis; the interpreter reads it as ONNX does."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 6)).astype(np.float32)
    scale = rng.standard_normal(x.shape[axis % 3:]).astype(np.float32)
    bias = rng.standard_normal(scale.shape).astype(np.float32)
    (got,) = reference.run_node(Node("ln", "LayerNormalization", ["x", "s", "b"], ["y"],
                                     {"axis": axis, "epsilon": 1e-5}), [x, scale, bias])
    axes = tuple(range(axis % 3, 3))
    want = (x - x.mean(axes, keepdims=True)) / np.sqrt(x.var(axes, keepdims=True) + 1e-5) * scale + bias
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
