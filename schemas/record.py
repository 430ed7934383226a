"""One row of the tuning log."""

from __future__ import annotations

import statistics
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from schemas.config import Config
from schemas.measure import MeasureResult
from schemas.task import TuningTask

SCHEMA_VERSION = 1
REMEASURE = "remeasure"  # the `tuner` of a re-measurement row: not a trial, never counted as one
IN_MODEL = "in-model"  # an in-model verdict row (stages/refine): the config's time inside the built model


class TuningRecord(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = SCHEMA_VERSION
    tunaflow_version: str
    session_id: str
    trial: int = Field(ge=0)
    tuner: str
    target_key: str
    task_signature: str
    task: TuningTask
    template_version: int = Field(ge=1)
    threads: int = Field(default=1, ge=1, description="threads the kernel ran with")
    cache: Literal["hot", "weights", "cold", "model"] = Field(
        default="hot", description="cache state each timed call started from (stages/measure/cache.py; older logs: "
        "hot; `model`: an in-model verdict's, whatever the layers before left)")
    config: Config
    result: MeasureResult
    gflops: float = Field(ge=0)
    # Re-measure rows only (a part written before these fields existed reads them as their defaults):
    rounds: tuple[float, ...] = Field(default=(), description="median seconds per call of each interleaved round")
    combined_s: float | None = Field(default=None, gt=0, description="the figure this config ranks by: the minimum "
                                     "of its trial medians and round medians (load only ever slows a kernel)")
    unstable: bool = Field(default=False, description="its last rounds still varied more than the stable CV")

    @property
    def cost_s(self) -> float:
        """Seconds per call the log ranks this record by: a re-measurement's combined figure, else its median."""
        return self.combined_s if self.combined_s is not None else self.result.median

    @property
    def rounds_cv(self) -> float | None:
        """Coefficient of variation of the round medians (None with fewer than two rounds)."""
        if len(self.rounds) < 2:
            return None
        return statistics.stdev(self.rounds) / statistics.mean(self.rounds)
