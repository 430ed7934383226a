"""Apply-best: the schedule each anchor op gets in the library.

For each tuning task, the best error-free record for (task signature, target key, threads)
in the log wins; a task with no such record (or whose recorded knobs the current template
no longer accepts) gets the template's default schedule, and the caller is told which.
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.config import Config
from schemas.record import TuningRecord
from schemas.target import Target
from schemas.task import TuningTask
from stages.log import TuningLog
from stages.templates import template_for


@dataclass(frozen=True)
class Choice:
    task: TuningTask
    config: Config
    record: TuningRecord | None
    why_default: str = ""

    @property
    def tuned(self) -> bool:
        return self.record is not None


def best_records(log: TuningLog | None, target: Target, threads: int) -> dict[str, TuningRecord]:
    """The lowest-median error-free record per task signature (one pass over the log)."""
    best: dict[str, TuningRecord] = {}
    if log is None:
        return best
    for r in log.records():
        if r.target_key != target.key or r.threads != threads or not r.result.ok:
            continue
        cur = best.get(r.task_signature)
        if cur is None or r.result.median < cur.result.median:
            best[r.task_signature] = r
    return best


def choose(tasks: list[TuningTask], log: TuningLog | None, target: Target, threads: int) -> dict[str, Choice]:
    """One choice per distinct task signature."""
    best = best_records(log, target, threads)
    choices: dict[str, Choice] = {}
    for task in tasks:
        if task.signature in choices:
            continue
        tpl = template_for(task)
        rec = best.get(task.signature)
        why = "no error-free record in the log" if log is not None else "no log given"
        if rec is not None:
            space = tpl.space(task, target)
            reason = space.reason(rec.config.knobs) if rec.template_version == tpl.VERSION else (
                f"record is for template version {rec.template_version}, this is {tpl.VERSION}")
            if reason is None:
                choices[task.signature] = Choice(task, rec.config, rec)
                continue
            why = f"best record rejected: {reason}"
        choices[task.signature] = Choice(task, tpl.default_config(task, target), None, why)
    return choices


def fallback_message(choices: dict[str, Choice]) -> str | None:
    """One message naming every task that fell back to its default schedule, or None."""
    fell = [c for c in choices.values() if not c.tuned]
    if not fell:
        return None
    lines = [f"{len(fell)} of {len(choices)} task(s) use the default schedule:"]
    lines += [f"  {c.task.description} [{c.task.signature}]: {c.why_default}" for c in fell]
    return "\n".join(lines)
