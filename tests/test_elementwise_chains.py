"""Element-wise chains between anchors run as one pass (stages/graph/passes_chain.py): DenseNet's Concat ->
BatchNorm (Mul, Add) -> Relu, and constant-operand chains of any links. The fused build must give the unfused
build's bits, at 1 and 2 threads, and the interpreter must run the fused node as the unfused graph did."""

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import stages.graph.passes as passes
from schemas import Target
from stages.build.library import build_library
from stages.extract import load_model
from stages.graph import reference
from stages.graph.passes import optimize
from stages.graph.passes_chain import CHAIN
from stages.runtime import load

RNG = np.random.default_rng(5)


def _save(tmp_path: Path, nodes, inputs: dict[str, tuple], inits) -> Path:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s))
                                           for n, s in inputs.items()],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _build(tmp_path: Path, path: Path, name: str, threads: int, feeds: dict, monkeypatch, fused: bool) -> np.ndarray:
    with monkeypatch.context() as m:
        if not fused:
            m.setattr(passes, "fuse_chains", lambda g: None)
        graph = optimize(load_model(path))
    build_library(graph, Target.host(), tmp_path / name, threads)
    return load(tmp_path / name).run(**feeds)["y"], graph


def _check(tmp_path: Path, path: Path, feeds: dict, monkeypatch, nodes_after: int, concat: int, steps: int) -> None:
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["y"], feeds)[0]
    for threads in (1, 2):
        plain, _ = _build(tmp_path, path, f"plain{threads}", threads, feeds, monkeypatch, fused=False)
        got, graph = _build(tmp_path, path, f"fused{threads}", threads, feeds, monkeypatch, fused=True)
        chains = [n for n in graph.nodes if n.op == CHAIN]
        assert len(graph.nodes) == nodes_after and len(chains) == 1, [n.op for n in graph.nodes]
        assert chains[0].attrs["concat"] == concat and len(chains[0].attrs["steps"]) == steps
        np.testing.assert_array_equal(got, plain)  # the same float32 ops in the same order
        np.testing.assert_array_equal(reference.run(graph, feeds)["y"], got)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def _bn(name: str, x: str, y: str, channels: int) -> tuple[list, list]:
    inits = [numpy_helper.from_array(v.astype(np.float32), f"{name}.{k}") for k, v in (
        ("scale", RNG.uniform(0.5, 2, channels)), ("bias", RNG.uniform(-1, 1, channels)),
        ("mean", RNG.uniform(-1, 1, channels)), ("var", RNG.uniform(0.5, 2, channels)))]
    return [helper.make_node("BatchNormalization", [x, *(i.name for i in inits)], [y], epsilon=1e-5)], inits


@pytest.mark.parametrize("counts,hw", [((32, 64, 32), (28, 28)),   # blocks of 16 channels, several per input
                                       ((5, 7, 3), (9, 11)),       # coprime counts: one channel a block
                                       ((64, 32), (7, 7))])        # one block per 32 channels
def test_concat_then_batchnorm_relu_is_one_pass(tmp_path, monkeypatch, counts, hw):
    names = [f"x{i}" for i in range(len(counts))]
    inputs = {n: (1, c, *hw) for n, c in zip(names, counts, strict=True)}
    bn, inits = _bn("bn", "cat", "norm", sum(counts))
    nodes = [helper.make_node("Concat", names, ["cat"], axis=1), *bn, helper.make_node("Relu", ["norm"], ["y"])]
    path = _save(tmp_path, nodes, inputs, inits)
    feeds = {n: RNG.standard_normal(s).astype(np.float32) for n, s in inputs.items()}
    _check(tmp_path, path, feeds, monkeypatch, nodes_after=1, concat=len(counts), steps=3)


def test_a_chain_of_constant_links_on_either_side_is_one_pass(tmp_path, monkeypatch):
    shape = (2, 6, 5, 7)
    consts = {"half": np.array(1.5, np.float32), "per_c": RNG.uniform(0.5, 2, (6, 1, 1)).astype(np.float32),
              "full": RNG.uniform(-1, 1, shape[1:]).astype(np.float32),
              "lo": np.array(-1.0, np.float32), "hi": np.array(2.5, np.float32)}
    nodes = [helper.make_node("Sub", ["half", "x"], ["a"]),     # the constant on the left
             helper.make_node("Div", ["a", "per_c"], ["b"]),
             helper.make_node("LeakyRelu", ["b"], ["b2"], alpha=0.2),
             helper.make_node("Clip", ["b2", "lo", "hi"], ["c"]),
             helper.make_node("Sigmoid", ["c"], ["d"]),
             helper.make_node("Mul", ["full", "d"], ["e"]),
             helper.make_node("Max", ["e", "half"], ["y"])]
    path = _save(tmp_path, nodes, {"x": shape}, [numpy_helper.from_array(v, k) for k, v in consts.items()])
    feeds = {"x": (3 * RNG.standard_normal(shape)).astype(np.float32)}
    _check(tmp_path, path, feeds, monkeypatch, nodes_after=1, concat=1, steps=7)


def test_a_link_read_twice_or_a_graph_output_ends_the_chain(tmp_path):
    """`a` feeds two nodes and `b` is a graph output: neither may vanish into a chain."""
    shape = (1, 4, 3, 3)
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["b"]),
             helper.make_node("Abs", ["a"], ["c"]), helper.make_node("Sigmoid", ["b"], ["d"]),
             helper.make_node("Add", ["c", "d"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "b")])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    ops = [n.op for n in optimize(load_model(path)).nodes]
    assert CHAIN not in ops and len(ops) == 5, ops
