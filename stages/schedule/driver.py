"""Spend a global trial budget over tasks, one batch at a time, as a scheduler decides."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from stages.schedule.scheduler import Scheduler, TaskState

# Runs up to n trials of one task; returns (trials run, best latency of the task so far in s).
Step = Callable[[int], tuple[int, float]]


def weighted_latency(states: Sequence[TaskState]) -> float:
    """The model's estimated latency: sum of weight x best latency (inf while a task has none)."""
    return sum(s.weight * s.best for s in states)


def allocate(scheduler: Scheduler, steps: Sequence[Step], weights: Sequence[float], budget: int,
             batch_size: int = 16) -> tuple[list[TaskState], list[tuple[int, float]]]:
    """Run batches until `budget` trials are spent or every task is exhausted.

    Returns the final task states and the curve (total trials, weighted latency) after each batch.
    """
    states = [TaskState(float(w)) for w in weights]
    curve: list[tuple[int, float]] = []
    spent = 0
    while spent < budget and not all(s.exhausted for s in states):
        i = scheduler.pick(states)
        ran, best = steps[i](min(batch_size, budget - spent))
        if ran == 0:
            states[i].exhausted = True
            continue
        states[i].record(ran, best)
        spent += ran
        latency = weighted_latency(states)
        curve.append((spent, latency if math.isfinite(latency) else math.inf))
    return states, curve
