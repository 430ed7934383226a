"""Anchor lowering and epilogue fusion: Conv / Gemm / MatMul → conv2d / dense / batch_matmul nodes.

Each anchor gets a `TuningTask` whose inputs are `[X, W, *epilogue tensors]` (the convention of
stages/graph/epilogue.py) and absorbs the element-wise chain that follows it while each link
has the anchor's result as its only reader: Relu, Clip, LeakyRelu, Sigmoid, Tanh, Gelu (both forms),
Swish, HardSigmoid, HardSwish (passes_act.py has made one node of each written-out form); an Add,
two-input Sum or Sub of a per-channel (or scalar) constant (bias); a Mul or Div by one
(scale_shift); an Add or Sum with a tensor of the output's shape (residual_add, run-time or
constant). The fused node takes the place of the last node it absorbed, so every tensor it
reads is computed before it. Reshapes (and Transposes of unit dims) that keep the channel axis last
(GPT-2's dense output [S, N] viewed as [1, S, N] before its Gelu and residual Add; ViT's [S, 1, N] then
[1, S, N]) are absorbed with the element-wise op after them.

Weights are re-laid once here, so equal layers get equal tasks whatever their ONNX form: a
constant 2-D weight makes a `dense` with W as (N, K) (Y = X @ W^T, attributes exactly those of
`stages.templates.dense.task`), Gemm's alpha and transB and MatMul's (K, N) layout folded in and
Gemm's beta folded into its bias. A product of two run-time tensors (or with a constant of rank
> 2) is a `batch_matmul` (2-D included), whose template reads both operands in place; `matmul`
(B packed at build time) is left to `tune-op`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from schemas.errors import ModelError
from schemas.task import EpilogueOp, TensorSpec, TuningTask
from stages.graph import epilogue as epi
from stages.graph.ir import Graph, Node, Value

ANCHORS = ("Conv", "Gemm", "MatMul")
DENSE_ATTRS = {"trans_a": False, "trans_b": True, "alpha": 1.0}
UNARY_EPILOGUE = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Clip": "clip", "LeakyRelu": "leaky_relu",
                  "Swish": "swish", "HardSigmoid": "hard_sigmoid", "HardSwish": "hard_swish"}
GELU_EPILOGUE = {"none": "gelu", "tanh": "gelu_tanh"}


@dataclass
class _Anchor:
    op: str
    inputs: list[str]
    specs: list[tuple[int, ...]]
    out_shape: tuple[int, ...]
    attrs: dict
    channel_axis: int
    out: str
    pre: list[Node] = field(default_factory=list)
    ops: list[EpilogueOp] = field(default_factory=list)
    tensors: list[str] = field(default_factory=list)
    absorbed: list[Node] = field(default_factory=list)


def fuse(g: Graph) -> None:
    users = g.consumers()
    taken: set[int] = set()
    placed: dict[int, list[Node]] = {}
    for node in list(g.nodes):
        if node.op not in ANCHORS:
            continue
        a = _lower(g, node)
        _absorb(g, a, users, taken)
        task = TuningTask(
            op=a.op,
            inputs=(*(TensorSpec(shape=s) for s in a.specs),
                    *epi.operand_specs(a.ops, a.out_shape, a.channel_axis)),
            outputs=(TensorSpec(shape=a.out_shape),),
            attrs=a.attrs,
            epilogue=tuple(a.ops),
        )
        fused = Node(node.name, a.op, [*a.inputs, *a.tensors], [a.out], dict(a.attrs), task)
        last = a.absorbed[-1] if a.absorbed else node
        placed[id(last)] = [*a.pre, fused]
        taken.update(id(n) for n in (node, *a.absorbed))
    g.nodes = [m for n in g.nodes for m in (placed.get(id(n), []) if id(n) in taken else [n])]


def _transposed(g: Graph, name: str, anchor: Node, pre: list[Node]) -> str:
    """`name` transposed: a re-laid constant, or a Transpose node run before the anchor."""
    if name in g.constants:
        return g.add_constant(f"{name}.T", g.constants[name].T)
    out = f"{anchor.name}/transpose_{len(pre)}"
    g.values[out] = Value(out, g.values[name].shape[::-1])
    pre.append(Node(out, "Transpose", [name], [out], {"perm": [1, 0]}))
    return out


def _lower(g: Graph, node: Node) -> _Anchor:
    shape = {n: g.values[n].shape for n in node.inputs}
    out = node.outputs[0]
    out_shape = g.values[out].shape
    if node.op == "Conv":
        if node.inputs[1] not in g.constants:
            raise ModelError(f"Conv {node.name!r}: its weights are computed at run time; tunaflow needs constants")
        x, w = node.inputs[:2]
        attrs = {k: tuple(node.attrs[k]) for k in ("strides", "pads", "dilations")} | {"group": node.attrs["group"]}
        a = _Anchor("conv2d", [x, w], [shape[x], shape[w]], out_shape, attrs, 1, out)
        if len(node.inputs) > 2:
            a.ops.append(EpilogueOp(kind="bias"))
            a.tensors.append(node.inputs[2])
        return a
    if node.op == "Gemm":
        return _lower_gemm(g, node, shape, out_shape)
    return _lower_matmul(g, node, shape, out_shape)


def _lower_gemm(g: Graph, node: Node, shape: dict, out_shape: tuple[int, ...]) -> _Anchor:
    at, pre = node.attrs, []
    x = _transposed(g, node.inputs[0], node, pre) if at["transA"] else node.inputs[0]
    b = node.inputs[1]
    m, n = out_shape
    k = g.values[x].shape[1]
    if b in g.constants:
        w = g.constants[b] if at["transB"] else g.constants[b].T
        wname = g.add_constant(f"{node.name}.weight", at["alpha"] * w) if at["alpha"] != 1 or not at["transB"] else b
        a = _Anchor("dense", [x, wname], [(m, k), (n, k)], (m, n), dict(DENSE_ATTRS), -1, node.outputs[0], pre)
    else:
        wname = b if not at["transB"] else _transposed(g, b, node, pre)
        a = _Anchor("batch_matmul", [x, wname], [(m, k), (k, n)], (m, n), {}, -1, node.outputs[0], pre)
        if at["alpha"] != 1:
            a.ops.append(EpilogueOp(kind="scale_shift"))
            a.tensors += [g.add_constant(f"{node.name}.alpha", np.full(n, at["alpha"])),
                          g.add_constant(f"{node.name}.zero", np.zeros(n))]
    if len(node.inputs) > 2:
        c = node.inputs[2]
        if c in g.constants:
            cval = at["beta"] * g.constants[c].astype(np.float64)
            vec = _per_channel(cval, (m, n), 1)
            kind, arr = ("bias", vec) if vec is not None else ("residual_add", np.broadcast_to(cval, (m, n)))
            a.ops.append(EpilogueOp(kind=kind))
            a.tensors.append(g.add_constant(f"{node.name}.bias", arr))
        elif shape[c] == (m, n) or math.prod(shape[c]) == n == shape[c][-1]:
            kind = "residual_add" if shape[c] == (m, n) else "bias"
            a.ops.append(EpilogueOp(kind=kind, attrs={"beta": at["beta"]} if at["beta"] != 1 else {}))
            a.tensors.append(c)
        else:
            raise ModelError(f"Gemm {node.name!r}: a run-time C of shape {list(shape[c])} (broadcast to {m}x{n}) "
                             "is not supported")
    return a


def _lower_matmul(g: Graph, node: Node, shape: dict, out_shape: tuple[int, ...]) -> _Anchor:
    x, b = node.inputs
    xs, bs = shape[x], shape[b]
    out = node.outputs[0]
    if b in g.constants and len(bs) <= 2:
        w = g.constants[b].reshape(bs[0], -1).T
        n, k = w.shape
        m = math.prod(xs[:-1])
        wname = g.add_constant(f"{node.name}.weight", w)
        return _Anchor("dense", [x, wname], [(m, k), (n, k)], (m, n), dict(DENSE_ATTRS), -1, out)
    if len(xs) < 2 or len(bs) < 2:
        raise ModelError(f"MatMul {node.name!r}: a 1-D operand computed at run time is not supported")
    return _Anchor("batch_matmul", [x, b], [xs, bs], out_shape, {}, -1, out)


def _per_channel(c: np.ndarray, out_shape: tuple[int, ...], axis: int) -> np.ndarray | None:
    """`c` as a (C,) vector if it only varies along `axis` of the output (or is a scalar), else None."""
    rank = len(out_shape)
    axis = axis % rank
    if c.ndim > rank:
        return None
    ext = c.reshape((1,) * (rank - c.ndim) + c.shape)
    if any(d != 1 and (i != axis or d != out_shape[i]) for i, d in enumerate(ext.shape)):
        return None
    return np.broadcast_to(ext.reshape(-1) if ext.shape[axis] != 1 else ext.reshape(1), (out_shape[axis],))


def _absorb(g: Graph, a: _Anchor, users: dict[str, list[Node]], taken: set[int]) -> None:
    while True:
        c = g.sole_consumer(a.out, users)
        if c is None or id(c) in taken:
            return
        views, out = [], a.out
        while c is not None and id(c) not in taken and _keeps_channels(g, a, c):
            views.append(c)  # [S, N] -> [1, S, N] between a dense and its Gelu or residual Add (GPT-2, ViT)
            a.out = c.outputs[0]
            c = g.sole_consumer(a.out, users)
        if views:
            if c is None or id(c) in taken or not _step(g, a, c):
                a.out = out
                return
            a.absorbed += [*views, c]
            a.out = c.outputs[0]
            continue
        if not _step(g, a, c):
            return
        a.absorbed.append(c)
        a.out = c.outputs[0]


def _keeps_channels(g: Graph, a: _Anchor, c: Node) -> bool:
    """Whether `c` is a Reshape (or a Transpose of unit dims) that keeps the anchor's channel axis last: the fused
    node can write the reshaped tensor directly (a tensor may be a contiguous reshape of its task's spec)."""
    if c.op not in ("Reshape", "Transpose") or a.channel_axis != -1:
        return False
    before, after = g.values[a.out].shape, g.values[c.outputs[0]].shape
    if c.op == "Transpose":  # moving only unit dims (ViT's [197, 1, 768] -> [1, 197, 768]) is a reshape
        moved = [d for d in c.attrs["perm"] if before[d] != 1]
        if moved != sorted(moved):
            return False
    return bool(before) and bool(after) and before[-1] == after[-1]


def _unary_attrs(kind: str, attrs: dict) -> dict[str, float]:
    """Numeric attributes, less those equal to the op's defaults (one task per layer, however it is written)."""
    default = epi.DEFAULTS.get(kind, {})
    return {k: float(v) for k, v in attrs.items() if k in ("min", "max", "alpha", "beta")
            and not (k in default and math.isclose(v, default[k], rel_tol=1e-6))}


def _step(g: Graph, a: _Anchor, c: Node) -> bool:
    """Absorb element-wise node `c` (reading the anchor's current result) into the epilogue, if it fits."""
    if c.op in UNARY_EPILOGUE or (c.op == "Gelu" and c.attrs.get("approximate", "none") in GELU_EPILOGUE):
        kind = UNARY_EPILOGUE.get(c.op) or GELU_EPILOGUE[c.attrs.get("approximate", "none")]
        a.ops.append(EpilogueOp(kind=kind, attrs=_unary_attrs(kind, c.attrs)))
        return True
    if c.op not in ("Add", "Sum", "Sub", "Mul", "Div") or len(c.inputs) != 2 or c.inputs[0] == c.inputs[1]:
        return False
    cur_shape = g.values[a.out].shape
    if g.values[c.outputs[0]].shape != cur_shape:
        return False
    other = c.inputs[1] if c.inputs[0] == a.out else c.inputs[0]
    first = c.inputs[0] == a.out
    vec = None
    if other in g.constants:
        vec = _per_channel(g.constants[other].astype(np.float64), cur_shape, a.channel_axis)
    if vec is None:
        if c.op not in ("Add", "Sum") or g.values[other].shape != cur_shape:
            return False
        a.ops.append(EpilogueOp(kind="residual_add"))
        a.tensors.append(other)
        return True
    if (c.op in ("Sub", "Div") and not first) or (c.op == "Div" and not np.all(vec)):
        return False
    if c.op in ("Add", "Sum", "Sub"):
        a.ops.append(EpilogueOp(kind="bias"))
        a.tensors.append(g.add_constant(f"{c.name}.bias", -vec if c.op == "Sub" else vec))
    else:
        a.ops.append(EpilogueOp(kind="scale_shift"))
        scale = vec if c.op == "Mul" else 1 / vec
        a.tensors += [g.add_constant(f"{c.name}.scale", scale), g.add_constant(f"{c.name}.shift", 0 * scale)]
    return True
