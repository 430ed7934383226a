"""The static memory plan: where every tensor lives while `tf_run` executes.

Intermediates share one workspace: walking the steps in order, a buffer is placed (first
fit, 64-byte aligned) when its producer runs and released after its last reader, so tensors
whose lifetimes do not overlap reuse the same bytes. Graph inputs and outputs live in the
caller's arrays, constants in the weights file.
"""

from __future__ import annotations

from dataclasses import dataclass

ALIGN = 64


def aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass(frozen=True)
class Step:
    """One kernel call: the tensors it reads and the tensors it writes (by storage name)."""

    reads: tuple[str, ...]
    writes: tuple[str, ...]


@dataclass(frozen=True)
class WorkspacePlan:
    offsets: dict[str, int]
    size: int
    naive_size: int


def plan_workspace(steps: list[Step], nbytes: dict[str, int]) -> WorkspacePlan:
    """Offsets for the tensors in `nbytes` (the intermediates) over the lifetime `steps` give them."""
    last: dict[str, int] = {}
    for i, step in enumerate(steps):
        for name in (*step.reads, *step.writes):
            if name in nbytes:
                last[name] = i
    live: dict[str, tuple[int, int]] = {}
    offsets: dict[str, int] = {}
    size = 0
    for i, step in enumerate(steps):
        for name in step.writes:
            if name in nbytes and name not in offsets:
                offsets[name] = _first_fit(sorted(live.values()), aligned(nbytes[name]))
                live[name] = (offsets[name], aligned(nbytes[name]))
                size = max(size, offsets[name] + aligned(nbytes[name]))
        for name in [n for n in live if last[n] <= i]:
            del live[name]
    return WorkspacePlan(offsets, size, sum(aligned(n) for n in nbytes.values()))


def _first_fit(blocks: list[tuple[int, int]], need: int) -> int:
    pos = 0
    for start, length in blocks:
        if start - pos >= need:
            return pos
        pos = max(pos, start + length)
    return pos
