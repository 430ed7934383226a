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
import contextlib
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.results import markdown_table, publish  # noqa: E402
from schemas import MeasureOptions, Target, TuningOptions, matmul_task  # noqa: E402
from schemas.report import ModelReport  # noqa: E402
from stages.build.apply_best import choose  # noqa: E402
from stages.log import TuningLog  # noqa: E402
from stages.measure.builder import Builder  # noqa: E402
from stages.measure.remeasure import Candidate, Remeasured, remeasure  # noqa: E402
from stages.measure.runner import LocalRunner  # noqa: E402
from stages.pipeline.model import build_checked, load_graph, tunable_tasks, tune_model  # noqa: E402
from stages.runtime import load  # noqa: E402
from stages.runtime.compare import compare, paired_ratio, random_feeds  # noqa: E402
from stages.templates import matmul  # noqa: E402
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


# How a re-measured config's figure is formed from its rounds: the one remeasure.py uses, and two others.
RULES = {"min of round medians (used)": min, "median of round medians": statistics.median}


def rule_table(sets: int, seed: int) -> list[str]:
    """Which figure of a config repeats: 8 matmul 128^3 configs (the default and 7 seeded random ones)
    re-measured (8 rounds) `sets` times as the machine is and `sets` times under one core's random bursts,
    alternating. Per rule: loaded/as-is figure (median, worst), run-to-run difference, same winner."""
    task, target = matmul_task(128, 128, 128), Target.host()
    space, rng = matmul.space(task, target), random.Random(seed)
    configs = [matmul.default_config(task, target)] + [
        space.config(i) for i in rng.sample(range(space.size), 3000) if space.is_valid(i)][:7]
    opts = MeasureOptions(number=1, repeat=3, min_repeat_ms=5, n_parallel=1)
    runs: dict[bool, list[list[Remeasured]]] = {False: [], True: []}
    with Builder(opts) as builder, LocalRunner(opts) as runner:
        for loaded in [False, True] * sets:
            with burning(120, bursts=True, seed=seed + len(runs[True])) if loaded else contextlib.nullcontext():
                done = remeasure(builder, runner, target, [Candidate(task, c) for c in configs], 8, 8)
            if not all(m.rounds for m in done.results):
                raise SystemExit(f"a config failed its re-measurement: {[m.result.error_msg for m in done.results]}")
            runs[loaded].append(done.results)
    figures = {"pooled median (before)": lambda m: m.result.median} | {
        name: (lambda m, f=f: f(m.rounds)) for name, f in RULES.items()}
    rows = []
    for name, fig in figures.items():
        ratios = [fig(b) / fig(a) for q, ld in zip(runs[False], runs[True], strict=True)
                  for a, b in zip(q, ld, strict=True)]
        same = [abs(fig(b) / fig(a) - 1) for sets_ in runs.values() for x, y in zip(sets_, sets_[1:], strict=False)
                for a, b in zip(x, y, strict=True)]
        winners = [min(range(len(r)), key=lambda i, r=r: fig(r[i])) for r in runs[False] + runs[True]]
        rows.append([name, f"{statistics.median(ratios):.3f}", f"{max(ratios):.3f}",
                     f"{statistics.median(same):.1%}" if same else "-",
                     f"{winners.count(statistics.mode(winners))}/{len(winners)}"])
    return [f"Which figure of a re-measured config repeats: {len(configs)} matmul 128^3 configs, 8 interleaved "
            f"rounds, {sets} re-measurements as the machine is and {sets} under one core burnt in random bursts, "
            "alternating.", "",
            *markdown_table(["figure", "loaded / as-is (median)", "worst", "run-to-run difference (median)",
                             "same winner"], rows)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=160, help="global trial budget of each tuning run")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=15, help="interleaved timing rounds of the three builds")
    parser.add_argument("--rule-sets", type=int, default=3, help="re-measurements per condition of the rule table")
    parser.add_argument("--write", action="store_true", help="also replace the noise section of RESULTS.md")
    args = parser.parse_args(argv)
    rules = rule_table(args.rule_sets, args.seed)
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
        *markdown_table(header, rows), "", *rules, "",
        f"Command: `flock /tmp/bench.lock .venv/bin/python benchmarks/noise.py --trials {args.trials} "
        f"--threads {args.threads} --seed {args.seed} --rounds {args.rounds}`."])
    publish("noise", "Tuning under load (issue 24)", body, args.write)


if __name__ == "__main__":
    main()
