"""Seeded random transformer graphs for differential fuzzing, written as exporters write them.

Encoder and decoder layers of random width (1-4 heads of 8-32 lanes, feed-forward 2-4x wide, 1-2 layers)
over float hidden states or int64 token ids (a word-embedding Gather plus position embeddings and a
LayerNorm), pre- or post-norm, LayerNormalization as the op or decomposed (ReduceMean, Sub, Pow, Sqrt,
Div), attention with separate or fused-then-Split Q/K/V projections, K transposed directly or by its own
Transpose, the scale on the scores or on Q, an int64 padding mask turned into an additive bias as Hugging
Face writes it (Cast, Sub, Mul by float32's minimum) and/or a causal mask (a constant Where), GELU in both
forms or ReLU in the feed-forward, sometimes a class-token select (Gather of index 0 on the sequence
axis) and a tanh pooler. Same `Case` as the CNN fuzzer, so `fuzz_check.check` judges them."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from stages.runtime.feeds import padding_mask
from support.fuzz_graphs import OPSET, Case, _Net

MAX_FLOPS = 30e6


class _Tx(_Net):
    def weight(self, rows: int, cols: int) -> str:
        return self.const("w", self.rng.standard_normal((rows, cols)) / np.sqrt(rows))

    def linear(self, x: str, cols: int) -> str:
        *lead, rows = self.shapes[x]
        y = self.op("MatMul", [x, self.weight(rows, cols)], (*lead, cols))
        return self.op("Add", [y, self.const("b", self.rng.uniform(-0.2, 0.2, cols))], (*lead, cols))

    def layer_norm(self, x: str) -> tuple[str, str]:
        s = self.shapes[x]
        gamma = self.const("g", 1 + 0.1 * self.rng.standard_normal(s[-1]))
        beta = self.const("be", 0.1 * self.rng.standard_normal(s[-1]))
        eps = self.pick([1e-5, 1e-12, 1e-6])
        if self.chance(0.6):
            return self.op("LayerNormalization", [x, gamma, beta], s, axis=-1, epsilon=eps), "ln"
        red = (*s[:-1], 1)
        mean = self.op("ReduceMean", [x], red, axes=[-1])
        centred = self.op("Sub", [x, mean], s)
        var = self.op("ReduceMean", [self.op("Pow", [centred, self.const("c", 2.0)], s)], red, axes=[-1])
        std = self.op("Sqrt", [self.op("Add", [var, self.const("c", eps)], red)], red)
        normed = self.op("Div", [centred, std], s)
        return self.op("Add", [self.op("Mul", [normed, gamma], s), beta], s), "ln*"

    def heads(self, x: str, b: int, s: int, h: int, d: int, perm: list[int]) -> str:
        split = self.op("Reshape", [x, self.const("shape", [b, s, h, d], np.int64)], (b, s, h, d))
        shape = tuple((b, s, h, d)[p] for p in perm)
        return self.op("Transpose", [split], shape, perm=perm)


def _attention(net: _Tx, x: str, b: int, s: int, h: int, d: int, bias: str | None) -> tuple[str, str]:
    hidden = h * d
    words = []
    if net.chance(0.4):  # one fused projection, split in three (GPT-2's c_attn)
        qkv = net.linear(x, 3 * hidden)
        outs = [net.fresh("split_") for _ in range(3)]
        net.nodes.append(helper.make_node("Split", [qkv, net.const("sizes", [hidden] * 3, np.int64)], outs,
                                          name=net.fresh("Split"), axis=-1))
        for o in outs:
            net.shapes[o] = (b, s, hidden)
        q, k, v = outs
        words.append("qkv")
    else:
        q, k, v = (net.linear(x, hidden) for _ in range(3))
    scale = 1 / np.sqrt(d)
    scale_q = net.chance(0.3)
    if scale_q:
        q = net.op("Mul", [q, net.const("c", scale)], (b, s, hidden))
    qh = net.heads(q, b, s, h, d, [0, 2, 1, 3])
    if net.chance(0.5):
        kt = net.heads(k, b, s, h, d, [0, 2, 3, 1])
        words.append("kT")
    else:
        kh = net.heads(k, b, s, h, d, [0, 2, 1, 3])
        kt = net.op("Transpose", [kh], (b, h, d, s), perm=[0, 1, 3, 2])
    scores = net.op("MatMul", [qh, kt], (b, h, s, s))
    if not scale_q:
        scores = (net.op("Div", [scores, net.const("c", np.sqrt(d))], (b, h, s, s)) if net.chance(0.5)
                  else net.op("Mul", [scores, net.const("c", scale)], (b, h, s, s)))
    if bias is not None:
        scores = net.op("Add", [scores, bias], (b, h, s, s))
    probs = net.op("Softmax", [scores], (b, h, s, s), axis=-1)
    ctx = net.op("MatMul", [probs, net.heads(v, b, s, h, d, [0, 2, 1, 3])], (b, h, s, d))
    merged = net.op("Transpose", [ctx], (b, s, h, d), perm=[0, 2, 1, 3])
    flat = net.op("Reshape", [merged, net.const("shape", [b, s, hidden], np.int64)], (b, s, hidden))
    return net.linear(flat, hidden), "attn" + ("[" + ",".join(words) + "]" if words else "")


def _feed_forward(net: _Tx, x: str, ffn: int) -> tuple[str, str]:
    hidden = net.shapes[x][-1]
    y, kind = net.act(net.linear(x, ffn), net.pick(["gelu", "gelu", "gelu_tanh", "relu"]))
    return net.linear(y, hidden), f"ffn+{kind}"


def _mask_bias(net: _Tx, b: int, s: int, padding: bool, causal: bool) -> str | None:
    """The additive attention bias: padding from the int64 `attention_mask` input, causal as a constant."""
    bias = None
    if padding:
        m = net.op("Cast", ["attention_mask"], (b, s), to=TensorProto.FLOAT)
        m4 = net.op("Unsqueeze", [m, net.const("axes", [1, 2], np.int64)], (b, 1, 1, s))
        inv = net.op("Sub", [net.const("c", 1.0), m4], (b, 1, 1, s))
        bias = net.op("Mul", [inv, net.const("c", np.finfo(np.float32).min)], (b, 1, 1, s))
    if causal:
        name = net.const("causal", np.tril(np.ones((s, s), dtype=bool)), bool)
        base = bias if bias is not None else net.const("c", 0.0)
        shape = (b, 1, s, s) if bias is not None else (s, s)
        bias = net.op("Where", [name, base, net.const("c", np.finfo(np.float32).min)], shape)
    return bias


def make_transformer_case(seed: int, index: int) -> Case:
    rng = np.random.default_rng([seed, index, 7])
    net = _Tx(rng)
    b = 2 if net.chance(0.2) else 1
    h = int(net.pick([1, 2, 4]))
    d = int(net.pick([8, 16, 24, 32]))
    hidden, mult, layers = h * d, int(net.pick([2, 4])), 1 if net.chance(0.6) else 2
    ffn = hidden * mult
    per_token = layers * (8 * hidden * hidden + 4 * hidden * ffn)
    s = int(rng.integers(1, 71))
    while s > 1 and b * s * (per_token + layers * 4 * s * hidden) > MAX_FLOPS:
        s = max(1, s * 3 // 4)
    tokens, padding, causal = net.chance(0.5), net.chance(0.5), net.chance(0.4)
    threads = int(net.pick([1, 2]))
    inputs, feeds, words = [], {}, [f"t{threads} {b}x{s} h{h}x{d} ffn{ffn}"]
    if tokens:
        vocab = int(rng.integers(20, 300))
        ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, [b, s])
        inputs.append(ids)
        feeds["input_ids"] = rng.integers(0, vocab, (b, s), dtype=np.int64)
        emb = net.op("Gather", [net.const("emb", rng.standard_normal((vocab, hidden))), "input_ids"], (b, s, hidden),
                     axis=0)
        x = net.op("Add", [emb, net.const("pos", 0.5 * rng.standard_normal((s, hidden)))], (b, s, hidden))
        x, norm = net.layer_norm(x)
        words.append(f"ids<{vocab} emb+{norm}")
    else:
        inputs.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, [b, s, hidden]))
        feeds["x"] = rng.standard_normal((b, s, hidden)).astype(np.float32)
        x = "x"
        net.shapes[x] = (b, s, hidden)
    if padding:
        inputs.append(helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [b, s]))
        feeds["attention_mask"] = padding_mask((b, s), np.int64)
        words.append("pad")
    if causal:
        words.append("causal")
    bias = _mask_bias(net, b, s, padding, causal)
    pre = net.chance(0.5)
    for _ in range(layers):
        for block in (lambda y: _attention(net, y, b, s, h, d, bias), lambda y: _feed_forward(net, y, ffn)):
            if pre:
                normed, norm = net.layer_norm(x)
                y, word = block(normed)
                x = net.op("Add", [x, y], (b, s, hidden))
                words.append(f"{norm}>{word}+x")
            else:
                y, word = block(x)
                x, norm = net.layer_norm(net.op("Add", [x, y], (b, s, hidden)))
                words.append(f"{word}+x>{norm}")
    if pre:
        x, norm = net.layer_norm(x)
        words.append(norm)
    outputs = [x]
    if net.chance(0.3):  # the class token, pooled
        first = net.op("Gather", [x, net.const("idx", 0, np.int64)], (b, hidden), axis=1)
        pooled = net.op("Tanh", [net.linear(first, hidden)], (b, hidden))
        outputs.append(pooled)
        words.append("cls>pool")
    results = [helper.make_tensor_value_info(o, TensorProto.FLOAT, list(net.shapes[o])) for o in outputs]
    graph = helper.make_graph(net.nodes, f"fuzz_tx_{seed}_{index}", inputs, results, net.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="fuzz")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return Case(seed, index, model, feeds, threads, " ".join(words))
