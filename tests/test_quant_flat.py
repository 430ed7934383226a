"""The flat int8 loops split over the worker pool (stages/memops/quant_flat.py): a per-tensor QuantizeLinear
(vector path: ties, saturation, infinities, NaN as 0) and a residual qadd, over tensors of several blocks with
a tail that is no multiple of a vector, equal onnxruntime's int8 run on 1 and 2 threads and on x86-64-avx2; the
islands' qlut and qmul split the same way equal their reference kernels."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from schemas import Target
from schemas.target import preset
from stages.build.library import build_library
from stages.extract import load_model
from stages.graph.ir import Graph, Node, Value
from stages.graph.passes import optimize
from stages.graph.reference_quant import QUANT_OPS
from stages.memops.quant_flat import BLOCK
from stages.runtime import load
from stages.templates import qgemm_isa
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


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_split_islands_qlut_and_broadcast_qmul_equal_their_reference(tmp_path, dtype):
    """qlut split in flat blocks, qmul one (image, channel) plane an item with the gate broadcast over the plane
    (squeeze-excite) and with two full operands (SiLU's x * sigmoid(x)), against the reference kernels."""
    rng = np.random.default_rng(8)
    info = np.iinfo(dtype)
    shape, gate = (2, 24, 37, 41), (2, 24, 1, 1)
    mul = {"a_zero_point": 5 if dtype == "uint8" else -3, "b_zero_point": 250 if dtype == "uint8" else 100,
           "ratio": float(np.float32(0.0173)), "y_zero_point": 7 if dtype == "uint8" else -9, "y_dtype": dtype}
    nodes = [Node("lut", "qlut", ["x", "t"], ["s"], {"y_dtype": dtype}),
             Node("gm", "qmul", ["x", "g"], ["y1"], mul), Node("sm", "qmul", ["x", "s"], ["y2"], mul)]
    vals = {n: Value(n, s, dtype) for n, s in (("x", shape), ("g", gate), ("s", shape), ("y1", shape), ("y2", shape))}
    table = rng.integers(0, 256, 256).astype(np.uint8).view(dtype)
    graph = Graph("islands", [vals["x"], vals["g"]], [vals["s"], vals["y1"], vals["y2"]], nodes, vals,
                  {"t": table})
    feeds = {"x": rng.integers(info.min, info.max + 1, shape).astype(dtype),
             "g": rng.integers(info.min, info.max + 1, gate).astype(dtype)}
    lut = QUANT_OPS["qlut"]([feeds["x"], table], {"y_dtype": dtype})[0]
    want = {"s": lut, "y1": QUANT_OPS["qmul"]([feeds["x"], feeds["g"]], mul)[0],
            "y2": QUANT_OPS["qmul"]([feeds["x"], lut], mul)[0]}
    for threads, target in ((1, Target.host()), (2, Target.host()), (2, preset("x86-64-avx2"))):
        out = tmp_path / f"lib-{threads}-{target.name}"
        build_library(graph, target, out, threads)
        got = load(out).run(**feeds)
        for k, v in want.items():
            np.testing.assert_array_equal(got[k], v, err_msg=f"{k}: {threads} thread(s) on {target.name}")


def test_table_lookups_use_byte_permutes_where_the_cpu_has_them():
    """The qlut's 64-byte path needs AVX-512 VBMI: named by the CPU (Ice Lake on, Zen 4 on, Cascade Lake and
    Skylake-X off), added or removed by a feature, and never on 256-bit vectors or off x86."""
    def target(cpu: str, features: str = "", bits: int = 512, triple: str = "x86_64-unknown-linux-gnu") -> Target:
        return Target(**{**preset("x86-64-avx512").model_dump(), "triple": triple, "cpu": cpu, "features": features,
                         "vector_bits": bits})
    assert qgemm_isa.byte_permute(target("znver4")) and qgemm_isa.byte_permute(target("icelake-server"))
    assert not qgemm_isa.byte_permute(target("cascadelake")) and not qgemm_isa.byte_permute(target("skylake-avx512"))
    assert qgemm_isa.byte_permute(target("skylake-avx512", "+avx512vbmi"))
    assert not qgemm_isa.byte_permute(target("znver4", "-avx512vbmi"))
    assert not qgemm_isa.byte_permute(target("znver4", bits=256))
    assert not qgemm_isa.byte_permute(preset("x86-64-avx2")) and not qgemm_isa.byte_permute(preset("aarch64"))
