"""The Parquet tuning log."""

from stages.log.store import LogError, Problem, TuningLog, merge

__all__ = ["LogError", "Problem", "TuningLog", "merge"]
