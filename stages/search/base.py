"""The tuner interface (propose a batch, learn from its results) and what a tuner is built from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from schemas.config import Config
from schemas.measure import MeasureResult
from schemas.record import TuningRecord
from schemas.target import Target
from schemas.task import TuningTask
from stages.templates.space import ConfigSpace


class Tuner(Protocol):
    name: str

    def has_next(self) -> bool: ...

    def next_batch(self, n: int) -> list[Config]:
        """Up to n configs never proposed before (nor excluded at construction)."""

    def update(self, configs: list[Config], results: list[MeasureResult]) -> None: ...


@dataclass(frozen=True)
class TunerContext:
    """Everything a tuner may use; simple tuners read only the space, seed and exclusions.

    `history` is what this task already has in the log (a resumed session learns from it);
    `transfer` holds records of the same op kind from other logs (other shapes or targets).
    """

    space: ConfigSpace
    task: TuningTask
    target: Target
    seed: int = 0
    exclude: frozenset[int] = frozenset()
    threads: int = 1
    history: tuple[tuple[Config, MeasureResult], ...] = ()
    transfer: tuple[TuningRecord, ...] = ()
    epsilon: float = 0.05
