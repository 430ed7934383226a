"""Issue 24: which cache state reproduces an anchor's time in the model (the data behind stages/measure/cache.py).

Per zoo model: a briefly tuned library (benchmarks/deployed.py's `tune`), profiled as `run --profile` profiles it,
interleaved with each tuned anchor's config timed alone by the tuner's runner in every cache state of
`MeasureOptions.cache` (hot, weights flushed, everything flushed), per single call. Prints library / state
(median over anchors) per size class of the kernel's weights, and with `--throughput` the trials/s of a
tune-op run of one task in the `hot` and `auto` states.

    flock /tmp/bench.lock .venv/bin/python benchmarks/cache_state.py --models mobilenet_v2,resnet50
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.deployed import tune  # noqa: E402
from benchmarks.results import markdown_table  # noqa: E402
from schemas import MeasureOptions, Target, TuningOptions  # noqa: E402
from stages.log import TuningLog  # noqa: E402
from stages.measure.builder import build_one  # noqa: E402
from stages.measure.cache import weight_bytes  # noqa: E402
from stages.measure.runner import LocalRunner  # noqa: E402
from stages.runtime import load  # noqa: E402
from stages.runtime.compare import random_feeds  # noqa: E402
from stages.runtime.deployed import chosen_records, round_figure  # noqa: E402
from stages.templates.conv2d_shape import conv2d_task  # noqa: E402
from stages.tune.loop import tune_task  # noqa: E402

STATES = ("hot", "weights", "cold")
ROUNDS = 5
PER_CALL = {"hot": 31, "weights": 31, "cold": 11}
CLASSES = ((0, 64 << 10, "< 64 KiB"), (64 << 10, 1 << 20, "64 KiB - 1 MiB"), (1 << 20, 8 << 20, "1 - 8 MiB"),
           (8 << 20, 1 << 40, ">= 8 MiB"))


def study(lib: Path, log: Path, runs: int) -> list[dict]:
    """Per tuned anchor: its weights' bytes, its library figure and its figure alone in each state (us)."""
    model = load(lib)
    feeds = random_feeds(model)
    records = chosen_records(model.manifest, log)
    builds = {n: build_one(r.task, r.config, model.manifest.target, r.threads) for n, r in records.items()}
    alone: dict[str, dict[str, list[float]]] = {n: {s: [] for s in STATES} for n in records}
    parts, ops = [], []
    with LocalRunner(MeasureOptions()) as runner:
        for chunk in np.array_split(np.arange(runs), ROUNDS):
            ops, samples = model.profile_samples(len(chunk), **feeds)
            parts.append(samples)
            for node, b in builds.items():
                for state in STATES:
                    opts = MeasureOptions(number=1, repeat=PER_CALL[state], min_repeat_ms=0.0, cache=state)
                    result = runner.run_one(b, opts)
                    if result.ok:
                        alone[node][state].append(result.median)
    samples = np.concatenate(parts)
    rows = []
    for i, op in enumerate(ops):
        got = alone.get(op.node)
        if got is None or not all(got.values()):
            continue
        rows.append({"node": op.node, "wbytes": weight_bytes(records[op.node].task),
                     "library": round_figure(samples[:, i])[0] * 1e6, **{s: min(got[s]) * 1e6 for s in STATES}})
    return rows


def by_class(name: str, rows: list[dict]) -> list[list[object]]:
    table = []
    for lo, hi, label in CLASSES:
        mine = [r for r in rows if lo <= r["wbytes"] < hi]
        if mine:
            table.append([name, label, len(mine), *(f"{statistics.median(r['library'] / r[s] for r in mine):.3f}"
                                                    for s in STATES),
                          f"{statistics.median(r['library'] for r in mine):.1f}"])
    table.append([name, "all", len(rows), *(f"{statistics.median(r['library'] / r[s] for r in rows):.3f}"
                                            for s in STATES), f"{statistics.median(r['library'] for r in rows):.1f}"])
    return table


def throughput(trials: int, work: Path) -> list[list[object]]:
    """Trials/s of tuning one MobileNetV2-like 1x1 conv (64 KiB of weights) in the hot and the auto state,
    alternating three times."""
    task = conv2d_task((1, 96, 28, 28), (24, 96, 1, 1))
    host = Target.host()
    got: dict[str, list[float]] = {"hot": [], "auto": []}
    for i in range(3):
        for state in got:
            options = TuningOptions(n_trials=trials, tuner="random", seed=i, top_k_remeasure=0,
                                    measure=MeasureOptions(cache=state))
            start = time.perf_counter()
            summary = tune_task(task, host, options, TuningLog(work / f"{state}-{i}"))
            got[state].append(summary.trials / (time.perf_counter() - start))
    return [[state, f"{statistics.median(v):.2f}", " ".join(f"{x:.2f}" for x in v)] for state, v in got.items()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="mobilenet_v2,resnet50")
    parser.add_argument("--trials-per-task", type=int, default=2)
    parser.add_argument("--logs", type=Path, default=ROOT / "runs" / "bench-cache-state")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--throughput", type=int, default=0, help="trials per tune-op run (0: skip)")
    parser.add_argument("--anchors", action="store_true", help="print every anchor's row")
    args = parser.parse_args(argv)
    args.logs.mkdir(parents=True, exist_ok=True)
    table = []
    with tempfile.TemporaryDirectory(prefix="tunaflow-cache-") as tmp:
        for name in filter(None, args.models.split(",")):
            lib, log, _, _ = tune(name, args.trials_per_task, args.logs, Path(tmp))
            rows = study(lib, log, args.runs)
            if args.anchors:
                print(markdown_table(["node", "weights KiB", "library us", *STATES],
                                     [[r["node"], r["wbytes"] >> 10, f"{r['library']:.1f}",
                                       *(f"{r[s]:.1f}" for s in STATES)] for r in rows]), file=sys.stderr)
            table += by_class(name, rows)
            print(markdown_table(["model"], table[-1:])[-1], file=sys.stderr, flush=True)
        print("\n".join(markdown_table(["model", "weights", "anchors", *(f"library / {s}" for s in STATES),
                                        "library us (median)"], table)))
        if args.throughput:
            print("\n".join(["", *markdown_table(["cache", "trials/s (median)", "runs"],
                                                 throughput(args.throughput, Path(tmp)))]))


if __name__ == "__main__":
    main()
