"""Which task gets the next batch: round-robin, or Ansor's gradient-based allocation.

The objective is the model's end-to-end latency, sum over tasks of weight x best latency
(weight = how often the task occurs in the model). The gradient scheduler gives the batch to the
task whose next trials are expected to cut that sum the most: a blend of how fast the task's best
improved over its last `window` trials (backward) and an optimistic guess that its latency keeps
falling like 1/trials (forward), times its weight. Every task gets one batch before that starts,
and with probability `epsilon` a random task is picked so a stalled estimate can recover.

Tasks of one `group` are alternative implementations of one op (a conv and its Winograd twin): the
model runs the fastest, so the objective counts the group's best, and a member's trials are worth
only what they are expected to take off that best. A member far slower than its twin stops getting
batches once its optimistic guess no longer reaches the twin (on the CNN, the direct kernels of the
four 16-channel convs had taken 40% of the budget while their Winograd twins, 1.7x faster, got 45
trials each).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


@dataclass
class TaskState:
    weight: float
    group: int | None = None  # tasks sharing a group implement one op (None: its own index)
    trials: int = 0
    best: float = math.inf
    history: list[tuple[int, float]] = field(default_factory=list)
    exhausted: bool = False

    def record(self, trials: int, best: float) -> None:
        self.trials += trials
        self.best = min(self.best, best)
        self.history.append((self.trials, self.best))


class Scheduler(Protocol):
    name: str

    def pick(self, states: list[TaskState]) -> int: ...


class RoundRobin:
    name = "round-robin"

    def __init__(self, seed: int = 0):
        self._next = 0

    def pick(self, states: list[TaskState]) -> int:
        for _ in range(len(states)):
            i = self._next
            self._next = (self._next + 1) % len(states)
            if not states[i].exhausted:
                return i
        raise ValueError("every task is exhausted")


class GradientScheduler:
    name = "gradient"

    def __init__(self, seed: int = 0, alpha: float = 0.2, window: int = 3, epsilon: float = 0.05,
                 lookahead: int = 8):  # trials ahead a member's guess must beat its group's best: about a batch
        self.rng = np.random.default_rng(seed)
        self.alpha, self.window, self.epsilon, self.lookahead = alpha, window, epsilon, lookahead

    def pick(self, states: list[TaskState]) -> int:
        live = [i for i, s in enumerate(states) if not s.exhausted]
        if not live:
            raise ValueError("every task is exhausted")
        fresh = [i for i in live if not math.isfinite(states[i].best)]
        if fresh:
            return fresh[0]
        if self.rng.random() < self.epsilon:
            return int(self.rng.choice(live))
        group_best = group_bests(states)
        gains = {i: states[i].weight * max(0.0, group_best[group_of(states[i], i)] - self.expected(states[i]))
                 for i in live}
        if max(gains.values()) > 0:
            return max(live, key=lambda i: gains[i])
        return min(live, key=lambda i: states[i].weight * self.gradient(states[i]))

    def expected(self, s: TaskState) -> float:
        """The task's best latency expected after `lookahead` more trials."""
        return s.best + self.lookahead * self.gradient(s)

    def gradient(self, s: TaskState) -> float:
        """d(best latency)/d(trial) expected next (negative: improving)."""
        forward = -s.best / max(s.trials, 1)
        if len(s.history) <= self.window:
            return forward
        t0, b0 = s.history[-1 - self.window]
        backward = (s.best - b0) / max(s.trials - t0, 1)
        return self.alpha * backward + (1 - self.alpha) * forward


def group_of(s: TaskState, i: int) -> int:
    """The group of task `i`: its `group`, or its own index (groups are indices of a member, as
    `stages.tune.model.alternative_groups` gives them)."""
    return i if s.group is None else s.group


def group_bests(states: list[TaskState]) -> dict[int, float]:
    """Each group's best latency: the fastest of its members."""
    best: dict[int, float] = {}
    for i, s in enumerate(states):
        key = group_of(s, i)
        best[key] = min(best.get(key, math.inf), s.best)
    return best


SCHEDULERS = {"round-robin": RoundRobin, "gradient": GradientScheduler}
