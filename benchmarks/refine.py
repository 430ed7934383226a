"""In-model refinement's effect: each zoo model built from its tuning log before and after `refine`, the two
builds timed at the same workspace addresses, interleaved.

Per model and thread count: the log's records without any in-model verdict are copied to a scratch log, the
"before" library is built from it, `stages.refine.in_model.refine` times each op's candidates in the model
and appends its verdict, and the "after" library is built from the refined log. The two take turns (the
first one first, then the other first) at `--places` workspace addresses shared by both (`Model.use_workspace`:
where the workspace lies changed one of EfficientNet-B0's convs 2x), `--rounds` rounds; each pair's ratio is
after/before at one address in one round; the table gives their median and quartiles. Writes the `refine`
section of benchmarks/RESULTS.md.

    flock /tmp/bench.lock .venv/bin/python benchmarks/refine.py [--models resnet50,inception_v3] [--threads 1]
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.results import markdown_table, publish  # noqa: E402
from benchmarks.zoo import MODELS, filled  # noqa: E402
from schemas import Target  # noqa: E402
from stages.build.library import build_library  # noqa: E402
from stages.extract import load_model  # noqa: E402
from stages.graph.passes import optimize  # noqa: E402
from stages.log import TuningLog  # noqa: E402
from stages.refine.in_model import refine, workspace_places  # noqa: E402
from stages.runtime import load  # noqa: E402
from stages.runtime.compare import random_feeds  # noqa: E402
from stages.runtime.quiet import settle  # noqa: E402


def paired(before, after, feeds: dict, places: int, rounds: int) -> tuple[float, float, list[float]]:
    """Median ms of each and the after/before ratio of every (round, address) pair."""
    spots = workspace_places(max(before.facts.workspace_bytes, after.facts.workspace_bytes), places)
    for lib in (before, after):
        for s in spots:
            lib.use_workspace(s)
            lib.run(**feeds)
    t0 = time.perf_counter()
    before.run(**feeds)
    reps = max(5, int(0.03 / (time.perf_counter() - t0)))
    settle()
    tb, ta, ratios = [], [], []
    for r in range(rounds):
        for s in spots:
            meds = {}
            for name, lib in ((("b", before), ("a", after)) if r % 2 == 0 else (("a", after), ("b", before))):
                lib.use_workspace(s)
                times = []
                for _ in range(reps):
                    t = time.perf_counter()
                    lib.run(**feeds)
                    times.append(time.perf_counter() - t)
                meds[name] = float(np.median(times))
            tb.append(meds["b"])
            ta.append(meds["a"])
            ratios.append(meds["a"] / meds["b"])
    return float(np.median(tb)) * 1e3, float(np.median(ta)) * 1e3, ratios


def bench(name: str, threads: int, logs: Path, work: Path, places: int, rounds: int) -> dict:
    target = Target.host()
    graph = optimize(load_model(filled(name, work)))
    log = work / f"{name}-t{threads}-log"
    TuningLog(log).append(TuningLog(logs / f"{name}-t{threads}").records())  # the verdicts left out
    build_library(graph, target, work / f"{name}-before", threads, log)
    report = refine(graph, target, threads, log)
    build_library(graph, target, work / f"{name}-after", threads, log)
    before, after = load(work / f"{name}-before"), load(work / f"{name}-after")
    feeds = random_feeds(before)
    b, a, ratios = paired(before, after, feeds, places, rounds)
    q = np.percentile(ratios, [25, 50, 75])
    return {"model": name, "threads": threads, "ops": len(report.ops), "changed": len(report.changed),
            "refine_s": report.seconds, "variants": report.variants, "saved_ms": report.saved_ms,
            "before_ms": b, "after_ms": a, "ratio": float(q[1]), "q": (float(q[0]), float(q[2])), "pairs": len(ratios)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--threads", default="1")
    ap.add_argument("--logs", type=Path, default=ROOT / "runs" / "bench-zoo", help="tuned logs (read, not changed)")
    ap.add_argument("--places", type=int, default=8, help="workspace addresses shared by both builds")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-write", action="store_true", help="print, do not update RESULTS.md")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="tf-bench-refine-") as tmp:
        for name in args.models.split(","):
            for threads in (int(t) for t in args.threads.split(",")):
                row = bench(name, threads, args.logs, Path(tmp), args.places, args.rounds)
                print(row, flush=True)
                rows.append(row)
    table = markdown_table(
        ["model", "threads", "ops timed", "picks changed", "variants", "refine s", "before ms", "after ms",
         "after / before [quartiles]", "saved by the verdict's medians, ms"],
        [[r["model"], r["threads"], r["ops"], r["changed"], r["variants"], f"{r['refine_s']:.0f}",
          f"{r['before_ms']:.2f}", f"{r['after_ms']:.2f}", f"{r['ratio']:.3f} [{r['q'][0]:.3f}-{r['q'][1]:.3f}]",
          f"{r['saved_ms']:.3f}"] for r in rows])
    geo = float(np.exp(np.mean(np.log([r["ratio"] for r in rows]))))
    command = "flock /tmp/bench.lock .venv/bin/python benchmarks/refine.py " + " ".join(sys.argv[1:])
    body = "\n".join([
        f"Command: `{command.strip()}`", "",
        f"Machine: {platform.machine()}, CPU `{Target.host().cpu}`. Logs: {args.logs.name}/ (the zoo's, their in-model "
        f"verdicts left out); {rows[0]['pairs']} pairs per model ({args.places} shared workspace addresses x "
        f"{args.rounds} rounds, each the median of at least 5 calls). `saved` is what the verdict's own medians "
        "(per op, its candidates' in-model times) say the changed picks save per inference: it includes the noise "
        "of picking the lowest of near-equal medians; `after / before` is the measured effect.", "",
        *table, "", f"Geometric mean after/before: {geo:.3f}."])
    publish("refine", "In-model refinement: builds before and after `refine` (`benchmarks/refine.py`)", body,
            not args.no_write)


if __name__ == "__main__":
    main()
