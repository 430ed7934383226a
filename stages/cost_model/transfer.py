"""Records from other logs that can help a task: exact matches (resume from them) and records of
the same op kind on other shapes or targets (seed the cost model)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from schemas.record import TuningRecord
from schemas.task import TuningTask
from stages.log import TuningLog


@dataclass(frozen=True)
class Transfer:
    exact: tuple[TuningRecord, ...]
    related: tuple[TuningRecord, ...]


def load_transfer(paths: Sequence[str], task: TuningTask, target_key: str, threads: int) -> Transfer:
    exact, related = [], []
    for path in paths:
        for r in TuningLog(path).records():
            if r.task.op != task.op:
                continue
            same = r.task_signature == task.signature and r.target_key == target_key and r.threads == threads
            (exact if same else related).append(r)
    return Transfer(tuple(exact), tuple(related))
