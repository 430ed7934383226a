"""Float islands between a DequantizeLinear and a QuantizeLinear, as onnxruntime computes them (part of the quant
pass, passes_quant.py). Computing them in float as ONNX defines them rounds differently from onnxruntime's kernels
now and then; one step flipped inside a network reaches the logits as several, so each island becomes an int8
node with onnxruntime's arithmetic (reference_quant.py gives it; tests/test_quant_islands.py checks it bit for bit):

- DQ -> Sigmoid -> Q: `qlut`, the 256-entry table QLinearSigmoid builds (MLAS's logistic polynomial).
- DQ(a) * DQ(b) -> Q (numpy broadcasting; b may be a quantized constant): `qmul`, QLinearMul's float32 rounding.
  A `qmul` of a tensor by its own `qlut` (SiLU/Swish) becomes one `qlut` of the composed table.
- DQ -> ReduceMean over H, W (keepdims) -> [Reshape] -> Q: `qmean`; onnxruntime keeps it in float, summing in
  the order of the layout it runs the tensor in (`_layout`): NHWC inside a squeeze-excite block (a running sum
  per channel), NCHW before the classifier (Eigen's vectorised sum of each plane).
- DQ -> BatchNormalization -> [Relu] -> Q: `qbatchnorm`, its float kernel: x * scale' + bias' with the scale and
  bias folded in float32 (scale / sqrt(var + eps), bias - mean * scale').
- DQ(x_0), ..., DQ(x_k) -> Concat over channels -> Q with scales that differ (equal ones move the integers,
  passes_quant.py): `qconcat`, each input's bytes mapped through the 256-entry table of Q(DQ_i(byte)), the
  values the float chain gives (DenseNet-121 re-concatenates every earlier feature map in float before each
  layer: 58 float concats and their QuantizeLinears were 13% of its int8 time, on one thread).
"""

from __future__ import annotations

import numpy as np

from stages.graph.ir import Graph, Node, Value
from stages.graph.passes_quant import _const, _const_dq, _qparams, _run_time_dq, dtype_of, one_type, shifts
from stages.graph.reference_quant import LUT_FUNCTIONS, QUANT_OPS, dequantize, lookup_table, quantize

# Ops the layout search walks through to the ops that decide onnxruntime's layout of a ReduceMean.
_LAYOUT_NEUTRAL = ("QuantizeLinear", "DequantizeLinear", "qadd", "qmul", "qlut", "Relu", "Clip")
_NHWC_OPS = ("qconv2d", "qavgpool", "MaxPool", "Conv")


def quantize_islands(g: Graph, shifted: set[str]) -> None:
    """`shifted`: the int8 tensors onnxruntime runs as uint8 (passes_quant.u8_pairs)."""
    for node in [n for n in g.nodes if n.op in LUT_FUNCTIONS]:
        _lookup(g, node)
    for node in [n for n in g.nodes if n.op == "Mul"]:
        _mul(g, node, shifted)
    for node in [n for n in g.nodes if n.op == "qmul"]:
        _compose_lookup(g, node)
    for node in [n for n in g.nodes if n.op == "BatchNormalization"]:
        _batch_norm(g, node)
    for node in [n for n in g.nodes if n.op == "ReduceMean"]:
        _reduce_mean(g, node)
    for node in [n for n in g.nodes if n.op == "Concat"]:
        _concat(g, node)


def _island(g: Graph, node: Node, inputs: int = 1, constant: bool = False) -> tuple[list[Node], Node] | None:
    """The per-tensor run-time DequantizeLinear nodes feeding `node`'s first `inputs` inputs and the per-tensor
    QuantizeLinear that alone reads its output, if that is the pattern; with `constant`, all but one of those
    inputs may instead be a per-tensor DequantizeLinear of an int8 constant."""
    prod, users = g.producer(), g.consumers()
    dqs = [_run_time_dq(g, i, prod) for i in node.inputs[:inputs]]
    if constant and any(d is not None for d in dqs):
        dqs = [d or _const_int8_dq(g, i, prod) for d, i in zip(dqs, node.inputs, strict=False)]
    q = g.sole_consumer(node.outputs[0], users)
    if q is None or q.op != "QuantizeLinear" or q.attrs.get("axis") is not None or any(d is None for d in dqs):
        return None
    return dqs, q  # type: ignore[return-value]


def _const_int8_dq(g: Graph, name: str, prod: dict[str, Node]) -> Node | None:
    """The per-tensor DequantizeLinear of an int8 / uint8 constant producing `name`, if that is what does."""
    dq = _const_dq(g, name, prod)
    if dq is None or dq.attrs.get("axis") is not None or g.constants[dq.inputs[1]].size != 1 \
            or g.constants[dq.inputs[0]].dtype.name not in ("uint8", "int8"):
        return None
    return dq


def _params(g: Graph, dq: Node, q: Node) -> dict:
    (sx, zx, _), (sy, zy, _) = _qparams(g, dq), _qparams(g, q)
    return {"x_scale": float(sx[0]), "x_zero_point": int(zx[0]), "y_scale": float(sy[0]),
            "y_zero_point": int(zy[0]), "y_dtype": g.constants[q.inputs[2]].dtype.name}


def _replace(g: Graph, node: Node, new: Node, gone: list[Node]) -> None:
    dead = {id(n) for n in gone}
    g.nodes = [new if n is node else n for n in g.nodes if id(n) not in dead]


def _lookup(g: Graph, node: Node) -> None:
    found = _island(g, node)
    if found is None:
        return
    (dq,), q = found
    p = _params(g, dq, q)
    if g.values[dq.inputs[0]].dtype != p["y_dtype"]:
        return
    table = lookup_table(node.op, p["x_scale"], p["x_zero_point"], p["y_scale"], p["y_zero_point"], p["y_dtype"])
    new = Node(node.name, "qlut", [dq.inputs[0], _const(g, f"{node.name}.table", table)], list(q.outputs),
               {"fn": node.op, "y_dtype": p["y_dtype"]})
    _replace(g, node, new, [q])


def _mul(g: Graph, node: Node, shifted: set[str]) -> None:
    """Also with one operand a quantized constant (hardswish's / 6, a gelu's 0.5 and 0.044715): QLinearMul's
    scalar path computes as its vector one (matched on all 256 inputs for 400 scale sets, 300 a hair from a tie;
    ONNX's float definition misses 42). Only where onnxruntime fuses (`one_type`: with a constant, not where it
    shifts the int8 operand or output into uint8, since the constant stays int8)."""
    found = _island(g, node, 2, constant=True)
    if found is None:
        return
    (da, db), q = found
    a, b = (d.inputs[0] for d in (da, db))
    pa, pb = _params(g, da, q), _params(g, db, q)
    sh = shifts({"y_shift": q.outputs[0]}, shifted)
    if {dtype_of(g, a), dtype_of(g, b)} != {pa["y_dtype"]} or not one_type(g, [a, b, q.outputs[0]], shifted):
        return
    f = np.float32
    ratio = f(pa["x_scale"]) * f(pb["x_scale"]) / f(pa["y_scale"])
    attrs = {"a_zero_point": pa["x_zero_point"], "b_zero_point": pb["x_zero_point"], "ratio": float(ratio),
             "y_zero_point": pa["y_zero_point"], "y_dtype": pa["y_dtype"], **sh}
    _replace(g, node, Node(node.name, "qmul", [a, b], list(q.outputs), attrs), [q])


def _compose_lookup(g: Graph, node: Node) -> None:
    """qmul(x, qlut(x)), a quantized SiLU/Swish (x * sigmoid(x)): both factors are functions of the one byte of
    x, so the product is one too, and the pair becomes one `qlut` whose table is the qmul of every byte with its
    table entry: the same bits, one pass over the tensor instead of two (EfficientNet-B0 int8 spent 40% of its
    time in these 49 pairs). Only without broadcasting, and where the table's output has no other reader."""
    prod, users = g.producer(), g.consumers()
    shape = g.values[node.outputs[0]].shape
    for k, (x, gate) in enumerate((node.inputs, node.inputs[::-1])):
        lut = prod.get(gate)
        if lut is None or lut.op != "qlut" or lut.inputs[0] != x or _live_readers(g, gate, users) != [node] \
                or g.values[x].shape != shape:
            continue
        byte = np.arange(256, dtype=np.uint8)
        xs, gs = byte.view(dtype_of(g, x)), g.constants[lut.inputs[1]].view(dtype_of(g, gate))
        table = QUANT_OPS["qmul"]([xs, gs] if k == 0 else [gs, xs], node.attrs)[0].view(np.uint8)
        new = Node(node.name, "qlut", [x, _const(g, f"{node.name}.table", table)], list(node.outputs),
                   {"fn": f"{lut.attrs['fn']}*x", "y_dtype": node.attrs["y_dtype"]})
        _replace(g, node, new, [lut])
        return


def _live_readers(g: Graph, name: str, users: dict[str, list[Node]]) -> list[Node]:
    """The nodes reading `name` whose own outputs someone reads (the islands leave their DequantizeLinear
    nodes unread until eliminate_dead); [] for a graph output."""
    if any(v.name == name for v in g.outputs):
        return []
    outs = {v.name for v in g.outputs}
    return [n for n in users.get(name, []) if any(o in users or o in outs for o in n.outputs)]


def _batch_norm(g: Graph, node: Node) -> None:
    prod, users = g.producer(), g.consumers()
    dq = _run_time_dq(g, node.inputs[0], prod)
    after = g.sole_consumer(node.outputs[0], users)
    relu = after is not None and after.op == "Relu"
    q = g.sole_consumer(after.outputs[0], users) if relu else after
    if dq is None or q is None or q.op != "QuantizeLinear" or q.attrs.get("axis") is not None \
            or any(i not in g.constants for i in node.inputs[1:5]) or len(g.values[dq.inputs[0]].shape) < 3:
        return
    f = np.float32
    scale, bias, mean, var = (g.constants[i].astype(f).reshape(-1) for i in node.inputs[1:5])
    inv_std = f(1) / np.sqrt(var + f(node.attrs.get("epsilon", 1e-5)))
    folded = inv_std * scale
    shift = bias - mean * folded
    p = _params(g, dq, q)
    new = Node(node.name, "qbatchnorm", [dq.inputs[0], _const(g, f"{node.name}.scale", folded.astype(f)),
                                         _const(g, f"{node.name}.bias", shift.astype(f))], list(q.outputs),
               {**p, "relu": int(relu)})
    _replace(g, node, new, [q, after] if relu else [q])


def _reduce_mean(g: Graph, node: Node) -> None:
    """Also DQ -> ReduceMean -> Reshape / Flatten -> Q (the global pool before a classifier): the reshape then
    moves the integers (quantizing commutes with it; onnxruntime moves its Q up the same way)."""
    users = g.consumers()
    reshape = g.sole_consumer(node.outputs[0], users)
    if reshape is None or reshape.op not in ("Reshape", "Flatten"):
        reshape = None
    found = _island(g, node) if reshape is None else _island_through(g, node, reshape)
    if found is None:
        return
    (dq,), q = found
    shape = g.values[dq.inputs[0]].shape
    if len(shape) != 4 or list(node.attrs["axes"]) != [2, 3] or not node.attrs.get("keepdims", 1):
        return
    attrs = {**_params(g, dq, q), "order": "nchw" if reshape is not None else _layout(g, dq, q.outputs[0])}
    if reshape is None:
        _replace(g, node, Node(node.name, "qmean", [dq.inputs[0]], list(q.outputs), attrs), [q])
        return
    mean = node.outputs[0]
    g.values[mean] = Value(mean, g.values[mean].shape, attrs["y_dtype"])
    reshape.outputs = list(q.outputs)
    _replace(g, node, Node(node.name, "qmean", [dq.inputs[0]], [mean], attrs), [q])


def _island_through(g: Graph, node: Node, reshape: Node) -> tuple[list[Node], Node] | None:
    """DQ -> node -> reshape -> Q: the DQ and the Q, as _island finds them around a single node."""
    dq = _run_time_dq(g, node.inputs[0], g.producer())
    q = g.sole_consumer(reshape.outputs[0], g.consumers())
    if dq is None or q is None or q.op != "QuantizeLinear" or q.attrs.get("axis") is not None:
        return None
    return [dq], q


def _layout(g: Graph, dq: Node, mean: str) -> str:
    """The layout onnxruntime runs the mean in. It runs its int8 convolutions in NHWC and moves the transposes
    back to NCHW as far down as they cancel: a mean whose result flows into another convolution (a squeeze-excite
    gate) stays NHWC; one before a Reshape or Flatten (the classifier head) or after a BatchNormalization (its
    NCHW float kernel) runs NCHW."""
    prod, users = g.producer(), g.consumers()
    node: Node | None = dq
    while node is not None and node.op in _LAYOUT_NEUTRAL:
        node = prod.get(node.inputs[0])
    if node is None or node.op in ("qbatchnorm", "BatchNormalization"):
        return "nchw"
    name = mean
    while True:
        readers = users.get(name, [])
        if not readers:
            return "nchw"
        if any(r.op in _NHWC_OPS for r in readers):
            return "nhwc"
        neutral = [r for r in readers if r.op in _LAYOUT_NEUTRAL]
        if not neutral:
            return "nchw"
        name = neutral[0].outputs[0]


def _concat(g: Graph, node: Node) -> None:
    """Over the channel axis only: the kernel copies each input's planes as one contiguous run per image."""
    rank = len(g.values[node.outputs[0]].shape)
    if rank < 2 or int(node.attrs.get("axis", 0)) % rank != 1:
        return
    found = _island(g, node, len(node.inputs))
    if found is None:
        return
    dqs, q = found
    byte = np.arange(256, dtype=np.uint8)
    params = [_params(g, dq, q) for dq in dqs]
    tables = [quantize(dequantize(byte.view(g.values[dq.inputs[0]].dtype), np.array(p["x_scale"], np.float32),
                                  np.array(p["x_zero_point"]), None),
                       np.array(p["y_scale"], np.float32), np.array(p["y_zero_point"]), None, p["y_dtype"])
              for dq, p in zip(dqs, params, strict=True)]
    attrs = {"parts": [[p["x_scale"], p["x_zero_point"]] for p in params],
             **{k: params[0][k] for k in ("y_scale", "y_zero_point", "y_dtype")}}
    table = _const(g, f"{node.name}.table", np.stack(tables).view(np.uint8))
    _replace(g, node, Node(node.name, "qconcat", [dq.inputs[0] for dq in dqs] + [table], list(q.outputs), attrs),
             [q])
