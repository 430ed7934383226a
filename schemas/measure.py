"""What one measurement of one candidate produced. Failures are data, never exceptions."""

from __future__ import annotations

import statistics
from datetime import UTC, datetime
from enum import IntEnum

from pydantic import BaseModel, ConfigDict, Field


class MeasureErrorNo(IntEnum):
    """Modelled on AutoTVM's MeasureErrorNo."""

    no_error = 0
    instantiation_error = 1
    compile_error = 2
    runtime_error = 4
    wrong_answer = 5
    build_timeout = 6
    run_timeout = 7
    unknown = 8
    implausible_result = 9  # a device's result no correct measurement can give (cost <= 0, NaN, past peak)


class MeasureResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    costs: tuple[float, ...] = ()
    error_no: MeasureErrorNo = MeasureErrorNo.no_error
    error_msg: str = ""
    build_s: float = Field(default=0.0, ge=0)
    run_s: float = Field(default=0.0, ge=0)
    timestamp: datetime = Field(default_factory=lambda: datetime.now(UTC))

    @property
    def ok(self) -> bool:
        return self.error_no == MeasureErrorNo.no_error and len(self.costs) > 0

    @property
    def median(self) -> float:
        """Median seconds per call (inf when failed): the machine is noisy, minima and means lie."""
        return statistics.median(self.costs) if self.ok else float("inf")

    @property
    def spread(self) -> float:
        """Coefficient of variation of the repeats (0 when fewer than two)."""
        if not self.ok or len(self.costs) < 2:
            return 0.0
        return statistics.stdev(self.costs) / statistics.mean(self.costs)


class Noise(BaseModel):
    """How busy the machine was while candidates were re-measured (from /proc: Linux only)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    seconds: float = Field(ge=0, description="how long the window lasted")
    cores: int = Field(ge=1)
    load_avg: float = Field(ge=0, description="1-minute load average at the window's end (tuning's builds count)")
    other_cores: float = Field(description="cores kept busy, on average, by processes other than tunaflow's own")
    steal: float = Field(ge=0, le=1, description="share of CPU time the hypervisor gave other guests")
    busy: bool = Field(description="other processes kept more than a quarter of a core busy, or steal exceeded 2%")
