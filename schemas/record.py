"""One row of the tuning log."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from schemas.config import Config
from schemas.measure import MeasureResult
from schemas.task import TuningTask

SCHEMA_VERSION = 1
REMEASURE = "remeasure"  # the `tuner` of a re-measurement row: not a trial, never counted as one


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
    config: Config
    result: MeasureResult
    gflops: float = Field(ge=0)
