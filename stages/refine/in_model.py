"""Time each op's candidates (`candidates.py`) inside the built model and log the verdict.

Variant j of the library runs every op's j-th candidate (its pick where it has fewer), so K builds time
every candidate in the model around it. The variants take turns, in alternating order, at the same few
workspace addresses (where the workspace lies changes single kernels up to 2x on Zen 5), and each op's
time per call is the median over those turns of the library's own per-call timers. Every candidate timed
gets an in-model row in the log (`IN_MODEL`): the build then runs the fastest of the latest verdict
(`stages.build.apply_best.apply_verdicts`), so tuning and building stay separate and a build stays a
function of the log.
"""

from __future__ import annotations

import mmap
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np

from schemas.measure import MeasureResult
from schemas.record import IN_MODEL, TuningRecord
from schemas.report import RefinedOp, RefineReport
from schemas.target import Target
from schemas.version import VERSION
from stages.build.library import BuildError, build_library
from stages.build.memplan import ALIGN
from stages.graph.ir import Graph
from stages.log import TuningLog
from stages.refine.candidates import WITHIN, Group, groups
from stages.runtime import load
from stages.runtime.compare import max_rel_error, random_feeds
from stages.runtime.loader import LoadError, Model
from stages.runtime.quiet import settle

TOP_K = 3
ROUNDS = 3
PLACES = 4  # workspace addresses each variant is timed at, the same for every variant
PLACE_STEP = 4096 * 37 + ALIGN  # apart by an odd number of pages and a line: no two share a page offset
TURN_S = 0.1  # timed runs per turn: about this long, 3 to 10 runs
AGREE = 1e-3  # the variants' outputs agree within this share of the largest (stages/build/verify.py's rule)


def refine(graph: Graph, target: Target, threads: int, log: Path, top_k: int = TOP_K, rounds: int = ROUNDS,
           again: bool = False, progress: Callable[[str], None] | None = None) -> RefineReport:
    """Time the top `top_k` records of every op of `graph` inside it (here: the target must run on this
    machine) and append the verdict to `log`; ops whose latest verdict timed the same candidates are left
    alone unless `again` (so a resumed run with nothing new to tune leaves the log as it was)."""
    start = time.perf_counter()
    say = progress or (lambda _: None)
    tlog = TuningLog(log)
    every = groups(graph, tlog, target, threads, top_k)
    rivalled = [g for g in every if len(g.candidates) > 1]
    timed = [g for g in rivalled if again or not g.judged]
    if not timed:
        why = (f"the latest verdict timed every op's candidates already ({len(rivalled)} op(s))" if rivalled else
               f"no op has a second record within {WITHIN}x of its best")
        return RefineReport(ops=[], variants=0, rounds=0, seconds=time.perf_counter() - start, skipped=why)
    count = max(len(g.candidates) for g in timed)
    with tempfile.TemporaryDirectory(prefix="tunaflow-refine-") as tmp:
        libs: dict[int, Model] = {}
        dropped: dict[int, str] = {}
        for j in range(count):
            say(f"building variant {j + 1} of {count}")
            try:
                libs[j] = _variant(graph, target, threads, every, {g.signature for g in timed}, j,
                                   Path(tmp) / f"variant{j}")
            except (BuildError, LoadError) as exc:
                dropped[j] = f"variant {j}: {exc}"
        if 0 not in libs:
            return RefineReport(ops=[], variants=count, rounds=0, seconds=time.perf_counter() - start,
                                skipped=f"the ranking's own picks could not be built: {dropped[0]}")
        feeds = random_feeds(libs[0])
        want = list(libs[0].run(**feeds).values())
        for j in [j for j in libs if j]:
            off = max(max_rel_error(g, w) for g, w in zip(libs[j].run(**feeds).values(), want, strict=True))
            if not off <= AGREE:
                dropped[j] = f"variant {j}: its outputs differ from the ranking's picks' by {off:.1e} of the largest"
                del libs[j]
        samples = _time(libs, feeds, rounds, say)
    session = f"refine-{uuid.uuid4().hex[:12]}"
    rows: list[TuningRecord] = []
    ops = []
    for g in timed:
        seconds = [_per_call(g, samples[j]) for j in range(len(g.candidates)) if j in libs]
        kept = [c for j, c in enumerate(g.candidates) if j in libs]
        if len(kept) < 2 or any(s is None for s in seconds):
            continue
        for c, s in zip(kept, seconds, strict=True):
            rows.append(_row(c, s, session, len(rows)))
        medians = [float(np.median(s)) for s in seconds]
        ops.append(RefinedOp(task=g.description, nodes=len(g.nodes),
                             candidates=tuple(f"{c.task.op} {c.config.short()}" for c in kept),
                             record_ms=tuple(c.cost_s * 1e3 for c in kept),
                             in_model_ms=tuple(m * 1e3 for m in medians), chosen=int(np.argmin(medians))))
    tlog.append(rows)
    return RefineReport(ops=ops, variants=count, rounds=rounds, seconds=time.perf_counter() - start,
                        dropped=[dropped[j] for j in sorted(dropped)])


def _variant(graph: Graph, target: Target, threads: int, every: list[Group], timed: set[str], j: int, out: Path
             ) -> Model:
    """The library running each timed op's j-th candidate (its pick where it has fewer, and every other op its
    pick), built from a log of just those."""
    log = out.with_name(out.name + "-log")
    TuningLog(log).append([g.candidates[j] if g.signature in timed and j < len(g.candidates) else g.candidates[0]
                           for g in every])
    build_library(graph, target, out, threads, log)
    return load(out)


def _time(libs: dict[int, Model], feeds: dict[str, np.ndarray], rounds: int, say: Callable[[str], None]
          ) -> dict[int, list[dict[str, float]]]:
    """Per variant, per turn: each node's median seconds (the sum of its kernel calls)."""
    places = workspace_places(max(lib.facts.workspace_bytes for lib in libs.values()), PLACES)
    for lib in libs.values():  # warm every variant at every place: first touches are page faults
        for p in places:
            lib.use_workspace(p)
            lib.run(**feeds)
    t0 = time.perf_counter()
    libs[0].run(**feeds)
    runs = int(np.clip(TURN_S / max(time.perf_counter() - t0, 1e-6), 3, 10))
    settle()
    samples: dict[int, list[dict[str, float]]] = {j: [] for j in libs}
    order = sorted(libs)
    for r in range(rounds):
        say(f"timing round {r + 1} of {rounds}: {len(libs)} variants at {PLACES} workspace addresses")
        for p in places:
            for j in (order if r % 2 == 0 else order[::-1]):
                libs[j].use_workspace(p)
                ops, secs = libs[j].profile_samples(runs, **feeds)
                per: dict[str, float] = {}
                for op, s in zip(ops, np.median(secs, axis=0), strict=True):
                    per[op.node] = per.get(op.node, 0.0) + float(s)
                samples[j].append(per)
    return samples


def workspace_places(size: int, count: int) -> list[np.ndarray]:
    """`count` workspaces of `size` bytes, ALIGN-aligned, PLACE_STEP apart in one anonymous mapping: the same
    addresses for every build timed in them (`Model.use_workspace`)."""
    area = mmap.mmap(-1, size + PLACE_STEP * count + ALIGN, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    whole = np.frombuffer(area, dtype=np.uint8)
    return [whole[k * PLACE_STEP: k * PLACE_STEP + size] for k in range(count)]


def _per_call(g: Group, turns: list[dict[str, float]]) -> list[float] | None:
    """The group's seconds per call in each turn (its nodes' mean), or None when a node never ran."""
    if any(n not in turns[0] for n in g.nodes):
        return None
    return [sum(t[n] for n in g.nodes) / len(g.nodes) for t in turns]


def _row(c: TuningRecord, seconds: list[float], session: str, trial: int) -> TuningRecord:
    result = MeasureResult(costs=tuple(seconds))
    return TuningRecord(
        tunaflow_version=VERSION, session_id=session, trial=trial, tuner=IN_MODEL, target_key=c.target_key,
        task_signature=c.task_signature, task=c.task, template_version=c.template_version, threads=c.threads,
        cache="model", config=c.config, result=result, gflops=c.task.flops / result.median / 1e9)
