"""Dilated convs whose window reaches past the image: taps that read only padding are dropped, and a conv whose
taps mostly read padding is split into one 1x1 conv per tap over the outputs it reaches; both exactly."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from schemas import Target
from stages.build.library import build_library
from stages.extract import load_model
from stages.graph import passes_conv, reference
from stages.graph.passes import optimize
from stages.graph.passes_conv import prune_padding_taps, split_sparse_taps
from stages.runtime import load


def _conv_model(path, size: tuple[int, int], k: tuple[int, int], stride: tuple[int, int], dil: tuple[int, int],
                pads: list[int], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((4, 3, *k)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=list(stride), dilations=list(dil), pads=pads),
             helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "dil", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 3, *size))],
                              [helper.make_empty_tensor_value_info("y")],
                              [onnx.numpy_helper.from_array(w, "w"), onnx.numpy_helper.from_array(b, "b")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return rng.standard_normal((1, 3, *size)).astype(np.float32)


@pytest.mark.parametrize("dilation,kernels", [(24, [(1, 1)]), (36, [(1, 1)]), (12, [(1, 1)] * 9), (2, [(3, 3)])])
def test_aspp_taps_outside_a_14x14_map_are_dropped_and_the_output_kept(tmp_path, monkeypatch, dilation, kernels):
    """DeepLabV3's ASPP: 3x3 at dilation d padded by d on 14x14. From d = 14 on only the centre tap reads the
    image (one 1x1 conv); at 12 the outer taps reach 2 rows or columns (18% of the multiplies read the image:
    nine 1x1 convs over those outputs, padded and summed); at 2 every tap reaches most outputs (kept whole)."""
    monkeypatch.setattr(passes_conv, "MIN_SAVED_MACS", 0)  # 3 -> 4 channels: far too small to split otherwise
    x = _conv_model(tmp_path / "m.onnx", (14, 14), (3, 3), (1, 1), (dilation, dilation), [dilation] * 4)
    graph = optimize(load_model(tmp_path / "m.onnx"))
    convs = [n for n in graph.nodes if n.op == "conv2d"]
    assert [c.task.inputs[1].shape[2:] for c in convs] == kernels
    assert {n.op for n in graph.nodes} <= {"conv2d", "Slice", "Pad", "Add", "Relu"}
    build_library(graph, Target.host(), tmp_path / "lib", 1, None)
    want = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(load(tmp_path / "lib").run(x=x)["y"], want, rtol=1e-5, atol=1e-5)


def test_random_windows_keep_every_output_exactly(tmp_path, monkeypatch):
    """Sizes, kernels, strides, dilations and asymmetric pads drawn at random: the graph after the pass computes
    what it did before (tunaflow's interpreter on both), and some cases do drop taps."""
    monkeypatch.setattr(passes_conv, "MIN_SAVED_MACS", 0)
    rng = np.random.default_rng(7)
    pruned = split = 0
    for case in range(60):
        size = tuple(int(v) for v in rng.integers(1, 12, 2))
        k = tuple(int(v) for v in rng.integers(1, 6, 2))
        dil = tuple(int(v) for v in rng.integers(1, 9, 2))
        stride = tuple(int(v) for v in rng.integers(1, 4, 2))
        pads = [int(v) for v in rng.integers(0, 20, 4)]
        if any(size[i] + pads[i] + pads[i + 2] < dil[i] * (k[i] - 1) + 1 for i in range(2)):
            continue
        path = tmp_path / f"c{case}.onnx"
        x = _conv_model(path, size, k, stride, dil, pads, seed=case)
        graph = load_model(path)
        before = reference.run(graph, {"x": x})
        prune_padding_taps(graph)
        (conv,) = [n for n in graph.nodes if n.op == "Conv"]
        pruned += graph.constants[conv.inputs[1]].shape[2:] != k
        np.testing.assert_allclose(reference.run(graph, {"x": x})["y"], before["y"], rtol=1e-5, atol=1e-5,
                                   err_msg=f"size {size} k {k} stride {stride} dilation {dil} pads {pads}")
        split_sparse_taps(graph)
        split += sum(n.op == "Conv" for n in graph.nodes) > 1
        np.testing.assert_allclose(reference.run(graph, {"x": x})["y"], before["y"], rtol=1e-5, atol=1e-5,
                                   err_msg=f"split: size {size} k {k} stride {stride} dilation {dil} pads {pads}")
    assert pruned >= 10 and split >= 10


@pytest.mark.parametrize("size,k,stride,dil,pads", [((10, 9), (3, 3), (2, 2), (6, 5), [6, 5, 7, 4]),
                                                     ((7, 12), (3, 5), (1, 2), (5, 4), [5, 9, 3, 8]),
                                                     ((28, 28), (3, 3), (1, 1), (24, 24), [24, 24, 24, 24])])
def test_split_taps_build_and_match_onnxruntime(tmp_path, monkeypatch, size, k, stride, dil, pads):
    """Strided, asymmetric and rectangular windows through the built library (the Slices of the split)."""
    monkeypatch.setattr(passes_conv, "MIN_SAVED_MACS", 0)
    x = _conv_model(tmp_path / "m.onnx", size, k, stride, dil, pads)
    graph = optimize(load_model(tmp_path / "m.onnx"))
    assert sum(n.op == "conv2d" for n in graph.nodes) > 1
    build_library(graph, Target.host(), tmp_path / "lib", 2, None)
    want = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(load(tmp_path / "lib").run(x=x)["y"], want, rtol=1e-5, atol=1e-5)


def test_a_small_conv_is_not_split_into_more_kernel_calls_than_it_saves(tmp_path):
    """A 3x3 conv on a 2x2 map reaches the image at 44% of its (tap, output) pairs, but at 3 -> 4 channels the
    multiplies saved are far fewer than MIN_SAVED_MACS: one conv stays."""
    _conv_model(tmp_path / "m.onnx", (2, 2), (3, 3), (1, 1), (1, 1), [1, 1, 1, 1])
    assert sum(n.op == "conv2d" for n in optimize(load_model(tmp_path / "m.onnx")).nodes) == 1
