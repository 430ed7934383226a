"""Differential check of fuzz cases: tunaflow's library against onnxruntime, one forked process per case.

Each case is built twice, with default schedules and with a tuning log of random valid configs for
every anchor task and its Winograd twin (random costs, so the build sometimes runs the twin), and
run on the case's seeded inputs. A build passes iff on every output max |got - want| <= 1e-3 *
max |want|. Cases run in processes forked from a clean server, so a segfault or a hang is a
recorded crash, not a dead fuzzer.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import tempfile
import time
import traceback
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import wait
from pathlib import Path

import numpy as np
import onnxruntime as ort

from schemas import Config, MeasureResult, Target, TuningRecord
from schemas.errors import UnsupportedOpsError
from stages.build.library import BuildError, build_library
from stages.extract import load_model
from stages.graph.passes import optimize
from stages.graph.twins import alternatives
from stages.log import TuningLog
from stages.runtime import load
from stages.templates import TEMPLATES, template_for
from support.fuzz_graphs import Case, make_case

RTOL = 1e-3
STATUSES = ("pass", "mismatch", "crash", "unsupported")
SAMPLE_TRIES = 4000


@dataclass(frozen=True)
class Outcome:
    seed: int
    index: int
    description: str
    status: str  # one of STATUSES
    detail: str = ""  # which build failed and how
    seconds: float = 0.0
    anchors: int = 0  # anchor kernels per build
    winograd: int = 0  # of them built as Winograd in the tuned build
    halo: int = 0  # convs handing over padded tensors, over both builds


def reference(case: Case) -> dict[str, np.ndarray]:
    """onnxruntime's outputs on one intra-op thread."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    sess = ort.InferenceSession(case.model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, case.feeds), strict=True))


def random_log(graph, target, threads: int, rng: np.random.Generator, path: Path) -> int:
    """A tuning log with one record per anchor task and per twin: a random valid config of its
    template's space at a random cost. Returns the number of records."""
    tasks = {}
    for node in graph.nodes:
        if node.task is not None and node.task.op in TEMPLATES:
            for task in (node.task, *alternatives(node.task)):
                tasks.setdefault(task.signature, task)
    records = []
    for task in tasks.values():
        tpl = template_for(task)
        space = tpl.space(task, target)
        config = next((Config(index=i, knobs=space.knobs_at(i)) for i in rng.integers(space.size, size=SAMPLE_TRIES)
                       if space.is_valid(int(i))), None) or tpl.default_config(task, target)
        cost = float(rng.lognormal(-9, 1))
        records.append(TuningRecord(
            tunaflow_version="fuzz", session_id="fuzz", trial=len(records), tuner="random", target_key=target.key,
            task_signature=task.signature, task=task, template_version=tpl.VERSION, threads=threads,
            config=Config(index=int(config.index), knobs=config.knobs), result=MeasureResult(costs=(cost,)),
            gflops=task.flops / cost / 1e9))
    if records:
        TuningLog(path).append(records)
    return len(records)


def _unsupported(exc: BaseException) -> bool:
    """An op tunaflow does not claim to support (anything else failing is a crash)."""
    return isinstance(exc, UnsupportedOpsError) or (
        isinstance(exc, BuildError) and str(exc).startswith("no kernel for these op types"))


def _error(exc: BaseException) -> str:
    where = traceback.extract_tb(exc.__traceback__)[-1]
    return f"{type(exc).__name__}: {str(exc).strip()[:400]} [{Path(where.filename).name}:{where.lineno}]"


def check(case: Case, workdir: Path) -> Outcome:
    """Import, build (default, then tuned), run and compare one case."""
    start = time.perf_counter()
    facts = {"anchors": 0, "winograd": 0, "halo": 0}

    def done(status: str, detail: str = "") -> Outcome:
        return Outcome(case.seed, case.index, case.description, status, detail, time.perf_counter() - start, **facts)

    target = Target.host()
    stage = "onnxruntime"  # a failure there is the generator's bug, reported as a crash all the same
    try:
        want = reference(case)
        stage = "import"
        graph = optimize(load_model(case.model))
        for schedule in ("default", "tuned"):
            stage = schedule
            log = None
            if schedule == "tuned":
                log = workdir / "log"
                if not random_log(graph, target, case.threads, np.random.default_rng([case.seed, case.index, 1]), log):
                    break  # no anchor: the tuned build would be the default one
            out = workdir / schedule
            manifest = build_library(graph, target, out, case.threads, log)
            anchors = [op for op in manifest.ops if op.task is not None]
            facts["anchors"] = len(anchors)
            facts["halo"] += sum(op.layout is not None for op in anchors)
            if schedule == "tuned":
                facts["winograd"] = sum(op.task.startswith("conv2d_winograd") for op in anchors)
            got = load(out).run(**case.feeds)
            for name, ref in want.items():
                err = float(np.max(np.abs(got[name].astype(np.float64) - ref))) if ref.size else 0.0
                scale = float(np.max(np.abs(ref))) if ref.size else 0.0
                if not err <= RTOL * scale:
                    return done("mismatch", f"{schedule}: output {name} max abs error {err:.3g} "
                                            f"vs {RTOL:g} x max |ref| {scale:.3g}")
    except Exception as exc:  # every failure is a finding, classified
        return done("unsupported" if _unsupported(exc) else "crash", f"{stage}: {_error(exc)}")
    return done("pass")


def _child(seed: int, index: int, conn) -> None:
    case = make_case(seed, index)
    with tempfile.TemporaryDirectory(prefix="tf-fuzz-") as tmp:
        conn.send(check(case, Path(tmp)))
    conn.close()


def _died(seed: int, index: int, how: str, started: float) -> Outcome:
    return Outcome(seed, index, make_case(seed, index).description, "crash", how, time.monotonic() - started)


def run_cases(seed: int, indices: Iterable[int], jobs: int = 1, timeout_s: float = 120.0) -> Iterator[Outcome]:
    """Outcomes of the cases as they finish, `jobs` forked processes at a time."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["support.fuzz_check"])
    todo = list(indices)
    running: dict = {}  # sentinel -> (process, connection, index, start)
    while todo or running:
        while todo and len(running) < jobs:
            index = todo.pop(0)
            recv, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_child, args=(seed, index, send), daemon=True)
            proc.start()
            send.close()
            running[proc.sentinel] = (proc, recv, index, time.monotonic())
        ready = wait([*running, *(r[1] for r in running.values())], timeout=1.0)
        now = time.monotonic()
        for key, (proc, recv, index, started) in list(running.items()):
            outcome = None
            if recv in ready or key in ready:
                if recv.poll():
                    try:
                        outcome = recv.recv()
                    except EOFError:
                        pass
                if outcome is None:
                    proc.join(5)
                    if proc.exitcode is None:
                        continue
                    code = proc.exitcode
                    how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
                    outcome = _died(seed, index, f"process {how}", started)
            elif now - started > timeout_s:
                proc.kill()
                outcome = _died(seed, index, f"timeout after {timeout_s:.0f} s", started)
            else:
                continue
            proc.join(5)
            recv.close()
            del running[key]
            yield outcome


def counts(outcomes: Iterable[Outcome]) -> dict[str, int]:
    tally = dict.fromkeys(STATUSES, 0)
    for o in outcomes:
        tally[o.status] += 1
    return tally
