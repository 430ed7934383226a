"""Operator templates: one module per op family, looked up by the task's op kind."""

from __future__ import annotations

from schemas.task import TuningTask
from stages.templates import batch_matmul, conv2d, conv2d_winograd, dense, matmul
from stages.templates.base import Template

TEMPLATES: dict[str, Template] = {"matmul": matmul, "conv2d": conv2d, "conv2d_winograd": conv2d_winograd,
                                  "dense": dense, "batch_matmul": batch_matmul}


# Other implementations of an op kind's tasks: each module's `serves(task)` says whether it can run a
# task, `twin(task)` is that task under its own op kind. Both are tuned; the build keeps the faster.
ALTERNATIVES: dict[str, tuple] = {"conv2d": (conv2d_winograd,)}


def alternatives(task: TuningTask) -> list[TuningTask]:
    """The twins of `task` that other templates can tune (e.g. Winograd for a 3x3 stride-1 conv)."""
    return [alt.twin(task) for alt in ALTERNATIVES.get(task.op, ()) if alt.serves(task)]


def template_for(task: TuningTask) -> Template:
    try:
        return TEMPLATES[task.op]
    except KeyError:
        raise ValueError(f"no template for op {task.op!r}; templates exist for {sorted(TEMPLATES)}") from None
