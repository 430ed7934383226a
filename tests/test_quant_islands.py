"""The int8 islands that compute what onnxruntime computes its own way (stages/graph/passes_quant_islands.py),
bit for bit against onnxruntime running that one op: QLinearSigmoid's table, QLinearMul, QLinearAdd's offset,
its float ReduceMean in both layouts' summation orders and its float BatchNormalization, over every input byte
(pair) and many random scales, ties included; then all of them built into one library from a quantized model."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from schemas import Target
from stages.build.library import build_library
from stages.extract import load_model
from stages.graph.ir import Graph, Node, Value
from stages.graph.passes import optimize
from stages.graph.passes_quant import quantize_graph
from stages.graph.passes_quant_islands import _batch_norm
from stages.graph.reference_quant import QUANT_OPS, lookup_table
from stages.runtime import load
from testing.quantize import onnxruntime_run, quantize_static

f = np.float32
ELEM = {"uint8": TensorProto.UINT8, "int8": TensorProto.INT8, "float32": TensorProto.FLOAT}
EVERY_PAIR = (np.repeat(np.arange(256), 256).astype(np.uint8), np.tile(np.arange(256), 256).astype(np.uint8))


def _session(nodes, inputs, inits, out_dtype, domain=False) -> ort.InferenceSession:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, ELEM[d], s) for n, d, s in inputs],
                              [helper.make_tensor_value_info("y", ELEM[out_dtype], None)],
                              [numpy_helper.from_array(np.asarray(v), n) for n, v in inits.items()])
    opsets = [helper.make_opsetid("", 19)] + ([helper.make_opsetid("com.microsoft", 1)] if domain else [])
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 9
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _qparams(rng, dtype, names, lo=-6.0, hi=0.0) -> dict:
    low, high = np.iinfo(dtype).min, np.iinfo(dtype).max
    out = {}
    for n in names:
        out[f"s{n}"] = f(np.exp(rng.uniform(lo, hi)))
        out[f"z{n}"] = np.array(rng.integers(low, high + 1), dtype=dtype)
    return out


def _qlinear(op: str, inputs: dict, p: dict, dtype: str) -> np.ndarray:
    """onnxruntime's com.microsoft QLinear* op on `inputs`, with scales s<name> / zero points z<name> from p."""
    order = [x for n in inputs for x in (n, f"s{n}", f"z{n}")] + ["sy", "zy"]
    node = helper.make_node(op, order, ["y"], domain="com.microsoft")
    sess = _session([node], [(n, dtype, v.shape) for n, v in inputs.items()], p, dtype, domain=True)
    return sess.run(None, inputs)[0]


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_sigmoid_table_is_qlinear_sigmoids(dtype):
    """Random scales, and one where the exact logistic 1 / (1 + exp(-x)) rounds one entry the other way."""
    rng = np.random.default_rng(5)
    x = np.arange(256, dtype=np.uint8).view(dtype)
    sets = [_qparams(rng, dtype, "x") | _qparams(rng, dtype, "y", -9.0, -3.0) for _ in range(60)]
    if dtype == "uint8":
        sets.append({"sx": f(0.00909464992582798), "zx": np.array(54, np.uint8), "sy": f(1 / 256),
                     "zy": np.array(0, np.uint8)})
    for p in sets:
        want = _qlinear("QLinearSigmoid", {"x": x}, p, dtype)
        table = lookup_table("Sigmoid", p["sx"], int(p["zx"]), p["sy"], int(p["zy"]), dtype)
        got = QUANT_OPS["qlut"]([x, table], {"y_dtype": dtype})[0]
        np.testing.assert_array_equal(got, want, err_msg=str(p))


def _graph(nodes: list, values: dict, constants: dict) -> Graph:
    """A tunaflow graph of normalised nodes; `values` maps tensor names to (shape, dtype)."""
    vals = {n: Value(n, shape, dtype) for n, (shape, dtype) in values.items()}
    produced = {o for node in nodes for o in node.outputs}
    inputs = [v for n, v in vals.items() if n not in produced]
    return Graph("islands", inputs, [vals[nodes[-1].outputs[0]]], nodes, vals,
                 {k: np.asarray(v) for k, v in constants.items()})


def _binary(op: str, p: dict, dtype: str) -> dict:
    """What the quant pass makes of DQ(a) op DQ(b) -> Q with these parameters: the node's attrs."""
    g = _graph([Node("da", "DequantizeLinear", ["a", "sa", "za"], ["af"], {"axis": None}),
                Node("db", "DequantizeLinear", ["b", "sb", "zb"], ["bf"], {"axis": None}),
                Node("op", op, ["af", "bf"], ["s"], {}),
                Node("q", "QuantizeLinear", ["s", "sy", "zy"], ["y"], {"axis": None, "dtype": dtype})],
               {"a": ((4,), dtype), "b": ((4,), dtype), "af": ((4,), "float32"), "bf": ((4,), "float32"),
                "s": ((4,), "float32"), "y": ((4,), dtype)}, p)
    quantize_graph(g)
    return next(n for n in g.nodes if n.op in ("qmul", "qadd")).attrs


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_qmul_is_qlinear_mul_on_every_pair_ties_included(dtype):
    rng = np.random.default_rng(7)
    a, b = (v.view(dtype) for v in EVERY_PAIR)
    sets = [_qparams(rng, dtype, "aby") for _ in range(24)]
    # ratio 1/2: every odd product is a tie of the float32 rounding
    sets.append({**sets[0], "sa": f(0.5), "sb": f(0.25), "sy": f(0.25)})
    for p in sets:
        want = _qlinear("QLinearMul", {"a": a, "b": b}, p, dtype)
        got = QUANT_OPS["qmul"]([a, b], _binary("Mul", p, dtype))[0]
        np.testing.assert_array_equal(got, want, err_msg=str(p))
    gate = b[::4096].reshape(1, 16, 1, 1)
    x = a[:16 * 64].reshape(1, 16, 8, 8)
    want = _qlinear("QLinearMul", {"a": x, "b": gate}, sets[1], dtype)
    np.testing.assert_array_equal(QUANT_OPS["qmul"]([x, gate], _binary("Mul", sets[1], dtype))[0], want)


def test_qadd_offset_rounds_as_qlinear_add_on_every_pair():
    """The offset zy - fma(ra, za, rb * zb): with a plain multiply-add some of these scale sets differ."""
    rng = np.random.default_rng(0)
    a, b = EVERY_PAIR
    plain_misses = 0
    for _ in range(60):
        p = _qparams(rng, "uint8", "aby", -5.0, -1.0)
        want = _qlinear("QLinearAdd", {"a": a, "b": b}, p, "uint8")
        attrs = _binary("Add", p, "uint8")
        np.testing.assert_array_equal(QUANT_OPS["qadd"]([a, b], attrs)[0], want, err_msg=str(p))
        ra, rb = f(attrs["a_ratio"]), f(attrs["b_ratio"])
        plain = QUANT_OPS["qadd"]([a, b], {**attrs, "offset": float(f(p["zy"]) - (ra * f(p["za"]) + rb * f(p["zb"])))})
        plain_misses += int((plain[0] != want).any())
    assert plain_misses > 0


def _dq_op_q(op_nodes, x_shape, p, extra=None, dtype="uint8") -> ort.InferenceSession:
    nodes = [helper.make_node("DequantizeLinear", ["x", "sx", "zx"], ["xf"]), *op_nodes,
             helper.make_node("QuantizeLinear", ["r", "sy", "zy"], ["y"])]
    return _session(nodes, [("x", dtype, x_shape)], {**p, **(extra or {})}, dtype)


@pytest.mark.parametrize("hw", [(2, 2), (3, 3), (6, 6), (7, 5), (16, 16)])
def test_qmean_sums_in_onnxruntimes_order_for_either_layout(hw):
    """onnxruntime's float ReduceMean over H, W: of an NHWC tensor (axes 1, 2; how it runs a squeeze-excite
    block's mean between its int8 convolutions) and of an NCHW one (the classifier's global pool). With the
    output scale the input's (what the quantizer gives a global pool) many means are exact ties, and a sum
    rounded in another order lands on the other side."""
    rng = np.random.default_rng(hw[0] * 31 + hw[1])
    h, w = hw
    c = 64
    for trial in range(4):
        p = _qparams(rng, "uint8", "x", -4.0, -1.5) | _qparams(rng, "uint8", "y", -6.0, -3.0)
        if trial % 2:
            p["sy"] = p["sx"]
        x = rng.integers(0, 256, (2, c, h, w)).astype(np.uint8)
        attrs = {"x_scale": p["sx"], "x_zero_point": int(p["zx"]), "y_scale": p["sy"], "y_zero_point": int(p["zy"]),
                 "y_dtype": "uint8"}
        for order, axes, feed in (("nhwc", [1, 2], x.transpose(0, 2, 3, 1)), ("nchw", [2, 3], x)):
            mean = helper.make_node("ReduceMean", ["xf", "axes"], ["r"], keepdims=1)
            sess = _dq_op_q([mean], feed.shape, p, {"axes": np.array(axes, np.int64)})
            want = sess.run(None, {"x": np.ascontiguousarray(feed)})[0].reshape(2, c)
            got = QUANT_OPS["qmean"]([x], {**attrs, "order": order})[0].reshape(2, c)
            np.testing.assert_array_equal(got, want, err_msg=order)


def test_qmean_kernels_sum_as_their_reference_for_every_plane_size(tmp_path):
    """The built qmean in both orders, batch 1 and 2, planes of 1 to 35 values (Eigen's head, packets and tail;
    MLAS's groups of four, two and one) against the reference checked above."""
    rng = np.random.default_rng(4)
    nodes, values, feeds = [], {}, {}
    for i, (n, h, w, order) in enumerate([(1, 1, 1, "nchw"), (1, 1, 3, "nchw"), (2, 3, 5, "nchw"), (2, 5, 7, "nchw"),
                                          (1, 1, 3, "nhwc"), (2, 1, 1, "nhwc"), (2, 1, 3, "nhwc"), (2, 5, 7, "nhwc")]):
        attrs = {"x_scale": float(f(0.0372)), "x_zero_point": 9, "y_scale": float(f(0.0372)), "y_zero_point": 3,
                 "y_dtype": "uint8", "order": order}
        nodes.append(Node(f"m{i}", "qmean", [f"x{i}"], [f"y{i}"], attrs))
        values |= {f"x{i}": ((n, 6, h, w), "uint8"), f"y{i}": ((n, 6, 1, 1), "uint8")}
        feeds[f"x{i}"] = rng.integers(0, 256, (n, 6, h, w)).astype(np.uint8)
    g = _graph(nodes, values, {})
    g.outputs = [g.values[node.outputs[0]] for node in nodes]
    build_library(g, Target.host(), tmp_path / "lib")
    got = load(tmp_path / "lib").run(**feeds)
    for node in nodes:
        want = QUANT_OPS["qmean"]([feeds[node.inputs[0]]], node.attrs)[0]
        np.testing.assert_array_equal(got[node.outputs[0]], want, err_msg=node.name)


@pytest.mark.parametrize("relu", [False, True])
def test_qbatchnorm_is_onnxruntimes_float_batch_norm(relu):
    rng = np.random.default_rng(3)
    c = 24
    for _ in range(5):
        p = _qparams(rng, "uint8", "xy", -5.0, -2.0)
        bn = {"sc": rng.standard_normal(c).astype(f), "bi": rng.standard_normal(c).astype(f),
              "mu": rng.standard_normal(c).astype(f), "var": rng.uniform(0.05, 3, c).astype(f)}
        nodes = [helper.make_node("BatchNormalization", ["xf", "sc", "bi", "mu", "var"], ["b" if relu else "r"],
                                  epsilon=1e-5)] + ([helper.make_node("Relu", ["b"], ["r"])] if relu else [])
        sess = _dq_op_q(nodes, (1, c, 9, 7), p, bn)
        x = rng.integers(0, 256, (1, c, 9, 7)).astype(np.uint8)
        shape = (1, c, 9, 7)
        g = _graph([Node("dq", "DequantizeLinear", ["x", "sx", "zx"], ["xf"], {"axis": None}),
                    Node("bn", "BatchNormalization", ["xf", "sc", "bi", "mu", "var"], ["b" if relu else "r"],
                         {"epsilon": 1e-5}),
                    *([Node("relu", "Relu", ["b"], ["r"], {})] if relu else []),
                    Node("q", "QuantizeLinear", ["r", "sy", "zy"], ["y"], {"axis": None, "dtype": "uint8"})],
                   {"x": (shape, "uint8"), "xf": (shape, "float32"), "b": (shape, "float32"),
                    "r": (shape, "float32"), "y": (shape, "uint8")}, {**p, **bn})
        _batch_norm(g, g.nodes[1])
        node = next(n for n in g.nodes if n.op == "qbatchnorm")
        got = QUANT_OPS["qbatchnorm"]([x, *(g.constants[i] for i in node.inputs[1:])], node.attrs)[0]
        np.testing.assert_array_equal(got, sess.run(None, {"x": x})[0])


def _island_model(batch: int, activation: str) -> onnx.ModelProto:
    """EfficientNet's block in small: Conv -> SiLU -> squeeze-excite (ReduceMean, 1x1 Conv, Sigmoid, broadcast
    Mul) -> global mean -> classifier, and DenseNet's: Conv -> BatchNormalization -> Relu -> global mean ->
    classifier; quantized by onnxruntime's quantize_static."""
    rng = np.random.default_rng(11)
    c = 8
    inits = {"w": rng.standard_normal((c, 3, 3, 3)) * 0.3, "we": rng.standard_normal((c, c, 1, 1)) * 0.3,
             "w2": rng.standard_normal((c, c, 1, 1)) * 0.3, "sc": rng.uniform(0.5, 2, c),
             "bi": rng.standard_normal(c), "mu": rng.standard_normal(c) * 0.1, "var": rng.uniform(0.5, 2, c)}
    inits = {k: v.astype(f) for k, v in inits.items()} | {"axes": np.array([2, 3], np.int64)}
    node = helper.make_node
    nodes = [node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), node("Sigmoid", ["c"], ["sg"]),
             node("Mul", ["c", "sg"], ["silu"]), node("ReduceMean", ["silu", "axes"], ["se"], keepdims=1),
             node("Conv", ["se", "we"], ["ce"]), node("Sigmoid", ["ce"], ["gate"]),
             node("Mul", ["silu", "gate"], ["ex"]), node("ReduceMean", ["ex", "axes"], ["m1"], keepdims=1),
             node("Conv", ["ex", "w2"], ["c2"]), node("BatchNormalization", ["c2", "sc", "bi", "mu", "var"], ["bn"]),
             node("Relu", ["bn"], ["rl"]), node("ReduceMean", ["rl", "axes"], ["m2"], keepdims=1)]
    # Two classifier heads: the global mean, flattened, into a Gemm. Their own weights: with one bias shared, the
    # quantizer makes both Gemms read the int32 bias it quantized for the second one's input scale, and
    # onnxruntime's fused QGemm takes those integers in the first one's units (not what the QDQ model says).
    for k in (1, 2):
        nodes += [node("Flatten", [f"m{k}"], [f"v{k}"]), node("Gemm", [f"v{k}", f"fc{k}", f"fb{k}"], [f"y{k}"],
                                                              transB=1)]
        inits |= {f"fc{k}": (rng.standard_normal((5, c)) * 0.5).astype(f), f"fb{k}": rng.standard_normal(5).astype(f)}
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, (batch, 3, 10, 9))
    graph = helper.make_graph(nodes, "islands", [x],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y1", "y2", "ex")],
                              [numpy_helper.from_array(v, n) for n, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    return quantize_static(model, calibration=4, activation=activation)


@pytest.mark.parametrize(("batch", "activation"), [(1, "uint8"), (2, "int8")])
def test_built_islands_match_onnxruntimes_int8_run_exactly(tmp_path, batch, activation):
    """uint8 and int8 activations; batch 1 and 2 (onnxruntime sums an NHWC mean in another order for a batch).
    With int8 both Muls stay float, as in onnxruntime: it shifts some of their int8 pairs to uint8 and not the
    others (`passes_quant.one_type`)."""
    model = _island_model(batch, activation)
    graph = optimize(load_model(model))
    ops = [n.op for n in graph.nodes]
    mul = {"uint8": "qmul", "int8": "Mul"}[activation]
    assert {"qlut", mul, "qmean", "qbatchnorm"} <= set(ops)
    assert not {"Sigmoid", {"qmul": "Mul", "Mul": "qmul"}[mul], "ReduceMean", "BatchNormalization"} & set(ops)
    assert sorted(n.attrs["order"] for n in graph.nodes if n.op == "qmean") == ["nchw", "nchw", "nhwc"]
    if activation == "uint8":  # the SiLU's qmul by its own sigmoid table is one composed table
        assert sorted(n.attrs["fn"] for n in graph.nodes if n.op == "qlut") == ["Sigmoid", "Sigmoid*x"]
    build_library(graph, Target.host(), tmp_path / "lib")
    library = load(tmp_path / "lib")
    rng = np.random.default_rng(2)
    for _ in range(8):
        feeds = {"x": (rng.standard_normal((batch, 3, 10, 9)) * 2).astype(f)}
        want, got = onnxruntime_run(model, feeds), library.run(**feeds)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)


@pytest.mark.parametrize("threads", [1, 2])
def test_qbatchnorm_library_on_the_worker_pool_equals_the_interpreter(tmp_path, threads):
    """A DenseNet-sized pre-activation (2 images of 64 planes of 28x28) split over the pool's threads: every byte as the
    interpreter (which test_qbatchnorm_is_onnxruntimes_float_batch_norm holds to onnxruntime)."""
    rng = np.random.default_rng(5)
    c, shape = 64, (2, 64, 28, 28)  # two images: the plane index wraps round the channels
    p = _qparams(rng, "uint8", "xy", -5.0, -2.0)
    bn = {"sc": rng.standard_normal(c).astype(f), "bi": rng.standard_normal(c).astype(f),
          "mu": rng.standard_normal(c).astype(f), "var": rng.uniform(0.05, 3, c).astype(f)}
    g = _graph([Node("dq", "DequantizeLinear", ["x", "sx", "zx"], ["xf"], {"axis": None}),
                Node("bn", "BatchNormalization", ["xf", "sc", "bi", "mu", "var"], ["b"], {"epsilon": 1e-5}),
                Node("relu", "Relu", ["b"], ["r"], {}),
                Node("q", "QuantizeLinear", ["r", "sy", "zy"], ["y"], {"axis": None, "dtype": "uint8"})],
               {"x": (shape, "uint8"), "xf": (shape, "float32"), "b": (shape, "float32"),
                "r": (shape, "float32"), "y": (shape, "uint8")}, {**p, **bn})
    _batch_norm(g, g.nodes[1])
    g.nodes = [n for n in g.nodes if n.op != "DequantizeLinear"]  # read by no one now
    assert [n.op for n in g.nodes] == ["qbatchnorm"]
    node = g.nodes[0]
    x = rng.integers(0, 256, shape).astype(np.uint8)
    want = QUANT_OPS["qbatchnorm"]([x, *(g.constants[i] for i in node.inputs[1:])], node.attrs)[0]
    build_library(g, Target.host(), tmp_path / "lib", threads)
    np.testing.assert_array_equal(load(tmp_path / "lib").run(x=x)["y"], want)


def _concat_model(parts: list[tuple[str, int, float, int]], hw: tuple[int, int], images: int, sy: float, zy: int) \
        -> onnx.ModelProto:
    """DQ(x_i) (dtype, channels, scale, zero point each) -> Concat over channels -> Q(sy, zy) to uint8."""
    names = [f"x{i}" for i in range(len(parts))]
    nodes = [helper.make_node("DequantizeLinear", [n, f"s{n}", f"z{n}"], [f"{n}f"]) for n in names]
    nodes += [helper.make_node("Concat", [f"{n}f" for n in names], ["cat"], axis=1),
              helper.make_node("QuantizeLinear", ["cat", "sy", "zy"], ["y"])]
    inits = {"sy": f(sy), "zy": np.array(zy, np.uint8)}
    for n, (dtype, _, s, z) in zip(names, parts, strict=True):
        inits |= {f"s{n}": f(s), f"z{n}": np.array(z, dtype)}
    graph = helper.make_graph(
        nodes, "concat", [helper.make_tensor_value_info(n, ELEM[d], [images, c, *hw])
                          for n, (d, c, _, _) in zip(names, parts, strict=True)],
        [helper.make_tensor_value_info("y", ELEM["uint8"], None)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    return model


@pytest.mark.parametrize("target", ["host", "x86-64-avx2"])
@pytest.mark.parametrize("threads", [1, 2])
def test_concat_of_different_scales_is_onnxruntimes_float_chain(tmp_path, target, threads):
    """DenseNet's pattern: int8 tensors of their own scales concatenated and requantized. Runs longer than a
    parallel block, shorter than one vector, a run of one plane, an int8 input and one already on the output's
    scale; the host's byte-permute lookups and the float chain of a target without them, both exactly as
    onnxruntime's DequantizeLinear -> Concat -> QuantizeLinear."""
    sy, zy = 0.05, 7
    parts = [("uint8", 400, 0.02, 3), ("int8", 3, 0.11, -5), ("uint8", 1, sy, zy), ("int8", 2, 0.013, 0)]
    model = _concat_model(parts, (7, 7), 2, sy, zy)
    onnx.save(model, tmp_path / "m.onnx")
    graph = optimize(load_model(tmp_path / "m.onnx"))
    assert [n.op for n in graph.nodes] == ["qconcat"]
    build_library(graph, Target.parse(target), tmp_path / "lib", threads)
    library = load(tmp_path / "lib")
    rng = np.random.default_rng(threads)
    for _ in range(3):
        feeds = {f"x{i}": rng.integers(0, 256, (2, c, 7, 7)).astype(np.uint8).view(d)
                 for i, (d, c, _, _) in enumerate(parts)}
        np.testing.assert_array_equal(library.run(**feeds)["y"], onnxruntime_run(model, feeds)["y"])
