"""Training rows for a cost model: features per config, labels normalised per task.

Labels are throughput / best throughput of the same task (failures 0), so tasks of different
sizes, and logs of other shapes or machines, share one scale; throughput is the fastest repeat's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from schemas.measure import MeasureResult
from schemas.record import TuningRecord
from schemas.target import Target
from schemas.task import TuningTask
from stages.cost_model.features import featurize
from stages.templates.space import Knobs


@dataclass(frozen=True)
class Rows:
    x: np.ndarray
    y: np.ndarray
    groups: np.ndarray
    weights: np.ndarray

    @staticmethod
    def concat(parts: Sequence[Rows]) -> Rows:
        """Stack parts, renumbering groups 0, 1, ... in order."""
        parts = [p for p in parts if len(p.y)]
        if not parts:
            return Rows(np.zeros((0, 0), np.float32), np.zeros(0), np.zeros(0, np.int64), np.zeros(0))
        offset, groups = 0, []
        for p in parts:
            _, inverse = np.unique(p.groups, return_inverse=True)
            groups.append(inverse + offset)
            offset += int(inverse.max()) + 1
        return Rows(np.vstack([p.x for p in parts]), np.concatenate([p.y for p in parts]),
                    np.concatenate(groups), np.concatenate([p.weights for p in parts]))


def knob_columns(knobs: Sequence[Knobs]) -> dict[str, np.ndarray]:
    """Knob value per config: float for numeric knobs, object for string ones; missing is NaN/None."""
    names = list(dict.fromkeys(name for kd in knobs for name in kd))
    cols: dict[str, np.ndarray] = {}
    for name in names:
        raw = [kd.get(name) for kd in knobs]
        if all(v is None or isinstance(v, int) for v in raw):
            cols[name] = np.array([np.nan if v is None else float(v) for v in raw])
        else:
            cols[name] = np.array(raw, dtype=object)
    return cols


def speed(result: MeasureResult) -> float:
    """A label's raw throughput (1 / seconds, 0 for a failure) from the fastest repeat: contention on a
    shared machine only ever slows a run down, so the minimum is the least noisy estimate of the
    config's own speed (a median still carries whichever repeats were disturbed)."""
    return 1.0 / min(result.costs) if result.ok else 0.0


def normalise(throughput: np.ndarray) -> np.ndarray:
    best = float(np.max(throughput)) if len(throughput) else 0.0
    return throughput / best if best > 0 else np.zeros_like(throughput)


def task_rows(task: TuningTask, target: Target, threads: int, knobs: Sequence[Knobs], throughput: np.ndarray,
              weight: float = 1.0) -> Rows:
    """One task's configs and their throughput (any unit; 0 = failed) as one group."""
    if not knobs:
        return Rows.concat([])
    x = featurize(task, target, threads, knob_columns(knobs))
    y = normalise(np.asarray(throughput, dtype=np.float64))
    return Rows(x, y, np.zeros(len(y), np.int64), np.full(len(y), weight))


def transfer_rows(records: Sequence[TuningRecord], target: Target, weight: float = 1.0) -> Rows:
    """Records of other tasks (same op kind), one group per task, target and thread count.

    Features use `target`'s facts: a log from another machine lends its ranking, not its caches.
    """
    by_group: dict[tuple, list[TuningRecord]] = {}
    for r in records:
        by_group.setdefault((r.task_signature, r.target_key, r.threads), []).append(r)
    parts = []
    for recs in by_group.values():
        task = recs[0].task
        parts.append(task_rows(task, target, recs[0].threads, [r.config.knobs for r in recs],
                               np.array([speed(r.result) for r in recs]), weight))
    return Rows.concat(parts)
