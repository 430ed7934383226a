"""Which tasks implement an op: a task another template can also run (a 3x3 stride-1 conv by Winograd)
has a twin, the same task under that template's op kind. Task extraction brings both; both are tuned
and the build runs whichever measured faster; with no record of either, the default build runs the
twin whose default schedule measured faster than the task's own (`default_wins`). The rules are
about the task alone, so they live with the tasks and every stage after them may ask them.
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


# Where the Winograd default (F(4x4), 2 tile rows) beats the direct default, measured per conv alone with its
# weights evicted from every cache before each call, as a whole model runs them (its weights stream from
# memory), on the zoo's 3x3 stride-1 layers and synthetic ones; Zen 4, 1 thread (benchmarks/zoo_conv_defaults.py
# times them warm, which hides the cost of the transformed weights: 256x14x14 -> 256 0.58x warm, 1.5x cold)
WINOGRAD_MIN_CHANNELS = 16  # in and out; 16x56x56 -> 16 0.76x the direct time, 8x64x64 -> 8 1.15x, 4 -> 16 1.3x
WINOGRAD_MAX_CHANNEL_PAIRS = 256 * 256  # C x K: 36 C K transformed weights, streamed once per work item, must
# stay in cache: 256 -> 256 at 28x28 0.9x, 320 -> 320 1.1x, 384 -> 384 1.45x, 448 -> 384 at 8x8 1.2x
WINOGRAD_MIN_OUTPUT = 24  # output rows and columns: the transformed weights (4x the direct ones) cost about as
# much memory time at any image size, the multiplies saved grow with it: 35x35-149x149 0.41-0.67x, 24x24 and
# 28x28 0.74-0.81x, 20x20 0.94-1.4x (2 of its 5 tile columns fill a 16-lane group of 4), 14x14 0.93-1.5x, 7x7 1.1x


def winograd_default_wins(task: TuningTask) -> bool:
    """Whether the Winograd twin's default schedule beats the direct default in a whole model: a conv
    Winograd serves with at least 16 input and output channels (fewer waste the transforms' lanes),
    at most 256 x 256 channel pairs (more spill the transformed weights from cache) and an output of at
    least 24x24 (on smaller ones the multiplies saved do not pay for the 4x larger weights' memory
    traffic). Derived at 1 thread; 2-thread figures on the shared machine agreed where they were steady."""
    if not winograd_serves(task):
        return False
    c, k = task.inputs[1].shape[1], task.inputs[1].shape[0]
    oh, ow = task.outputs[0].shape[2:]
    return (min(c, k) >= WINOGRAD_MIN_CHANNELS and c * k <= WINOGRAD_MAX_CHANNEL_PAIRS
            and min(oh, ow) >= WINOGRAD_MIN_OUTPUT)


Rule = Callable[[TuningTask], bool]
# op kind -> (whether another template can run the task, that template's twin of it, whether the twin's
# default schedule beats the task's own), one triple per template
TWINS: dict[str, tuple[tuple[Rule, Callable[[TuningTask], TuningTask], Rule], ...]] = {
    "conv2d": ((winograd_serves, winograd_twin, winograd_default_wins),),
}


def alternatives(task: TuningTask) -> list[TuningTask]:
    """The twins of `task` that other templates can tune (e.g. Winograd for a 3x3 stride-1 conv)."""
    return [make(task) for serves, make, _ in TWINS.get(task.op, ()) if serves(task)]


def default_alternative(task: TuningTask) -> TuningTask | None:
    """The twin an untuned build runs instead of `task` (its default schedule is faster), or None."""
    return next((make(task) for serves, make, wins in TWINS.get(task.op, ()) if serves(task) and wins(task)), None)
