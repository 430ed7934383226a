"""NaN, infinities and huge values through every activation, fused or not, against onnxruntime.

The differential fuzzers feed finite random inputs, so a kernel that turned a NaN into a number went
unseen: Relu (alone and as a conv or dense epilogue), Clip and HardSigmoid epilogues returned 0 for a
NaN, Sigmoid and Tanh 1, and Softmax a row of 0.25s for a row holding a NaN or +inf, where onnxruntime
and ONNX's definitions give NaN. One model holds a branch per op, so one build checks them all.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from schemas import Target
from stages.build.library import build_library
from stages.extract import load_model
from stages.graph.passes import optimize
from stages.runtime import load

SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 3e38, -3e38, 100.0, -100.0, 89.0, -89.0, 1.0, -1.0, 0.5,
                    1e-30, -1e-30], dtype=np.float32)
SHAPE = (1, 4, 4, 4)  # every channel meets every special value: a 1x1 identity conv keeps them apart

UNARY = ["Relu", "Sigmoid", "Tanh", "Erf", "Exp", "Log", "Softplus", "Softsign", "Abs", "Neg", "Reciprocal", "Floor",
         "Ceil", "Sign", "Sqrt", "Selu", "Elu", "HardSigmoid", "HardSwish", "LeakyRelu"]
EPILOGUES = ["Relu", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Swish", "Clip", "Gelu", "GeluTanh"]


def _activation(kind: str, src: str, out: str, tag: str) -> list[onnx.NodeProto]:
    """One activation as exporters write it (Swish as x * Sigmoid(x), ReLU6 as Clip with constant bounds)."""
    if kind == "Swish":
        return [helper.make_node("Sigmoid", [src], [f"{tag}_s"]), helper.make_node("Mul", [src, f"{tag}_s"], [out])]
    if kind == "Clip":
        return [helper.make_node("Clip", [src, "zero", "six"], [out])]
    if kind == "Gelu":
        return [helper.make_node("Gelu", [src], [out])]
    if kind == "GeluTanh":
        return [helper.make_node("Gelu", [src], [out], approximate="tanh")]
    return [helper.make_node(kind, [src], [out])]


def _model() -> tuple[onnx.ModelProto, list[str]]:
    nodes, outputs, names = [], [], []

    def output(name: str, shape: tuple[int, ...]) -> None:
        outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, shape))
        names.append(name)

    for op in UNARY:
        nodes.append(helper.make_node(op, ["x"], [f"{op}_y"]))
        output(f"{op}_y", SHAPE)
    for kind in EPILOGUES:  # conv + activation: fused into the conv's epilogue
        nodes += [helper.make_node("Conv", ["x", "eye"], [f"conv_{kind}"]),
                  *_activation(kind, f"conv_{kind}", f"conv_{kind}_y", f"conv_{kind}")]
        output(f"conv_{kind}_y", SHAPE)
    for kind in ("Relu", "Gelu"):  # dense + activation: the GEMM family's epilogue (one row per special value)
        nodes += [helper.make_node("Reshape", ["x", "rows"], [f"rows_{kind}"]),
                  helper.make_node("MatMul", [f"rows_{kind}", "ident"], [f"dense_{kind}"]),
                  *_activation(kind, f"dense_{kind}", f"dense_{kind}_y", f"dense_{kind}")]
        output(f"dense_{kind}_y", (16, 4))
    nodes.append(helper.make_node("Softmax", ["x"], ["softmax_y"], axis=-1))
    output("softmax_y", SHAPE)
    inits = [helper.make_tensor("eye", TensorProto.FLOAT, (4, 4, 1, 1), np.eye(4, dtype=np.float32).ravel()),
             helper.make_tensor("ident", TensorProto.FLOAT, (4, 4), np.eye(4, dtype=np.float32).ravel()),
             helper.make_tensor("rows", TensorProto.INT64, (2,), [16, 4]),
             helper.make_tensor("zero", TensorProto.FLOAT, (), [0.0]),
             helper.make_tensor("six", TensorProto.FLOAT, (), [6.0])]
    graph = helper.make_graph(nodes, "special", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                              outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), names


def _inputs() -> np.ndarray:
    """Each plane runs through the special values in another order; the last plane's rows are, for Softmax,
    one with a NaN, one with +inf, one all -inf and one finite."""
    x = np.stack([np.roll(SPECIAL, 5 * c) for c in range(4)]).reshape(SHAPE).copy()
    x[0, 3] = [[1.0, np.nan, 2.0, 3.0], [1.0, np.inf, 2.0, 3.0], [-np.inf] * 4, [1.0, -2.0, 3.0, 50.0]]
    return x


def _disagreements(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Where NaN-ness or an infinity differs, or finite values differ by more than 1e-5 relative."""
    same_nan = np.isnan(got) == np.isnan(want)
    same_inf = np.where(np.isinf(want), got == want, ~np.isinf(got))
    both = np.isfinite(got) & np.isfinite(want)
    with np.errstate(invalid="ignore"):
        close = np.abs(got.astype(np.float64) - want) <= 1e-5 * np.maximum(np.abs(want), 1e-3)
    return ~(same_nan & same_inf & np.where(both, close, True))


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    work = tmp_path_factory.mktemp("special")
    model, names = _model()
    path = work / "special.onnx"
    onnx.save(model, path)
    x = _inputs()
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(names, {"x": x})
    build_library(optimize(load_model(path)), Target.host(), work / "lib", 1, None)
    got = load(work / "lib").run(x=x)
    return {n: (got[n], w) for n, w in zip(names, want, strict=True)}


def test_every_activation_after_a_conv_or_dense_is_fused_into_its_epilogue(tmp_path):
    model, _ = _model()
    onnx.save(model, tmp_path / "m.onnx")
    graph = optimize(load_model(tmp_path / "m.onnx"))
    ops = Counter(n.op for n in graph.nodes)
    assert ops == Counter({"conv2d": len(EPILOGUES), "dense": 2, "Reshape": 2, "Softmax": 1, **{op: 1 for op in UNARY}})


@pytest.mark.parametrize("name", [f"{op}_y" for op in UNARY] + [f"conv_{k}_y" for k in EPILOGUES]
                         + ["dense_Relu_y", "dense_Gelu_y", "softmax_y"])
def test_special_values_come_out_as_onnxruntime_gives_them(outputs, name):
    got, want = outputs[name]
    bad = _disagreements(got, want)
    if bad.any():
        where = np.argwhere(bad)[:4]
        shown = "; ".join(f"at {list(map(int, w))}: tunaflow {got[tuple(w)]!r}, onnxruntime {want[tuple(w)]!r}"
                          for w in where)
        pytest.fail(f"{name}: {int(bad.sum())} of {bad.size} elements disagree ({shown})")
