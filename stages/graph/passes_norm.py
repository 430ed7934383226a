"""LayerNormalization recovered from the nine ops exporters emit below opset 17:

    mean = ReduceMean(x, trailing axes); d = x - mean; var = ReduceMean(d ** 2 or d * d)
    y = d / Sqrt(var + eps) [* gamma] [+ beta]

becomes one LayerNormalization node (one pass over the row instead of nine kernels). After the fusion pass, a
LayerNormalization of a chain of Adds becomes one AddLayerNormalization (`fuse_add_layernorm`).
"""

from __future__ import annotations

import numpy as np

from stages.graph.ir import Graph, Node


def rewrite_layernorm(g: Graph) -> None:
    for r1 in [n for n in g.nodes if n.op == "ReduceMean"]:
        match = _match(g, r1)
        if match is None:
            continue
        nodes, x, axis, eps, gamma, beta = match
        shape = g.values[x].shape[axis:]
        ins = [x, g.add_constant(f"{r1.name}.ln_scale", np.broadcast_to(gamma, shape))]
        if beta is not None:
            ins.append(g.add_constant(f"{r1.name}.ln_bias", np.broadcast_to(beta, shape)))
        last = nodes[-1]
        ln = Node(f"{r1.name}/layernorm", "LayerNormalization", ins, list(last.outputs),
                  {"axis": axis, "epsilon": eps})
        gone = {id(n) for n in nodes}
        g.nodes = [ln if n is last else n for n in g.nodes if id(n) not in gone or n is last]


def _const(g: Graph, node: Node, name: str) -> np.ndarray | None:
    """The constant operand of binary `node` next to `name`, if it has one."""
    if len(node.inputs) != 2 or name not in node.inputs:
        return None
    other = node.inputs[1] if node.inputs[0] == name else node.inputs[0]
    return g.constants.get(other)


def _only(g: Graph, name: str, op: str, users) -> Node | None:
    node = g.sole_consumer(name, users)
    return node if node is not None and node.op == op else None


def _match(g: Graph, r1: Node):
    users = g.consumers()
    x = r1.inputs[0]
    rank = len(g.values[x].shape)
    axes = r1.attrs["axes"]
    if not r1.attrs["keepdims"] or axes != list(range(axes[0], rank)):
        return None
    sub = _only(g, r1.outputs[0], "Sub", users)
    if sub is None or sub.inputs != [x, r1.outputs[0]]:
        return None
    d = sub.outputs[0]
    readers = {id(n): n for n in users.get(d, [])}.values()
    if len(readers) != 2 or any(v.name == d for v in g.outputs):
        return None
    sq = next((n for n in readers if n.op in ("Pow", "Mul")), None)
    div = next((n for n in readers if n.op == "Div"), None)
    if sq is None or div is None or div.inputs[0] != d:
        return None
    if not (sq.inputs == [d, d] or (sq.op == "Pow" and _scalar(_const(g, sq, d)) == 2.0)):
        return None
    r2 = _only(g, sq.outputs[0], "ReduceMean", users)
    if r2 is None or r2.attrs != r1.attrs:
        return None
    add = _only(g, r2.outputs[0], "Add", users)
    eps = _scalar(_const(g, add, r2.outputs[0])) if add is not None else None
    sqrt = _only(g, add.outputs[0], "Sqrt", users) if eps is not None else None
    if sqrt is None or div.inputs[1] != sqrt.outputs[0] or g.sole_consumer(sqrt.outputs[0], users) is not div:
        return None
    nodes = [r1, sub, sq, r2, add, sqrt, div]
    gamma, beta = np.ones(1, np.float32), None
    mul = _only(g, div.outputs[0], "Mul", users)
    if mul is not None and _trailing(_const(g, mul, div.outputs[0]), g.values[x].shape, axes[0]):
        gamma = _const(g, mul, div.outputs[0])
        nodes.append(mul)
        bias = _only(g, mul.outputs[0], "Add", users)
        if bias is not None and _trailing(_const(g, bias, mul.outputs[0]), g.values[x].shape, axes[0]):
            beta = _const(g, bias, mul.outputs[0])
            nodes.append(bias)
    return nodes, x, axes[0], eps, gamma, beta


def _scalar(c: np.ndarray | None) -> float | None:
    return float(c.reshape(-1)[0]) if c is not None and c.size == 1 else None


def _trailing(c: np.ndarray | None, shape: tuple[int, ...], axis: int) -> bool:
    """Whether constant `c` broadcasts over the normalised trailing axes only (a per-feature scale or bias)."""
    if c is None or c.ndim > len(shape) - axis:
        return False
    try:
        return np.broadcast_shapes(c.shape, shape[axis:]) == shape[axis:]
    except ValueError:
        return False


def fuse_add_layernorm(g: Graph) -> None:
    """LayerNormalization(a + b [+ c ...]) → AddLayerNormalization(a, b, ..., scale[, bias]), which sums each
    row and normalises it in one kernel (stages/memops/reduce.py); the sum is its second output when anything
    else reads it (GPT-2's residual stream). Run after `fuse`: a residual Add a dense's epilogue absorbed is
    gone by then, so this takes the sums no anchor precedes (the embeddings' word + position [+ type])."""
    for ln in [n for n in g.nodes if n.op == "LayerNormalization"]:
        users, prod = g.consumers(), g.producer()
        top = ln.inputs[0]
        add = prod.get(top)
        if len(ln.outputs) != 1 or add is None or not _is_add(g, add, g.values[top].shape):
            continue
        terms, chain = _sum_terms(g, add, g.values[top].shape, users, prod)
        if terms is None:
            continue
        keep = any(n is not ln for n in users[top]) or any(v.name == top for v in g.outputs)
        fused = Node(f"{ln.name}/add", "AddLayerNormalization", [*terms, *ln.inputs[1:]],
                     [ln.outputs[0], *([top] if keep else [])], {**ln.attrs, "terms": len(terms), "with_sum": keep})
        gone = {id(n) for n in (*chain, ln)}
        g.nodes = [fused if n is add else n for n in g.nodes if id(n) not in gone or n is add]


def _is_add(g: Graph, node: Node, shape: tuple[int, ...]) -> bool:
    return node.op in ("Add", "Sum") and len(node.inputs) == 2 and g.values[node.outputs[0]].shape == shape \
        and g.values[node.outputs[0]].dtype == "float32"


def _sum_terms(g: Graph, add: Node, shape: tuple[int, ...], users, prod) -> tuple[list[str] | None, list[Node]]:
    """The summands of the chain of Adds ending in `add`, left to right, and the Adds; (None, []) when a summand
    is neither a run-time tensor of `shape` nor a constant that broadcasts to it."""
    terms: list[str] = []
    chain = [add]
    for name in add.inputs:
        src = prod.get(name)
        if src is not None and _is_add(g, src, shape) and g.sole_consumer(name, users) is add:
            inner, nodes = _sum_terms(g, src, shape, users, prod)
            if inner is None:
                return None, []
            terms += inner
            chain += nodes
        elif name in g.constants:
            try:
                ok = np.broadcast_shapes(g.constants[name].shape, shape) == shape
            except ValueError:
                ok = False
            if not ok or g.constants[name].dtype != np.float32:
                return None, []
            terms.append(name)
        elif g.values[name].shape == shape:
            terms.append(name)
        else:
            return None, []
    return terms, chain
