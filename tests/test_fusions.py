"""Activations as exporters write them (SiLU as x * Sigmoid(x), HardSwish, HardSigmoid, ReLU6, both Gelu
forms) fuse into the anchor before them as one epilogue op, or run as one memory pass without one; each
model is imported, optimised, built into a library and run, and must match onnxruntime."""

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from schemas import Target
from stages.build.library import build_library
from stages.extract import load_model
from stages.graph.ir import Graph
from stages.graph.passes import optimize
from stages.runtime import load

RNG = np.random.default_rng(11)
CONV_X = (1, 8, 10, 10)
GEMM_X = (6, 24)


def const(name: str, shape, lo=-1.0, hi=1.0):
    return numpy_helper.from_array(RNG.uniform(lo, hi, shape).astype(np.float32), name)


def scalar(name: str, v: float):
    return numpy_helper.from_array(np.array(v, np.float32), name)


def conv(y="c"):
    """Conv 8 -> 16 channels, 3x3, pad 1, with bias; weights large enough that outputs reach |x| > 6."""
    return [helper.make_node("Conv", ["x", "w", "b"], [y], pads=[1, 1, 1, 1])], [const("w", (16, 8, 3, 3)),
                                                                                 const("b", (16,))]


def gemm(y="c"):
    return [helper.make_node("Gemm", ["x", "w", "b"], [y], transB=1)], [const("w", (32, 24)), const("b", (32,))]


def model(tmp_path: Path, nodes, inits, x_shape, opset=17, outputs=("y",)) -> Path:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10 if opset > 20 else 8
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    return path


def build_and_compare(tmp_path: Path, path: Path, x_shape) -> Graph:
    """Optimise, build, run; every output within 1e-3 of its largest magnitude of onnxruntime's."""
    opt = optimize(load_model(path))
    build_library(opt, Target.host(), tmp_path / "lib")
    x = (3 * RNG.standard_normal(x_shape)).astype(np.float32)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = load(tmp_path / "lib").run(x=x)
    for o, ref in zip(sess.get_outputs(), sess.run(None, {"x": x}), strict=True):
        err = np.abs(got[o.name] - ref).max()
        assert err <= 1e-3 * np.abs(ref).max(), f"{o.name}: max abs error {err}, max abs ref {np.abs(ref).max()}"
    return opt


def epilogues(g: Graph) -> list[tuple[str, list[str]]]:
    return [(n.op, [e.kind for e in n.task.epilogue]) for n in g.nodes if n.task is not None]


def silu(x: str, y: str, swap: bool = False):
    ins = [f"{x}_sig", x] if swap else [x, f"{x}_sig"]
    return [helper.make_node("Sigmoid", [x], [f"{x}_sig"]), helper.make_node("Mul", ins, [y])]


def gelu_tanh(x: str, y: str, form: str):
    """The tanh approximation of Gelu as written by GPT-2 (`gpt2`: 0.5 * x * (1 + tanh(...)), Pow), by ONNX's
    own expansion (`onnx`: x * (0.5 * (1 + tanh(...))), Sum) and with the cube as products (`products`)."""
    if form == "products":
        cube = [helper.make_node("Mul", [x, x], ["sq"]), helper.make_node("Mul", ["sq", x], ["cube"])]
    else:
        cube = [helper.make_node("Pow", [x, "three"], ["cube"])]
    add = "Sum" if form == "onnx" else "Add"
    inner = [*cube, helper.make_node("Mul", ["k", "cube"], ["kc"]), helper.make_node(add, [x, "kc"], ["s"]),
             helper.make_node("Mul", ["s", "sqrt2pi"], ["u"]), helper.make_node("Tanh", ["u"], ["t"]),
             helper.make_node(add, ["t", "one"], ["p"])]
    if form == "onnx":
        outer = [helper.make_node("Mul", ["half", "p"], ["hp"]), helper.make_node("Mul", [x, "hp"], [y])]
    else:
        outer = [helper.make_node("Mul", ["half", x], ["hx"]), helper.make_node("Mul", ["hx", "p"], [y])]
    inits = [scalar("three", 3.0), scalar("k", 0.044715), scalar("sqrt2pi", np.sqrt(2 / np.pi)), scalar("one", 1.0),
             scalar("half", 0.5)]
    return inner + outer, inits


@pytest.mark.parametrize("swap", [False, True], ids=["x*sig", "sig*x"])
def test_conv_silu_fuses_into_the_conv(tmp_path, swap):
    cn, ci = conv()
    g = build_and_compare(tmp_path, model(tmp_path, cn + silu("c", "y", swap), ci, CONV_X), CONV_X)
    assert epilogues(g) == [("conv2d", ["bias", "swish"])] and len(g.nodes) == 1


def test_conv_batchnorm_silu_as_efficientnet_exports_it_is_one_conv(tmp_path):
    cn, ci = conv()
    bn = helper.make_node("BatchNormalization", ["c", "s", "t", "m", "v"], ["n"])
    inits = [*ci, const("s", 16, 0.5, 1.5), const("t", 16), const("m", 16), const("v", 16, 0.5, 1.5)]
    g = build_and_compare(tmp_path, model(tmp_path, [*cn, bn, *silu("n", "y")], inits, CONV_X), CONV_X)
    assert epilogues(g) == [("conv2d", ["bias", "swish"])] and len(g.nodes) == 1


@pytest.mark.parametrize("form", ["gpt2", "onnx", "products"])
def test_gemm_tanh_gelu_decomposition_fuses_into_the_dense(tmp_path, form):
    gn, gi = gemm()
    nodes, inits = gelu_tanh("c", "y", form)
    g = build_and_compare(tmp_path, model(tmp_path, gn + nodes, gi + inits, GEMM_X), GEMM_X)
    assert epilogues(g) == [("dense", ["bias", "gelu_tanh"])] and len(g.nodes) == 1


def test_gemm_gelu_op_with_tanh_approximation_fuses(tmp_path):
    gn, gi = gemm()
    nodes = [*gn, helper.make_node("Gelu", ["c"], ["y"], approximate="tanh")]
    g = build_and_compare(tmp_path, model(tmp_path, nodes, gi, GEMM_X, opset=20), GEMM_X)
    assert epilogues(g) == [("dense", ["bias", "gelu_tanh"])] and len(g.nodes) == 1


HARD = {
    "HardSwish op": ([helper.make_node("HardSwish", ["c"], ["y"])], [], 14, ("hard_swish", {})),
    "x*HardSigmoid": ([helper.make_node("HardSigmoid", ["c"], ["h"], alpha=1 / 6),
                       helper.make_node("Mul", ["c", "h"], ["y"])], [], 13, ("hard_swish", {})),
    "x*(relu6(x+3)/6)": ([helper.make_node("Add", ["c", "three"], ["a"]),
                          helper.make_node("Clip", ["a", "zero", "six"], ["r"]),
                          helper.make_node("Div", ["r", "six"], ["h"]), helper.make_node("Mul", ["h", "c"], ["y"])],
                         [scalar("three", 3.0), scalar("zero", 0.0), scalar("six", 6.0)], 17, ("hard_swish", {})),
    "x*relu6(x+3)*(1/6)": ([helper.make_node("Add", ["three", "c"], ["a"]),
                            helper.make_node("Clip", ["a", "zero", "six"], ["r"]),
                            helper.make_node("Mul", ["c", "r"], ["p"]), helper.make_node("Mul", ["p", "sixth"], ["y"])],
                           [scalar("three", 3.0), scalar("zero", 0.0), scalar("six", 6.0), scalar("sixth", 1 / 6)],
                           17, ("hard_swish", {})),
    "HardSigmoid op": ([helper.make_node("HardSigmoid", ["c"], ["y"], alpha=0.3, beta=0.4)], [], 17,
                       ("hard_sigmoid", {"alpha": 0.3, "beta": 0.4})),
    "relu6(x+3)/6": ([helper.make_node("Add", ["c", "three"], ["a"]),
                      helper.make_node("Clip", ["a", "zero", "six"], ["r"]),
                      helper.make_node("Div", ["r", "six"], ["y"])],
                     [scalar("three", 3.0), scalar("zero", 0.0), scalar("six", 6.0)], 17,
                     ("hard_sigmoid", {"alpha": 1 / 6})),
    "ReLU6 Clip inputs": ([helper.make_node("Clip", ["c", "zero", "six"], ["y"])],
                          [scalar("zero", 0.0), scalar("six", 6.0)], 17, ("clip", {"min": 0.0, "max": 6.0})),
    "ReLU6 Clip attributes": ([helper.make_node("Clip", ["c"], ["y"], min=0.0, max=6.0)], [], 6,
                              ("clip", {"min": 0.0, "max": 6.0})),
}


@pytest.mark.parametrize("case", HARD, ids=list(HARD))
def test_conv_hard_activations_fuse_into_the_conv(tmp_path, case):
    nodes, inits, opset, (kind, attrs) = HARD[case]
    cn, ci = conv()
    g = build_and_compare(tmp_path, model(tmp_path, cn + nodes, ci + inits, CONV_X, opset=opset), CONV_X)
    assert epilogues(g) == [("conv2d", ["bias", kind])] and len(g.nodes) == 1
    assert g.nodes[0].task.epilogue[1].attrs == pytest.approx(attrs, rel=1e-6)


def test_swish_op_and_the_written_out_silu_are_one_task(tmp_path):
    cn, ci = conv()
    written = optimize(load_model(model(tmp_path, cn + silu("c", "y"), ci, CONV_X)))
    op = build_and_compare(tmp_path, model(tmp_path, [*cn, helper.make_node("Swish", ["c"], ["y"])], ci, CONV_X,
                                           opset=24), CONV_X)
    assert op.nodes[0].task.signature == written.nodes[0].task.signature


def test_sigmoid_read_elsewhere_is_left_alone_and_stays_correct(tmp_path):
    cn, ci = conv()
    nodes = [*cn, *silu("c", "y"), helper.make_node("Tanh", ["c_sig"], ["z"])]
    g = build_and_compare(tmp_path, model(tmp_path, nodes, ci, CONV_X, outputs=("y", "z")), CONV_X)
    assert epilogues(g) == [("conv2d", ["bias"])]
    assert sorted(n.op for n in g.nodes[1:]) == ["Mul", "Sigmoid", "Tanh"]


def test_a_gate_of_another_tensor_is_no_silu(tmp_path):
    """x * Sigmoid(c) with x not c (a gate, as in GLU) must stay a Mul."""
    cn, ci = conv()
    nodes = [*cn, helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["x2", "s"], ["y"]),
             helper.make_node("Conv", ["x", "w2"], ["x2"], pads=[1, 1, 1, 1])]
    nodes = [nodes[0], nodes[3], nodes[1], nodes[2]]
    g = build_and_compare(tmp_path, model(tmp_path, nodes, [*ci, const("w2", (16, 8, 3, 3))], CONV_X), CONV_X)
    assert [n.op for n in g.nodes].count("Swish") == 0
    assert sorted(k for _, ks in epilogues(g) for k in ks) == ["bias", "sigmoid"]


def test_relu6_plus_3_read_twice_is_not_a_hard_sigmoid(tmp_path):
    cn, ci = conv()
    nodes = [*cn, helper.make_node("Add", ["c", "three"], ["a"]), helper.make_node("Clip", ["a", "zero", "six"], ["r"]),
             helper.make_node("Div", ["r", "six"], ["y"]), helper.make_node("Relu", ["r"], ["z"])]
    inits = [*ci, scalar("three", 3.0), scalar("zero", 0.0), scalar("six", 6.0)]
    g = build_and_compare(tmp_path, model(tmp_path, nodes, inits, CONV_X, outputs=("y", "z")), CONV_X)
    assert epilogues(g) == [("conv2d", ["bias", "bias", "clip"])]
    assert "HardSigmoid" not in [n.op for n in g.nodes]


STANDALONE = {
    "silu": (silu("x", "y"), [], 17),
    "HardSwish": ([helper.make_node("HardSwish", ["x"], ["y"])], [], 14),
    "x*HardSigmoid": ([helper.make_node("HardSigmoid", ["x"], ["h"], alpha=1 / 6),
                       helper.make_node("Mul", ["h", "x"], ["y"])], [], 13),
    "gelu_tanh": (*gelu_tanh("x", "y", "gpt2"), 17),
    "Swish alpha": ([helper.make_node("Swish", ["x"], ["y"], alpha=1.5)], [], 24),
}


@pytest.mark.parametrize("case", STANDALONE, ids=list(STANDALONE))
def test_without_an_anchor_each_activation_is_one_memory_pass(tmp_path, case):
    nodes, inits, opset = STANDALONE[case]
    g = build_and_compare(tmp_path, model(tmp_path, nodes, inits, (2, 5, 7, 9), opset=opset), (2, 5, 7, 9))
    assert len(g.nodes) == 1 and g.nodes[0].op in ("Swish", "HardSwish", "Gelu")


def test_silu_of_a_conv_output_read_elsewhere_is_one_swish_pass_after_the_conv(tmp_path):
    cn, ci = conv()
    nodes = [*cn, *silu("c", "y"), helper.make_node("Relu", ["c"], ["z"])]
    g = build_and_compare(tmp_path, model(tmp_path, nodes, ci, CONV_X, outputs=("y", "z")), CONV_X)
    assert epilogues(g) == [("conv2d", ["bias"])]
    assert sorted(n.op for n in g.nodes[1:]) == ["Relu", "Swish"]
