"""Activations recovered from the element-wise ops exporters write them as, each into one node: one
epilogue op when an anchor precedes it (no separate pass over memory), one memory pass when none does.

- Gelu: x * 0.5 * (1 + erf(x / sqrt 2)) (the erf form, `approximate="none"`) and
  x * 0.5 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))) (`approximate="tanh"`, GPT-2's gelu_new and
  ONNX's own expansion; x^3 as Pow(x, 3) or products of x), either in any association of the products;
- Swish (alpha 1: SiLU, EfficientNet's activation): x * Sigmoid(x);
- HardSigmoid: Clip(x + b, 0, m) / m (or * 1/m), torch's relu6(x + 3) / 6 when written out;
- HardSwish: x * HardSigmoid(x) (torch below opset 14) and x * Clip(x + b, 0, m) / m with the scale
  applied to either the clip or the product (Keras' x * relu6(x + 3) * (1/6)).

Every value inside a pattern except x must be read by the pattern alone, so nothing else loses it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from stages.graph.ir import Graph, Node

Users = dict[str, list[Node]]


def rewrite_activations(g: Graph) -> None:
    """Every rewrite, HardSigmoid before HardSwish (x * relu6(x + 3) / 6 becomes x * HardSigmoid(x) first)."""
    for p in (rewrite_gelu, rewrite_gelu_tanh, rewrite_hard_sigmoid, rewrite_hard_swish, rewrite_swish):
        p(g)


def _const_value(g: Graph, name: str | None) -> float | None:
    c = g.constants.get(name) if name is not None else None
    return float(c.reshape(-1)[0]) if c is not None and c.size == 1 else None


def _other(node: Node, name: str) -> str | None:
    """The other input of a binary node that reads `name`."""
    if len(node.inputs) != 2 or name not in node.inputs:
        return None
    return node.inputs[1] if node.inputs[0] == name else node.inputs[0]


def _is_const(g: Graph, node: Node, name: str, value: float) -> bool:
    v = _const_value(g, _other(node, name))
    return v is not None and math.isclose(v, value, rel_tol=1e-4)


def _only(g: Graph, name: str, ops: tuple[str, ...], users: Users) -> Node | None:
    """The sole reader of `name` if it is one of `ops`."""
    node = g.sole_consumer(name, users)
    return node if node is not None and node.op in ops else None


def _replace(g: Graph, last: Node, new: Node, gone: list[Node]) -> None:
    """`new` takes the place of `last` (so everything it reads is computed before it); `gone` are dropped."""
    drop = {id(n) for n in gone}
    g.nodes = [new if n is last else n for n in g.nodes if id(n) not in drop or n is last]


# ---- Gelu ------------------------------------------------------------------------------------

def rewrite_gelu(g: Graph) -> None:
    """x * 0.5 * (1 + erf(x / sqrt 2)) (any association of the two products) → Gelu(x)."""
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
        gelu = Node(last.name + "/gelu", "Gelu", [x], list(last.outputs), {"approximate": "none"})
        _replace(g, last, gelu, [div, erf, add, *chain])


def rewrite_gelu_tanh(g: Graph) -> None:
    """x * 0.5 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))) → Gelu(x, approximate="tanh")."""
    for tanh in [n for n in g.nodes if n.op == "Tanh"]:
        users, prod = g.consumers(), g.producer()
        inner = _tanh_inner(g, tanh, users, prod)
        if inner is None:
            continue
        x, nodes = inner
        add = _only(g, tanh.outputs[0], ("Add", "Sum"), users)
        if add is None or not _is_const(g, add, tanh.outputs[0], 1.0):
            continue
        chain = _gelu_products(g, x, add.outputs[0], users, prod)
        if chain is None:
            continue
        last = chain[-1]
        gelu = Node(last.name + "/gelu", "Gelu", [x], list(last.outputs), {"approximate": "tanh"})
        _replace(g, last, gelu, [*nodes, tanh, add, *chain])


def _tanh_inner(g: Graph, tanh: Node, users: Users, prod: dict[str, Node]) -> tuple[str, list[Node]] | None:
    """(x, the nodes computing sqrt(2/pi) * (x + 0.044715 * x^3) for `tanh`), or None."""
    scale = prod.get(tanh.inputs[0])
    if scale is None or scale.op != "Mul" or g.sole_consumer(scale.outputs[0], users) is not tanh:
        return None
    s = next((i for i in scale.inputs if _is_const(g, scale, i, math.sqrt(2 / math.pi))), None)
    add = prod.get(s) if s is not None else None
    if add is None or add.op not in ("Add", "Sum") or len(add.inputs) != 2 or _only(g, s, ("Mul",), users) is not scale:
        return None
    for x, q in (add.inputs, add.inputs[::-1]):
        mul = prod.get(q)
        if mul is None or mul.op != "Mul" or _only(g, q, ("Add", "Sum"), users) is not add:
            continue
        cube = next((i for i in mul.inputs if _is_const(g, mul, i, 0.044715)), None)
        powers = _cube(g, x, cube, mul, users, prod) if cube is not None else None
        if powers is not None:
            return x, [*powers, mul, add, scale]
    return None


def _cube(g: Graph, x: str, name: str, reader: Node, users: Users, prod: dict[str, Node]) -> list[Node] | None:
    """The nodes computing `name` = x^3 (Pow(x, 3), (x * x) * x or x * (x * x)) for `reader` alone, or None."""
    node = prod.get(name)
    if node is None or g.sole_consumer(name, users) is not reader:
        return None
    if node.op == "Pow" and node.inputs[0] == x and _is_const(g, node, x, 3.0):
        return [node]
    if node.op != "Mul" or x not in node.inputs:
        return None
    sq = prod.get(_other(node, x))
    if sq is not None and sq.op == "Mul" and sq.inputs == [x, x] and g.sole_consumer(sq.outputs[0], users) is node:
        return [sq, node]
    return None


def _gelu_products(g: Graph, x: str, a: str, users: Users, prod: dict[str, Node]) -> list[Node] | None:
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


# ---- Swish, HardSigmoid, HardSwish --------------------------------------------------------------

def rewrite_swish(g: Graph) -> None:
    """x * Sigmoid(x) → Swish(x, alpha=1), SiLU."""
    _rewrite_gated(g, "Sigmoid", "Swish", "swish", lambda gate: {"alpha": 1.0})


def _rewrite_gated(g: Graph, gate_op: str, op: str, suffix: str, attrs: Callable[[Node], dict]) -> None:
    """x * Gate(x) → Op(x, **attrs(gate)): x is read twice, once by each node of the pattern."""
    for gate in [n for n in g.nodes if n.op == gate_op]:
        users = g.consumers()
        x, h = gate.inputs[0], gate.outputs[0]
        mul = _only(g, h, ("Mul",), users)
        if mul is None or _other(mul, h) != x:
            continue
        _replace(g, mul, Node(f"{mul.name}/{suffix}", op, [x], list(mul.outputs), attrs(gate)), [gate])


def rewrite_hard_sigmoid(g: Graph) -> None:
    """Clip(x + b, 0, m) * (1/m) → HardSigmoid(x, 1/m, b/m); x * Clip(x + b, 0, m) * (1/m) → HardSwish."""
    for clip in [n for n in g.nodes if n.op == "Clip"]:
        users, prod = g.consumers(), g.producer()
        top = clip.attrs.get("max", math.inf)
        add = prod.get(clip.inputs[0])
        if clip.attrs.get("min") != 0.0 or top <= 0 or add is None or add.op not in ("Add", "Sum") \
                or g.sole_consumer(add.outputs[0], users) is not clip:
            continue
        x = next((i for i in add.inputs if _const_value(g, _other(add, i)) is not None), None)
        reader = g.sole_consumer(clip.outputs[0], users)
        if x is None or x in g.constants or reader is None or reader.op not in ("Mul", "Div"):
            continue
        b = _const_value(g, _other(add, x))
        attrs = {"alpha": 1 / top, "beta": b / top}
        if _scales_to_one(g, reader, clip.outputs[0], top):
            _replace(g, reader, Node(reader.name + "/hard_sigmoid", "HardSigmoid", [x], list(reader.outputs), attrs),
                     [add, clip])
            continue
        scale = g.sole_consumer(reader.outputs[0], users)
        if reader.op == "Mul" and _other(reader, clip.outputs[0]) == x and scale is not None \
                and _scales_to_one(g, scale, reader.outputs[0], top):
            _replace(g, scale, Node(scale.name + "/hard_swish", "HardSwish", [x], list(scale.outputs), attrs),
                     [add, clip, reader])


def _scales_to_one(g: Graph, node: Node, name: str, top: float) -> bool:
    """Whether `node` is `name` * (1 / top) or `name` / top."""
    v = _const_value(g, _other(node, name))
    if v is None or node.op not in ("Mul", "Div") or (node.op == "Div" and node.inputs[0] != name):
        return False
    return math.isclose(v * top if node.op == "Mul" else top / v, 1.0, rel_tol=1e-5)


def rewrite_hard_swish(g: Graph) -> None:
    """x * HardSigmoid(x) → HardSwish(x) with the HardSigmoid's alpha and beta."""
    _rewrite_gated(g, "HardSigmoid", "HardSwish", "hard_swish",
                   lambda hs: {"alpha": hs.attrs.get("alpha", 0.2), "beta": hs.attrs.get("beta", 0.5)})
