"""What the builder hands the runner: an object file plus what is needed to run and check it."""

from __future__ import annotations

from dataclasses import dataclass

from schemas.config import Config
from schemas.measure import MeasureErrorNo
from schemas.target import Target
from schemas.task import TuningTask


@dataclass(frozen=True)
class BuildResult:
    task: TuningTask
    target: Target
    config: Config
    obj: bytes | None
    build_s: float
    error_no: MeasureErrorNo = MeasureErrorNo.no_error
    error_msg: str = ""

    @property
    def ok(self) -> bool:
        return self.obj is not None and self.error_no == MeasureErrorNo.no_error
