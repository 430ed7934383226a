"""Hand-built quantized graphs, one per op form (per tensor / per channel, uint8 / int8 with negative zero
points, saturation, ties at .5): tunaflow's numpy reference and its built library against onnxruntime and
onnx.reference.ReferenceEvaluator; the canonical int8 nodes the quant pass makes; bad quantized models as one
clear error naming the node."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from schemas import Target
from schemas.target import preset
from stages.build.library import build_library
from stages.extract import ModelError, load_model
from stages.graph.passes import optimize
from stages.graph.reference import run
from stages.graph.reference_quant import limits
from stages.runtime import load
from testing.quantize import onnxruntime_run

OPSET = 19
ELEM = {"uint8": TensorProto.UINT8, "int8": TensorProto.INT8, "float32": TensorProto.FLOAT,
        "int32": TensorProto.INT32, "bool": TensorProto.BOOL}


def _model(nodes, inputs, outputs, inits) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "q", [helper.make_tensor_value_info(n, ELEM[d], s) for n, d, s in inputs],
        [helper.make_tensor_value_info(n, ELEM[d], None) for n, d in outputs],
        [numpy_helper.from_array(np.asarray(v), n) for n, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 9
    return model


def _everyone(model: onnx.ModelProto, feeds: dict, tmp_path, target: Target | None = None) -> dict[str, dict]:
    """Outputs by who computed them: onnxruntime, onnx.reference, tunaflow's reference and its library; when int8
    anchors have tasks (templates), also the library built with their generated loop kernels instead."""
    graph = optimize(load_model(model))
    names = [o.name for o in model.graph.output]
    results = {"onnxruntime": onnxruntime_run(model, feeds),
               "onnx.reference": dict(zip(names, ReferenceEvaluator(model).run(None, feeds), strict=True)),
               "tunaflow reference": run(graph, feeds)}
    builds = {"tunaflow library": graph}
    if any(n.task is not None for n in graph.nodes):
        builds["tunaflow loop kernels"] = replace(graph, nodes=[replace(n, task=None) for n in graph.nodes])
    for who, g in builds.items():
        out = tmp_path / f"lib-{len(list(tmp_path.iterdir()))}"
        build_library(g, target or Target.host(), out)
        results[who] = load(out).run(**feeds)
    return results


def _ties(scale: np.ndarray, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Values whose quotient by their channel's `scale` (axis 1) is exactly k + 0.5 (ties), many beyond the
    8-bit range, and every third one drawn at random."""
    rng = np.random.default_rng(seed)
    per = np.broadcast_to(scale.reshape(-1), (shape[1],)).reshape(1, -1, *[1] * (len(shape) - 2))
    x = (rng.integers(-300, 300, shape) + 0.5) * per
    x.reshape(-1)[::3] = (rng.standard_normal(x.size) * 60).reshape(-1)[::3]
    return x.astype(np.float32)


@pytest.mark.parametrize("dtype,zero", [("uint8", 3), ("uint8", 0), ("int8", -7), ("int8", 5)])
@pytest.mark.parametrize("per_channel", [False, True])
def test_quantize_dequantize_round_half_to_even_and_saturate(tmp_path, dtype, zero, per_channel):
    shape = (2, 3, 4, 5)
    scale = np.array([0.5, 0.25, 2.0], np.float32) if per_channel else np.array(0.5, np.float32)
    zp = (np.array([zero, zero + 1, zero - 2]) if per_channel else np.array(zero)).astype(dtype)
    attrs = {"axis": 1} if per_channel else {}
    model = _model([helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], **attrs),
                    helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], **attrs)],
                   [("x", "float32", shape)], [("q", dtype), ("y", "float32")], {"s": scale, "z": zp})
    x = _ties(scale, shape, 0)
    results = _everyone(model, {"x": x}, tmp_path)
    want = results.pop("onnxruntime")
    assert want["q"].dtype == np.dtype(dtype)
    assert (want["q"] == np.iinfo(dtype).max).any() and (want["q"] == np.iinfo(dtype).min).any()  # saturated
    for who, got in results.items():
        assert got["q"].dtype == want["q"].dtype, who
        np.testing.assert_array_equal(got["q"], want["q"], err_msg=who)
        np.testing.assert_array_equal(got["y"], want["y"], err_msg=who)


def _qdq_conv(x_dtype: str, zx: int, group: int, relu: bool, per_channel: bool, bias: bool, seed: int = 0):
    rng = np.random.default_rng(seed)
    c, o = 4, 4 if group > 1 else 6
    w = rng.integers(-127, 128, (o, c // group, 3, 3)).astype(np.int8)
    sw = (rng.uniform(0.01, 0.03, o) if per_channel else np.array(0.02)).astype(np.float32)
    sx, sy = np.float32(0.05), np.float32(0.4)
    nodes = [helper.make_node("DequantizeLinear", ["x", "sx", "zx"], ["xf"]),
             helper.make_node("DequantizeLinear", ["w", "sw", "zw"], ["wf"], axis=0)]
    inits = {"sx": sx, "zx": np.array(zx, x_dtype), "w": w, "sw": sw, "zw": np.zeros(sw.shape, np.int8),
             "sy": sy, "zy": np.array(128 if not relu else 0, "uint8")}
    conv_in = ["xf", "wf"]
    if bias:
        inits.update(b=rng.integers(-2000, 2000, o).astype(np.int32), sb=(sx * np.broadcast_to(sw, (o,))),
                     zb=np.zeros(o, np.int32))
        nodes.append(helper.make_node("DequantizeLinear", ["b", "sb", "zb"], ["bf"], axis=0))
        conv_in.append("bf")
    nodes.append(helper.make_node("Conv", conv_in, ["yf"], pads=[1, 0, 1, 2], strides=[2, 1], group=group))
    last = "yf"
    if relu:
        nodes.append(helper.make_node("Relu", ["yf"], ["yr"]))
        last = "yr"
    nodes += [helper.make_node("QuantizeLinear", [last, "sy", "zy"], ["yq"]),
              helper.make_node("DequantizeLinear", ["yq", "sy", "zy"], ["y"])]
    model = _model(nodes, [("x", x_dtype, (1, c, 9, 7))], [("y", "float32"), ("yq", "uint8")], inits)
    lo, hi = np.iinfo(x_dtype).min, np.iinfo(x_dtype).max
    return model, {"x": rng.integers(lo, hi + 1, (1, c, 9, 7)).astype(x_dtype)}


@pytest.mark.parametrize("x_dtype,zx,group,relu,per_channel,bias", [
    ("uint8", 128, 1, False, True, True), ("uint8", 17, 1, True, True, False), ("uint8", 0, 4, True, False, True),
    ("int8", -9, 1, False, False, True), ("int8", 0, 2, True, True, True)])
def test_qdq_conv_becomes_one_qconv2d_matching_onnxruntime_exactly(tmp_path, x_dtype, zx, group, relu, per_channel,
                                                                    bias):
    model, feeds = _qdq_conv(x_dtype, zx, group, relu, per_channel, bias)
    graph = optimize(load_model(model))
    assert [n.op for n in graph.nodes] == ["qconv2d", "DequantizeLinear"]
    anchor = graph.nodes[0]
    assert anchor.attrs["x_zero_point"] == zx and anchor.attrs["x_dtype"] == x_dtype
    assert [graph.constants[i].dtype for i in anchor.inputs[1:]] == [np.int8, np.int32, np.float32]
    assert anchor.attrs["epilogue"] == ([{"kind": "relu"}] if relu else [])
    results = _everyone(model, feeds, tmp_path)
    want = results.pop("onnxruntime")
    assert len(np.unique(want["yq"])) > 20  # a real spread of output values, not all saturated
    for who, got in results.items():
        step = np.abs(got["yq"].astype(int) - want["yq"].astype(int)).max()
        if who == "onnx.reference":  # float Conv between DQ and Q: a near-tie may round the other way
            assert step <= 1, who
        else:  # the same integer arithmetic as onnxruntime's QLinearConv
            assert step == 0, who


def test_qdq_gemm_and_matmul_become_qdense(tmp_path):
    rng = np.random.default_rng(3)
    sx, sy = np.float32(0.1), np.float32(0.3)
    inits = {"sx": sx, "zx": np.array(120, np.uint8), "sy": sy, "zy": np.array(100, np.uint8),
             "w1": rng.integers(-127, 128, (8, 16)).astype(np.int8),
             "s1": rng.uniform(0.01, 0.02, 8).astype(np.float32),
             "z1": np.zeros(8, np.int8), "w2": rng.integers(-127, 128, (8, 5)).astype(np.int8),
             "s2": np.array(0.02, np.float32), "z2": np.array(0, np.int8),
             "c": rng.standard_normal(8).astype(np.float32), "lo": np.array(-1.0, np.float32),
             "hi": np.array(2.5, np.float32)}
    nodes = [helper.make_node("DequantizeLinear", ["x", "sx", "zx"], ["xf"]),
             helper.make_node("DequantizeLinear", ["w1", "s1", "z1"], ["w1f"], axis=0),
             helper.make_node("Gemm", ["xf", "w1f", "c"], ["g"], transB=1, alpha=0.5),
             helper.make_node("Clip", ["g", "lo", "hi"], ["gc"]),
             helper.make_node("QuantizeLinear", ["gc", "sy", "zy"], ["gq"]),
             helper.make_node("DequantizeLinear", ["gq", "sy", "zy"], ["gf"]),
             helper.make_node("DequantizeLinear", ["w2", "s2", "z2"], ["w2f"]),
             helper.make_node("MatMul", ["gf", "w2f"], ["m"]),
             helper.make_node("QuantizeLinear", ["m", "sy", "zy"], ["y"])]
    model = _model(nodes, [("x", "uint8", (3, 16))], [("y", "uint8")], inits)
    graph = optimize(load_model(model))
    assert [n.op for n in graph.nodes] == ["qdense", "qdense"]
    assert graph.nodes[0].attrs["epilogue"][0]["kind"] == "clip"
    feeds = {"x": rng.integers(0, 256, (3, 16)).astype(np.uint8)}
    results = _everyone(model, feeds, tmp_path)
    want = results.pop("onnxruntime")["y"].astype(int)
    for who, got in results.items():
        assert np.abs(got["y"].astype(int) - want).max() <= 1, who
    for who in ("tunaflow library", "tunaflow loop kernels"):
        np.testing.assert_array_equal(results[who]["y"], results["tunaflow reference"]["y"], err_msg=who)


def test_qlinear_conv_and_matmul_nodes(tmp_path):
    rng = np.random.default_rng(5)
    inits = {"sx": np.float32(0.05), "zx": np.array(10, np.uint8),
             "w": rng.integers(-100, 100, (4, 3, 3, 3)).astype(np.int8),
             "sw": rng.uniform(0.01, 0.03, 4).astype(np.float32), "zw": np.zeros(4, np.int8),
             "sy": np.float32(0.5), "zy": np.array(50, np.uint8), "b": rng.integers(-500, 500, 4).astype(np.int32),
             "m": rng.integers(-100, 100, (7, 6)).astype(np.int8), "sm": np.float32(0.03), "zm": np.array(0, np.int8),
             "so": np.float32(0.7), "zo": np.array(3, np.uint8)}
    nodes = [helper.make_node("QLinearConv", ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy", "b"], ["c"],
                              pads=[1, 1, 1, 1]),
             helper.make_node("QLinearMatMul", ["c", "sy", "zy", "m", "sm", "zm", "so", "zo"], ["y"])]
    model = _model(nodes, [("x", "uint8", (1, 3, 5, 7))], [("y", "uint8"), ("c", "uint8")], inits)
    graph = optimize(load_model(model))
    assert sorted(n.op for n in graph.nodes) == ["qconv2d", "qdense"]
    results = _everyone(model, {"x": rng.integers(0, 256, (1, 3, 5, 7)).astype(np.uint8)}, tmp_path)
    want = results.pop("onnxruntime")
    for who, got in results.items():
        for k in ("c", "y"):
            assert np.abs(got[k].astype(int) - want[k].astype(int)).max() <= (1 if who == "onnx.reference" else 0), \
                (who, k)


def test_integer_ops_and_dynamic_quantize_exact(tmp_path):
    """What quantize_dynamic writes: DynamicQuantizeLinear -> MatMulInteger (run-time zero point), and
    ConvInteger with zero points, all integers: equal everywhere."""
    rng = np.random.default_rng(7)
    inits = {"w": rng.integers(-128, 128, (12, 5)).astype(np.int8), "zw": np.array(-3, np.int8),
             "k": rng.integers(0, 256, (3, 2, 3, 3)).astype(np.uint8), "zk": np.array(250, np.uint8),
             "zc": np.array(131, np.uint8)}
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             helper.make_node("MatMulInteger", ["xq", "w", "xz", "zw"], ["mm"]),
             helper.make_node("ConvInteger", ["img", "k", "zc", "zk"], ["cv"], pads=[0, 1, 0, 1], strides=[1, 2])]
    model = _model(nodes, [("x", "float32", (2, 4, 12)), ("img", "uint8", (1, 2, 6, 8))],
                   [("mm", "int32"), ("cv", "int32"), ("xq", "uint8"), ("xs", "float32"), ("xz", "uint8")], inits)
    feeds = {"x": (rng.standard_normal((2, 4, 12)) * 3 + 1).astype(np.float32),
             "img": rng.integers(0, 256, (1, 2, 6, 8)).astype(np.uint8)}
    results = _everyone(model, feeds, tmp_path)
    want = results.pop("onnxruntime")
    for who, got in results.items():
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=f"{who}: {k}")


def test_max_pool_reshape_and_concat_stay_int8_between_equal_scales(tmp_path):
    s, z = np.float32(0.1), np.array(7, np.uint8)
    s2 = np.float32(0.2)
    inits = {"s": s, "z": z, "s2": s2}
    dq = [helper.make_node("DequantizeLinear", [n, "s", "z"], [n + "f"]) for n in ("a", "b")]
    nodes = [*dq, helper.make_node("MaxPool", ["af"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("QuantizeLinear", ["p", "s", "z"], ["pq"]),
             helper.make_node("DequantizeLinear", ["pq", "s", "z"], ["pf"]),
             helper.make_node("Concat", ["pf", "bf"], ["cat"], axis=1),
             helper.make_node("QuantizeLinear", ["cat", "s", "z"], ["catq"]),
             helper.make_node("Concat", ["pf", "bf"], ["cat2"], axis=1),  # another scale: requantized by tables
             helper.make_node("QuantizeLinear", ["cat2", "s2", "z"], ["cat2q"])]
    model = _model(nodes, [("a", "uint8", (1, 2, 7, 9)), ("b", "uint8", (1, 3, 4, 5))],
                   [("catq", "uint8"), ("cat2q", "uint8")], inits)
    graph = optimize(load_model(model))
    ops = {n.outputs[0]: (n.op, [graph.values[i].dtype for i in n.inputs]) for n in graph.nodes}
    assert ops["pq"] == ("MaxPool", ["uint8"]) and ops["catq"] == ("Concat", ["uint8", "uint8"])
    assert ops["cat2q"][0] == "qconcat" and ops["cat2q"][1] == ["uint8", "uint8", "uint8"]
    rng = np.random.default_rng(9)
    feeds = {"a": rng.integers(0, 256, (1, 2, 7, 9)).astype(np.uint8),
             "b": rng.integers(0, 256, (1, 3, 4, 5)).astype(np.uint8)}
    results = _everyone(model, feeds, tmp_path)
    want = results.pop("onnxruntime")
    for who, got in results.items():
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=f"{who}: {k}")


def test_avx2_target_runs_the_quantized_conv(tmp_path):
    model, feeds = _qdq_conv("uint8", 128, 1, True, True, True, seed=4)
    results = _everyone(model, feeds, tmp_path, preset("x86-64-avx2"))
    np.testing.assert_array_equal(results["tunaflow library"]["yq"], results["onnxruntime"]["yq"])


def _bad(node: onnx.NodeProto, inits: dict) -> onnx.ModelProto:
    return _model([node], [("x", "float32", (1, 3, 4, 4))], [("y", "uint8")], inits)


@pytest.mark.parametrize("node,inits,message", [
    (helper.make_node("QuantizeLinear", ["x"], ["y"], name="q_no_scale"), {}, "scale input is missing"),
    (helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], name="q_axis", axis=4),
     {"s": np.ones(3, np.float32), "z": np.zeros(3, np.uint8)}, "axis 4 is out of range"),
    (helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], name="q_float_zero"),
     {"s": np.float32(0.1), "z": np.float32(0.0)}, "zero point 'z' is float32"),
    (helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], name="q_bad_scale"),
     {"s": np.float32(-0.1), "z": np.array(0, np.uint8)}, "finite and positive"),
])
def test_bad_quantized_model_is_one_error_naming_the_node(node, inits, message):
    with pytest.raises(ModelError) as err:
        load_model(_bad(node, inits))
    text = str(err.value)
    assert node.name in text and message in text and "\n" not in text


def test_float_weight_zero_point_of_a_dequantize_is_refused():
    model = _model([helper.make_node("DequantizeLinear", ["w", "s", "z"], ["wf"], name="dq_w", axis=0),
                    helper.make_node("Conv", ["x", "wf"], ["y"])],
                   [("x", "float32", (1, 3, 4, 4))], [("y", "float32")],
                   {"w": np.ones((2, 3, 1, 1), np.int8), "s": np.ones(2, np.float32), "z": np.zeros(2, np.float32)})
    with pytest.raises(ModelError, match="'dq_w'.*zero point 'z' is float32 but its input 'w' is int8"):
        load_model(model)


def test_uint8_tensors_are_unsigned_in_casts_and_comparisons(tmp_path):
    """Values >= 128 of a uint8 tensor: widened with zero extension, compared unsigned, saturated to 0..255."""
    model = _model([helper.make_node("Cast", ["x"], ["f"], to=TensorProto.FLOAT),
                    helper.make_node("Cast", ["x"], ["i"], to=TensorProto.INT32),
                    helper.make_node("Less", ["x", "t"], ["lt"]),
                    helper.make_node("Cast", ["v"], ["u"], to=TensorProto.UINT8)],
                   [("x", "uint8", (6,)), ("t", "uint8", (6,)), ("v", "float32", (6,))],
                   [("f", "float32"), ("i", "int32"), ("u", "uint8"), ("lt", "bool")], {})
    feeds = {"x": np.array([0, 1, 127, 128, 200, 255], np.uint8), "t": np.array([1, 1, 200, 127, 255, 0], np.uint8),
             "v": np.array([0.0, 1.0, 127.0, 128.0, 200.0, 255.0], np.float32)}
    results = _everyone(model, feeds, tmp_path)
    want = results.pop("onnxruntime")
    for who, got in results.items():
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=f"{who}: {k}")


def test_residual_add_becomes_qadd_rounding_as_onnxruntime(tmp_path):
    """DQ(a) + DQ(b) -> Q: one int8 `qadd` that rounds as onnxruntime's QLinearAdd does, element for element, on
    every pair of uint8 values (with these scales another order of its two fused multiply-adds rounds 1 or 2 of
    the 65536 pairs the other way, and the float DQ, Add, Q of ONNX's definition may differ by a step)."""
    inits = {"sa": np.float32(0.09846683), "za": np.array(215, np.uint8), "sb": np.float32(0.07484336),
             "zb": np.array(176, np.uint8), "sy": np.float32(0.07203674), "zy": np.array(180, np.uint8)}
    nodes = [helper.make_node("DequantizeLinear", ["a", "sa", "za"], ["af"]),
             helper.make_node("DequantizeLinear", ["b", "sb", "zb"], ["bf"]),
             helper.make_node("Add", ["af", "bf"], ["s"]),
             helper.make_node("QuantizeLinear", ["s", "sy", "zy"], ["y"])]
    model = _model(nodes, [("a", "uint8", (1, 1, 256, 256)), ("b", "uint8", (1, 1, 256, 256))], [("y", "uint8")],
                   inits)
    graph = optimize(load_model(model))
    assert [n.op for n in graph.nodes] == ["qadd"]
    a, b = np.meshgrid(np.arange(256), np.arange(256), indexing="ij")
    feeds = {"a": a.astype(np.uint8).reshape(1, 1, 256, 256), "b": b.astype(np.uint8).reshape(1, 1, 256, 256)}
    results = _everyone(model, feeds, tmp_path)
    want = results.pop("onnxruntime")["y"].astype(int)
    for who, got in results.items():
        step = np.abs(got["y"].astype(int) - want).max()
        assert step <= (1 if who == "onnx.reference" else 0), who


def test_task_fields_describe_the_canonical_anchor():
    """What the int8 templates get: X, W (int8), B (int32), S (float32) specs, zero points, conv attributes and the
    epilogue; a TuningTask is made of them once the task schema has the int8 ops."""
    from typing import get_args

    from schemas.task import OpKind, TuningTask
    from stages.graph.passes_quant import task_fields

    model, _ = _qdq_conv("uint8", 17, 1, True, True, True)
    graph = optimize(load_model(model))
    fields = task_fields(graph, graph.nodes[0])
    assert fields["op"] == "qconv2d"
    assert [(s["shape"], s["dtype"]) for s in fields["inputs"]] == [
        ((1, 4, 9, 7), "uint8"), ((6, 4, 3, 3), "int8"), ((6,), "int32"), ((6,), "float32")]
    assert fields["outputs"] == [{"shape": (1, 6, 5, 7), "dtype": "uint8"}]
    assert fields["attrs"] == {"x_zero_point": 17, "y_zero_point": 0, "strides": (2, 1), "pads": (1, 0, 1, 2),
                               "dilations": (1, 1), "group": 1}
    assert fields["epilogue"] == [{"kind": "relu", "attrs": {}}]
    if "qconv2d" in get_args(OpKind):
        assert TuningTask(**fields).flops == 2 * 6 * 5 * 7 * 4 * 3 * 3


@pytest.mark.parametrize("pool", [dict(kernel_shape=[2, 2], strides=[2, 2]),
                                  dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1]),
                                  dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 0, 1, 0], count_include_pad=1),
                                  dict(kernel_shape=[3, 2], strides=[2, 2], ceil_mode=1)])
def test_average_pool_between_dq_and_q_becomes_qavgpool_rounding_as_onnxruntime(tmp_path, pool):
    inits = {"sx": np.float32(0.0371), "zx": np.array(119, np.uint8), "sy": np.float32(0.0233),
             "zy": np.array(101, np.uint8)}
    nodes = [helper.make_node("DequantizeLinear", ["x", "sx", "zx"], ["xf"]),
             helper.make_node("AveragePool", ["xf"], ["p"], **pool),
             helper.make_node("QuantizeLinear", ["p", "sy", "zy"], ["y"])]
    model = _model(nodes, [("x", "uint8", (1, 16, 13, 11))], [("y", "uint8")], inits)
    graph = optimize(load_model(model))
    assert [n.op for n in graph.nodes] == ["qavgpool"]
    feeds = {"x": np.random.default_rng(13).integers(0, 256, (1, 16, 13, 11)).astype(np.uint8)}
    results = _everyone(model, feeds, tmp_path)
    want = results.pop("onnxruntime")["y"].astype(int)
    for who, got in results.items():
        assert got["y"].shape == want.shape, who
        assert np.abs(got["y"].astype(int) - want).max() <= (1 if who == "onnx.reference" else 0), who


def test_qavgpool_rounds_exact_ties_as_onnxruntime_adding_the_zero_point_first(tmp_path):
    """Equal input and output scales make every window whose sum is 2 mod 4 an exact .5 tie. onnxruntime's
    QLinearAveragePool (which it runs for DQ -> AveragePool -> Q) rounds avg / sy + zy, so an odd zero point
    sends each tie to the other neighbour than QuantizeLinear's round-then-add. tunaflow copies onnxruntime:
    rounding as QuantizeLinear put DenseNet-121 at 224x224 two output steps off onnxruntime's int8 run."""
    inits = {"s": np.float32(0.0625), "z": np.array(7, np.int8)}
    nodes = [helper.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             helper.make_node("AveragePool", ["xf"], ["p"], kernel_shape=[2, 2], strides=[1, 1]),
             helper.make_node("QuantizeLinear", ["p", "s", "z"], ["y"])]
    model = _model(nodes, [("x", "int8", (1, 3, 9, 8))], [("y", "int8")], inits)
    x = np.random.default_rng(5).integers(-40, 40, (1, 3, 9, 8)).astype(np.int8)
    total = sum(x[..., i:i + 8, j:j + 7].astype(int) - 7 for i in (0, 1) for j in (0, 1))
    ties = total % 4 == 2
    assert ties.sum() > 30  # the inputs hold ties
    want = np.round(total / 4 + 7).astype(int)  # numpy rounds half to even, exactly on these quarters
    spec = np.round(total / 4).astype(int) + 7
    assert np.array_equal(want[~ties], spec[~ties]) and not np.array_equal(want[ties], spec[ties])
    graph = optimize(load_model(model))
    assert [n.op for n in graph.nodes] == ["qavgpool"]
    assert np.array_equal(onnxruntime_run(model, {"x": x})["y"].astype(int), want)
    assert np.array_equal(run(graph, {"x": x})["y"].astype(int), want)
    build_library(graph, Target.host(), tmp_path / "lib", 1)
    assert np.array_equal(load(tmp_path / "lib").run(x=x)["y"].astype(int), want)
    assert np.array_equal(ReferenceEvaluator(model).run(None, {"x": x})[0].astype(int), spec)


@pytest.mark.parametrize("threads", [1, 2])
def test_qavgpool_planes_on_the_worker_pool_match_onnxruntime(tmp_path, threads):
    """DenseNet-121's transition pool (2x2, stride 2) on two images of 160 planes of 28x28: enough planes that two
    threads share them; every byte as onnxruntime's."""
    inits = {"sx": np.float32(0.0371), "zx": np.array(119, np.uint8), "sy": np.float32(0.0233),
             "zy": np.array(101, np.uint8)}
    nodes = [helper.make_node("DequantizeLinear", ["x", "sx", "zx"], ["xf"]),
             helper.make_node("AveragePool", ["xf"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("QuantizeLinear", ["p", "sy", "zy"], ["y"])]
    model = _model(nodes, [("x", "uint8", (2, 160, 28, 28))], [("y", "uint8")], inits)
    graph = optimize(load_model(model))
    build_library(graph, Target.host(), tmp_path / "lib", threads)
    x = np.random.default_rng(threads).integers(0, 256, (2, 160, 28, 28)).astype(np.uint8)
    np.testing.assert_array_equal(load(tmp_path / "lib").run(x=x)["y"], onnxruntime_run(model, {"x": x})["y"])


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize(("in_readers", "out_readers"), [(1, 1), (1, 2), (2, 1), (2, 2)])
def test_an_average_pool_fuses_only_where_onnxruntime_fuses_it(tmp_path, dtype, in_readers, out_readers):
    """Q -> DQ -> AveragePool -> Q -> DQ inside a graph, each DQ read once or twice. onnxruntime shifts an int8
    pair read once to uint8 (QDQS8ToU8) and fuses QLinearAveragePool only where input and output end up of one
    type; elsewhere the float AveragePool rounds otherwise near .5. Equal scales make every window whose sum is
    2 mod 4 an exact tie. Fuzz cases 1:60 and 1:138 (int8, input pair shifted, output not) were 2-3 steps off."""
    inits = {"s": np.float32(0.05), "z": np.array(3, dtype)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xf"]),
             helper.make_node("AveragePool", ["xf"], ["p"], kernel_shape=[2, 2]),
             helper.make_node("QuantizeLinear", ["p", "s", "z"], ["pq"]),
             helper.make_node("DequantizeLinear", ["pq", "s", "z"], ["pf"]),
             helper.make_node("Relu", ["pf"], ["y0"])]
    outputs = [("y0", "float32")]
    if out_readers == 2:
        nodes.append(helper.make_node("Sigmoid", ["pf"], ["y1"]))
        outputs.append(("y1", "float32"))
    if in_readers == 2:
        nodes.append(helper.make_node("Tanh", ["xf"], ["y2"]))
        outputs.append(("y2", "float32"))
    model = _model(nodes, [("x", "float32", (1, 4, 16, 16))], outputs, inits)
    lo, hi = limits(dtype)
    xq = np.random.default_rng(3).integers(lo, hi + 1, (1, 4, 16, 16))
    x = ((xq - 3) * np.float32(0.05)).astype(np.float32)
    fused = (dtype == "uint8" or (in_readers == 1) == (out_readers == 1))  # as measured on onnxruntime 1.32
    graph = optimize(load_model(model))
    assert ("qavgpool" in [n.op for n in graph.nodes]) == fused
    want = onnxruntime_run(model, {"x": x})
    build_library(graph, Target.host(), tmp_path / "lib", 1)
    got = load(tmp_path / "lib").run(x=x)
    # unfused, both run the float AveragePool, whose window sums add in another order (onnxruntime: row by row,
    # as onnx.reference; tunaflow: rows first), so a near-.5 average may land one step apart
    tol = 1e-6 if fused else 0.05 * (1 + 1e-4)
    for name, ref in want.items():
        assert np.abs(got[name] - ref).max() <= tol, name


def _near_ties(op: str, dtype: str):
    """Q -> DQ -> op -> Q -> DQ, float in and out, so each int8 tensor sits in a Q/DQ pair inside the graph, as in
    a quantized model. Its outputs land on and next to .5 often: scales a power of two apart (a 3-wide window's
    mean, a 1.5x rescale), odd zero points, inputs on every byte of the range."""
    lo, hi = limits(dtype)
    z = {"uint8": (131, 7, 77), "int8": (-3, 7, 51)}[dtype]
    sa, sb = np.float32(0.0478), np.float32(0.0478 * 1.5)
    # the op's float multiplier (sa / sy; sa * sb / sy) a hair under 0.5: halves of odd integers fall just short
    # of .5, which the zero point's float add keeps or rounds onto the tie, by its size
    scale = {"avgpool": 2 * sa, "add": 2 * sa, "mul": 2 * sa * sb}[op]
    sy = np.float32(scale)
    while (sa * sb if op == "mul" else sa) / sy >= np.float32(0.5):
        sy = np.nextafter(sy, np.float32(1))
    inits = {"sa": sa, "za": np.array(z[0], dtype), "sb": sb, "zb": np.array(z[1], dtype), "sy": sy,
             "zy": np.array(z[2], dtype)}
    shape = (1, 8, 24, 24)
    pair = [helper.make_node("QuantizeLinear", ["a", "sa", "za"], ["aq"]),
            helper.make_node("DequantizeLinear", ["aq", "sa", "za"], ["af"]),
            helper.make_node("QuantizeLinear", ["b", "sb", "zb"], ["bq"]),
            helper.make_node("DequantizeLinear", ["bq", "sb", "zb"], ["bf"])]
    body = {"avgpool": [helper.make_node("AveragePool", ["af"], ["t"], kernel_shape=[1, 3], strides=[1, 1])],
            "add": [helper.make_node("Add", ["af", "bf"], ["t"])],
            "mul": [helper.make_node("Mul", ["af", "bf"], ["t"])]}[op]
    nodes = (pair[:2] if op == "avgpool" else pair) + body + [
        helper.make_node("QuantizeLinear", ["t", "sy", "zy"], ["yq"]),
        helper.make_node("DequantizeLinear", ["yq", "sy", "zy"], ["y"])]
    inputs = [("a", "float32", shape)] + ([] if op == "avgpool" else [("b", "float32", shape)])
    model = _model(nodes, inputs, [("y", "float32")], inits)
    rng = np.random.default_rng(3)
    feeds = {n: ((rng.integers(lo, hi + 1, shape) - zp) * sc).astype(np.float32)
             for (n, _, _), sc, zp in zip(inputs, (sa, sb), z, strict=False)}
    return model, feeds, sy


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("op", ["avgpool", "add", "mul"])
def test_fused_int8_ops_round_exactly_as_onnxruntime_on_near_ties(tmp_path, op, dtype):
    """onnxruntime on x86 runs the int8 tensors of Q/DQ pairs as uint8 with the zero point + 128, and QLinearAdd,
    QLinearMul and QLinearAveragePool add zero points in float before rounding, so values near .5 round by the
    shifted sum. qadd, qmul and qavgpool copy it, in the interpreter and in the library: every output equals
    onnxruntime's."""
    model, feeds, step = _near_ties(op, dtype)
    graph = optimize(load_model(model))
    assert f"q{op}" in [n.op for n in graph.nodes]
    want = onnxruntime_run(model, feeds)["y"]
    assert np.abs(run(graph, feeds)["y"] - want).max() / step < 1e-3
    build_library(graph, Target.host(), tmp_path / "lib", 1)
    assert np.abs(load(tmp_path / "lib").run(**feeds)["y"] - want).max() / step < 1e-3


@pytest.mark.parametrize("target", ["host", "x86-64-avx2"])
@pytest.mark.parametrize("zw", [0, 2])
def test_matmul_integer_with_constant_weights_runs_the_dot_product_path_exactly(tmp_path, zw, target):
    """quantize_dynamic's MatMulInteger with int8 weights: K = 141 crosses whole 4-byte x lanes chunks (VNNI's
    64, AVX2's 32) and a byte tail; the run-time activation zero point comes out through the column sums."""
    rng = np.random.default_rng(11)
    k, n = 141, 7
    inits = {"w": rng.integers(-128, 126, (k, n)).astype(np.int8), "zw": np.array(zw, np.int8)}
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             helper.make_node("MatMulInteger", ["xq", "w", "xz", "zw"], ["mm"])]
    model = _model(nodes, [("x", "float32", (2, 3, k))], [("mm", "int32"), ("xs", "float32")], inits)
    feeds = {"x": (rng.standard_normal((2, 3, k)) * 3 + 1).astype(np.float32)}
    want = onnxruntime_run(model, feeds)["mm"]
    graph = optimize(load_model(model))
    build_library(graph, Target.host() if target == "host" else preset(target), tmp_path / "lib", 2)
    np.testing.assert_array_equal(load(tmp_path / "lib").run(**feeds)["mm"], want)


def _scalar_operand_model(op: str, dtype: str, rng: np.random.Generator, const_first: bool):
    """DQ(x) op DQ(c) -> Q with c a quantized constant scalar (hardswish's + 3, gelu's 1 + tanh, / 6) and scales
    set a hair (0-3 ulps) from a tie: c's term (Add) or one product (Mul) k + 0.5 output steps."""
    low, high = (0, 255) if dtype == "uint8" else (-128, 127)
    sx, sy = (np.float32(np.exp(rng.uniform(-6, -2))) for _ in range(2))
    zx, zc, zy, c = (int(rng.integers(low, high + 1)) for _ in range(4))
    while c == zc:
        c = int(rng.integers(low, high + 1))
    k = int(rng.integers(-60, 60))
    if op == "Add":
        sc = np.float32((k + 0.5) * float(sy) / (c - zc))
    else:
        x0 = zx + (1 if zx < high else -1)
        sc = np.float32((k + 0.5) * float(sy) / (float(sx) * (x0 - zx) * (c - zc)))
    for _ in range(int(rng.integers(0, 4))):
        sc = np.nextafter(sc, np.float32(1))
    t = np.uint8 if dtype == "uint8" else np.int8
    inits = {"sx": sx, "zx": np.array(zx, t), "c": np.array(c, t), "sc": np.float32(abs(sc)),
             "zc": np.array(zc, t), "sy": sy, "zy": np.array(zy, t)}
    pair = ["cf", "xf"] if const_first else ["xf", "cf"]
    nodes = [helper.make_node("DequantizeLinear", ["x", "sx", "zx"], ["xf"]),
             helper.make_node("DequantizeLinear", ["c", "sc", "zc"], ["cf"]),
             helper.make_node(op, pair, ["r"]), helper.make_node("QuantizeLinear", ["r", "sy", "zy"], ["y"])]
    return _model(nodes, [("x", dtype, (4, 64))], [("y", dtype)], inits)


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("op", ["Add", "Mul"])
def test_an_int8_add_or_mul_by_a_quantized_constant_rounds_as_onnxruntime(tmp_path, op, dtype):
    """onnxruntime fuses DQ(x) op DQ(constant) -> Q into QLinearAdd / QLinearMul of the integers, whose float32
    arithmetic rounds near-ties otherwise than ONNX's float definition (fuzz cases 0:100 and 0:182: hardswish and
    tanh-gelu constants, 4 output steps off after a few layers). Every one of the 256 inputs, in the interpreter
    for 40 near-tie scale sets and in the library for 2, equals onnxruntime's byte."""
    rng = np.random.default_rng(3)
    x = np.arange(256).astype(np.uint8).view(dtype).reshape(4, 64)
    float_misses = 0
    for trial in range(40):
        model = _scalar_operand_model(op, dtype, rng, const_first=trial % 2 == 1)
        graph = optimize(load_model(model))
        assert [n.op for n in graph.nodes] == [f"q{op.lower()}"]
        want = onnxruntime_run(model, {"x": x})["y"]
        np.testing.assert_array_equal(run(graph, {"x": x})["y"], want, err_msg=f"trial {trial}")
        float_misses += int((ReferenceEvaluator(model).run(None, {"x": x})[0] != want).any())
        if trial < 2:
            build_library(graph, Target.host(), tmp_path / f"lib{trial}", 1)
            np.testing.assert_array_equal(load(tmp_path / f"lib{trial}").run(x=x)["y"], want)
    assert float_misses > 0  # the cases do reach the ties where the float definition differs


@pytest.mark.parametrize("op", ["Add", "Mul"])
def test_an_int8_pair_times_or_plus_a_quantized_constant_stays_float_as_onnxruntime_keeps_it(tmp_path, op):
    """An int8 Q/DQ pair onnxruntime shifts into uint8 meets an int8 constant it does not shift: it leaves
    DQ, op, Q in float, so tunaflow does too (its QLinear arithmetic would round near-ties otherwise)."""
    rng = np.random.default_rng(4)
    for trial in range(12):
        inner = _scalar_operand_model(op, "int8", rng, const_first=False)
        nodes = [helper.make_node("QuantizeLinear", ["xin", "sx", "zx"], ["x"]), *inner.graph.node,
                 helper.make_node("DequantizeLinear", ["y", "sy", "zy"], ["out"])]
        inits = {t.name: numpy_helper.to_array(t) for t in inner.graph.initializer}
        model = _model(nodes, [("xin", "float32", (4, 64))], [("out", "float32")], inits)
        xin = ((np.arange(-128, 128).reshape(4, 64) - inits["zx"].astype(int)) * inits["sx"]).astype(np.float32)
        graph = optimize(load_model(model))
        assert op in [n.op for n in graph.nodes]
        want = onnxruntime_run(model, {"xin": xin})["out"]
        np.testing.assert_array_equal(run(graph, {"xin": xin})["out"], want, err_msg=f"trial {trial}")
        if trial == 0:
            build_library(graph, Target.host(), tmp_path / "lib", 1)
            np.testing.assert_array_equal(load(tmp_path / "lib").run(xin=xin)["out"], want)


def test_the_interpreter_runs_an_int8_max_pool_with_padding():
    """The self-check's interpreter (which names the first diverging node) padded an int8 MaxPool with -inf and
    raised OverflowError, so a mismatch in any quantized model with a MaxPool could not be located."""
    inits = {"s": np.float32(0.1), "z": np.array(-5, np.int8)}
    nodes = [helper.make_node("DequantizeLinear", ["x", "s", "z"], ["xf"]),
             helper.make_node("MaxPool", ["xf"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 0, 1, 2]),
             helper.make_node("QuantizeLinear", ["p", "s", "z"], ["y"])]
    model = _model(nodes, [("x", "int8", (1, 2, 7, 6))], [("y", "int8")], inits)
    x = np.random.default_rng(2).integers(-128, 128, (1, 2, 7, 6)).astype(np.int8)
    graph = optimize(load_model(model))
    assert [n.op for n in graph.nodes] == ["MaxPool"]
    assert np.array_equal(run(graph, {"x": x})["y"], ReferenceEvaluator(model).run(None, {"x": x})[0])


@pytest.mark.parametrize("op", ["Add", "Mul"])
@pytest.mark.parametrize("readers", [(1, 1, 1), (1, 1, 2), (1, 2, 1), (2, 1, 1), (2, 2, 1), (2, 2, 2)])
def test_an_int8_add_or_mul_fuses_only_where_onnxruntime_fuses_it(tmp_path, op, readers):
    """DQ(a) op DQ(b) -> Q with each of a, b, y read once or twice. onnxruntime shifts the int8 pairs read once to
    uint8 and fuses QLinearAdd / QLinearMul only where all three end up of one type (measured for all eight
    layouts); elsewhere it adds or multiplies in float, and so must tunaflow, or near .5 a step flips."""
    inits = {"sa": np.float32(0.05), "za": np.array(3, np.int8), "sb": np.float32(0.07), "zb": np.array(-5, np.int8),
             "sy": np.float32(0.09 if op == "Add" else 0.2), "zy": np.array(7, np.int8)}
    nodes = [helper.make_node("QuantizeLinear", ["a", "sa", "za"], ["aq"]),
             helper.make_node("DequantizeLinear", ["aq", "sa", "za"], ["af"]),
             helper.make_node("QuantizeLinear", ["b", "sb", "zb"], ["bq"]),
             helper.make_node("DequantizeLinear", ["bq", "sb", "zb"], ["bf"]),
             helper.make_node(op, ["af", "bf"], ["p"]),
             helper.make_node("QuantizeLinear", ["p", "sy", "zy"], ["pq"]),
             helper.make_node("DequantizeLinear", ["pq", "sy", "zy"], ["pf"]),
             helper.make_node("Relu", ["pf"], ["y0"])]
    outputs = [("y0", "float32")]
    for n, src in zip(readers, ("af", "bf", "pf"), strict=True):
        if n == 2:
            nodes.append(helper.make_node("Tanh", [src], [f"t_{src}"]))
            outputs.append((f"t_{src}", "float32"))
    shape = (1, 4, 12, 12)
    model = _model(nodes, [("a", "float32", shape), ("b", "float32", shape)], outputs, inits)
    rng = np.random.default_rng(4)
    feeds = {"a": rng.uniform(-6, 6, shape).astype(np.float32), "b": rng.uniform(-9, 9, shape).astype(np.float32)}
    graph = optimize(load_model(model))
    assert (f"q{op.lower()}" in [n.op for n in graph.nodes]) == (len(set(readers)) == 1)
    want = onnxruntime_run(model, feeds)
    build_library(graph, Target.host(), tmp_path / "lib", 1)
    got = load(tmp_path / "lib").run(**feeds)
    for name, ref in want.items():
        assert np.abs(got[name] - ref).max() <= 1e-6, name
