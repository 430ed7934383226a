"""Int8 anchors as tuning tasks: each canonical `qconv2d` / `qdense` node (passes_quant.py), and each MatMulInteger
of a run-time uint8 X and a constant int8 W with zero point 0 (what `quantize_dynamic` writes), gets the TuningTask
its template (stages/templates/qconv2d.py, qdense.py, qmatmul.py) tunes and builds, so quantized models are tuned,
logged and built like float ones; a node no schedule serves still runs its generated loop kernel
(stages/memops/quant.py).
"""

from __future__ import annotations

import math

import numpy as np

from schemas.task import TensorSpec, TuningTask
from stages.graph.ir import Graph, Node
from stages.graph.passes_quant import task_fields

INT8_ANCHORS = ("qconv2d", "qdense")


def assign_int8_tasks(g: Graph) -> None:
    for node in g.nodes:
        if node.op in INT8_ANCHORS and node.task is None:
            node.task = TuningTask(**task_fields(g, node))
        elif node.op == "MatMulInteger" and node.task is None:
            node.task = _matmul_integer_task(g, node)


def _matmul_integer_task(g: Graph, node: Node) -> TuningTask | None:
    """X [..., M, K] uint8 at run time, W [K, N] int8 constant, one zero point each, W's 0: a `qmatmul`."""
    x, w, zx, zw = node.inputs
    xs = g.values[x].shape
    wv = g.constants.get(w)
    zwv = g.constants.get(zw)
    if x in g.constants or g.values[x].dtype != "uint8" or wv is None or wv.dtype != np.int8 or wv.ndim != 2 \
            or zwv is None or zwv.size != 1 or zwv.any() or math.prod(g.values[zx].shape) != 1 or len(xs) < 2:
        return None
    (k, n), m = wv.shape, math.prod(xs[:-1])
    inputs = (TensorSpec(shape=(m, k), dtype="uint8"), TensorSpec(shape=(k, n), dtype="int8"),
              TensorSpec(shape=(1,), dtype="uint8"), TensorSpec(shape=(1,), dtype="int8"))
    return TuningTask(op="qmatmul", inputs=inputs, outputs=(TensorSpec(shape=(m, n), dtype="int32"),))
