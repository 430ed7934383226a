"""The attention score chain of transformer exports, made one row kernel (`AttentionSoftmax`).

Both of torch's exporters write scaled dot-product attention as

    S = MatMul(Q * s, K^T * s)          (either scalar Mul may be missing, or a Mul / Div of the product)
    P = Softmax(S + mask, axis=-1)      (the mask Add is missing without a mask: ViT)
    P = Where(IsNaN(P), 0, P)           (the dynamo exporter and the classic one at opset >= 14)

which costs four or five passes over the score tensor (and two over Q and K). This pass leaves the MatMul with
the unscaled operands and puts everything after it in one node, `AttentionSoftmax(S, [mask])` with attributes
`scale` (the product of the scalars), `nan_to` (the Where's constant, or None) and `axis` (the last), which
stages/memops/attention.py runs in one pass per row (scale and mask applied as the row is loaded).

Both operands of the MatMul must be computed at run time (Q and K), and every value inside the chain must be
read by the chain alone.
"""

from __future__ import annotations

import math

from stages.graph.ir import Graph, Node

OP = "AttentionSoftmax"


def fuse_attention_softmax(g: Graph) -> None:
    for sm in [n for n in g.nodes if n.op == "Softmax"]:
        _rewrite(g, sm)


def _scalar(g: Graph, name: str) -> float | None:
    c = g.constants.get(name)
    return float(c.reshape(-1)[0]) if c is not None and c.size == 1 and c.dtype.kind == "f" else None


def _scaled(g: Graph, node: Node | None, name: str) -> tuple[str, float] | None:
    """(x, s) when `node` computes `name` = x * s, s * x or x / s with a scalar constant s."""
    if node is None or node.op not in ("Mul", "Div") or len(node.inputs) != 2 or name not in node.outputs:
        return None
    x, c = node.inputs
    if node.op == "Mul" and _scalar(g, x) is not None:
        x, c = c, x
    s = _scalar(g, c)
    if s is None or x in g.constants or (node.op == "Div" and s == 0):
        return None
    return x, (s if node.op == "Mul" else 1 / s)


def _rewrite(g: Graph, sm: Node) -> None:
    users, prod = g.consumers(), g.producer()
    x = sm.inputs[0]
    rank = len(g.values[x].shape)
    if sm.attrs.get("axis", -1) % rank != rank - 1 or rank < 2:
        return
    gone: list[Node] = []
    scale, mask = 1.0, None
    add = prod.get(x)
    if add is not None and add.op == "Add" and len(add.inputs) == 2 and g.sole_consumer(x, users) is sm:
        scores, mask = _split_mask(g, add, prod)
        if scores is None:
            return
        gone.append(add)
    else:
        scores = x
    step = _scaled(g, prod.get(scores), scores)
    if step is not None and g.sole_consumer(scores, users) is (gone[-1] if gone else sm):
        gone.append(prod[scores])
        scores, scale = step[0], step[1]
    mm = prod.get(scores)
    if mm is None or mm.op != "MatMul" or g.sole_consumer(scores, users) is not (gone[-1] if gone else sm) \
            or any(i in g.constants for i in mm.inputs):
        return  # a classifier's logits (a constant weight, its bias added) keep their dense and its epilogue
    inputs = list(mm.inputs)
    for i, name in enumerate(inputs):
        step = _scaled(g, prod.get(name), name)
        if step is not None and g.sole_consumer(name, users) is mm:
            gone.append(prod[name])
            inputs[i] = step[0]
            scale *= step[1]
    last, nan_to = _nan_guard(g, sm, users)
    if last is sm:
        nan_to = None
    else:
        gone += [sm, *[n for n in users[sm.outputs[0]] if n is not last]]
    if mask is None and math.isclose(scale, 1.0) and nan_to is None:
        return
    mm.inputs = inputs
    fused = Node(f"{sm.name}/attention", OP, [scores, *([mask] if mask else [])], list(last.outputs),
                 {"axis": rank - 1, "scale": scale, "nan_to": nan_to})
    drop = {id(n) for n in gone if n is not last}
    g.nodes = [fused if n is last else n for n in g.nodes if id(n) not in drop]


def _split_mask(g: Graph, add: Node, prod: dict[str, Node]) -> tuple[str | None, str | None]:
    """(scores, mask) of `scores + mask`: the scores are the MatMul's product (maybe scaled), the mask the other
    operand, which must broadcast to the scores' shape."""
    for s, m in (add.inputs, add.inputs[::-1]):
        src = prod.get(s)
        inner = _scaled(g, src, s)
        if src is not None and (src.op == "MatMul" or (inner is not None and prod.get(inner[0]) is not None
                                                        and prod[inner[0]].op == "MatMul")):
            shape, mshape = g.values[s].shape, (g.constants[m].shape if m in g.constants else g.values[m].shape)
            if len(mshape) <= len(shape) and all(d in (1, e) for d, e in zip(mshape[::-1], shape[::-1], strict=False)):
                return s, m
    return None, None


def _nan_guard(g: Graph, sm: Node, users: dict[str, list[Node]]) -> tuple[Node, float | None]:
    """(Where(IsNaN(P), c, P), c) when the softmax's output P is read by exactly that pair, else (sm, None)."""
    p = sm.outputs[0]
    readers = users.get(p, [])
    if len(readers) != 2 or any(v.name == p for v in g.outputs):
        return sm, None
    isnan = next((n for n in readers if n.op == "IsNaN"), None)
    where = next((n for n in readers if n.op == "Where"), None)
    if isnan is None or where is None or g.sole_consumer(isnan.outputs[0], users) is not where:
        return sm, None
    cond, fill, other = where.inputs
    value = _scalar(g, fill)
    if cond != isnan.outputs[0] or other != p or value is None:
        return sm, None
    return where, value
