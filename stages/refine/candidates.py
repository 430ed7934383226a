"""Which records of each op to time inside the model: the one the log's ranking picks and its nearest rivals.

A record's time is its kernel alone (weights flushed, activations hot); inside the model the layers before
leave other caches and the workspace other addresses, and the order can change: ResNet-50's 14x14 Winograd
layers rank F(4x4) first (0.56 ms alone) but run it 0.80 ms per call in the model, where F(2x2) (0.62 alone)
runs 0.66 (Zen 5). Rivals are the default schedule (ViT-B/16's default build ran 2% faster than its tuned one at
2 threads), the other implementation's best (a conv's Winograd twin) and the next distinct configs by rank,
each within `WITHIN` of the pick's time: further off, the model would not reverse the order.
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.record import TuningRecord
from schemas.target import Target
from schemas.task import TuningTask
from stages.build.apply_best import choose, implementations, latest_verdict, ranked_records, refusal, verdicts_for
from stages.graph.ir import Graph
from stages.graph.twins import alternatives
from stages.log import TuningLog
from stages.log.store import rank_key
from stages.templates import TEMPLATES, template_for
from stages.templates.space import NoValidConfig

WITHIN = 1.5


@dataclass(frozen=True)
class Group:
    """The nodes of one task signature and the records to time on them, the ranking's pick first."""

    signature: str
    description: str
    nodes: tuple[str, ...]
    candidates: tuple[TuningRecord, ...]
    judged: bool  # the op's latest verdict timed every one of these candidates already


def groups(graph: Graph, log: TuningLog, target: Target, threads: int, top_k: int) -> list[Group]:
    """Every op of `graph` with a tuned pick, in graph order, with at most `top_k` candidates each."""
    nodes: dict[str, list[str]] = {}
    tasks = {}
    for n in graph.nodes:
        if n.task is not None and n.task.op in TEMPLATES and n.inputs[1] in graph.constants:
            nodes.setdefault(n.task.signature, []).append(n.name)
            tasks[n.task.signature] = n.task
    everyone = [*tasks.values(), *(alt for t in tasks.values() for alt in alternatives(t))]
    choices = choose(everyone, log, target, threads)
    picked = implementations(list(tasks.values()), choices)
    ranked = ranked_records(log, target, threads)
    verdicts = verdicts_for(log, target, threads)
    out = []
    for sig, task in tasks.items():
        pick = choices[picked[sig].signature].record
        if pick is None:
            continue
        twins = {t.signature: t for t in (task, *alternatives(task))}
        rivals = sorted((r for s, t in twins.items() for r in ranked.get(s, [])
                         if r.cost_s <= WITHIN * pick.cost_s and refusal(t, r, target) is None), key=rank_key)
        chosen = [pick]
        seen = {_key(pick)}
        defaults = [_default_record(t, [r for r in rivals if r.task_signature == s], target) for s, t in twins.items()]
        firsts = [next((r for r in rivals if r.task_signature == s), None) for s in twins]
        for r in [*(d for d in defaults if d is not None), *(f for f in firsts if f is not None), *rivals]:
            if len(chosen) < top_k and _key(r) not in seen:
                seen.add(_key(r))
                chosen.append(r)
        judged = seen <= {_key(v) for v in latest_verdict(verdicts, set(twins))}
        out.append(Group(sig, task.description, tuple(nodes[sig]), tuple(chosen), judged))
    return out


def _default_record(task: TuningTask, ranked: list[TuningRecord], target: Target) -> TuningRecord | None:
    """The best record of the task's default schedule (a session's first trial), if the log has one."""
    try:
        default = template_for(task).default_config(task, target).key()
    except NoValidConfig:
        return None
    return next((r for r in ranked if r.config.key() == default), None)


def _key(r: TuningRecord) -> tuple[str, str]:
    return r.task_signature, r.config.key()
