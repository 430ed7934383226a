"""The int8 MaxPool kernel (stages/memops/quant_pool.py): a DQ -> MaxPool -> Q of one scale stays on the
integers; the built library equals a numpy max over the window (padding never counted) for uint8 and int8,
odd widths past one row vector and one column vector, strides, dilations, asymmetric pads and ceil_mode, on
1 and 2 threads and on the x86-64-avx2 preset."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from schemas import Target
from schemas.target import preset
from stages.build.library import build_library
from stages.extract import load_model
from stages.graph.passes import optimize
from stages.runtime import load

ELEM = {"uint8": TensorProto.UINT8, "int8": TensorProto.INT8}


def _model(dtype: str, shape: tuple[int, ...], **attrs) -> onnx.ModelProto:
    zp = np.array(7 if dtype == "uint8" else -5, dtype)
    nodes = [helper.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             helper.make_node("MaxPool", ["xf"], ["p"], **attrs),
             helper.make_node("QuantizeLinear", ["p", "s", "z"], ["y"])]
    graph = helper.make_graph(nodes, "pool", [helper.make_tensor_value_info("x", ELEM[dtype], shape)],
                              [helper.make_tensor_value_info("y", ELEM[dtype], None)],
                              [numpy_helper.from_array(np.float32(0.05), "s"), numpy_helper.from_array(zp, "z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    return model


def _reference(x: np.ndarray, k, s, d, pads, out_hw) -> np.ndarray:
    """The window's real elements' max, by explicit loops."""
    n, c, h, w = x.shape
    out = np.empty((n, c, *out_hw), x.dtype)
    for oy in range(out_hw[0]):
        for ox in range(out_hw[1]):
            ys = [oy * s[0] - pads[0] + i * d[0] for i in range(k[0])]
            xs = [ox * s[1] - pads[1] + j * d[1] for j in range(k[1])]
            ys, xs = [v for v in ys if 0 <= v < h], [v for v in xs if 0 <= v < w]
            out[:, :, oy, ox] = x[:, :, ys][:, :, :, xs].max(axis=(2, 3))
    return out


def _out_hw(hw, k, s, d, pads, ceil) -> tuple[int, int]:
    span = [hw[i] + pads[i] + pads[i + 2] - (k[i] - 1) * d[i] - 1 for i in range(2)]
    return tuple((-(-v // s[i]) if ceil else v // s[i]) + 1 for i, v in enumerate(span))


CASES = [  # input shape, kernel, strides, dilations, pads (t, l, b, r), ceil_mode
    ((1, 3, 112, 112), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), 0),  # ResNet's stem pool
    ((2, 2, 9, 71), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 0),  # past one 64-byte row vector, stride 1
    ((1, 2, 13, 77), (2, 3), (2, 3), (1, 2), (0, 2, 1, 0), 1),  # stride 3, dilation, ceil mode
    ((1, 1, 5, 5), (5, 5), (1, 1), (1, 1), (2, 2, 2, 2), 0),  # windows wider than the image
]


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[0])))
def test_int8_max_pool_matches_the_window_max(tmp_path, dtype, case):
    shape, k, s, d, pads, ceil = case
    model = _model(dtype, shape, kernel_shape=list(k), strides=list(s), dilations=list(d), pads=list(pads),
                   ceil_mode=ceil)
    graph = optimize(load_model(model))
    assert [(n.op, graph.values[n.inputs[0]].dtype) for n in graph.nodes] == [("MaxPool", dtype)]
    info = np.iinfo(dtype)
    x = np.random.default_rng(3).integers(info.min, info.max + 1, shape).astype(dtype)
    x[..., :2, :] = x[..., :, -2:] = info.min  # the minimum next to the padding, which must not win
    for threads, target in ((1, Target.host()), (2, Target.host()), (2, preset("x86-64-avx2"))):
        out = tmp_path / f"lib-{threads}-{target.name}"
        build_library(graph, target, out, threads)
        got = load(out).run(x=x)["y"]
        want = _reference(x, k, s, d, (pads[0], pads[1]), _out_hw(shape[2:], k, s, d, pads, ceil))
        np.testing.assert_array_equal(got, want, err_msg=f"{threads} thread(s) on {target.name}")
