"""The tuner interface: propose a batch, learn from its results."""

from __future__ import annotations

from typing import Protocol

from schemas.config import Config
from schemas.measure import MeasureResult


class Tuner(Protocol):
    name: str

    def has_next(self) -> bool: ...

    def next_batch(self, n: int) -> list[Config]:
        """Up to n configs never proposed before (nor excluded at construction)."""

    def update(self, configs: list[Config], results: list[MeasureResult]) -> None: ...
