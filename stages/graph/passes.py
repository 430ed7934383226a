"""Graph passes run after import, in order (`optimize`):

1. `fold_batchnorm`: a BatchNormalization right after a Conv or Gemm with constant weights is
   folded into the weights and bias (free at run time); any other one becomes Mul + Add by
   per-channel constants, which the fusion pass can still absorb as a scale_shift.
2. `rewrite_gelu`: the Erf form of Gelu that exporters emit (x * 0.5 * (1 + erf(x / sqrt 2)), in
   its usual orders) becomes one Gelu node.
3. `rewrite_layernorm` (passes_norm.py): the opset < 17 decomposition of layer normalisation
   (ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add) becomes one LayerNormalization.
4. `fuse` (passes_fuse.py): every Conv / Gemm / MatMul becomes an anchor node with a TuningTask
   and absorbs the element-wise chain after it into the task's epilogue.
5. `eliminate_dead`: nodes nobody reads, and constants nobody reads, are dropped.

Layout: activations stay NCHW between nodes; the conv2d template re-lays its weights (and blocks
its input internally) itself, so no layout-transform nodes are needed between convolutions.
"""

from __future__ import annotations

import copy
import math

import numpy as np

from stages.graph.ir import Graph, Node, Value
from stages.graph.passes_fuse import fuse
from stages.graph.passes_norm import rewrite_layernorm


def optimize(graph: Graph) -> Graph:
    """A new graph with every pass applied; the input graph is left as it was (constant arrays are shared:
    passes add new constants, they never write into existing ones)."""
    g = copy.deepcopy(graph, memo={id(a): a for a in graph.constants.values()})
    for p in (fold_batchnorm, rewrite_gelu, rewrite_layernorm, fuse, eliminate_dead):
        p(g)
    return g


def fold_batchnorm(g: Graph) -> None:
    users = g.consumers()
    prod = g.producer()
    drop: set[int] = set()
    for bn in [n for n in g.nodes if n.op == "BatchNormalization"]:
        scale, beta, mean, var = (g.constants[i].astype(np.float64) for i in bn.inputs[1:])
        s = scale / np.sqrt(var + bn.attrs["epsilon"])
        t = beta - mean * s
        src = prod.get(bn.inputs[0])
        if src is not None and g.sole_consumer(bn.inputs[0], users) is bn and _fold_into(g, src, s, t):
            src.outputs = [bn.outputs[0]]
            drop.add(id(bn))
            continue
        shape = (-1,) + (1,) * (len(g.values[bn.inputs[0]].shape) - 2)
        mid = bn.outputs[0] + "/scaled"
        g.values[mid] = Value(mid, g.values[bn.outputs[0]].shape)
        s_name = g.add_constant(bn.name + ".scale", s.reshape(shape))
        t_name = g.add_constant(bn.name + ".shift", t.reshape(shape))
        i = g.nodes.index(bn)
        g.nodes[i: i + 1] = [Node(bn.name + "/mul", "Mul", [bn.inputs[0], s_name], [mid]),
                             Node(bn.name + "/add", "Add", [mid, t_name], list(bn.outputs))]
    g.nodes = [n for n in g.nodes if id(n) not in drop]


def _fold_into(g: Graph, src: Node, s: np.ndarray, t: np.ndarray) -> bool:
    """Scale the output channels of a Conv or Gemm with constant weights by s, then add t."""
    if src.op not in ("Conv", "Gemm") or any(i not in g.constants for i in src.inputs[1:]):
        return False
    w = g.constants[src.inputs[1]].astype(np.float64)
    if src.op == "Conv":
        w2 = w * s.reshape(-1, 1, 1, 1)
        bias = g.constants[src.inputs[2]].astype(np.float64) if len(src.inputs) > 2 else 0.0
        b2 = bias * s + t
    else:
        w2 = w * s.reshape(-1, 1) if src.attrs["transB"] else w * s.reshape(1, -1)
        c = src.attrs["beta"] * g.constants[src.inputs[2]].astype(np.float64) if len(src.inputs) > 2 else 0.0
        b2 = np.broadcast_to(c * s + t, np.broadcast_shapes(np.shape(c * s), t.shape))
        src.attrs = {**src.attrs, "beta": 1.0}
    src.inputs = [src.inputs[0], g.add_constant(src.name + ".w_bn", w2), g.add_constant(src.name + ".b_bn", b2)]
    return True


def _const_value(g: Graph, name: str) -> float | None:
    c = g.constants.get(name)
    return float(c.reshape(-1)[0]) if c is not None and c.size == 1 else None


def _other(node: Node, name: str) -> str | None:
    """The other input of a binary node that reads `name`."""
    if len(node.inputs) != 2 or name not in node.inputs:
        return None
    return node.inputs[1] if node.inputs[0] == name else node.inputs[0]


def _is_const(g: Graph, node: Node, name: str, value: float) -> bool:
    other = _other(node, name)
    v = _const_value(g, other) if other is not None else None
    return v is not None and math.isclose(v, value, rel_tol=1e-4)


def rewrite_gelu(g: Graph) -> None:
    """Replace x * 0.5 * (1 + erf(x / sqrt 2)) (any association of the two products) by Gelu(x)."""
    for erf in [n for n in g.nodes if n.op == "Erf"]:
        users, prod = g.consumers(), g.producer()
        div = prod.get(erf.inputs[0])
        if div is None or div.op not in ("Div", "Mul") or div.inputs[0] in g.constants:
            continue
        x = div.inputs[0]
        if not _is_const(g, div, x, math.sqrt(2) if div.op == "Div" else 1 / math.sqrt(2)):
            continue
        add = g.sole_consumer(erf.outputs[0], users)
        if add is None or add.op != "Add" or not _is_const(g, add, erf.outputs[0], 1.0):
            continue
        chain = _gelu_products(g, x, add.outputs[0], users, prod)
        if chain is None or g.sole_consumer(div.outputs[0], users) is not erf:
            continue
        last = chain[-1]
        gone = {id(n) for n in (div, erf, add, *chain)}
        i = g.nodes.index(last)
        g.nodes[i] = Node(last.name + "/gelu", "Gelu", [x], list(last.outputs), {"approximate": "none"})
        g.nodes = [n for n in g.nodes if id(n) not in gone]


def _gelu_products(g: Graph, x: str, a: str, users, prod) -> list[Node] | None:
    """The Mul nodes forming x * 0.5 * a, last one last, or None if the pattern is not there."""
    m = g.sole_consumer(a, users)
    if m is None or m.op != "Mul":
        return None
    other = _other(m, a)
    if other == x or _is_const(g, m, a, 0.5):
        m2 = g.sole_consumer(m.outputs[0], users)
        if m2 is None or m2.op != "Mul":
            return None
        ok = _is_const(g, m2, m.outputs[0], 0.5) if other == x else _other(m2, m.outputs[0]) == x
        return [m, m2] if ok else None
    half = prod.get(other)
    if half is not None and half.op == "Mul" and x in half.inputs and _is_const(g, half, x, 0.5) \
            and g.sole_consumer(other, users) is m:
        return [half, m]
    return None


def eliminate_dead(g: Graph) -> None:
    """Drop nodes whose outputs nobody reads (walking backwards), then unread constants and values."""
    live = {v.name for v in g.outputs}
    kept = []
    for node in reversed(g.nodes):
        if any(o in live for o in node.outputs):
            kept.append(node)
            live.update(node.inputs)
    g.nodes = kept[::-1]
    g.constants = {k: v for k, v in g.constants.items() if k in live}
    g.values = {k: v for k, v in g.values.items() if k in live or any(k == i.name for i in g.inputs)}
