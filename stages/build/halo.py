"""Conv-to-conv hand-offs in the padded layout: the first conv writes its output inside the zero
borders the second conv pads with, and the second reads that buffer as its packed input, so its
pack phase (a copy of the whole input, ~7% of a 16-channel 3x3 conv here) disappears.

Only where nothing else can tell: the tensor is read by that one stride-1 conv and nobody else,
is not a graph output, and the first conv's epilogue has no tensor shaped like its output (a
residual would be read at the padded offsets).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from stages.build.apply_best import Choice
from stages.graph import epilogue
from stages.graph.ir import Graph, Node
from stages.templates import conv2d


@dataclass(frozen=True)
class HaloPlan:
    halos: dict[str, conv2d.Halo]  # node name → how its anchor kernel stores X and Y
    floats: dict[str, int]  # padded tensor → floats of its buffer


def plan_halos(graph: Graph, choices: dict[str, Choice]) -> HaloPlan:
    readers = Counter(name for node in graph.nodes for name in node.inputs if name)
    producer = {node.outputs[0]: node for node in graph.nodes if node.outputs}
    outputs = {v.name for v in graph.outputs}
    halos: dict[str, conv2d.Halo] = {}
    floats: dict[str, int] = {}
    for node in graph.nodes:
        if not _templated_conv(graph, node, choices):
            continue
        x = node.inputs[0]
        first = producer.get(x)
        if first is None or x in outputs or readers[x] != 1 or not _templated_conv(graph, first, choices):
            continue
        if not all(s.per_channel for s in epilogue.operands(first.task.epilogue)):
            continue
        padded = conv2d.padded_input(node.task, choices[node.task.signature].config.knobs)
        if padded is None:
            continue
        pads, floats[x] = padded
        halos[node.name] = conv2d.Halo(x_padded=True, y_pad=halos.get(node.name, conv2d.NO_HALO).y_pad)
        halos[first.name] = conv2d.Halo(x_padded=halos.get(first.name, conv2d.NO_HALO).x_padded, y_pad=pads)
    return HaloPlan(halos, floats)


def _templated_conv(graph: Graph, node: Node, choices: dict[str, Choice]) -> bool:
    """A conv2d anchor the template builds: its weights (which the template packs) are a build-time
    constant, so it cannot fall back to the generic kernel, which knows no halos."""
    task = node.task
    return (task is not None and task.op == conv2d.NAME and task.signature in choices
            and len(node.inputs) > 1 and node.inputs[1] in graph.constants)
