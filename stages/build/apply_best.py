"""Apply-best: the schedule each anchor op gets in the library.

For each tuning task, the best error-free record for (task signature, target key, threads)
in the log wins; a task with no such record (or whose recorded knobs the current template
no longer accepts) gets the template's default schedule, and the caller is told which. A task
the template has no schedule for at all (`NoValidConfig`) gets none: the build runs the generic
kernel and says why. An op with alternative implementations (a conv and its Winograd twin) runs
whichever has the faster record; with no record of either, the one whose default schedule measured
faster on such a task (`stages.graph.twins.default_alternative`).
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.config import Config
from schemas.record import TuningRecord
from schemas.target import Target
from schemas.task import TuningTask
from stages.graph.twins import alternatives, default_alternative
from stages.log import TuningLog
from stages.log.store import rank_key
from stages.templates import template_for
from stages.templates.space import NoValidConfig


@dataclass(frozen=True)
class Choice:
    task: TuningTask
    config: Config | None  # None: the template has no schedule for the task (`why_default` says why)
    record: TuningRecord | None
    why_default: str = ""

    @property
    def tuned(self) -> bool:
        return self.record is not None


def ranked_records(log: TuningLog | None, target: Target, threads: int) -> dict[str, list[TuningRecord]]:
    """Error-free records per task signature, best first (`rank_key`: re-measured, then lowest median)."""
    ranked: dict[str, list[TuningRecord]] = {}
    if log is None:
        return ranked
    for r in log.records():
        if r.target_key == target.key and r.threads == threads and r.result.ok:
            ranked.setdefault(r.task_signature, []).append(r)
    for recs in ranked.values():
        recs.sort(key=rank_key)
    return ranked


def choose(tasks: list[TuningTask], log: TuningLog | None, target: Target, threads: int) -> dict[str, Choice]:
    """One choice per distinct task signature: its fastest record the template still accepts, else the default."""
    ranked = ranked_records(log, target, threads)
    choices: dict[str, Choice] = {}
    for task in tasks:
        if task.signature in choices:
            continue
        tpl = template_for(task)
        space = tpl.space(task, target)
        why = "no error-free record in the log" if log is not None else "no log given"
        for rec in ranked.get(task.signature, []):
            reason = space.reason(rec.config.knobs) if rec.template_version == tpl.VERSION else (
                f"records are for template version {rec.template_version}, this is {tpl.VERSION}")
            if reason is None:
                choices[task.signature] = Choice(task, rec.config, rec)
                break
            why = f"no record the template accepts ({reason})"
        else:
            try:
                choices[task.signature] = Choice(task, tpl.default_config(task, target), None, why)
            except NoValidConfig as exc:
                choices[task.signature] = Choice(task, None, None, str(exc))
    return choices


def implementations(tasks: list[TuningTask], choices: dict[str, Choice]) -> dict[str, TuningTask]:
    """Task signature → the task to build it with: an alternative implementation (`alternatives`)
    when its best record beats the task's own best record by `rank_key`, or the task has none; with no
    record of either, the alternative whose default schedule measured faster (`default_alternative`,
    if it has one); else the task itself."""
    picked: dict[str, TuningTask] = {}
    for task in tasks:
        best = task
        for alt in alternatives(task):
            mine, theirs = choices.get(best.signature), choices.get(alt.signature)
            if theirs is not None and theirs.tuned and (
                    mine is None or not mine.tuned or rank_key(theirs.record) < rank_key(mine.record)):
                best = alt
        mine = choices.get(task.signature)
        if best is task and (mine is None or not mine.tuned):
            alt = default_alternative(task)
            theirs = choices.get(alt.signature) if alt is not None else None
            if theirs is not None and theirs.config is not None:
                best = alt
        picked[task.signature] = best
    return picked


def fallback_message(choices: dict[str, Choice]) -> str | None:
    """One message naming every task that fell back to its default schedule, or None."""
    fell = [c for c in choices.values() if not c.tuned]
    if not fell:
        return None
    lines = [f"{len(fell)} of {len(choices)} task(s) use the default schedule:"]
    lines += [f"  {c.task.description} [{c.task.signature}]: {c.why_default}" for c in fell]
    return "\n".join(lines)
