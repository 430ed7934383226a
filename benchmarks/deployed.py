"""Issue 24: tuning time = deployed time across the zoo CNNs, per anchor.

Per zoo model: tune it briefly with `tunaflow tune --no-prefect` (a child process; a budget of `--trials-per-task`
x tunable tasks, the log kept in --logs so a rerun resumes and takes no new trials), then profile the tuned
library as `tunaflow run --profile` does (stages/runtime/deployed.py): each tuned anchor's fastest round median
in the model against its chosen record's figure. With `--alone` (the default) each anchor's config is also timed
alone through the tuner's runner, interleaved with the profile: the tuner's way (the mean of a >= 10 ms loop) and
per single call, which tells whether it is the record or the model that disagrees. Goal: the median over anchors
of library time / record time within 5% of 1. Prints the table (the lead pastes it into RESULTS.md).

    flock /tmp/bench.lock .venv/bin/python benchmarks/deployed.py [--models resnet50,mobilenet_v2] [--trials-per-task 8]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.results import markdown_table  # noqa: E402
from benchmarks.zoo import MODELS, filled  # noqa: E402
from schemas.deployed import AnchorTime  # noqa: E402
from stages.extract import load_model  # noqa: E402
from stages.graph.passes import optimize  # noqa: E402
from stages.graph.tasks import extract_tasks  # noqa: E402
from stages.measure import noise  # noqa: E402
from stages.runtime import load  # noqa: E402
from stages.runtime.compare import random_feeds  # noqa: E402
from stages.runtime.deployed import ROUNDS, anchor_times, chosen_records, profile_and_time_alone, summary  # noqa: E402
from stages.tune.loop import tunable  # noqa: E402

RUNS = 200


def tune(name: str, per_task: int, logs: Path, work: Path) -> tuple[Path, Path, int, float]:
    """The tuned library and its log (tuned here unless the log already holds the budget), tasks, tune s."""
    path = filled(name, work)
    tasks = [t for t in extract_tasks(optimize(load_model(path))) if tunable([t.task])[0]]
    log, lib = logs / f"{name}-t1", work / f"{name}-lib"
    start = time.perf_counter()
    done = subprocess.run([str(ROOT / ".venv" / "bin" / "tunaflow"), "tune", str(path), "-o", str(lib), "--log",
                           str(log), "--trials", str(per_task * len(tasks)), "--threads", "1", "--no-prefect",
                           "--no-verify", "--json"], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"tunaflow tune {name} failed:\n{done.stderr[-2000:]}")
    return lib, log, len(tasks), time.perf_counter() - start


def profile(lib: Path, log: Path, runs: int, alone: bool) -> tuple[list[AnchorTime], object, float]:
    """The verdicts, the machine's load during the profile, and the median over anchors of the library's
    fastest round *mean* over the record: a preempted call counts in a mean as it does in the tuner's loop."""
    model = load(lib)
    feeds = random_feeds(model)
    records = chosen_records(model.manifest, log)
    start = noise.sample()
    if alone:
        ops, samples, times = profile_and_time_alone(model, runs, feeds, records)
    else:
        (ops, samples), times = model.profile_samples(runs, **feeds), None
    window = noise.between(start, noise.sample())
    means = [min(float(np.mean(c)) for c in np.array_split(samples[:, i], ROUNDS)) / op.record["median_s"]
             for i, op in enumerate(ops) if op.record]
    return anchor_times(model.manifest, ops, samples, records, times, window), window, statistics.median(means)


def row(name: str, tasks: int, tune_s: float, verdicts: list[AnchorTime], window, means: float) -> list[object]:
    s = summary(verdicts)
    worst = next(v for v in verdicts if v.node == s["worst"]["node"])
    per_call = [v.deployed_us / v.alone_call_us for v in verdicts if v.alone_call_us]
    cold = [v.deployed_us / v.alone_cold_us for v in verdicts if v.alone_cold_us]
    loop = [v.alone_us / v.tuned_us for v in verdicts if v.alone_us]
    return [name, tasks, f"{tune_s:.0f}", s["anchors"], f"{s['median_ratio']:.3f}",
            f"{s['off']}/{s['anchors']}",
            f"{worst.node} {worst.ratio:.2f}" + (f": {worst.reasons[0]}" if worst.reasons else ""),
            f"{statistics.median(per_call):.3f}" if per_call else "-",
            f"{statistics.median(cold):.3f}" if cold else "-",
            f"{statistics.median(loop):.3f}" if loop else "-", f"{means:.3f}",
            f"{window.other_cores:.2f}" if window else "-"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--trials-per-task", type=int, default=8)
    parser.add_argument("--logs", type=Path, default=ROOT / "runs" / "bench-deployed")
    parser.add_argument("--runs", type=int, default=RUNS, help="profile runs of each library")
    parser.add_argument("--no-alone", dest="alone", action="store_false",
                        help="do not time each anchor's config alone as well")
    args = parser.parse_args(argv)
    args.logs.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="tunaflow-deployed-") as tmp:
        for name in args.models.split(","):
            lib, log, tasks, tune_s = tune(name, args.trials_per_task, args.logs, Path(tmp))
            verdicts, window, means = profile(lib, log, args.runs, args.alone)
            rows.append(row(name, tasks, tune_s, verdicts, window, means))
            print(markdown_table(["model"], [rows[-1]])[-1], file=sys.stderr, flush=True)  # each row as it is done
    header = ["model", "tasks", "tune s", "tuned anchors", "library / record (median)", "off by > 5%",
              "worst anchor", "library / alone per call (median)",
              "library / alone cold per call (median)", "alone the tuner's way / record (median)",
              "library round means / record (median)",
              "other cores busy"]
    print("\n".join([
        f"1 thread, {args.trials_per_task} trials per tunable task (`tunaflow tune --no-prefect`, logs in "
        f"{args.logs.relative_to(ROOT) if args.logs.is_relative_to(ROOT) else args.logs}); library time: the fastest "
        f"of 5 rounds' medians over {args.runs} profiled runs (`run --profile`); record time: the chosen record's "
        "figure. 'Alone': the same config timed by the tuner's runner interleaved with the profile, per single call "
        "(hot, and cold: the caches flushed before each call) and the tuner's way (mean of a >= 10 ms loop). "
        "Goal: library / record within 5% (median over anchors).", "",
        *markdown_table(header, rows), "",
        f"Command: `flock /tmp/bench.lock .venv/bin/python benchmarks/deployed.py --models {args.models} "
        f"--trials-per-task {args.trials_per_task}`"]))


if __name__ == "__main__":
    main()
