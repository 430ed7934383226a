"""Issue 24: does tuning on a loaded machine build as fast a library as tuning on a quiet one?

Two workloads: the bundled CNN, and ResNet-18's heaviest three conv tasks (by FLOPs x occurrences: the 3x3
convs at 64x56x56 (4 of them), 128x28x28 (3) and 256x14x14 (3), bias+relu, each with its Winograd twin). Each is
tuned twice from empty logs with the same seed and budget: once as the machine is, and once while a competing
process burns one core in random bursts (0.2-1.5 s on, 0.2-1.5 s off; started and stopped by this benchmark, at
most an hour; `testing/burner.py`). Then the CNN's two libraries and its default-schedule one are timed
interleaved (no burner); for ResNet-18's tasks, the "build" is each conv's chosen implementation and config (as
the library build picks them), and the quiet choice, the loaded choice and the default schedule are re-measured
in the same interleaved rounds, weighted by occurrences. Every task's chosen record is checked against its
default schedule's. Goal: the build tuned under load within 5% of the quiet one, no chosen config slower than its
default schedule. Prints its table; `--write` also replaces the `noise` section of RESULTS.md.

    flock /tmp/bench.lock .venv/bin/python benchmarks/noise.py [--trials 160] [--threads 1] [--workloads cnn,resnet18]
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
from schemas import EpilogueOp, MeasureOptions, Target, TuningOptions, TuningTask, matmul_task  # noqa: E402
from schemas.report import ModelReport  # noqa: E402
from stages.build.apply_best import choose, implementations  # noqa: E402
from stages.graph.twins import alternatives  # noqa: E402
from stages.log import TuningLog  # noqa: E402
from stages.measure.builder import Builder  # noqa: E402
from stages.measure.remeasure import Candidate, Remeasured, remeasure  # noqa: E402
from stages.measure.runner import LocalRunner  # noqa: E402
from stages.pipeline.model import build_checked, load_graph, tunable_tasks, tune_model  # noqa: E402
from stages.runtime import load  # noqa: E402
from stages.runtime.compare import compare, paired_ratio, random_feeds  # noqa: E402
from stages.templates import matmul, template_for  # noqa: E402
from stages.templates.conv2d_shape import conv2d_task  # noqa: E402
from stages.tune.loop import default_record, tune_tasks  # noqa: E402
from stages.tune.session import SessionSummary  # noqa: E402
from testing.burner import burning  # noqa: E402

MODEL = ROOT / "data" / "models" / "cnn.onnx"
# ResNet-18 (224x224) convs by FLOPs x occurrences: each of these is 231 MFLOP; the stem (7x7/2) is 236 MFLOP
# once, the stride-2 and 1x1 convs less; the 3x3 at 512x7x7 (3 of them) ties with the last two and is left out.
RESNET18 = (((1, 64, 56, 56), (64, 64, 3, 3), 4), ((1, 128, 28, 28), (128, 128, 3, 3), 3),
            ((1, 256, 14, 14), (256, 256, 3, 3), 3))


def resnet18_convs() -> list[tuple[TuningTask, int]]:
    """The three conv tasks (bias+relu, as BatchNorm folds into a bias) and their occurrences."""
    epilogue = (EpilogueOp(kind="bias"), EpilogueOp(kind="relu"))
    return [(conv2d_task(x, w, (1, 1), (1, 1, 1, 1), epilogue_ops=epilogue), n) for x, w, n in RESNET18]


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


def tune_resnet18(name: str, work: Path, trials: int, threads: int, seed: int) -> tuple[list[SessionSummary], float]:
    """The three convs and their Winograd twins under one global budget (the gradient scheduler, weights by
    occurrences), as `tunaflow tune` would tune them inside the model."""
    tasks, weights = [], []
    for task, n in resnet18_convs():
        for t in (task, *alternatives(task)):
            tasks.append(t)
            weights.append(n)
    options = TuningOptions(seed=seed, measure=MeasureOptions(threads=threads))
    start = time.perf_counter()
    summaries = tune_tasks(tasks, weights, Target.host(), options, TuningLog(work / name / "log"), budget=trials)
    return summaries, time.perf_counter() - start


def resnet18_choices(log: Path, threads: int) -> list[tuple[TuningTask, object]]:
    """Per conv: the task the build would run (itself or its twin) and that task's chosen record."""
    convs = [task for task, _ in resnet18_convs()]
    choices = choose(convs + [alt for t in convs for alt in alternatives(t)], TuningLog(log), Target.host(), threads)
    picked = implementations(convs, choices)
    return [(picked[t.signature], choices[picked[t.signature].signature]) for t in convs]


def resnet18_vs_default(log: Path, threads: int) -> tuple[int, int, float]:
    """As `chosen_vs_default`: each conv's chosen record (either implementation) against its own default."""
    target, ratios = Target.host(), []
    for (task, _), (_, choice) in zip(resnet18_convs(), resnet18_choices(log, threads), strict=True):
        default = default_record(TuningLog(log), task, target, threads)
        if choice.record is not None and default is not None:
            ratios.append(choice.record.cost_s / default.cost_s)
    return sum(r > 1 for r in ratios), len(ratios), max(ratios, default=0.0)


def resnet18_latency(work: Path, threads: int, rounds: int) -> dict[str, list[float]]:
    """Per round, the weighted sum (occurrences x seconds) of each variant's convs: the quiet choices, the loaded
    choices and the default schedules, all re-measured in the same interleaved rounds on the machine as it is."""
    target = Target.host()
    variants = {name: resnet18_choices(work / name / "log", threads) for name in ("quiet", "loaded")}
    candidates, index = [], []
    for i, (task, n) in enumerate(resnet18_convs()):
        for name in ("quiet", "loaded"):
            chosen, choice = variants[name][i]
            candidates.append(Candidate(chosen, choice.config))
            index.append((name, n))
        candidates.append(Candidate(task, template_for(task).default_config(task, target)))
        index.append(("default", n))
    opts = MeasureOptions(threads=threads)
    with Builder(opts) as builder, LocalRunner(opts) as runner:
        done = remeasure(builder, runner, target, candidates, rounds, rounds)
    if not all(m.rounds for m in done.results):
        raise SystemExit(f"a config failed its re-measurement: {[m.result.error_msg for m in done.results]}")
    sums: dict[str, list[float]] = {"quiet": [0.0] * rounds, "loaded": [0.0] * rounds, "default": [0.0] * rounds}
    for (name, n), m in zip(index, done.results, strict=True):
        for r, seconds in enumerate(m.rounds):
            sums[name][r] += n * seconds
    return sums


def noise_cells(report: ModelReport | list[SessionSummary]) -> list[object]:
    """Re-measurement windows busy, other cores (median), rounds CV (median), unstable: a model's task reports
    or the sessions of a task list alike."""
    if isinstance(report, ModelReport):
        triples = [(t.noise, t.rounds_cv, t.unstable) for t in report.tasks]
    else:
        triples = [(s.noise, s.best.rounds_cv if s.best else None, bool(s.best and s.best.unstable)) for s in report]
    windows = [w for w, _, _ in triples if w is not None]
    rounds_cv = [c for _, c, _ in triples if c is not None]
    return [f"{sum(n.busy for n in windows)}/{len(windows)}",
            f"{statistics.median(n.other_cores for n in windows):.2f}" if windows else "-",
            f"{statistics.median(rounds_cv):.1%}" if rounds_cv else "-",
            sum(u for _, _, u in triples)]


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


HEADER = ["tuned", "tune s", "latency ms", "vs quiet build", "vs default build", "tasks slower than default",
          "worst chosen/default", "tasks re-measured busy", "other cores (median)", "rounds CV (median)", "unstable"]


def cnn_section(args: argparse.Namespace) -> list[str]:
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
    return [f"The bundled CNN, {args.trials} trials per run, {args.threads} thread(s), seed {args.seed}; the three "
            f"builds timed interleaved after tuning ({args.rounds} rounds x 20 calls, ratios are medians of per-round "
            f"ratios; default build {stats['default']['median_ms']:.3f} ms). 'Busy': other processes kept more "
            "than a quarter of a core busy, or steal exceeded 2%, during a task group's re-measurement.", "",
            *markdown_table(HEADER, rows)]


def resnet18_section(args: argparse.Namespace) -> list[str]:
    trials = args.resnet18_trials
    with tempfile.TemporaryDirectory(prefix="tunaflow-noise-r18-") as tmp:
        work = Path(tmp)
        quiet, quiet_s = tune_resnet18("quiet", work, trials, args.threads, args.seed)
        with burning(3600, bursts=True, seed=args.seed):
            loaded, loaded_s = tune_resnet18("loaded", work, trials, args.threads, args.seed)
        sums = resnet18_latency(work, args.threads, args.rounds)
        rows = []
        for name, key, summaries, wall in (("quiet", "quiet", quiet, quiet_s),
                                           ("bursts of 1 core", "loaded", loaded, loaded_s)):
            slower, compared, worst = resnet18_vs_default(work / key / "log", args.threads)
            vs = {other: statistics.median(a / b for a, b in zip(sums[key], sums[other], strict=True))
                  for other in ("quiet", "default")}
            rows.append([name, f"{wall:.0f}", f"{statistics.median(sums[key]) * 1e3:.3f}", f"{vs['quiet']:.3f}",
                         f"{vs['default']:.3f}", f"{slower}/{compared}", f"{worst:.3f}", *noise_cells(summaries)])
    return [f"ResNet-18's heaviest three conv tasks (3x3 at 64x56x56 x4, 128x28x28 x3, 256x14x14 x3, bias+relu, "
            f"each with its Winograd twin: 6 tasks), {trials} trials per run, {args.threads} thread(s), seed "
            f"{args.seed}; 'latency' is the occurrence-weighted sum of each conv's chosen kernel (implementation and "
            f"config as the build picks them), the quiet choices, the loaded ones and the default schedules "
            f"re-measured in the same {args.rounds} interleaved rounds; ratios are medians of per-round ratios "
            f"(default {statistics.median(sums['default']) * 1e3:.3f} ms).", "",
            *markdown_table(HEADER, rows)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=160, help="global trial budget of each CNN tuning run")
    parser.add_argument("--resnet18-trials", type=int, default=96,
                        help="global trial budget of each ResNet-18 tasks tuning run (6 tasks)")
    parser.add_argument("--workloads", default="cnn,resnet18", help="which of cnn and resnet18 to run")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=15, help="interleaved timing rounds of the builds")
    parser.add_argument("--rule-sets", type=int, default=3,
                        help="re-measurements per condition of the rule table (0: no rule table)")
    parser.add_argument("--write", action="store_true", help="also replace the noise section of RESULTS.md")
    args = parser.parse_args(argv)
    workloads = args.workloads.split(",")
    unknown = sorted(set(workloads) - {"cnn", "resnet18"})
    if unknown:
        parser.error(f"unknown workload(s) {unknown}; choose from cnn, resnet18")
    lines: list[str] = []
    if "cnn" in workloads:
        lines += [*cnn_section(args), ""]
    if "resnet18" in workloads:
        lines += [*resnet18_section(args), ""]
    if args.rule_sets > 0:
        lines += [*rule_table(args.rule_sets, args.seed), ""]
    lines.append(f"Command: `flock /tmp/bench.lock .venv/bin/python benchmarks/noise.py --workloads {args.workloads} "
                 f"--trials {args.trials} --resnet18-trials {args.resnet18_trials} --threads {args.threads} "
                 f"--seed {args.seed} --rounds {args.rounds} --rule-sets {args.rule_sets}`.")
    publish("noise", "Tuning under load (issue 24)", "\n".join(lines), args.write)


if __name__ == "__main__":
    main()
