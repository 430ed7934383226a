"""The Parquet tuning log."""

from stages.log.errors import LogBusyError, LogError, LogVersionError, LogWriteError
from stages.log.store import Problem, TuningLog, merge

__all__ = ["LogBusyError", "LogError", "LogVersionError", "LogWriteError", "Problem", "TuningLog", "merge"]
