"""Transposes that only move unit dims become Reshapes, so the build runs them as aliases, not copies.

ViT-B/16's exporter writes `Transpose(perm=[1, 0, 2])` of a `[1, 197, 768]` tensor before every attention
block (and GPT-2's and the classic exporters' views do the same with other unit dims): the elements keep their
order in memory, yet each one was a copy kernel. The dims of size > 1 keep their relative order exactly when
the permutation is a reshape; then the node becomes `Reshape(shape=<its output shape>)`.
"""

from __future__ import annotations

from stages.graph.ir import Graph


def unit_transposes_to_reshapes(g: Graph) -> None:
    for node in g.nodes:
        if node.op != "Transpose" or node.inputs[0] not in g.values:
            continue
        shape = g.values[node.inputs[0]].shape
        perm = node.attrs.get("perm") or list(range(len(shape)))[::-1]
        moved = [d for d in perm if shape[d] != 1]
        if moved == sorted(moved):
            node.op, node.attrs = "Reshape", {"shape": [int(shape[d]) for d in perm]}
