"""Element-wise chains left between anchors become one pass each (`ElementwiseChain`).

DenseNet normalises the Concat of every earlier layer before each layer's conv: BatchNormalization (which no
conv before it can absorb: `fold_batchnorm` leaves Mul and Add) and Relu, four passes over the tensor of which
three only rewrite it (2.8 ms of DenseNet-121's 25 at one thread on Zen 5). A chain is a run of float32
element-wise nodes, each the only reader of the one before, whose other operands are constants that do not
grow the tensor (a per-channel scale and shift, a scalar); it becomes one node applying the same ops in the
same order (bit for bit the unfused graph). A Concat over channels whose only reader starts a chain of
per-channel or scalar constants becomes the chain's head: each input is read once and written once.
Runs after anchor fusion, so an anchor's epilogue takes what follows it first.
"""

from __future__ import annotations

from stages.graph.ir import Graph, Node

CHAIN = "ElementwiseChain"
# Ops a link may be (each has a rule in stages/memops/elementwise.py's UNARY or BINARY).
UNARY = frozenset({"Relu", "Sigmoid", "Tanh", "Clip", "LeakyRelu", "Swish", "HardSigmoid", "HardSwish", "Gelu", "Elu",
                   "Selu", "Shrink", "Softplus", "Softsign", "Abs", "Neg", "Exp", "Log", "Sqrt", "Reciprocal", "Floor",
                   "Ceil", "Sign", "Erf"})
BINARY = frozenset({"Add", "Sub", "Mul", "Div", "Max", "Min"})


def fuse_chains(g: Graph) -> None:
    users = g.consumers()
    taken: set[int] = set()
    fused: dict[int, Node] = {}  # id of a chain's last node -> the node replacing the chain
    for node in list(g.nodes):
        if id(node) in taken:
            continue
        if _concat_head(g, node):
            head, links, inputs = node, [], list(node.inputs)
        elif (source := _running(g, node, None)) is not None:
            head, links, inputs = None, [node], [source]
        else:
            continue
        run = node.outputs[0]
        while (c := g.sole_consumer(run, users)) is not None and id(c) not in taken \
                and _running(g, c, run) is not None and (head is None or _per_channel(g, c, run)):
            links.append(c)
            run = c.outputs[0]
        if len(links) < (1 if head is not None else 2):
            continue
        chain = ([head] if head is not None else []) + links
        taken.update(id(n) for n in chain)
        fused[id(chain[-1])] = _node(g, inputs, head is not None, links)
    g.nodes = [fused.get(id(n), n) for n in g.nodes if id(n) not in taken or id(n) in fused]


def _concat_head(g: Graph, node: Node) -> bool:
    """A float32 Concat along axis 1 of tensors of rank 2 or more."""
    if node.op != "Concat" or len(node.inputs) < 2 or any(not i for i in node.inputs):
        return False
    rank = len(g.values[node.outputs[0]].shape)
    return rank >= 2 and int(node.attrs.get("axis", 0)) % rank == 1 \
        and all(g.values[i].dtype == "float32" for i in node.inputs)


def _running(g: Graph, c: Node, run: str | None) -> str | None:
    """The run-time tensor a link `c` transforms (`run` when given), or None if `c` is no link: a float32 unary
    op, or a binary op of that tensor and a float32 constant of no larger shape than the result."""
    out = c.outputs[0] if len(c.outputs) == 1 else None
    if out is None or g.values[out].dtype != "float32":
        return None
    if c.op in UNARY and len(c.inputs) == 1:
        x = c.inputs[0]
    elif c.op in BINARY and len(c.inputs) == 2 and c.inputs[0] != c.inputs[1]:
        consts = [i for i in c.inputs if i in g.constants]
        if len(consts) != 1 or g.values[consts[0]].dtype != "float32":
            return None
        x = c.inputs[1] if c.inputs[0] == consts[0] else c.inputs[0]
        if len(g.values[consts[0]].shape) > len(g.values[out].shape):
            return None
    else:
        return None
    if run is not None and x != run:
        return None
    return x if x not in g.constants and g.values[x].dtype == "float32" and g.values[x].shape == g.values[out].shape \
        else None


def _per_channel(g: Graph, c: Node, run: str) -> bool:
    """Whether a link after a Concat head reads a constant that varies at most along the channels (dim 1)."""
    consts = [i for i in c.inputs if i != run]
    if not consts:
        return True
    shape, out = g.values[consts[0]].shape, g.values[c.outputs[0]].shape
    full = (1,) * (len(out) - len(shape)) + tuple(shape)
    return all(d == 1 for k, d in enumerate(full) if k != 1)


def _node(g: Graph, inputs: list[str], concat: bool, links: list[Node]) -> Node:
    """The chain as one node: `inputs` are what it transforms (a Concat head's inputs, or the first link's
    run-time tensor), each link's constant appended."""
    heads, inputs = len(inputs), list(inputs)
    steps = []
    for c in links:
        const = next((i for i in c.inputs if i in g.constants), None) if c.op in BINARY else None
        if const is None:
            steps.append({"op": c.op, "attrs": dict(c.attrs), "operand": None})
            continue
        inputs.append(const)
        steps.append({"op": c.op, "attrs": {}, "operand": len(inputs) - 1, "left": c.inputs[0] == const})
    last = links[-1]
    return Node(last.name, CHAIN, inputs, list(last.outputs),
                {"concat": heads if concat else 1, "axis": 1, "steps": steps})
