"""Spend a global trial budget over tasks, one batch at a time, as a scheduler decides."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from stages.tune.task_scheduler import Scheduler, TaskState, group_bests, group_of

# Runs up to n trials of one task; returns (trials run, best latency of the task so far in s).
Step = Callable[[int], tuple[int, float]]


def weighted_latency(states: Sequence[TaskState]) -> float:
    """The model's estimated latency: sum over groups (an op and its alternative implementations) of
    weight x the group's best latency (inf while a group has none)."""
    states = list(states)
    weights = {group_of(s, i): s.weight for i, s in enumerate(states)}
    return sum(weights[g] * best for g, best in group_bests(states).items())


def allocate(scheduler: Scheduler, steps: Sequence[Step], weights: Sequence[float], budget: int,
             batch_size: int = 16, groups: Sequence[int] | None = None
             ) -> tuple[list[TaskState], list[tuple[int, float]]]:
    """Run batches until `budget` trials are spent or every task is exhausted. Tasks with equal
    `groups` entries implement one op: the model runs the fastest.

    Returns the final task states and the curve (total trials, weighted latency) after each batch.
    """
    states = [TaskState(float(w), None if groups is None else groups[i]) for i, w in enumerate(weights)]
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
