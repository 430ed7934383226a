"""Pydantic models for everything that crosses a boundary."""

from schemas.config import Config
from schemas.measure import MeasureErrorNo, MeasureResult
from schemas.options import MeasureOptions, TuningOptions
from schemas.record import SCHEMA_VERSION, TuningRecord
from schemas.target import Target, TargetError
from schemas.task import EpilogueOp, TensorSpec, TuningTask, matmul_task

__all__ = [
    "SCHEMA_VERSION", "Config", "EpilogueOp", "MeasureErrorNo", "MeasureOptions", "MeasureResult",
    "Target", "TargetError", "TensorSpec", "TuningOptions", "TuningRecord", "TuningTask", "matmul_task",
]
