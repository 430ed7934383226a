"""Latency of sporadic calls (a server between requests): the bundled CNN's 2-thread library with
its workers spinning 0.2 ms after a loop (tunaflow before) and 2 ms (the default), the 1-thread
library, and onnxruntime at 2 threads, with an idle gap before every call, same run.

Each spin setting is its own copy of the library (a library owns its worker pool, which reads
TUNAFLOW_SPIN_US when its first worker starts). Per gap: 7 interleaved rounds of 40 calls (each
turn after the others' threads went quiet, and one untimed call);
latency is the median call, ratios the median of per-round ratios against the 2 ms library.
Tunes nothing: builds from the tuning logs of `benchmarks/models.py` (--logs), or the default
schedules when there are none. Writes the `serving` section of benchmarks/RESULTS.md.

    flock /tmp/bench.lock .venv/bin/python benchmarks/serving.py [--logs runs/bench-models]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.results import replace_section  # noqa: E402
from schemas import Target  # noqa: E402
from stages.build.library import build_library  # noqa: E402
from stages.extract import load_model  # noqa: E402
from stages.graph.passes import optimize  # noqa: E402
from stages.runtime import load  # noqa: E402
from stages.runtime.compare import onnxruntime_runner, random_feeds  # noqa: E402
from stages.runtime.quiet import settle  # noqa: E402

MODEL = ROOT / "data" / "models" / "cnn.onnx"
GAPS_MS = (0.0, 0.3, 1.0, 3.0)
ROUNDS, CALLS = 7, 40
REFERENCE = "tunaflow 2T, spin 2 ms"


def libraries(logs: Path, work: Path) -> dict[str, Callable[[], object]]:
    graph = optimize(load_model(MODEL))
    target = Target.host()
    built = {}
    for threads in (1, 2):
        log = logs / f"cnn-t{threads}"
        build_library(graph, target, work / f"t{threads}", threads, log if log.exists() else None)
        built[threads] = log.exists()
    shutil.copytree(work / "t2", work / "t2-short")
    loaded = [(name, load(work / path), spin) for name, path, spin in (
        (REFERENCE, "t2", "2000"), ("tunaflow 2T, spin 0.2 ms", "t2-short", "200"), ("tunaflow 1T", "t1", None))]
    feeds = random_feeds(loaded[0][1])  # one input for every contender: the builds share the model's inputs
    models = {}
    for name, model, spin in loaded:
        if spin is not None:
            os.environ["TUNAFLOW_SPIN_US"] = spin
        model.run(**feeds)  # starts this library's workers, which read the setting now
        models[name] = (lambda m=model: m.run(**feeds))
    os.environ.pop("TUNAFLOW_SPIN_US", None)
    ort = onnxruntime_runner(MODEL, 2)
    models["onnxruntime 2T"] = lambda: ort(feeds)
    print(f"tuned from logs: {built}", flush=True)
    return models


def timed(fn: Callable[[], object], gap_s: float) -> float:
    """Median seconds of a call after `gap_s` idle, once the contender before has stopped spinning."""
    settle()
    fn()
    times = []
    for _ in range(CALLS):
        if gap_s:
            time.sleep(gap_s)
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--logs", type=Path, default=ROOT / "runs" / "bench-models", help="models.py's tuning logs")
    ap.add_argument("--no-write", action="store_true", help="print, do not update RESULTS.md")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tf-serving-") as tmp:
        models = libraries(args.logs, Path(tmp))
        names = list(models)
        rows = []
        for gap in GAPS_MS:
            rounds: dict[str, list[float]] = {n: [] for n in names}
            for r in range(ROUNDS):
                for n in names[r % len(names):] + names[:r % len(names)]:
                    rounds[n].append(timed(models[n], gap / 1e3))
            ref = np.array(rounds[REFERENCE])
            rows.append((gap, {n: (float(np.median(v)) * 1e3, float(np.median(np.array(v) / ref)))
                               for n, v in rounds.items()}))
            print(gap, rows[-1][1], flush=True)
    head = "| gap before each call | " + " | ".join(names) + " |"
    lines = [head, "|" + "---|" * (len(names) + 1)]
    for gap, cells in rows:
        lines.append(f"| {gap:.1f} ms | " + " | ".join(
            f"{ms:.3f} ms" + ("" if n == REFERENCE else f" ({ratio:.2f}x)") for n, (ms, ratio) in cells.items()) + " |")
    command = "flock /tmp/bench.lock .venv/bin/python benchmarks/serving.py " + " ".join(sys.argv[1:])
    text = (f"Command: `{command.strip()}`\n\nThe bundled CNN, batch 1; median call of {ROUNDS} interleaved rounds "
            f"x {CALLS} calls, each call after an idle `time.sleep(gap)`; in brackets the median per-round ratio "
            f"to `{REFERENCE}` (above 1: slower). The 2-thread libraries are the same build, differing only in "
            "TUNAFLOW_SPIN_US.\n\n" + "\n".join(lines) + "\n")
    print(text)
    if not args.no_write:
        replace_section("serving", "Sporadic calls: worker spin vs latency (`benchmarks/serving.py`)", text)


if __name__ == "__main__":
    main()
