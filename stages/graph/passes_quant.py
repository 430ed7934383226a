"""Quantized graphs to int8 nodes (the first pass of `optimize`), as QDQ models and QLinear* imports come in.

1. Anchors: DequantizeLinear(x) and a constant DequantizeLinear(W) (and of the int32 bias, or a float
   bias) -> Conv / Gemm / MatMul -> [Relu | Clip] -> QuantizeLinear becomes one canonical `qconv2d` or
   `qdense` node (reference_quant.py gives its arithmetic): integer weights [N, ...] (zero point
   subtracted; a weight whose values minus its zero point leave int8 keeps the float form), int32 bias
   round(b / (sx * sw[n])), multiplier S = sx * sw[n] / sy in float32 (alpha folded in), Relu and Clip as
   clamps in the quantized domain (exact: quantizing is monotone). x and y are per-tensor.
2. Int8 memory-bound ops: DequantizeLinear -> MaxPool / Reshape / Flatten / Concat -> QuantizeLinear whose
   scales and zero points all agree reads and writes the integers directly (exact: max and copies commute
   with a monotone affine map); DQ(a) + DQ(b) -> Q is one `qadd` and DQ -> AveragePool -> Q one `qavgpool`
   (onnxruntime's QLinearAdd and QLinearAveragePool arithmetic); Sigmoid, Mul, ReduceMean and
   BatchNormalization between DQ and Q become `qlut`, `qmul`, `qmean`, `qbatchnorm` (passes_quant_islands.py).
3. Every DequantizeLinear of constants left becomes a float constant; every other Q/DQ runs as a
   memory-bound kernel, and whatever lies between them (a residual Add, pooling, activations) in float.

`task_fields` turns a canonical node into its TuningTask fields; the nodes keep `task = None` (a generated
loop kernel, stages/memops/quant.py) until an int8 template serves them.
"""

from __future__ import annotations

import math

import numpy as np

from stages.graph.ir import Graph, Node, Value
from stages.graph.reference_quant import dequantize, fma32, limits, quantize

ANCHOR_OPS = ("Conv", "Gemm", "MatMul")
INT8_MEMORY_OPS = ("MaxPool", "Reshape", "Flatten", "Concat")


def quantize_graph(g: Graph) -> None:
    shifted = u8_pairs(g)
    for node in [n for n in g.nodes if n.op in ANCHOR_OPS]:
        _anchor(g, node)
    for node in [n for n in g.nodes if n.op == "Add"]:
        _add(g, node, shifted)
    for node in [n for n in g.nodes if n.op == "AveragePool"]:
        _average_pool(g, node, shifted)
    for node in [n for n in g.nodes if n.op in INT8_MEMORY_OPS]:
        _memory_op(g, node)
    from stages.graph.passes_quant_islands import quantize_islands  # it builds on this module's helpers

    quantize_islands(g, shifted)
    _fold_constant_dequantize(g)


def u8_pairs(g: Graph) -> set[str]:
    """The int8 tensors onnxruntime runs as uint8 on x86, zero point + 128 (its QDQS8ToU8 rewrite): the output of a
    QuantizeLinear read by one DequantizeLinear alone (not a graph output), itself read once, by a node or as a graph
    output (onnxruntime first gives each reader its own DequantizeLinear). QLinearAdd, QLinearMul and
    QLinearAveragePool add zero points in float before rounding, so near .5 the shifted sum rounds otherwise."""
    users = g.consumers()
    outs = {v.name for v in g.outputs}
    found = set()
    for q in g.nodes:
        if q.op != "QuantizeLinear" or len(q.inputs) < 3 or q.inputs[2] not in g.constants \
                or g.constants[q.inputs[2]].dtype != np.int8:
            continue
        y = q.outputs[0]
        readers = users.get(y, [])
        if len(readers) != 1 or readers[0].op != "DequantizeLinear" or y in outs:
            continue
        dq_out = readers[0].outputs[0]
        if len(users.get(dq_out, [])) + (dq_out in outs) == 1:
            found.add(y)
    return found


def dtype_of(g: Graph, name: str) -> str:
    """The element type of a tensor, constant or computed at run time."""
    return g.constants[name].dtype.name if name in g.constants else g.values[name].dtype


def one_type(g: Graph, names: list[str], shifted: set[str]) -> bool:
    """Whether onnxruntime runs the quantized tensors `names` (run-time or constant) as one type: each is uint8 or
    an int8 one it shifts (`shifted`), or none is. Its QDQ selectors fuse DQ -> op -> Q into a QLinear op only
    then (measured for Add, Mul and AveragePool over every layout of once- and twice-read tensors); otherwise the
    op runs in float and rounds otherwise near .5, so tunaflow keeps it float too."""
    return len({dtype_of(g, n) == "uint8" or n in shifted for n in names}) == 1


def shifts(names: dict[str, str], shifted: set[str]) -> dict[str, int]:
    """`{attr: 128 or 0}` for the tensors `names` ({attr: tensor}) by whether onnxruntime runs them as uint8."""
    return {k: 128 if v in shifted else 0 for k, v in names.items()}


def task_fields(g: Graph, node: Node) -> dict:
    """The TuningTask fields (op, inputs, outputs, attrs, epilogue) of a canonical `qconv2d` / `qdense` node, as
    plain data: `TuningTask(**task_fields(g, node))` once the task schema has the int8 dtypes. X of a qdense is
    its [M, K] view; W, B, S are the node's constants."""
    a = node.attrs
    w = g.constants[node.inputs[1]]
    x_shape = g.values[node.inputs[0]].shape
    y_shape = g.values[node.outputs[0]].shape
    if node.op == "qdense":
        x_shape, y_shape = (math.prod(x_shape[:-1]), x_shape[-1]), (math.prod(y_shape[:-1]), y_shape[-1])
    inputs = [{"shape": x_shape, "dtype": a["x_dtype"]}, {"shape": w.shape, "dtype": "int8"},
              {"shape": (w.shape[0],), "dtype": "int32"}, {"shape": (w.shape[0],), "dtype": "float32"}]
    attrs = {"x_zero_point": int(a["x_zero_point"]), "y_zero_point": int(a["y_zero_point"])}
    if node.op == "qconv2d":
        attrs.update({k: tuple(a[k]) for k in ("strides", "pads", "dilations")}, group=int(a["group"]))
    epilogue = [{"kind": op["kind"], "attrs": {k: float(v) for k, v in op.items() if k != "kind"}}
                for op in a["epilogue"]]
    return {"op": node.op, "inputs": inputs, "outputs": [{"shape": y_shape, "dtype": a["y_dtype"]}],
            "attrs": attrs, "epilogue": epilogue}


# --- helpers ------------------------------------------------------------------------------------------

def _const(g: Graph, name: str, value: np.ndarray) -> str:
    """Store a constant of any dtype under `name` (suffixed if taken)."""
    base, i = name, 0
    while name in g.values or name in g.constants:
        i += 1
        name = f"{base}.{i}"
    g.constants[name] = np.ascontiguousarray(value)
    g.values[name] = Value(name, g.constants[name].shape, g.constants[name].dtype.name)
    return name


def _qparams(g: Graph, node: Node) -> tuple[np.ndarray, np.ndarray, int | None]:
    """(scale float32 1-D, zero point int64 1-D, axis) of a Q or DQ node."""
    s = g.constants[node.inputs[1]].astype(np.float32).reshape(-1)
    z = g.constants[node.inputs[2]].astype(np.int64).reshape(-1)
    return s, z, node.attrs.get("axis")


def _same_params(g: Graph, a: Node, b: Node) -> bool:
    sa, za, xa = _qparams(g, a)
    sb, zb, xb = _qparams(g, b)
    return (xa is None and xb is None and sa.tobytes() == sb.tobytes() and za.tobytes() == zb.tobytes()
            and g.constants[a.inputs[2]].dtype == g.constants[b.inputs[2]].dtype)


def _run_time_dq(g: Graph, name: str, prod: dict[str, Node]) -> Node | None:
    """The per-tensor DequantizeLinear of a run-time int8 tensor producing `name`, if that is what does."""
    dq = prod.get(name)
    if dq is None or dq.op != "DequantizeLinear" or dq.inputs[0] in g.constants or dq.attrs.get("axis") is not None:
        return None
    return dq if g.values[dq.inputs[0]].dtype in ("uint8", "int8") else None


def _const_dq(g: Graph, name: str, prod: dict[str, Node]) -> Node | None:
    dq = prod.get(name)
    if dq is None or dq.op != "DequantizeLinear" or any(i not in g.constants for i in dq.inputs):
        return None
    return dq


def _epilogue_chain(g: Graph, out: str, users: dict[str, list[Node]]) -> tuple[list[Node], Node] | None:
    """Relu / Clip nodes then the per-tensor QuantizeLinear after an anchor's output, each the sole reader."""
    chain: list[Node] = []
    while True:
        nxt = g.sole_consumer(out, users)
        if nxt is None:
            return None
        if nxt.op == "QuantizeLinear":
            return (chain, nxt) if nxt.attrs.get("axis") is None else None
        if nxt.op not in ("Relu", "Clip"):
            return None
        chain.append(nxt)
        out = nxt.outputs[0]


# --- 1. anchors ---------------------------------------------------------------------------------------

def _anchor(g: Graph, node: Node) -> None:
    prod, users = g.producer(), g.consumers()
    dq_x = _run_time_dq(g, node.inputs[0], prod)
    dq_w = _const_dq(g, node.inputs[1], prod)
    tail = _epilogue_chain(g, node.outputs[0], users)
    if dq_x is None or dq_w is None or tail is None:
        return
    chain, q = tail
    weights = _weights(g, node, dq_w)
    if weights is None:
        return
    w, sw = weights
    sx, zx, _ = _qparams(g, dq_x)
    sy, zy, _ = _qparams(g, q)
    alpha = np.float32(node.attrs.get("alpha", 1.0)) if node.op == "Gemm" else np.float32(1)
    multiplier = (np.float32(sx[0]) * sw) / np.float32(sy[0]) * alpha
    bias = _bias(g, node, prod, np.float32(sx[0]) * sw, w.shape[0], float(alpha))
    if bias is None:
        return
    y_dtype = g.constants[q.inputs[2]].dtype.name
    epilogue = [_clamp(op, sy[0], int(zy[0]), y_dtype) for op in chain]
    attrs = {"x_zero_point": int(zx[0]), "y_zero_point": int(zy[0]), "x_dtype": g.values[dq_x.inputs[0]].dtype,
             "y_dtype": y_dtype, "epilogue": epilogue}
    if node.op == "Conv":
        attrs.update({k: list(node.attrs[k]) for k in ("strides", "pads", "dilations")}, group=int(node.attrs["group"]))
    new = Node(node.name, "qconv2d" if node.op == "Conv" else "qdense",
               [dq_x.inputs[0], _const(g, f"{node.name}.w_q", w), _const(g, f"{node.name}.b_q", bias),
                _const(g, f"{node.name}.requant", multiplier.astype(np.float32))], list(q.outputs), attrs)
    gone = {id(n) for n in (*chain, q)}
    g.nodes = [new if n is node else n for n in g.nodes if id(n) not in gone]


def _weights(g: Graph, node: Node, dq_w: Node) -> tuple[np.ndarray, np.ndarray] | None:
    """int8 weights laid out [N, ...] (dense: [N, K]) with their zero point taken out, and their scale per N."""
    raw = g.constants[dq_w.inputs[0]]
    s, z, axis = _qparams(g, dq_w)
    if raw.dtype.name not in ("int8", "uint8"):
        return None
    n_axis = 0
    if node.op == "MatMul" or (node.op == "Gemm" and not node.attrs.get("transB", 0)):
        n_axis = 1
    if node.op == "Gemm" and node.attrs.get("transA", 0) or raw.ndim != (4 if node.op == "Conv" else 2):
        return None
    if axis is not None and axis != n_axis:
        return None
    n = raw.shape[n_axis]
    zero = z.reshape((-1,) + (1,) * (raw.ndim - n_axis - 1)) if axis is not None else z[0]
    w = raw.astype(np.int64) - zero
    if w.min() < -128 or w.max() > 127:
        return None
    if n_axis == 1:
        w = w.T
    return w.astype(np.int8), np.broadcast_to(s, (n,)).astype(np.float32)


def _bias(g: Graph, node: Node, prod: dict[str, Node], bias_scale: np.ndarray, n: int, alpha: float) \
        -> np.ndarray | None:
    """The int32 bias, in units of the accumulator (which the multiplier scales by sx * sw * alpha / sy): the
    quantizer's integers when their scale is sx * sw, else the float bias rounded."""
    if len(node.inputs) < 3 or not node.inputs[2]:
        return np.zeros(n, np.int32)
    name = node.inputs[2]
    dq = _const_dq(g, name, prod)
    if dq is not None:
        raw = g.constants[dq.inputs[0]]
        s, z, _ = _qparams(g, dq)
        if raw.dtype == np.int32 and raw.size == n and not z.any() and np.broadcast_to(s, (n,)).tobytes() == \
                bias_scale.tobytes() and node.attrs.get("beta", 1.0) == 1.0 and alpha == 1.0:
            return raw.reshape(-1).astype(np.int32)
        value = dequantize(raw, g.constants[dq.inputs[1]], g.constants[dq.inputs[2]], dq.attrs["axis"])
    elif name in g.constants:
        value = g.constants[name]
    else:
        return None
    value = np.asarray(value, np.float64) * node.attrs.get("beta", 1.0)
    if value.size not in (1, n):
        return None
    exact = np.rint(np.broadcast_to(value.reshape(-1), (n,)) / (bias_scale.astype(np.float64) * alpha))
    if np.abs(exact).max(initial=0) >= 2 ** 31:
        return None
    return exact.astype(np.int32)


def _clamp(op: Node, sy: float, zy: int, dtype: str) -> dict:
    """Relu / Clip after the anchor as a clamp of the quantized output (Q(clip(y)) = clip(Q(y)): Q is monotone)."""
    if op.op == "Relu":
        return {"kind": "relu"}
    lo, hi = limits(dtype)
    bounds = [float(op.attrs.get("min", -np.inf)), float(op.attrs.get("max", np.inf))]
    qs = [int(quantize(np.array([np.clip(b, -3e38, 3e38)], np.float32), np.array(sy), np.array(zy), None, dtype)[0])
          for b in bounds]
    return {"kind": "clip", "min": max(lo, qs[0]), "max": min(hi, qs[1])}


# --- 2. int8 memory-bound ops ---------------------------------------------------------------------------

def _add(g: Graph, node: Node, shifted: set[str]) -> None:
    """DQ(a) + DQ(b) -> Q of equal shapes: `qadd`, y = saturate(round(fma(a, ra, fma(b, rb, offset)))) with
    ra = sa / sy, rb = sb / sy, offset = zy - fma(ra, za, rb * zb), all float32: how onnxruntime's fused
    QLinearAdd rounds on x86 (its AVX2 kernel; the compiler contracts the offset's multiply-add into an fma),
    matched on every pair of uint8 values for 300 random scale sets (tests/test_quant_islands.py runs 60; a
    plain multiply-add offset misses one set in twenty by a step somewhere; the float DQ, Add, Q of ONNX's
    definition misses now and then). Int8 tensors onnxruntime runs as uint8 (`u8_pairs`) are shifted likewise; only
    where onnxruntime fuses (`one_type`)."""
    prod, users = g.producer(), g.consumers()
    dqs = [_run_time_dq(g, i, prod) for i in node.inputs]
    q = g.sole_consumer(node.outputs[0], users)
    if q is None or q.op != "QuantizeLinear" or q.attrs.get("axis") is not None:
        return
    if any(d is None for d in dqs):
        _add_scalar(g, node, q, dqs, shifted)
        return
    a, b = (d.inputs[0] for d in dqs)
    y_dtype = g.constants[q.inputs[2]].dtype.name
    if g.values[a].shape != g.values[b].shape or {g.values[a].dtype, g.values[b].dtype} != {y_dtype} \
            or not one_type(g, [a, b, q.outputs[0]], shifted):
        return
    (sa, za, _), (sb, zb, _), (sy, zy, _) = (_qparams(g, n) for n in (*dqs, q))
    f = np.float32
    sh = shifts({"a_shift": a, "b_shift": b, "y_shift": q.outputs[0]}, shifted)
    ra, rb = f(sa[0]) / f(sy[0]), f(sb[0]) / f(sy[0])
    offset = f(zy[0] + sh["y_shift"]) - fma32(ra, f(za[0] + sh["a_shift"]), rb * f(zb[0] + sh["b_shift"]))
    attrs = {"a_ratio": float(ra), "b_ratio": float(rb), "offset": float(offset), "y_dtype": y_dtype, **sh}
    new = Node(node.name, "qadd", [a, b], list(q.outputs), attrs)
    g.nodes = [new if n is node else n for n in g.nodes if n is not q]


def _add_scalar(g: Graph, node: Node, q: Node, dqs: list[Node | None], shifted: set[str]) -> None:
    """DQ(x) + DQ(constant scalar) -> Q (hardswish's + 3, gelu's 1 + tanh): a one-input `qadd` whose offset holds
    the constant, y = saturate(round(fma(x, rx, fma(c, rc, zy - fma(rx, zx, rc * zc))))): QLinearAdd's scalar path
    (the constant's term folded into its fixed part by a multiply-add), matched on all 256 inputs for 400 scale
    sets, 300 of them a hair from a tie (ONNX's float definition misses 98). Only where onnxruntime fuses
    (`one_type`): where it shifts the int8 operand or output into uint8, the int8 constant stays int8."""
    prod = g.producer()
    consts = [_const_dq(g, i, prod) if d is None else None for i, d in zip(node.inputs, dqs, strict=True)]
    run = [d for d in dqs if d is not None]
    const = next((c for c in consts if c is not None), None)
    if len(run) != 1 or const is None or const.attrs.get("axis") is not None:
        return
    x, raw = run[0].inputs[0], g.constants[const.inputs[0]]
    y_dtype = g.constants[q.inputs[2]].dtype.name
    if raw.size != 1 or g.values[x].dtype != y_dtype or raw.dtype.name != y_dtype \
            or g.values[x].shape != g.values[node.outputs[0]].shape \
            or not one_type(g, [x, const.inputs[0], q.outputs[0]], shifted):
        return
    (sx, zx, _), (sc, zc, _), (sy, zy, _) = (_qparams(g, n) for n in (run[0], const, q))
    if sc.size != 1 or zc.size != 1:
        return
    f = np.float32
    rx, rc = f(sx[0]) / f(sy[0]), f(sc[0]) / f(sy[0])
    fixed = f(zy[0]) - fma32(rx, f(zx[0]), rc * f(zc[0]))
    offset = fma32(f(raw.reshape(-1)[0]), rc, fixed)
    attrs = {"a_ratio": float(rx), "offset": float(offset), "y_dtype": y_dtype}
    new = Node(node.name, "qadd", [x], list(q.outputs), attrs)
    g.nodes = [new if n is node else n for n in g.nodes if n is not q]


def _average_pool(g: Graph, node: Node, shifted: set[str]) -> None:
    """DQ -> AveragePool -> Q: `qavgpool`, the window sum of dequantized values in float32 (rows, then columns),
    divided by its count, then y = saturate(round(avg / sy + zy)), onnxruntime's QLinearAveragePool rounding.
    Only where onnxruntime fuses it (`one_type`)."""
    prod, users = g.producer(), g.consumers()
    dq = _run_time_dq(g, node.inputs[0], prod)
    q = g.sole_consumer(node.outputs[0], users)
    if dq is None or q is None or q.op != "QuantizeLinear" or q.attrs.get("axis") is not None \
            or list(node.attrs.get("dilations", (1, 1))) != [1, 1] \
            or not one_type(g, [dq.inputs[0], q.outputs[0]], shifted):
        return
    (sx, zx, _), (sy, zy, _) = _qparams(g, dq), _qparams(g, q)
    attrs = {**node.attrs, "x_scale": float(sx[0]), "x_zero_point": int(zx[0]), "y_scale": float(sy[0]),
             "y_zero_point": int(zy[0]), "y_dtype": g.constants[q.inputs[2]].dtype.name,
             **shifts({"y_shift": q.outputs[0]}, shifted)}
    new = Node(node.name, "qavgpool", [dq.inputs[0]], list(q.outputs), attrs)
    g.nodes = [new if n is node else n for n in g.nodes if n is not q]


def _memory_op(g: Graph, node: Node) -> None:
    prod, users = g.producer(), g.consumers()
    dqs = [_run_time_dq(g, i, prod) for i in node.inputs]
    q = g.sole_consumer(node.outputs[0], users)
    if q is None or q.op != "QuantizeLinear" or any(d is None or not _same_params(g, d, q) for d in dqs):
        return
    node.inputs = [d.inputs[0] for d in dqs]
    node.outputs = list(q.outputs)
    g.nodes = [n for n in g.nodes if n is not q]


# --- 3. constants ---------------------------------------------------------------------------------------

def _fold_constant_dequantize(g: Graph) -> None:
    kept = []
    for node in g.nodes:
        if node.op == "DequantizeLinear" and all(i in g.constants for i in node.inputs):
            x, s, z = (g.constants[i] for i in node.inputs)
            out = node.outputs[0]
            g.constants[out] = np.ascontiguousarray(dequantize(x, s, z, node.attrs["axis"]), dtype=np.float32)
            g.values[out] = Value(out, g.constants[out].shape)
        else:
            kept.append(node)
    g.nodes = kept
