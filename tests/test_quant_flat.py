"""The flat int8 loops split over the worker pool (stages/memops/quant_flat.py): a per-tensor QuantizeLinear
(vector path: ties, saturation, infinities, NaN as 0) and a residual qadd, over tensors of several blocks with
a tail that is no multiple of a vector, equal onnxruntime's int8 run on 1 and 2 threads and on x86-64-avx2."""

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
from stages.memops.quant_flat import BLOCK
from stages.runtime import load
from testing.quantize import onnxruntime_run

SHAPE = (1, 5, 131, 103)  # 67465 elements: 4 full blocks and a tail of 1929 (not a multiple of 16)
ELEM = {"uint8": TensorProto.UINT8, "int8": TensorProto.INT8}


def _model(dtype: str) -> onnx.ModelProto:
    za, zb, zy = (np.array(v if dtype == "uint8" else v - 128, dtype) for v in (121, 3, 250))
    inits = {"sx": np.float32(0.037), "zx": zy, "sa": np.float32(0.02), "za": za, "sb": np.float32(0.031),
             "zb": zb, "sy": np.float32(0.045), "zy": zy}
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
             helper.make_node("DequantizeLinear", ["a", "sa", "za"], ["af"]),
             helper.make_node("DequantizeLinear", ["b", "sb", "zb"], ["bf"]),
             helper.make_node("Add", ["af", "bf"], ["s"]),
             helper.make_node("QuantizeLinear", ["s", "sy", "zy"], ["y"])]
    graph = helper.make_graph(nodes, "flat", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE),
                                              helper.make_tensor_value_info("a", ELEM[dtype], SHAPE),
                                              helper.make_tensor_value_info("b", ELEM[dtype], SHAPE)],
                              [helper.make_tensor_value_info(n, ELEM[dtype], None) for n in ("xq", "y")],
                              [numpy_helper.from_array(np.asarray(v), n) for n, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    return model


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_split_quantize_and_qadd_equal_onnxruntime(tmp_path, dtype):
    assert np.prod(SHAPE) > 4 * BLOCK and np.prod(SHAPE) % BLOCK % 16
    model = _model(dtype)
    graph = optimize(load_model(model))
    assert sorted(n.op for n in graph.nodes) == ["QuantizeLinear", "qadd"]
    rng = np.random.default_rng(5)
    info = np.iinfo(dtype)
    x = (rng.standard_normal(SHAPE) * 8).astype(np.float32)
    flat = x.reshape(-1)
    flat[::7] = (rng.integers(-300, 300, flat[::7].size) + 0.5).astype(np.float32) * np.float32(0.037)  # ties
    flat[1::101], flat[2::103], flat[3::107] = np.nan, np.inf, -np.inf
    feeds = {"x": x, "a": rng.integers(info.min, info.max + 1, SHAPE).astype(dtype),
             "b": rng.integers(info.min, info.max + 1, SHAPE).astype(dtype)}
    want = onnxruntime_run(model, feeds)
    want["xq"][np.isnan(x)] = 0  # NaN quantizes to 0 (stages/memops/quant.py; onnxruntime's int8 says -128)
    for threads, target in ((1, Target.host()), (2, Target.host()), (2, preset("x86-64-avx2"))):
        out = tmp_path / f"lib-{threads}-{target.name}"
        build_library(graph, target, out, threads)
        got = load(out).run(**feeds)
        for k in ("xq", "y"):
            np.testing.assert_array_equal(got[k], want[k], err_msg=f"{k}: {threads} thread(s) on {target.name}")
