"""Records from other logs that can help a task: exact matches (resume from them) and records of
the same op family on other shapes or targets (seed the cost model). A family is the op kinds
that share one feature function: matmul, dense and batch_matmul are all the GEMM schedule."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from schemas.record import TuningRecord
from schemas.task import TuningTask
from stages.cost_model.features import FEATURES
from stages.log import TuningLog


@dataclass(frozen=True)
class Transfer:
    exact: tuple[TuningRecord, ...]
    related: tuple[TuningRecord, ...]


def load_transfer(paths: Sequence[str], task: TuningTask, target_key: str, threads: int) -> Transfer:
    exact, related = [], []
    for path in paths:
        for r in TuningLog(path).records():
            if not same_family(r.task.op, task.op):
                continue
            same = r.task_signature == task.signature and r.target_key == target_key and r.threads == threads
            (exact if same else related).append(r)
    return Transfer(tuple(exact), tuple(related))


def same_family(a: str, b: str) -> bool:
    return a == b or (a in FEATURES and FEATURES.get(a) is FEATURES.get(b))
