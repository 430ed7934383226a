"""Random CNN ONNX graphs for differential fuzzing: `make_case(seed, index)` is always the same model.

Graphs are chains of blocks (convs with any stride, padding, dilation and grouping, BatchNormalization,
pools, residual and projection blocks, inverted residuals, concatenated branches, squeeze-and-excitation,
global pooling, a Flatten+Gemm head), with activations written as exporters write them (SiLU as
`Mul(x, Sigmoid(x))`, both GELU forms as elementary ops, ReLU6 as Clip). Sizes are capped (FLOPs,
floats per tensor) so one case builds and runs in about a second.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
MAX_FLOPS = 30e6  # per graph
MAX_FLOATS = 120_000  # per tensor
LARGE = 3  # a tenth of the cases get caps this many times larger: packed conv inputs past L2 (1 MB)
MAX_CHANNELS = 300


@dataclass(frozen=True)
class Case:
    seed: int
    index: int
    model: onnx.ModelProto
    feeds: dict[str, np.ndarray]
    threads: int
    description: str

    @property
    def name(self) -> str:
        return f"seed {self.seed} case {self.index}"


class _Net:
    """Accumulates ONNX nodes and initializers, tracking every value's shape and the FLOPs spent."""

    def __init__(self, rng: np.random.Generator, scale: int = 1):
        self.rng = rng
        self.max_flops, self.max_floats = MAX_FLOPS * scale, MAX_FLOATS * scale
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.flops = 0.0
        self.count = 0

    def fresh(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def const(self, prefix: str, value, dtype=np.float32) -> str:
        name = self.fresh(prefix)
        arr = np.asarray(value, dtype)
        self.inits.append(numpy_helper.from_array(arr, name))
        self.shapes[name] = arr.shape
        return name

    def op(self, op_type: str, inputs: list[str], shape: tuple[int, ...], **attrs) -> str:
        out = self.fresh(op_type.lower() + "_")
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=self.fresh(op_type), **attrs))
        self.shapes[out] = shape
        return out

    def pick(self, options, p=None):
        return options[int(self.rng.choice(len(options), p=p))]

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    # ---- activations, as exporters write them -------------------------------------------------

    def act(self, x: str, kind: str | None = None) -> tuple[str, str]:
        kind = kind or self.pick(ACTS)
        s = self.shapes[x]
        if kind == "relu":
            return self.op("Relu", [x], s), kind
        if kind == "relu6":
            return self.op("Clip", [x, self.const("lo", 0.0), self.const("hi", 6.0)], s), kind
        if kind == "sigmoid":
            return self.op("Sigmoid", [x], s), kind
        if kind == "silu":
            return self.op("Mul", [x, self.op("Sigmoid", [x], s)], s), kind
        if kind == "hardswish":  # the opset-14 op, x * HardSigmoid(x), or x * relu6(x + 3) / 6
            form = self.pick(["op", "hardsigmoid", "relu6"])
            if form == "op":
                return self.op("HardSwish", [x], s), kind
            gate = (self.op("HardSigmoid", [x], s, alpha=1 / 6, beta=0.5) if form == "hardsigmoid"
                    else self._relu6_shifted(x))
            return self.op("Mul", [x, gate], s), kind
        if kind == "hardsigmoid":
            if self.chance(0.3):
                return self._relu6_shifted(x), kind
            return self.op("HardSigmoid", [x], s, alpha=self.pick([0.2, 1 / 6]), beta=0.5), kind
        if kind == "leaky":
            return self.op("LeakyRelu", [x], s, alpha=self.pick([0.01, 0.1, 0.2])), kind
        if kind == "tanh":
            return self.op("Tanh", [x], s), kind
        if kind == "gelu":  # 0.5 * x * (1 + erf(x / sqrt(2)))
            scaled = (self.op("Div", [x, self.const("c", np.sqrt(2.0))], s) if self.chance(0.7)
                      else self.op("Mul", [x, self.const("c", 1 / np.sqrt(2.0))], s))
            one_plus = self.op("Add", [self.op("Erf", [scaled], s), self.const("c", 1.0)], s)
            return self.op("Mul", [self.op("Mul", [x, one_plus], s), self.const("c", 0.5)], s), kind
        if kind == "gelu_tanh":  # 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))
            cube = (self.op("Pow", [x, self.const("c", 3.0)], s) if self.chance(0.5)
                    else self.op("Mul", [self.op("Mul", [x, x], s), x], s))
            inner = self.op("Add", [x, self.op("Mul", [cube, self.const("c", 0.044715)], s)], s)
            t = self.op("Tanh", [self.op("Mul", [inner, self.const("c", np.sqrt(2 / np.pi))], s)], s)
            half_x = self.op("Mul", [x, self.const("c", 0.5)], s)
            return self.op("Mul", [half_x, self.op("Add", [t, self.const("c", 1.0)], s)], s), kind
        raise ValueError(kind)

    def _relu6_shifted(self, x: str) -> str:
        """relu6(x + 3) / 6, as exporters write hard sigmoid."""
        s = self.shapes[x]
        shifted = self.op("Add", [x, self.const("c", 3.0)], s)
        clipped = self.op("Clip", [shifted, self.const("lo", 0.0), self.const("hi", 6.0)], s)
        return self.op("Div", [clipped, self.const("c", 6.0)], s)

    # ---- convolutions ---------------------------------------------------------------------------

    def conv(self, x: str, cout: int | None = None, k: int | None = None, stride: int | None = None,
             same: bool = False, groups: int | None = None, dilation: int | None = None) -> tuple[str, str] | None:
        """A Conv (bias sometimes) with sampled geometry, or None if none fits the caps. `same`: stride 1
        and output size = input size (pads possibly asymmetric)."""
        n, cin, h, w = self.shapes[x]
        rng = self.rng
        k = k or self.pick([1, 3, 5, 7], [0.3, 0.45, 0.15, 0.1])
        d = dilation or (2 if k > 1 and self.chance(0.12) else 1)
        s = 1 if same else stride or self.pick([1, 2], [0.7, 0.3])
        ke = d * (k - 1) + 1
        if same:
            top, left = int(rng.integers(0, ke)), int(rng.integers(0, ke))
            if self.chance(0.6):
                top = left = ke // 2
            pads = [top, left, ke - 1 - top, ke - 1 - left]
        else:
            mode = rng.random()
            pads = ([ke // 2] * 4 if mode < 0.5 else [0] * 4 if mode < 0.75
                    else [int(v) for v in rng.integers(0, ke, 4)])
        oh, ow = (h + pads[0] + pads[2] - ke) // s + 1, (w + pads[1] + pads[3] - ke) // s + 1
        if oh < 1 or ow < 1:
            if same or k == 1:
                return None
            return self.conv(x, cout, 1, stride, same, groups, 1)
        if groups is None:
            r = rng.random()
            divisors = [g for g in range(2, cin + 1) if cin % g == 0 and g < cin]
            groups = cin if r < 0.25 else self.pick(divisors) if r < 0.35 and divisors else 1
        g = groups
        exact = cout is not None  # the caller needs this many channels (a residual Add), or nothing
        if cout is None:
            r = rng.random()
            if g == cin and g > 1:
                cout = cin * self.pick([1, 1, 2])
            else:
                cout = int(rng.integers(1, (32 if r < 0.6 else 128 if r < 0.9 else MAX_CHANNELS) + 1))
        cout = max(g, cout // g * g)
        per_out = 2.0 * (cin // g) * k * k * oh * ow * n
        fit = min(cout, MAX_CHANNELS, self.max_floats // (n * oh * ow), int((self.max_flops - self.flops) // per_out))
        fit = fit // g * g
        if fit < g or (exact and fit < cout):
            return None
        cout = fit
        self.flops += per_out * cout
        wgt = self.const("w", rng.standard_normal((cout, cin // g, k, k)) * np.sqrt(2.0 / (cin // g * k * k)))
        ins = [x, wgt] + ([self.const("b", rng.uniform(-0.3, 0.3, cout))] if self.chance(0.8) else [])
        y = self.op("Conv", ins, (n, cout, oh, ow), kernel_shape=[k, k], strides=[s, s], pads=pads,
                    dilations=[d, d], group=g)
        sym = pads[0] == pads[1] == pads[2] == pads[3]
        word = (f"conv{k}" + (f"s{s}" if s > 1 else "") + (f"d{d}" if d > 1 else "")
                + ("dw" if g == cin > 1 else f"g{g}" if g > 1 else "")
                + (f"p{pads[0]}" if sym else "p" + ",".join(map(str, pads))) + f">{cout}")
        return y, word

    def bn(self, x: str) -> str:
        c = self.shapes[x][1]
        r = self.rng
        params = [r.uniform(0.5, 1.5, c), r.uniform(-0.3, 0.3, c), r.uniform(-0.3, 0.3, c), r.uniform(0.5, 1.5, c)]
        return self.op("BatchNormalization", [x, *(self.const("bn", p) for p in params)], self.shapes[x],
                       epsilon=1e-5)

    def conv_unit(self, x: str, act_p: float = 0.6, **kw) -> tuple[str, str] | None:
        """conv [+ BN] [+ activation]."""
        made = self.conv(x, **kw)
        if made is None:
            return None
        y, word = made
        if self.chance(0.4):
            y, word = self.bn(y), word + "+bn"
        if self.chance(act_p):
            y, kind = self.act(y)
            word += "+" + kind
        return y, word


ACTS = ("relu", "relu6", "sigmoid", "silu", "hardswish", "hardsigmoid", "leaky", "tanh", "gelu", "gelu_tanh")


# ---- blocks: each takes the current tensor and returns (new tensor, description) or None -----------

def _conv_block(net: _Net, x: str):
    return net.conv_unit(x)


def _pool(net: _Net, x: str):
    n, c, h, w = net.shapes[x]
    kind = net.pick(["MaxPool", "AveragePool"])
    k = [min(int(net.rng.integers(1, 4)), dim) for dim in (h, w)]
    s = net.pick([1, 2], [0.4, 0.6])
    pads = [int(net.rng.integers(0, k[i % 2])) if net.chance(0.5) else 0 for i in range(4)]
    if net.chance(0.3):  # Inception's kind: stride 1, the input's size kept (pads split either way)
        s, first = 1, [int(net.rng.integers(0, kk)) for kk in k]
        pads = [*first, *(kk - 1 - f for kk, f in zip(k, first, strict=True))]
    spans = [dim + pads[i] + pads[i + 2] - k[i] for i, dim in enumerate((h, w))]
    ceil = int(net.chance(0.3))
    # A last window starting in the end padding is dropped by onnxruntime's kernel (and tunaflow, and
    # PyTorch) but kept by ONNX shape inference, which then fails a later Gemm: leave that case out.
    if ceil and any(-(-spans[i] // s) * s >= dim + pads[i] for i, dim in enumerate((h, w))):
        ceil = 0
    attrs = dict(kernel_shape=k, strides=[s, s], pads=pads, ceil_mode=ceil)
    if kind == "AveragePool":
        attrs["count_include_pad"] = int(net.chance(0.5))
    out = [(-(-span // s) if ceil else span // s) + 1 for span in spans]
    y = net.op(kind, [x], (n, c, *out), **attrs)
    word = (f"{'max' if kind == 'MaxPool' else 'avg'}{k[0]}x{k[1]}s{s}p{','.join(map(str, pads))}"
            + ("ceil" if ceil else "") + ("incl" if attrs.get("count_include_pad") else ""))
    return y, word


def _act_block(net: _Net, x: str):
    return net.act(x)


def _residual(net: _Net, x: str):
    """x + f(x): one or two shape-preserving convs, then sometimes an activation."""
    c = net.shapes[x][1]
    words = []
    y = x
    for i in range(net.pick([1, 2])):
        made = net.conv_unit(y, act_p=0.7 if i == 0 else 0.2, cout=c, same=True,
                             groups=net.pick([1, c]) if c > 1 else 1)
        if made is None:
            return None
        y, word = made
        words.append(word)
    y = net.op("Add", [x, y] if net.chance(0.5) else [y, x], net.shapes[x])
    tail = ""
    if net.chance(0.6):
        y, tail = net.act(y, "relu" if net.chance(0.6) else None)
    return y, f"res[{' '.join(words)}]{tail}"


def _down(net: _Net, x: str):
    """A projection block: conv stride 2 (odd kernel, symmetric pads) + 1x1 stride-2 shortcut, added."""
    n, c, h, w = net.shapes[x]
    k = net.pick([3, 5])
    cout = int(net.rng.integers(max(1, c), min(MAX_CHANNELS, 2 * c + 8) + 1))
    a = net.conv(x, cout=cout, k=k, stride=2, groups=1, dilation=1)
    if a is None:
        return None
    main, word = a
    main = net.pick([lambda v: net.bn(v), lambda v: v])(main)
    cout = net.shapes[main][1]
    main, kind = net.act(main, "relu")
    sc = net.conv(x, cout=cout, k=1, stride=2, groups=1)
    if sc is None or net.shapes[sc[0]] != net.shapes[main]:
        return None
    y, _ = net.act(net.op("Add", [main, sc[0]], net.shapes[main]), "relu")
    return y, f"down[{word} | {sc[1]}]"


def _inverted(net: _Net, x: str):
    """MobileNet's inverted residual: 1x1 expand, depthwise kxk, 1x1 project (+ x when shapes allow)."""
    c = net.shapes[x][1]
    e = net.conv_unit(x, act_p=1.0, cout=c * net.pick([1, 2, 4, 6]), k=1, stride=1, groups=1)
    if e is None:
        return None
    stride = net.pick([1, 2], [0.7, 0.3])
    dw = net.conv_unit(e[0], act_p=1.0, k=net.pick([3, 5]), groups=net.shapes[e[0]][1], same=stride == 1,
                       stride=stride, dilation=1)
    if dw is None:
        return None
    p = net.conv(dw[0], cout=c, k=1, stride=1, groups=1)
    if p is None:
        return None
    y = net.op("Add", [x, p[0]], net.shapes[x]) if net.shapes[p[0]] == net.shapes[x] else p[0]
    return y, f"mb[{e[1]} {dw[1]} {p[1]}{' +x' if y != p[0] else ''}]"


def _concat(net: _Net, x: str):
    """Two or three same-size branches concatenated on channels."""
    n, c, h, w = net.shapes[x]
    branches, words = [], []
    for _ in range(net.pick([2, 3])):
        r = net.rng.random()
        if r < 0.25:
            y = net.op("MaxPool", [x], (n, c, h, w), kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])
            made = (y, "max3")
        else:
            made = net.conv_unit(x, same=True, k=net.pick([1, 3, 5]), groups=1)
        if made is None:
            return None
        branches.append(made[0])
        words.append(made[1])
    channels = sum(net.shapes[b][1] for b in branches)
    if channels > MAX_CHANNELS or n * channels * h * w > net.max_floats:
        return None
    y, tail = net.op("Concat", branches, (n, channels, h, w), axis=1), ""
    if net.chance(0.5):  # DenseNet's pre-activation: BN (no conv before it to fold into) and an activation
        y, tail = net.bn(y), "+bn"
        if net.chance(0.7):
            y, kind = net.act(y)
            tail += "+" + kind
    return y, f"cat[{' | '.join(words)}]{tail}"


def _se(net: _Net, x: str):
    """Squeeze-and-excitation: x * sigmoid(conv1x1(act(conv1x1(GAP(x)))))."""
    n, c, h, w = net.shapes[x]
    g = net.op("GlobalAveragePool", [x], (n, c, 1, 1))
    r = max(1, c // net.pick([4, 8, 16]))
    a = net.conv(g, cout=r, k=1, stride=1, groups=1)
    if a is None:
        return None
    mid, kind = net.act(a[0], net.pick(["relu", "silu"]))
    b = net.conv(mid, cout=c, k=1, stride=1, groups=1)
    if b is None:
        return None
    gate = net.op("Sigmoid", [b[0]], net.shapes[b[0]])
    y = net.op("Mul", [x, gate] if net.chance(0.7) else [gate, x], net.shapes[x])
    return y, f"se[{r}{kind}]"


def _gap(net: _Net, x: str):
    n, c, h, w = net.shapes[x]
    return net.op("GlobalAveragePool", [x], (n, c, 1, 1)), "gap"


BLOCKS: list[tuple[Callable, float]] = [(_conv_block, 0.3), (_pool, 0.1), (_act_block, 0.05), (_residual, 0.14),
                                        (_down, 0.08), (_inverted, 0.12), (_concat, 0.08), (_se, 0.1), (_gap, 0.03)]


def _head(net: _Net, x: str) -> tuple[str, str]:
    n, c, h, w = net.shapes[x]
    words = []
    if h * w > 1 and net.chance(0.7):
        x, _ = _gap(net, x)
        h = w = 1
        words.append("gap")
    flat = net.op("Flatten", [x], (n, c * h * w), axis=1)
    classes = int(net.rng.integers(1, 65))
    k = c * h * w
    if 2.0 * n * k * classes + net.flops > net.max_flops:
        return flat, "flatten"
    net.flops += 2.0 * n * k * classes
    wgt = net.const("fc", net.rng.standard_normal((classes, k)) / np.sqrt(k))
    y = net.op("Gemm", [flat, wgt, net.const("fcb", net.rng.uniform(-0.3, 0.3, classes))], (n, classes), transB=1)
    return y, " ".join(words + [f"fc>{classes}"])


def make_case(seed: int, index: int) -> Case:
    rng = np.random.default_rng([seed, index])
    large = bool(rng.random() < 0.1)
    net = _Net(rng, LARGE if large else 1)
    n = 2 if net.chance(0.15) else 1
    c = int(rng.integers(1, 33)) if net.chance(0.85) else int(rng.integers(33, MAX_CHANNELS + 1))
    if net.chance(0.15):
        h, w = (int(v) for v in rng.integers(1, 8, 2))
    else:
        h = int(rng.integers(8, 81))
        w = h if net.chance(0.5) else int(rng.integers(8, 81))
    while n * c * h * w > net.max_floats:
        h, w = max(1, h * 3 // 4), max(1, w * 3 // 4)
    x = "x"
    net.shapes[x] = (n, c, h, w)
    words = [f"{n}x{c}x{h}x{w}"]
    outputs = []
    funcs, weights = zip(*BLOCKS, strict=True)
    for _ in range(int(rng.integers(1, 6))):
        block = funcs[int(rng.choice(len(funcs), p=np.array(weights) / sum(weights)))]
        if len(net.shapes[x]) != 4:
            break
        mark = len(net.nodes), len(net.inits), net.flops
        made = block(net, x)
        if made is None:  # roll the half-built block back
            del net.nodes[mark[0]:], net.inits[mark[1]:]
            net.flops = mark[2]
            continue
        if outputs == [] and net.chance(0.1):
            outputs.append(made[0])  # an intermediate tensor that is also read on
            words.append("out:")
        x, word = made
        words.append(word)
    if len(net.shapes[x]) == 4 and net.chance(0.3):
        x, word = _head(net, x)
        words.append(word)
    if x in outputs or x == "x":
        x, kind = net.act(x, "relu")
        words.append(kind)
    outputs.append(x)
    graph = helper.make_graph(
        net.nodes, f"fuzz_{seed}_{index}", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, c, h, w])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, list(net.shapes[o])) for o in outputs], net.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="fuzz")
    model.ir_version = 8
    feeds = {"x": rng.standard_normal((n, c, h, w)).astype(np.float32)}
    threads = int(net.pick([1, 2]))
    return Case(seed, index, model, feeds, threads, f"t{threads} " + ("large " if large else "") + " ".join(words))
