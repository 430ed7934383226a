"""Tuning time = deployed time: each tuned anchor's time inside the built library against its chosen record.

The tuner times a kernel alone (the same inputs, called for >= 10 ms per repeat) in the cache state its record
names (`TuningRecord.cache`: by default its weights flushed before each call and its activations hot, as a layer
finds them in the model; older logs: hot) and ranks a config by the fastest of its medians; in the model the
kernel runs once per call, its inputs come from the previous layer and its weights from wherever the other layers
left them. Both figures are compared by the same rule (the fastest median of rounds of consecutive runs), and an
anchor more than `TOLERANCE` off is flagged with what can be told about why: the record's thread count or its own
noise, the library's padded hand-off layout, the machine's load during the profile, and, when the kernel was timed
alone again (`profile_and_time_alone`), whether it is the record or the model that disagrees.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import NamedTuple

import numpy as np

from schemas.deployed import AnchorTime
from schemas.manifest import Manifest, OpInfo
from schemas.measure import Noise
from schemas.options import MeasureOptions
from schemas.record import REMEASURE, TuningRecord
from stages.log import TuningLog
from stages.measure.builder import build_one
from stages.measure.remeasure import cv
from stages.measure.runner import LocalRunner

TOLERANCE = 0.05
ROUNDS = 5  # a profile's runs are split into this many rounds of consecutive runs
ALONE_ROUNDS = 3
PER_CALL = 31  # single calls per round when a kernel is timed alone per call
PER_COLD_CALL = 11  # and with its caches flushed before each call (64 MB written per call)
TINY_S = 1e-6  # below this a single call's time is mostly the clock's and the call's overhead


class Alone(NamedTuple):
    """Seconds per call of an anchor's config timed alone by the tuner's runner: as the tuner times it (the mean of
    a >= 10 ms loop in its record's cache state, which counts every preemption on a busy machine), per single call
    hot (the median of `PER_CALL` calls, as the profile counts), per single call with the caches flushed before
    each, and the tuner's loop hot (what a record timed before cache states existed says)."""

    loop: float
    call: float
    cold: float
    hot: float


def chosen_records(manifest: Manifest, log: str | Path | None = None) -> dict[str, TuningRecord]:
    """Node -> the full log record its manifest entry names (session and trial), from `log` or the manifest's
    own log; empty when neither is a log directory (the manifest's figures are then all there is)."""
    path = Path(log) if log is not None else Path(manifest.log) if manifest.log else None
    if path is None or not path.is_dir():
        return {}
    wanted: dict[tuple[str, int], list[OpInfo]] = {}
    for op in manifest.ops:
        if op.record:
            wanted.setdefault((op.record["session_id"], op.record["trial"]), []).append(op)
    found: dict[str, TuningRecord] = {}
    for r in TuningLog(path).records():
        for op in wanted.get((r.session_id, r.trial), []):
            if r.task_signature == op.task_signature:
                found[op.node] = r
    return found


def round_figure(samples: np.ndarray, rounds: int = ROUNDS) -> tuple[float, float]:
    """The fastest median of `rounds` rounds of consecutive runs of one call, and the rounds' CV."""
    medians = [float(np.median(chunk)) for chunk in np.array_split(np.asarray(samples), rounds) if len(chunk)]
    return min(medians), cv(medians)


def profile_and_time_alone(model, runs: int, feeds: dict, records: dict[str, TuningRecord],
                           rounds: int = ROUNDS) -> tuple[list[OpInfo], np.ndarray, dict[str, Alone]]:
    """The library's profile (`runs` runs in `rounds` rounds) interleaved with each tuned anchor's chosen config
    timed alone by the tuner's runner, so both see the same load (`Alone`: four ways, the fastest round median
    of each). Identical records are timed once."""
    manifest = model.manifest
    unique = {_key(r): r for r in records.values()}
    builds = {k: build_one(r.task, r.config, manifest.target, r.threads) for k, r in unique.items()}
    figures: dict[tuple, tuple[list[float], ...]] = {k: ([], [], [], []) for k in unique}
    parts: list[np.ndarray] = []
    ops: list[OpInfo] = []
    runners = {n: LocalRunner(MeasureOptions(threads=n)) for n in {r.threads for r in unique.values()}}
    try:
        for chunk in np.array_split(np.arange(runs), rounds):
            ops, samples = model.profile_samples(max(1, len(chunk)), **feeds)
            parts.append(samples)
            for k, b in builds.items():
                runner = runners[k[2]]
                tuners = runner.options.model_copy(update={"cache": unique[k].cache})  # as its record was timed
                single = runner.options.model_copy(update={"number": 1, "min_repeat_ms": 0.0, "repeat": PER_CALL,
                                                           "cache": "hot"})
                cold = single.model_copy(update={"cache": "cold", "repeat": PER_COLD_CALL})
                hot = runner.options.model_copy(update={"cache": "hot"})
                for figure, opts in zip(figures[k], (tuners, single, cold, hot), strict=True):
                    result = runner.run_one(b, opts)
                    if result.ok:
                        figure.append(result.median)
    finally:
        for runner in runners.values():
            runner.close()
    alone = {node: Alone(*(min(f) for f in figures[_key(r)])) for node, r in records.items()
             if all(figures[_key(r)])}
    return ops, np.concatenate(parts), alone


def _key(r: TuningRecord) -> tuple[str, str, int]:
    return r.task.signature, r.config.key(), r.threads


def anchor_times(manifest: Manifest, ops: list[OpInfo], samples: np.ndarray, records: dict[str, TuningRecord],
                 alone: dict[str, Alone] | None = None, noise: Noise | None = None) -> list[AnchorTime]:
    """One verdict per tuned anchor (an op with a record), from the library's profile `samples` (runs x ops)."""
    verdicts = []
    for i, op in enumerate(ops):
        if not op.record:
            continue
        deployed, spread = round_figure(samples[:, i])
        tuned = float(op.record["median_s"])
        ratio = deployed / tuned
        off = abs(ratio - 1) > TOLERANCE
        got = (alone or {}).get(op.node)
        why = reasons(manifest, op, (deployed, tuned), spread, records.get(op.node), got, noise) if off else ()
        verdicts.append(AnchorTime(node=op.node, task=op.task or op.op, deployed_us=deployed * 1e6,
                                   tuned_us=tuned * 1e6, alone_us=got.loop * 1e6 if got else None,
                                   alone_call_us=got.call * 1e6 if got else None,
                                   alone_cold_us=got.cold * 1e6 if got else None, ratio=ratio, off=off,
                                   reasons=tuple(why)))
    return verdicts


def reasons(manifest: Manifest, op: OpInfo, figures: tuple[float, float], spread: float, record: TuningRecord | None,
            alone: Alone | None, noise: Noise | None) -> list[str]:
    """What can be told about an anchor off by more than the tolerance (`figures`: its deployed and tuned
    seconds; `alone`: the kernel timed alone the tuner's way and per call), most decisive first."""
    why: list[str] = []
    deployed, tuned = figures
    ratio = deployed / tuned
    if record is not None and record.threads != manifest.threads:
        why.append(f"the record was measured on {record.threads} thread(s), the library runs {manifest.threads}")
    if alone is not None:
        why.append(_alone_reason(deployed, tuned, alone, record, manifest))
    if op.layout:
        what = "reads its input padded by the conv before (no pack phase)" if "x padded" in op.layout else \
            "writes its output inside the next conv's zero border"
        why.append(f"the library's kernel {what}: a layout the tuned kernel did not have")
    if record is not None and record.unstable:
        why.append(f"the record's re-measurement never settled (rounds CV {record.rounds_cv or 0:.0%})")
    if record is not None and record.tuner != REMEASURE and len(record.result.costs) > 1:
        rel = (max(record.result.costs) - min(record.result.costs)) / record.result.median
        if rel > TOLERANCE:
            why.append(f"the record is one trial, never re-measured, whose repeats spread {rel:.0%}")
    if spread > TOLERANCE:
        why.append(f"the profile's rounds varied {spread:.0%}")
    if noise is not None and noise.busy:
        why.append(f"the machine was busy during the profile ({noise.other_cores:.1f} cores used by other "
                   f"processes, steal {noise.steal:.0%})")
    if op.record and float(op.record["median_s"]) < TINY_S:
        why.append("a sub-microsecond kernel: one call's timing in the model includes the clock's own cost")
    if not why:
        state = record.cache if record is not None else "hot"
        why.append(f"slower in the model than when tuned: the tuner timed it alone ({state} cache), here its "
                   "inputs come from the previous layer (run --alone to tell)" if ratio > 1 else
                   "faster in the model than when tuned: load slowed every measurement of the record (run --alone "
                   "to tell)")
    return why


def _alone_reason(deployed: float, tuned: float, alone: Alone, record: TuningRecord | None,
                  manifest: Manifest) -> str:
    loop, call, cold = alone.loop, alone.call, alone.cold
    if _near(deployed, call):
        if _near(loop, tuned):
            return (f"alone it takes {call * 1e6:.1f} us per call, as in the model, and {loop * 1e6:.1f} us the "
                    "tuner's way (the mean of a >= 10 ms loop, which counts every preemption on a busy machine): "
                    "the machine's load, not the library")
        return (f"alone it now takes {loop / tuned:.2f}x its record the tuner's way and per call what it takes in "
                "the model: the record's figure does not hold (load when it was tuned, or the machine's state now)")
    if deployed > call and deployed <= cold * (1 + TOLERANCE):
        timed = ("in the tuner's loop they stay in cache" if record is None or record.cache == "hot" else
                 f"its record was timed in the {record.cache!r} state")
        return (f"alone it takes {call * 1e6:.1f} us per call hot and {cold * 1e6:.1f} us with its caches flushed "
                f"first, in the model {deployed * 1e6:.1f} us: cache state ({_operands(record, manifest)}: {timed}, "
                "in the model the other layers evict them)")
    return (f"alone it takes {call * 1e6:.1f} us per call hot, {cold * 1e6:.1f} us with its caches flushed first, "
            f"in the model {deployed / call:.2f}x the hot figure: not cache state alone")


def _near(a: float, b: float) -> bool:
    return abs(a / b - 1) <= TOLERANCE


def _operands(record: TuningRecord | None, manifest: Manifest) -> str:
    if record is None:
        return "its operands"
    kib = sum(spec.size for spec in record.task.inputs) * 4 / 1024
    l2 = manifest.target.l2_bytes / 1024
    return f"its {kib:.0f} KiB of operands{', more than L2' if kib > l2 else ''}"


def summary(verdicts: list[AnchorTime]) -> dict:
    """Median ratio over anchors, how many are off, and the worst."""
    if not verdicts:
        return {"anchors": 0, "off": 0, "median_ratio": None, "worst": None}
    worst = max(verdicts, key=lambda v: abs(np.log(v.ratio)))
    return {"anchors": len(verdicts), "off": sum(v.off for v in verdicts),
            "median_ratio": statistics.median(v.ratio for v in verdicts),
            "worst": {"node": worst.node, "ratio": worst.ratio}}
