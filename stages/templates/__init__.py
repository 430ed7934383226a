"""Operator templates: one module per op family, looked up by the task's op kind."""

from __future__ import annotations

from schemas.task import TuningTask
from stages.templates import batch_matmul, conv2d, conv2d_winograd, dense, matmul, qconv2d, qdense, qmatmul
from stages.templates.base import Template

TEMPLATES: dict[str, Template] = {"matmul": matmul, "conv2d": conv2d, "conv2d_winograd": conv2d_winograd,
                                  "dense": dense, "batch_matmul": batch_matmul, "qdense": qdense,
                                  "qconv2d": qconv2d, "qmatmul": qmatmul}


def template_for(task: TuningTask) -> Template:
    try:
        return TEMPLATES[task.op]
    except KeyError:
        raise ValueError(f"no template for op {task.op!r}; templates exist for {sorted(TEMPLATES)}") from None
