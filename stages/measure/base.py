"""What a runner is: measure built candidates, one result per build, never raising for a bad one."""

from __future__ import annotations

from typing import Protocol

from schemas.measure import MeasureResult
from schemas.options import MeasureOptions
from stages.measure.artifact import BuildResult


class Runner(Protocol):
    options: MeasureOptions

    def run(self, builds: list[BuildResult]) -> list[MeasureResult]: ...

    def close(self) -> None: ...

    def __enter__(self) -> Runner: ...

    def __exit__(self, *exc: object) -> None: ...
