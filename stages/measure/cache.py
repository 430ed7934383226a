"""Which cache state a kernel is timed in, so its record's time is the time it takes inside the model.

In a model each anchor runs once per inference: its activations were just written by the layer before
(in cache), its weights were last read one inference ago and the other layers have evicted them since.
The tuner's hot loop keeps the weights in L1/L2 and ranks configs by a state the model never has.

Measured (benchmarks/cache_state.py, 2026-12-02, Zen 4: 1 MiB L2, 32 MiB L3; per anchor the library's time
over the same config timed alone per call, median over anchors): hot 1.18 / 1.10 / 1.41 (MobileNetV2 /
ResNet-50 / EfficientNet-B0), weights flushed 0.96 / 0.97 / 1.00, everything flushed 0.72 / 0.88 / 0.74.
Flushing the weights is the closest state in every weight-size class, including kernels whose weights
exceed L2 (ResNet-50, 1-8 MiB: hot 1.12, weights 0.95) or even 8 MiB (hot 1.14, weights 0.95): a hot loop
keeps those in L3, the model streams them from memory. So `auto` flushes the weights of every kernel that
has any, and keeps kernels of activations only (batch_matmul) hot.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from schemas.options import MeasureOptions
from schemas.target import Target
from schemas.task import TuningTask
from stages.graph.epilogue import operands

Resolved = Literal["hot", "weights", "cold"]
ACTIVATION_OPS = ("batch_matmul",)  # every operand is an activation (attention's Q, K, V): nothing to evict
DTYPE_BYTES = {"float32": 4, "int32": 4, "uint8": 1, "int8": 1}


def weight_indices(task: TuningTask) -> list[int]:
    """Which of the task's inputs are constants in a model: all but the first (the activation) and a residual
    (an activation written a few layers before)."""
    if task.op in ACTIVATION_OPS:
        return []
    epi = operands(task.epilogue)
    first = len(task.inputs) - len(epi)  # epilogue tensors follow the op's own inputs
    residual = {first + slot for slot, o in enumerate(epi) if o.role == "residual"}
    return [i for i in range(1, len(task.inputs)) if i not in residual]


def weight_bytes(task: TuningTask) -> int:
    return sum(task.inputs[i].size * DTYPE_BYTES[task.inputs[i].dtype] for i in weight_indices(task))


def resolve(options: MeasureOptions, task: TuningTask, target: Target) -> Resolved:
    """The state to time this kernel in: `auto` means its weights flushed when it has any, else hot. The per-line
    flush is x86's: elsewhere `auto` stays hot (a 64 MiB write before each call would slow tuning on a small
    device many times over) and an explicit `weights` flushes everything (`cold`)."""
    x86 = target.triple.startswith(("x86_64", "i686"))
    if options.cache == "auto":
        return "weights" if weight_bytes(task) and x86 else "hot"
    if options.cache == "weights" and not x86:
        return "cold"
    return options.cache


def weight_args(task: TuningTask, args: list[np.ndarray]) -> list[np.ndarray]:
    """The kernel's buffers to flush in `weights` state. Every template's arguments are its inputs in order
    (packed), then any workspace, then the output: a workspace is the library's scratch, hot in the model."""
    return [args[i] for i in weight_indices(task)]
