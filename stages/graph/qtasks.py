"""Int8 anchors as tuning tasks: each canonical `qconv2d` / `qdense` node (passes_quant.py) gets the TuningTask
its template (stages/templates/qconv2d.py, qdense.py) tunes and builds, so quantized models are tuned, logged
and built like float ones; a node no schedule serves still runs its generated loop kernel (stages/memops/quant.py).
"""

from __future__ import annotations

from schemas.task import TuningTask
from stages.graph.ir import Graph
from stages.graph.passes_quant import task_fields

INT8_ANCHORS = ("qconv2d", "qdense")


def assign_int8_tasks(g: Graph) -> None:
    for node in g.nodes:
        if node.op in INT8_ANCHORS and node.task is None:
            node.task = TuningTask(**task_fields(g, node))
