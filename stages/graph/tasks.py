"""Task extraction: the tuning tasks of an optimised graph, each tuned once however often it occurs.

Only anchor nodes (conv2d, dense, matmul, batch_matmul, with their fused epilogues) become tasks;
memory-bound ops (pooling, softmax, normalisation, reshapes, ...) run generic kernels untuned.
Two anchors with the same `TuningTask.signature` share one task whose weight is the number of
occurrences, so a scheduler can spend trials where the model spends time. A task another template
can also implement (a 3x3 stride-1 conv by Winograd) brings that twin as a task of its own, with
the same nodes and weight: both are tuned, and the build runs whichever measured faster.
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.task import TuningTask
from stages.graph.ir import Graph
from stages.graph.twins import alternatives


@dataclass(frozen=True)
class ExtractedTask:
    task: TuningTask
    weight: int
    nodes: tuple[str, ...]
    alternative_to: str | None = None  # the signature of the task this one is another implementation of

    @property
    def flops(self) -> int:
        """FLOPs of one occurrence."""
        return self.task.flops


def extract_tasks(graph: Graph) -> list[ExtractedTask]:
    """Tasks in order of first occurrence in the graph, each followed by its alternative implementations."""
    found: dict[str, tuple[TuningTask, list[str]]] = {}
    for node in graph.nodes:
        if node.task is not None:
            found.setdefault(node.task.signature, (node.task, []))[1].append(node.name)
    out = []
    for task, names in found.values():
        out.append(ExtractedTask(task, len(names), tuple(names)))
        out += [ExtractedTask(alt, len(names), tuple(names), task.signature) for alt in alternatives(task)]
    return out


def untuned_ops(graph: Graph) -> dict[str, int]:
    """Memory-bound op types left in the graph, with their counts."""
    counts: dict[str, int] = {}
    for node in graph.nodes:
        if node.task is None:
            counts[node.op] = counts.get(node.op, 0) + 1
    return counts
