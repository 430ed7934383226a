"""Write the bundled models (data/models/*.onnx) with onnx.helper and seeded weights; no download.

    python data/make_models.py [OUT_DIR]

- cnn.onnx: a small ResNet-like CNN on 1x3x64x64 — conv+BN+relu stem, max pool, two identity
  residual blocks (16 channels), two down-sampling blocks with 1x1 projections (32, 64),
  global average pool, flatten, gemm to 10 classes. Opset 13.
- mlp.onnx: 16x784 → Gemm 256 + Relu → Gemm 128 + BatchNormalization + Tanh → MatMul 10 + Add
  → Softmax. Opset 13.
- transformer.onnx: one encoder block on 1x64x128 (4 heads of 32, FFN 512), as exporters write
  it: Q/K/V MatMul + Add, head split through a Shape/Gather/Unsqueeze/Concat → Reshape chain,
  Transpose, batch MatMul, Div by sqrt(d), Softmax, output projection, residual Add,
  LayerNormalization, FFN with Gelu in its Erf form, residual Add, LayerNormalization. Opset 17.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SEED = 20261129


class Builder:
    """Accumulates nodes and initializers; names values `<prefix>_<n>`."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}_{self.count}"

    def const(self, prefix: str, value: np.ndarray) -> str:
        n = self.name(prefix)
        self.inits.append(numpy_helper.from_array(np.asarray(value), n))
        return n

    def weight(self, prefix: str, shape: tuple[int, ...], fan_in: int) -> str:
        return self.const(prefix, (self.rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32))

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, **attrs) -> str | list[str]:
        outs = [self.name(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=self.name(op_type), **attrs))
        return outs[0] if n_out == 1 else outs

    def batchnorm(self, x: str, c: int) -> str:
        r = self.rng
        params = [r.uniform(0.5, 1.5, c), r.uniform(-0.2, 0.2, c), r.uniform(-0.2, 0.2, c), r.uniform(0.5, 1.5, c)]
        return self.op("BatchNormalization", [x, *(self.const("bn", p.astype(np.float32)) for p in params)],
                       epsilon=1e-5)

    def model(self, name: str, inputs, outputs, opset: int) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="tunaflow")
        model.ir_version = 8
        onnx.checker.check_model(model)
        return model


def _io(name: str, shape: list[int]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def cnn() -> onnx.ModelProto:
    b = Builder(SEED)

    def conv_bn(x: str, cin: int, cout: int, k: int, stride: int, relu: bool) -> str:
        w = b.weight("conv_w", (cout, cin, k, k), cin * k * k)
        y = b.batchnorm(b.op("Conv", [x, w], kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4), cout)
        return b.op("Relu", [y]) if relu else y

    def block(x: str, cin: int, cout: int, stride: int) -> str:
        y = conv_bn(conv_bn(x, cin, cout, 3, stride, True), cout, cout, 3, 1, False)
        skip = x if stride == 1 and cin == cout else conv_bn(x, cin, cout, 1, stride, False)
        return b.op("Relu", [b.op("Add", [y, skip])])

    x = conv_bn("input", 3, 16, 3, 1, True)
    x = b.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    for cin, cout, stride in ((16, 16, 1), (16, 16, 1), (16, 32, 2), (32, 64, 2)):
        x = block(x, cin, cout, stride)
    x = b.op("Flatten", [b.op("GlobalAveragePool", [x])], axis=1)
    w, bias = b.weight("fc_w", (10, 64), 64), b.weight("fc_b", (10,), 1)
    b.nodes.append(helper.make_node("Gemm", [x, w, bias], ["logits"], name="fc", transB=1))
    return b.model("cnn", [_io("input", [1, 3, 64, 64])], [_io("logits", [1, 10])], 13)


def mlp() -> onnx.ModelProto:
    b = Builder(SEED + 1)
    w1, b1 = b.weight("w1", (256, 784), 784), b.weight("b1", (256,), 16)
    x = b.op("Relu", [b.op("Gemm", ["input", w1, b1], transB=1)])
    w2, b2 = b.weight("w2", (256, 128), 256), b.weight("b2", (128,), 16)
    x = b.op("Tanh", [b.batchnorm(b.op("Gemm", [x, w2, b2]), 128)])
    w3, b3 = b.weight("w3", (128, 10), 128), b.weight("b3", (10,), 16)
    x = b.op("Add", [b.op("MatMul", [x, w3]), b3])
    b.nodes.append(helper.make_node("Softmax", [x], ["probs"], name="softmax", axis=-1))
    return b.model("mlp", [_io("input", [16, 784])], [_io("probs", [16, 10])], 13)


def transformer(seq: int = 64, hidden: int = 128, heads: int = 4, ffn: int = 512) -> onnx.ModelProto:
    b = Builder(SEED + 2)
    d = hidden // heads
    i64 = np.int64

    def linear(x: str, cin: int, cout: int) -> str:
        return b.op("Add", [b.op("MatMul", [x, b.weight("w", (cin, cout), cin)]), b.weight("b", (cout,), 16)])

    def layer_norm(x: str) -> str:
        scale = b.const("ln_scale", b.rng.uniform(0.8, 1.2, hidden).astype(np.float32))
        return b.op("LayerNormalization", [x, scale, b.weight("ln_bias", (hidden,), 16)], axis=-1, epsilon=1e-5)

    shape = b.op("Shape", ["input"])
    dims = [b.op("Unsqueeze", [b.op("Gather", [shape, b.const("idx", np.array(i, i64))], axis=0),
                               b.const("axes", np.array([0], i64))]) for i in (0, 1)]
    head_shape = b.op("Concat", [*dims, b.const("heads", np.array([heads, d], i64))], axis=0)

    def split_heads(x: str, perm: list[int]) -> str:
        return b.op("Transpose", [b.op("Reshape", [x, head_shape])], perm=perm)

    q = split_heads(linear("input", hidden, hidden), [0, 2, 1, 3])
    k = split_heads(linear("input", hidden, hidden), [0, 2, 3, 1])
    v = split_heads(linear("input", hidden, hidden), [0, 2, 1, 3])
    scores = b.op("Div", [b.op("MatMul", [q, k]), b.const("sqrt_d", np.array(np.sqrt(d), np.float32))])
    ctx = b.op("MatMul", [b.op("Softmax", [scores], axis=-1), v])
    ctx = b.op("Reshape", [b.op("Transpose", [ctx], perm=[0, 2, 1, 3]), b.const("shape", np.array([1, seq, hidden],
                                                                                                  i64))])
    x = layer_norm(b.op("Add", [linear(ctx, hidden, hidden), "input"]))
    h = linear(x, hidden, ffn)
    erf = b.op("Erf", [b.op("Div", [h, b.const("sqrt2", np.array(np.sqrt(2), np.float32))])])
    gelu = b.op("Mul", [b.op("Mul", [h, b.op("Add", [erf, b.const("one", np.array(1, np.float32))])]),
                        b.const("half", np.array(0.5, np.float32))])
    y = b.op("Add", [linear(gelu, ffn, hidden), x])
    scale = b.const("ln_scale", b.rng.uniform(0.8, 1.2, hidden).astype(np.float32))
    b.nodes.append(helper.make_node("LayerNormalization", [y, scale, b.weight("ln_bias", (hidden,), 16)], ["output"],
                                    name="ln_out", axis=-1, epsilon=1e-5))
    return b.model("transformer", [_io("input", [1, seq, hidden])], [_io("output", [1, seq, hidden])], 17)


MODELS = {"cnn": cnn, "mlp": mlp, "transformer": transformer}


def main(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, make in MODELS.items():
        path = out_dir / f"{name}.onnx"
        onnx.save(make(), str(path))
        print(f"{path}  {path.stat().st_size / 1024:.0f} KiB")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "models")
