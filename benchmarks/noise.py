"""Issue 24: does tuning on a loaded machine build as fast a library as tuning on a quiet one?

Tunes the bundled CNN twice from empty logs with the same seed and budget: once as the machine is, and
once while a competing process burns one core in random bursts (0.2-1.5 s on, 0.2-1.5 s off; started and
stopped by this benchmark, at most an hour; `testing/burner.py`). Then builds both libraries and the
default-schedule one and times the three interleaved (no burner), and checks every task's chosen record
against its default schedule's. Goal: the build tuned under load within 5% of the quiet one, no chosen
config slower than its default schedule. Prints its table; `--write` also replaces the `noise` section of RESULTS.md.

    flock /tmp/bench.lock .venv/bin/python benchmarks/noise.py [--trials 160] [--threads 1] [--write]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.results import markdown_table, publish  # noqa: E402
from schemas import MeasureOptions, Target, TuningOptions  # noqa: E402
from schemas.report import ModelReport  # noqa: E402
from stages.build.apply_best import choose  # noqa: E402
from stages.log import TuningLog  # noqa: E402
from stages.pipeline.model import build_checked, load_graph, tunable_tasks, tune_model  # noqa: E402
from stages.runtime import load  # noqa: E402
from stages.runtime.compare import compare, paired_ratio, random_feeds  # noqa: E402
from stages.tune.loop import default_record  # noqa: E402
from testing.burner import burning  # noqa: E402

MODEL = ROOT / "data" / "models" / "cnn.onnx"
def tune(name: str, work: Path, trials: int, threads: int, seed: int) -> tuple[ModelReport, float]:
    options = TuningOptions(seed=seed, measure=MeasureOptions(threads=threads))
    start = time.perf_counter()
    report, _ = tune_model(MODEL, Target.host(), options, work / name / "log", work / name / "lib", budget=trials,
                           verify=False)
    return report, time.perf_counter() - start


def chosen_vs_default(log: Path, threads: int) -> tuple[int, int, float]:
    """Tasks whose chosen record is slower than their default schedule's record, tasks compared, and the worst
    ratio chosen/default (by each record's `cost_s`, what the build ranks by)."""
    target = Target.host()
    tasks = [t.task for t in tunable_tasks(load_graph(MODEL))]
    choices = choose(tasks, TuningLog(log), target, threads)
    ratios = []
    for task in tasks:
        chosen, default = choices[task.signature].record, default_record(TuningLog(log), task, target, threads)
        if chosen is not None and default is not None:
            ratios.append(chosen.cost_s / default.cost_s)
    return sum(r > 1 for r in ratios), len(ratios), max(ratios, default=0.0)


def noise_cells(report: ModelReport) -> list[object]:
    windows = [t.noise for t in report.tasks if t.noise is not None]
    rounds_cv = [t.rounds_cv for t in report.tasks if t.rounds_cv is not None]
    return [f"{sum(n.busy for n in windows)}/{len(windows)}",
            f"{statistics.median(n.other_cores for n in windows):.2f}" if windows else "-",
            f"{statistics.median(rounds_cv):.1%}" if rounds_cv else "-",
            sum(t.unstable for t in report.tasks)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=160, help="global trial budget of each tuning run")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=15, help="interleaved timing rounds of the three builds")
    parser.add_argument("--write", action="store_true", help="also replace the noise section of RESULTS.md")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tunaflow-noise-") as tmp:
        work = Path(tmp)
        quiet, quiet_s = tune("quiet", work, args.trials, args.threads, args.seed)
        with burning(3600, bursts=True, seed=args.seed):
            loaded, loaded_s = tune("loaded", work, args.trials, args.threads, args.seed)
        build_checked(str(MODEL), load_graph(MODEL), Target.host(), str(work / "default"), args.threads, None, False)
        libs = {name: load(work / name / "lib") for name in ("quiet", "loaded")} | {"default": load(work / "default")}
        feeds = random_feeds(libs["quiet"])
        stats = compare({name: (lambda m=m: m.run(**feeds)) for name, m in libs.items()}, number=20,
                        rounds=args.rounds)
        rows = []
        for name, report, wall in (("quiet", quiet, quiet_s), ("bursts of 1 core", loaded, loaded_s)):
            key = "quiet" if report is quiet else "loaded"
            slower, compared, worst = chosen_vs_default(work / key / "log", args.threads)
            rows.append([name, f"{wall:.0f}", f"{stats[key]['median_ms']:.3f}",
                         f"{paired_ratio(stats, key, 'quiet'):.3f}", f"{paired_ratio(stats, key, 'default'):.3f}",
                         f"{slower}/{compared}", f"{worst:.3f}", *noise_cells(report)])
    header = ["tuned", "tune s", "latency ms", "vs quiet build", "vs default build", "tasks slower than default",
              "worst chosen/default", "tasks re-measured busy", "other cores (median)", "rounds CV (median)",
              "unstable"]
    body = "\n".join([
        f"The bundled CNN, {args.trials} trials per run, {args.threads} thread(s), seed {args.seed}; the three "
        f"builds timed interleaved after tuning ({args.rounds} rounds x 20 calls, ratios are medians of per-round "
        f"ratios; default build {stats['default']['median_ms']:.3f} ms). 'Busy': other processes kept more "
        "than half a core busy, or steal exceeded 2%, during a task group's re-measurement.", "",
        *markdown_table(header, rows), "",
        f"Command: `flock /tmp/bench.lock .venv/bin/python benchmarks/noise.py --trials {args.trials} "
        f"--threads {args.threads}`."])
    publish("noise", "Tuning under load (issue 24)", body, args.write)


if __name__ == "__main__":
    main()
