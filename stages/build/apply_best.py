"""Apply-best: the schedule each anchor op gets in the library.

For each tuning task, the best error-free record for (task signature, target key, threads)
in the log wins; a task with no such record (or whose recorded knobs the current template
no longer accepts) gets the template's default schedule, and the caller is told which. A task
the template has no schedule for at all (`NoValidConfig`) gets none: the build runs the generic
kernel and says why. An op with alternative implementations (a conv and its Winograd twin) runs
whichever has the faster record; with no record of either, the one whose default schedule measured
faster on such a task (`stages.graph.twins.default_alternative`).

An in-model verdict (`stages/refine`) overrides that ranking: the records of an op (and its twins) timed
inside the built model, the fastest there wins. The latest verdict of an op counts, and only while the
record the ranking would pick is among those it timed: a better record tuned since voids it.
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
        why = "no error-free record in the log" if log is not None else "no log given"
        for rec in ranked.get(task.signature, []):
            reason = refusal(task, rec, target)
            if reason is None:
                choices[task.signature] = Choice(task, rec.config, rec)
                break
            why = f"no record the template accepts ({reason})"
        else:
            try:
                choices[task.signature] = Choice(task, template_for(task).default_config(task, target), None, why)
            except NoValidConfig as exc:
                choices[task.signature] = Choice(task, None, None, str(exc))
    return choices


def refusal(task: TuningTask, record: TuningRecord, target: Target) -> str | None:
    """Why the template would not build `record`'s config for `task` today, or None."""
    tpl = template_for(task)
    if record.template_version != tpl.VERSION:
        return f"records are for template version {record.template_version}, this is {tpl.VERSION}"
    return tpl.space(task, target).reason(record.config.knobs)


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


def latest_verdict(verdicts: list[TuningRecord], signatures: set[str]) -> list[TuningRecord]:
    """The rows of the last refinement session that timed any of `signatures` (an op and its twins), of those."""
    mine = [v for v in verdicts if v.task_signature in signatures]
    return [v for v in mine if v.session_id == mine[-1].session_id] if mine else []


def verdicts_for(log: TuningLog, target: Target, threads: int) -> list[TuningRecord]:
    """The log's error-free in-model rows for this target and thread count, oldest first."""
    return [v for v in log.verdicts() if v.target_key == target.key and v.threads == threads and v.result.ok]


def apply_verdicts(tasks: list[TuningTask], picked: dict[str, TuningTask], choices: dict[str, Choice],
                   log: TuningLog | None, target: Target, threads: int) -> None:
    """Let each op's latest in-model verdict (see the module's docstring) pick its implementation and schedule:
    updates `picked` and `choices` in place. The choice keeps the config's own best record (its time alone), so
    the manifest and `run --profile` compare the library with the kernel as tuned."""
    verdicts = [] if log is None else verdicts_for(log, target, threads)
    ranked = ranked_records(log, target, threads) if verdicts else {}
    trial = {(r.task_signature, r.config.key()): r for recs in ranked.values() for r in reversed(recs)}  # best wins
    for task in {t.signature: t for t in tasks}.values():
        group = {t.signature: t for t in (task, *alternatives(task))}
        latest = latest_verdict(verdicts, set(group))
        incumbent = choices.get(picked[task.signature].signature)
        if not latest or incumbent is None or incumbent.record is None:
            continue
        timed = {(v.task_signature, v.config.key()) for v in latest}
        if (incumbent.record.task_signature, incumbent.record.config.key()) not in timed:
            continue
        fit = [v for v in latest if (v.task_signature, v.config.key()) in trial
               and refusal(group[v.task_signature], v, target) is None]
        if fit:
            win = min(fit, key=lambda v: v.cost_s)
            picked[task.signature] = group[win.task_signature]
            choices[win.task_signature] = Choice(group[win.task_signature], win.config,
                                                 trial[(win.task_signature, win.config.key())])


def fallback_message(choices: dict[str, Choice]) -> str | None:
    """One message naming every task that fell back to its default schedule, or None."""
    fell = [c for c in choices.values() if not c.tuned]
    if not fell:
        return None
    lines = [f"{len(fell)} of {len(choices)} task(s) use the default schedule:"]
    lines += [f"  {c.task.description} [{c.task.signature}]: {c.why_default}" for c in fell]
    return "\n".join(lines)
