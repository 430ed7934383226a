"""Tuning records made by hand for the log tests, and a log whose newest part a crash cut in half."""

from __future__ import annotations

from pathlib import Path

from schemas import Config, MeasureErrorNo, MeasureResult, TuningRecord, matmul_task
from stages.log import TuningLog

TASK = matmul_task(8, 8, 8)


def rec(trial: int, cost: float | None, session: str = "s1", index: int | None = None,
        target: str = "tk") -> TuningRecord:
    """A record of TASK: measured at `cost` seconds, or a wrong answer when `cost` is None."""
    result = (MeasureResult(costs=(cost, cost * 1.1, cost * 0.9)) if cost is not None else
              MeasureResult(error_no=MeasureErrorNo.wrong_answer, error_msg="max abs error 1"))
    return TuningRecord(
        tunaflow_version="0.1.0", session_id=session, trial=trial, tuner="random", target_key=target,
        task_signature=TASK.signature, task=TASK, template_version=1,
        config=Config(index=trial if index is None else index, knobs={"mr": 4, "vw": 16, "order": "mnk"}),
        result=result, gflops=0.0 if cost is None else TASK.flops / cost / 1e9,
    )


def log_with_a_torn_part(path: Path) -> tuple[TuningLog, Path]:
    """A log of one whole part (trial 0) and one truncated to half its bytes (trials 1-2); returns the torn part."""
    log = TuningLog(path)
    log.append([rec(0, 1e-3)])
    part = log.append([rec(1, 1e-3), rec(2, 1e-3)])
    data = part.read_bytes()
    part.write_bytes(data[: len(data) // 2])
    return log, part
