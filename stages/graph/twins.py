"""Which tasks implement an op: a task another template can also run (a 3x3 stride-1 conv by Winograd)
has a twin, the same task under that template's op kind. Task extraction brings both; both are tuned
and the build runs whichever measured faster. The rule is about the task alone, so it lives with the
tasks and every stage after them may ask it.
"""

from __future__ import annotations

from collections.abc import Callable

from schemas.task import TuningTask

WINOGRAD = "conv2d_winograd"


def winograd_serves(task: TuningTask) -> bool:
    """Whether Winograd F(m,3) can run a conv2d task: 3x3 window, stride 1, no dilation, one group."""
    if task.op != "conv2d":
        return False
    a = task.attrs
    return (tuple(task.inputs[1].shape[2:]), tuple(a["strides"]), tuple(a["dilations"]), int(a["group"])) == (
        (3, 3), (1, 1), (1, 1), 1)


def winograd_twin(task: TuningTask) -> TuningTask:
    """The `conv2d_winograd` task computing what the conv2d `task` computes."""
    if not winograd_serves(task):
        raise ValueError(f"Winograd F(m,3) serves 3x3 stride-1 undilated single-group convs, not {task.description}")
    return task.model_copy(update={"op": WINOGRAD})


# op kind -> (whether another template can run the task, that template's twin of it), one pair per template
TWINS: dict[str, tuple[tuple[Callable[[TuningTask], bool], Callable[[TuningTask], TuningTask]], ...]] = {
    "conv2d": ((winograd_serves, winograd_twin),),
}


def alternatives(task: TuningTask) -> list[TuningTask]:
    """The twins of `task` that other templates can tune (e.g. Winograd for a 3x3 stride-1 conv)."""
    return [make(task) for serves, make in TWINS.get(task.op, ()) if serves(task)]
