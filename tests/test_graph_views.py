"""A Transpose that only moves unit dims (ViT's [1, S, C] -> [S, 1, C]) runs as an alias of its input, not a
copy kernel; one that reorders real dims is still a copy; a copy of a copy (through Reshapes) is one
StridedCopy; all match numpy through a built library, and random chains match numpy in the interpreter."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from schemas import Target
from stages.build.library import build_library
from stages.extract import load_model
from stages.graph import reference
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


@pytest.mark.parametrize(("shape", "perm"), [((3, 37, 50), [0, 2, 1]), ((20, 33), [1, 0]), ((5, 16, 16), [0, 2, 1]),
                                           ((2, 17, 3, 19), [0, 3, 2, 1]), ((1, 40, 2, 18), [0, 2, 3, 1]),
                                           ((16, 7), [1, 0])])
def test_transposes_in_register_tiles_with_ragged_edges_are_exact(tmp_path, shape, perm):
    """Float transposes whose output runs along a source stride go 16 x 16 tiles through registers, with masked
    edge tiles on either dim (37 = 2 x 16 + 5, 33, 17, 19...), and narrow ones (7) stay element loops."""
    ops, got, want = _built(tmp_path, perm, shape)
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


def test_vit_s_qkv_split_is_one_strided_copy_per_slice(tmp_path):
    """ViT's Q/K/V split: [1, S, 1, 3, C] transposed to [3, S, 1, 1, C], squeezed, sliced in three: three
    strided copies of the input, no Transpose kernel, no Slice."""
    ops = _run_split(tmp_path, (1, 7, 1, 3, 16), [3, 1, 2, 0, 4], [3, 7, 1, 16], [1, 2, 3])
    assert ops == ["Relu"] + ["StridedCopy", "Relu"] * 3


def test_slices_of_a_real_transpose_read_its_input_and_the_transpose_goes(tmp_path):
    ops = _run_split(tmp_path, (3, 4, 8), [1, 0, 2], None, [2, 4])
    assert "Transpose" not in ops and ops.count("StridedCopy") == 2


def _chain_model(tmp_path: Path, shape: tuple[int, ...], steps: list[tuple]) -> Path:
    """Relu(x), then a chain of ("T", perm), ("R", shape), ("S", starts, ends, axes, steps) and ("P", axis,
    sizes, which) nodes (a Split of which only output `which` is read), then Relu: the chain sits between two
    kernels."""
    nodes, inits, src = [helper.make_node("Relu", ["x"], ["c0"])], [], "c0"
    for k, step in enumerate(steps, 1):
        out = f"c{k}"
        if step[0] == "T":
            nodes.append(helper.make_node("Transpose", [src], [out], perm=list(step[1])))
        elif step[0] == "R":
            inits.append(onnx.numpy_helper.from_array(np.array(step[1], np.int64), f"shape{k}"))
            nodes.append(helper.make_node("Reshape", [src, f"shape{k}"], [out]))
        elif step[0] == "P":
            inits.append(onnx.numpy_helper.from_array(np.array(step[2], np.int64), f"sizes{k}"))
            parts = [out if j == step[3] else f"unread{k}_{j}" for j in range(len(step[2]))]
            nodes.append(helper.make_node("Split", [src, f"sizes{k}"], parts, axis=step[1]))
        else:
            names = [f"{n}{k}" for n in ("starts", "ends", "axes", "steps")]
            inits += [onnx.numpy_helper.from_array(np.array(v, np.int64), n)
                      for v, n in zip(step[1:], names, strict=True)]
            nodes.append(helper.make_node("Slice", [src, *names], [out]))
        src = out
    nodes.append(helper.make_node("Relu", [src], ["y"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    path = tmp_path / "chain.onnx"
    onnx.save(m, str(path))
    return path


def _numpy_chain(x: np.ndarray, steps: list[tuple]) -> np.ndarray:
    y = np.maximum(x, 0)
    for step in steps:
        if step[0] == "T":
            y = y.transpose(step[1])
        elif step[0] == "R":
            y = y.reshape(step[1])
        elif step[0] == "P":
            y = np.split(y, np.cumsum(step[2])[:-1], axis=step[1])[step[3]]
        else:
            index = [slice(None)] * y.ndim
            for a, b, e, s in zip(step[3], step[1], step[2], step[4], strict=True):
                index[a] = slice(b, e, s)
            y = y[tuple(index)]
    return np.maximum(y, 0)


def _copies(ops: list[str]) -> int:
    return sum(op in ("Transpose", "Slice", "StridedCopy") for op in ops)


def test_bert_s_key_transposes_are_one_copy_and_a_transpose_undone_is_an_alias(tmp_path):
    cases = [((1, 6, 4, 8), [("T", (0, 2, 1, 3)), ("R", (4, 6, 8)), ("T", (0, 2, 1))], 1),  # K^T
             ((5, 3, 8), [("T", (2, 0, 1)), ("T", (1, 2, 0))], 0),  # a Transpose and its inverse
             ((6, 10), [("S", [1], [9], [1], [2]), ("T", (1, 0)), ("S", [2], [6], [1], [1])], 1)]
    for k, (shape, steps, copies) in enumerate(cases):
        g = optimize(load_model(_chain_model(tmp_path, shape, steps)))
        build_library(g, Target.host(), tmp_path / f"lib{k}")
        lib = load(tmp_path / f"lib{k}")
        x = np.random.default_rng(k).standard_normal(shape).astype(np.float32)
        np.testing.assert_array_equal(lib.run(x=x)["y"], _numpy_chain(x, steps))
        assert _copies([i.op for i in lib.manifest.ops if i.kind != "alias"]) == copies, (k, lib.manifest.ops)


@st.composite
def _chains(draw) -> tuple[tuple[int, ...], list[tuple]]:
    shape = tuple(draw(st.lists(st.integers(2, 5), min_size=2, max_size=4)))
    cur, steps = shape, []
    for _ in range(draw(st.integers(3, 6))):
        kind = draw(st.sampled_from("TRSP"))
        if kind == "T":
            perm = tuple(draw(st.permutations(range(len(cur)))))
            steps.append(("T", perm))
            cur = tuple(cur[p] for p in perm)
        elif kind == "R":
            flat = [d for n in cur for d in ([2, n // 2] if n % 2 == 0 and n > 2 and draw(st.booleans()) else [n])]
            if len(flat) > 1 and draw(st.booleans()):
                j = draw(st.integers(0, len(flat) - 2))
                flat[j:j + 2] = [flat[j] * flat[j + 1]]
            steps.append(("R", tuple(flat)))
            cur = tuple(flat)
        elif kind == "P":
            a = draw(st.integers(0, len(cur) - 1))
            if cur[a] < 2:
                continue
            cut, which = draw(st.integers(1, cur[a] - 1)), draw(st.integers(0, 1))
            steps.append(("P", a, [cut, cur[a] - cut], which))
            cur = tuple((cut if which == 0 else n - cut) if d == a else n for d, n in enumerate(cur))
        else:
            a = draw(st.integers(0, len(cur) - 1))
            b = draw(st.integers(0, cur[a] - 1))
            s = draw(st.integers(1, 2))
            e = draw(st.integers(b + 1, cur[a]))
            steps.append(("S", [b], [e], [a], [s]))
            cur = tuple(len(range(b, e, s)) if d == a else n for d, n in enumerate(cur))
    return shape, steps


@settings(max_examples=100, deadline=None)
@given(_chains())
def test_random_chains_of_slices_transposes_and_reshapes_compose_right(tmp_path_factory, chain):
    shape, steps = chain
    tmp = tmp_path_factory.mktemp("chain")
    g = optimize(load_model(_chain_model(tmp, shape, steps)))
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    np.testing.assert_array_equal(reference.run(g, {"x": x})["y"], _numpy_chain(x, steps))
    assert _copies([n.op for n in g.nodes]) <= max(1, sum(s[0] != "R" for s in steps))


def test_gpt2_s_split_read_by_head_transposes_goes(tmp_path):
    """GPT-2's Q/K/V: a Split of the [1, S, 3C] projection, each third viewed as heads and transposed (K
    twice): every Transpose reads the projection itself, and the Split's copy goes."""
    s, heads, d = 5, 2, 4
    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("Split", ["a", "sizes"], ["q", "k", "v"], axis=2)]
    inits = [onnx.numpy_helper.from_array(np.array([heads * d] * 3, np.int64), "sizes"),
             onnx.numpy_helper.from_array(np.array([1, s, heads, d], np.int64), "heads")]
    for t in "qkv":
        nodes += [helper.make_node("Reshape", [t, "heads"], [f"{t}h"]),
                  helper.make_node("Transpose", [f"{t}h"], [f"{t}t"], perm=[0, 2, 1, 3])]
    nodes += [helper.make_node("Transpose", ["kt"], ["kT"], perm=[0, 1, 3, 2])]
    outs = ["qt", "kT", "vt"]
    nodes += [helper.make_node("Relu", [t], [f"y_{t}"]) for t in outs]
    graph = helper.make_graph(nodes, "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, s, 3 * heads * d])],
                              [helper.make_tensor_value_info(f"y_{t}", TensorProto.FLOAT, None) for t in outs], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / "split.onnx"))
    g = optimize(load_model(tmp_path / "split.onnx"))
    build_library(g, Target.host(), tmp_path / "lib")
    lib = load(tmp_path / "lib")
    x = np.random.default_rng(2).standard_normal((1, s, 3 * heads * d)).astype(np.float32)
    q, k, v = (np.maximum(x, 0)[..., i * heads * d:(i + 1) * heads * d].reshape(1, s, heads, d).transpose(0, 2, 1, 3)
               for i in range(3))
    got = lib.run(x=x)
    for name, want in zip(outs, (q, k.transpose(0, 1, 3, 2), v), strict=True):
        np.testing.assert_array_equal(got[f"y_{name}"], want)
    ops = [i.op for i in lib.manifest.ops if i.kind != "alias"]
    assert "Split" not in ops and "Transpose" not in ops and ops.count("StridedCopy") == 3, ops
