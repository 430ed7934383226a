"""Attention's head transposes, read and written in place by the batch matmuls around them.

After `compose_copies` every attention block still copies Q and V into per-head order (BERT: a Transpose
of `[1, S, 12, 64]`; ViT-B/16: a StridedCopy of the qkv projection) and copies the product of the
probabilities and V back (a Transpose to `[S, 12, 64]`). Each copy is a view: element `i` of it sits at
`base + sum(i_d * strides[d])` of its source. The batch matmul template reads A and B and writes C with any
such strides as long as the last dim is unit-stride (`batch_matmul.Views`), so the build hands it the source
buffers and the copies disappear: BERT's and ViT's 4 copies per block become 1 (K^T, whose last dim is
strided, stays a copy).

Only where nothing else can tell: the copy (and each Reshape between it and the matmul) has that one
reader, none is a graph output, the source is a run-time tensor; on the output side the matmul's result is
read by that one Transpose alone and its epilogue has no tensor shaped like C. The schedule is the one
tuned on contiguous operands.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

from stages.build.apply_best import Choice
from stages.graph import epilogue
from stages.graph.ir import Graph, Node, contiguous_strides
from stages.graph.passes_views import View, copy_view, reshaped, transpose_perm
from stages.templates import batch_matmul
from stages.templates.batch_matmul import Views


@dataclass(frozen=True)
class ViewPlan:
    graph: Graph  # the copies folded in are gone; their matmuls read the sources and write the results
    views: dict[str, Views]  # batch matmul node name → where its A, B and C live


def plan_gemm_views(graph: Graph, choices: dict[str, Choice]) -> ViewPlan:
    readers = Counter(name for node in graph.nodes for name in node.inputs if name)
    outputs = {v.name for v in graph.outputs}
    producer = graph.producer()
    consumer = {name: node for node in graph.nodes for name in node.inputs if name and readers[name] == 1}
    views: dict[str, Views] = {}
    gone: set[str] = set()
    rewired: dict[str, Node] = {}
    for node in graph.nodes:
        task = node.task
        if task is None or task.op != batch_matmul.NAME or task.signature not in choices:
            continue
        inputs, found = list(node.inputs), []
        for i in (0, 1):
            fold = _input_view(graph, producer, readers, outputs, node.inputs[i], task.inputs[i].shape)
            fold = None if fold is None or fold[0].name in gone else fold  # (an earlier matmul writes through it)
            found.append(fold and fold[1])
            if fold:
                inputs[i] = fold[0].inputs[0]
                gone.update(n.name for n in (fold[0], *fold[2]))
        out, c_view = node.outputs[0], None
        reader = consumer.get(out)
        if reader is not None and reader.op == "Transpose" and out not in outputs \
                and all(s.per_channel for s in epilogue.operands(task.epilogue)):
            c_view = _output_view(graph, reader, task.outputs[0].shape)
            if c_view is not None:
                out = reader.outputs[0]
                gone.add(reader.name)
        if found == [None, None] and c_view is None:
            continue
        views[node.name] = Views(a=found[0], b=found[1], c=c_view)
        rewired[node.name] = replace(node, inputs=inputs, outputs=[out])
    nodes = [rewired.get(n.name, n) for n in graph.nodes if n.name not in gone]
    return ViewPlan(replace(graph, nodes=nodes), views)


def _input_view(graph: Graph, producer: dict[str, Node], readers: Counter, outputs: set[str], name: str,
                shape: tuple[int, ...]) -> tuple[Node, tuple[int, tuple[int, ...]], list[Node]] | None:
    """(the copy, `name` as a (base, strides) view of its source, the Reshapes between) when the matmul may
    read the source in place."""
    found = copy_view(graph, producer, name)
    if found is None:
        return None
    copy, chain, view = found
    if copy.op == "Split" or copy.inputs[0] in graph.constants \
            or any(readers[n.outputs[0]] != 1 or n.outputs[0] in outputs for n in (copy, *chain)):
        return None
    view = reshaped(view, shape)  # the task's operand shape (the graph's may be a reshape of it)
    if view is None or (shape[-1] > 1 and view.strides[-1] != 1):
        return None
    return copy, (view.base, view.strides), chain


def _output_view(graph: Graph, transpose: Node, shape: tuple[int, ...]) -> tuple[int, tuple[int, ...]] | None:
    """C as a view of the Transpose's output buffer: C's dim `perm[d]` steps by that output's stride `d`."""
    y = graph.values[transpose.inputs[0]].shape
    perm = transpose_perm(transpose, len(y))
    into = contiguous_strides(graph.values[transpose.outputs[0]].shape)
    strides = [0] * len(y)
    for d, p in enumerate(perm):
        strides[p] = into[d]
    view = reshaped(View(0, y, tuple(strides)), shape)
    if view is None or (shape[-1] > 1 and view.strides[-1] != 1):
        return None
    return view.base, view.strides
