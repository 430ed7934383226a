"""tunaflow side by side with Apache TVM MetaSchedule, numpy/OpenBLAS and onnxruntime, in one run.

For each workload and trial budget, tunaflow's default tuner (here, through `stages.tune.session`)
and TVM MetaSchedule (`peers_tvm.py`, in the peers venv) tune from scratch with the same thread
count. Each side's best is exported as a shared library, and one harness (`peers_harness.py`, in
the peers venv) checks every output against numpy and times tunaflow, TVM, numpy and onnxruntime
in interleaved rounds (best of N). End to end, the bundled CNN and transformer are tuned, built
and timed against onnxruntime at 1 and 2 threads (`stages.runtime.compare`). Writes
benchmarks/PEERS.md and the `peers` section of benchmarks/RESULTS.md.

    make bench-peers                                            # everything (about 90 min on 2 cores)
    make bench-peers PEERS_ARGS="--workloads matmul_512 --budgets 64 --no-e2e"   # a slice

TVM is never imported here: the peers venv (`.venv-peers`, made by `make bench-peers`) runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
import traceback
from importlib import metadata
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from peers_report import (  # noqa: E402
    GOAL_E2E,
    goal_lines,
    markdown_table,
    op_rows,
    peer_spec,
    ratio,
    verdict,
)
from results import replace_section  # noqa: E402

PEERS_MD = ROOT / "benchmarks" / "PEERS.md"
MODELS = ROOT / "data" / "models"

# name → (tunaflow template, CLI options); the workloads.
WORKLOADS: dict[str, tuple[str, dict]] = {
    "matmul_512": ("matmul", {"m": 512, "n": 512, "k": 512}),
    "matmul_1024": ("matmul", {"m": 1024, "n": 1024, "k": 1024}),
    "dense_128x1024x1024_bias_relu": ("matmul", {"m": 128, "n": 1024, "k": 1024, "epilogue": "bias,relu"}),
    "conv_64x56x56_k3_bias_relu": ("conv2d", {"input": "1x64x56x56", "weight": "64x64x3x3", "stride": "1",
                                              "pad": "1", "epilogue": "bias,relu"}),
    "conv_256x14x14_k3_bias_relu": ("conv2d", {"input": "1x256x14x14", "weight": "256x256x3x3", "stride": "1",
                                               "pad": "1", "epilogue": "bias,relu"}),
}
E2E_MODELS = ("cnn", "transformer")


def peers_env(threads: int) -> dict[str, str]:
    """The peers' environment: OpenBLAS tuning variables unset (for those processes only), TVM's threads set."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    env["TVM_NUM_THREADS"] = str(threads)
    return env


def timeout(args, trials: int) -> float:
    return args.timeout_base + args.timeout_per_trial * trials


def tvm_target(threads: int) -> dict:
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    return {"kind": "llvm", "mcpu": llvm.get_host_cpu_name(), "num-cores": threads}


def tune_tunaflow(task, budget: int, threads: int, timeout_s: float, work: Path) -> dict:
    """Tune from scratch (empty log), then export the best config as WORK/lib.so + its packed arguments."""
    from schemas import MeasureOptions, Target, TuningOptions
    from stages.log import TuningLog
    from stages.tune.loop import tune_task

    target = Target.host()
    options = TuningOptions(n_trials=budget, timeout_s=timeout_s, measure=MeasureOptions(threads=threads))
    start = time.perf_counter()
    summary = tune_task(task, target, options, TuningLog(work / "log"))
    wall = time.perf_counter() - start
    out = {"wall_s": wall, "trials": summary.trials, "errors": summary.errors, "tuner": options.tuner,
           "tuning_best_gflops": summary.best_gflops}
    if summary.best is None:
        return {**out, "error": f"no valid config in {summary.trials} trials ({summary.errors})"}
    export_tunaflow(task, summary.best.config.knobs, target, threads, work)
    return {**out, "config": summary.best.config.short(), "lib": str(work / "lib.so"), "args": str(work / "args.npz")}


def export_tunaflow(task, knobs: dict, target, threads: int, work: Path) -> None:
    from stages.build.library import find_compiler
    from stages.codegen import runtime
    from stages.codegen.compile import compile_ir
    from stages.templates import template_for

    tpl = template_for(task)
    (work / "kernel.o").write_bytes(compile_ir(tpl.build_ir(task, knobs, target, threads), target).data)
    subprocess.run(runtime.link_command(find_compiler(), [str(work / "kernel.o")], str(work / "lib.so")),
                   check=True, capture_output=True, text=True)
    args = tpl.kernel_args(task, knobs, tpl.make_inputs(task, seed=0))
    np.savez(work / "args.npz", **{f"a{i}": a for i, a in enumerate(args)})


def tune_tvm(spec: dict, budget: int, threads: int, peers_python: str, timeout_s: float, work: Path,
             build_timeout: float | None = None) -> dict:
    """MetaSchedule in the peers venv, as a subprocess with a timeout; its error is kept when it fails."""
    (work / "workload.json").write_text(json.dumps(spec))
    (work / "target.json").write_text(json.dumps(tvm_target(threads)))
    cmd = [peers_python, str(ROOT / "benchmarks" / "peers_tvm.py"), str(work / "workload.json"), str(budget),
           str(work / "target.json"), str(work / "ms"), str(work / "lib.so"),
           *([str(build_timeout)] if build_timeout else [])]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=peers_env(threads))
    except subprocess.TimeoutExpired:
        return {"wall_s": time.perf_counter() - start, "error": f"timed out after {timeout_s:.0f} s"}
    (work / "tvm.log").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("PEERS_RESULT ")]
    if proc.returncode != 0 or not lines:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        return {"wall_s": time.perf_counter() - start, "error": f"exit {proc.returncode}: {tail[-600:]}"}
    return {**json.loads(lines[-1].split(" ", 1)[1]), "lib": str(work / "lib.so")}


def write_inputs(task, work: Path) -> Path:
    from stages.templates import template_for

    tpl = template_for(task)
    xs = tpl.make_inputs(task, seed=0)
    path = work / "inputs.npz"
    np.savez(path, ref=tpl.reference(task, xs), **{f"x{i}": x for i, x in enumerate(xs)})
    return path


def run_harness(spec: dict, flops: int, inputs: Path, contenders: list[dict], args, work: Path) -> dict:
    plan = {"workload": spec, "flops": flops, "inputs": str(inputs), "threads": args.threads,
            "rounds": args.rounds, "min_round_s": args.min_round_s, "contenders": contenders}
    (work / "plan.json").write_text(json.dumps(plan))
    cmd = [args.peers_python, str(ROOT / "benchmarks" / "peers_harness.py"), str(work / "plan.json")]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.harness_timeout,
                              env=peers_env(args.threads))
    except subprocess.TimeoutExpired:
        return {"error": f"harness timed out after {args.harness_timeout:.0f} s"}
    if proc.returncode != 0:
        return {"error": f"harness exit {proc.returncode}: {proc.stderr.strip()[-800:]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_workload(name: str, args, root: Path) -> dict:
    from stages.templates import TEMPLATES

    op, opts = WORKLOADS[name]
    task = TEMPLATES[op].task_from_cli(dict(opts))
    spec = peer_spec(name, op, opts)
    work = root / name
    work.mkdir(parents=True)
    tuned: dict = {}
    contenders: list[dict] = [{"name": "numpy", "kind": "numpy"}, {"name": "onnxruntime", "kind": "onnxruntime"}]
    for b in args.budgets:
        d = work / f"tunaflow-{b}"
        d.mkdir()
        try:
            tuned[("tunaflow", b)] = tune_tunaflow(task, b, args.threads, timeout(args, b), d)
        except Exception as exc:  # reported, never dropped
            tuned[("tunaflow", b)] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc(limit=4)}
        print(f"{name} tunaflow@{b}: {summary_line(tuned[('tunaflow', b)])}", flush=True)
        d = work / f"tvm-{b}"
        d.mkdir()
        tuned[("tvm", b)] = tune_tvm(spec, b, args.threads, args.peers_python, timeout(args, b), d,
                                     args.tvm_build_timeout)
        print(f"{name} tvm@{b}: {summary_line(tuned[('tvm', b)])}", flush=True)
        for side in ("tunaflow", "tvm"):
            t = tuned[(side, b)]
            if "error" not in t:
                contenders.append({"name": f"{side}@{b}", "kind": side, "lib": t["lib"], **(
                    {"args": t["args"]} if side == "tunaflow" else {})})
    harness = run_harness(spec, task.flops, write_inputs(task, work), contenders, args, work)
    return {"task": task.description, "spec": spec, "flops": task.flops, "tuned": tuned, "harness": harness}


def summary_line(t: dict) -> str:
    if "error" in t:
        return f"FAILED {t['error'][:300]}"
    return f"{t.get('trials')} trials in {t['wall_s']:.0f} s"


def run_e2e(model: str, threads: int, trials: int, args, root: Path) -> dict:
    """Tune the model's tasks (fresh log, `trials` over all tasks), build, time vs onnxruntime interleaved."""
    from schemas import MeasureOptions, Target, TuningOptions
    from stages.build.library import build_library
    from stages.extract import load_model
    from stages.graph.passes import optimize
    from stages.graph.tasks import extract_tasks
    from stages.log import TuningLog
    from stages.runtime import load
    from stages.runtime.compare import compare, max_rel_error, onnxruntime_runner, random_feeds
    from stages.tune.loop import tunable, tune_tasks

    path = MODELS / f"{model}.onnx"
    work = root / f"e2e-{model}-{threads}t"
    target = Target.host()
    options = TuningOptions(n_trials=trials, batch_size=8, timeout_s=timeout(args, trials),
                            measure=MeasureOptions(threads=threads))
    graph = optimize(load_model(path, {}))
    tasks = [t for t in extract_tasks(graph) if tunable([t.task])[0]]
    start = time.perf_counter()
    summaries = tune_tasks([t.task for t in tasks], [t.weight for t in tasks], target, options,
                           TuningLog(work / "log"), trials)
    tune_s = time.perf_counter() - start
    build_library(graph, target, work / "lib", threads, work / "log")
    lib = load(work / "lib")
    feeds = random_feeds(lib)
    ort = onnxruntime_runner(path, threads)
    err = max_rel_error(next(iter(lib.run(**feeds).values())), ort(feeds)[0])
    stats = compare({"tunaflow": lambda: lib.run(**feeds), "onnxruntime": lambda: ort(feeds)})
    return {"tasks": len(tasks), "trials": sum(s.trials for s in summaries), "tune_s": tune_s, "rel_err": err,
            "tunaflow_ms": stats["tunaflow"]["median_ms"], "onnxruntime_ms": stats["onnxruntime"]["median_ms"]}


def versions(peers: dict) -> list[str]:
    own = {p: _version(p) for p in ("llvmlite", "numpy", "onnxruntime", "lightgbm")}
    return [f"- tunaflow side (project venv): Python {platform.python_version()}, "
            + ", ".join(f"{k} {v}" for k, v in own.items()),
            "- peers venv: " + ", ".join(f"{k} {v}" for k, v in peers.items())]


def _version(pkg: str) -> str:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return "not installed"


def write_report(results: dict, e2e: dict, args, started: float, load: tuple) -> None:
    from schemas import Target

    harnesses = [r["harness"] for r in results.values() if "versions" in r["harness"]]
    first = harnesses[0] if harnesses else {}
    tvm_info = next((t for r in results.values() for t in r["tuned"].values() if "target" in t), {})
    full = set(args.workloads) == set(WORKLOADS) and set(args.budgets) == {64, 256} and not args.no_e2e
    title = "# tunaflow vs the peers (TVM MetaSchedule, numpy/OpenBLAS, onnxruntime)"
    lines = [title, ""]
    if not full or args.note:
        lines += [f"> **{'Partial slice' if not full else 'Note'}**: {args.note or 'not the full run.'}", ""]
    lines += [f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}, "
              f"{(time.time() - started) / 60:.0f} min; load average {load[0]:.1f} at start, "
              f"{os.getloadavg()[0]:.1f} at end (2 cores).", "",
              "Command:", "", "```", args.command, "```", "",
              "## Op level", "",
              f"Both tuners start from an empty log with {args.threads} threads. Best GFLOPS are re-measured by one "
              f"harness in this run (outputs checked against a float64 numpy reference first), best of "
              f"{args.rounds} interleaved rounds; tunaflow's B/W weights are packed once before timing (a weight "
              "in a model), TVM gets the same plain layouts as numpy.", ""]
    header = ["workload", "trials", "tunaflow GFLOPS", "TVM GFLOPS", "numpy", "onnxruntime", "tf/TVM", "tf/numpy",
              "tf tune s", "TVM tune s", "tf/TVM time", "trials/s tf / TVM"]
    rows = [row for name, r in results.items() for row in op_rows(name, args.budgets, r["tuned"], r["harness"])]
    lines += markdown_table(header, rows) + [""]
    lines += ["### Goals", "", "Issue 8: tunaflow/TVM GFLOPS >= 1.0 at each budget, tunaflow/numpy >= 1.0 at 256 "
              "trials, tunaflow/TVM tuning wall time <= 0.25 for the same trials, end to end "
              "tunaflow/onnxruntime latency <= 1.0.", ""]
    for name, r in results.items():
        lines += goal_lines(name, args.budgets, r["tuned"], r["harness"])
    lines += ["", "### Failures and details", ""]
    lines += failure_lines(results) or ["- none: every contender built, checked and timed"]
    lines += details(results)
    if e2e:
        lines += ["", "## End to end", "", "Tuned with the default tuner over the model's tasks (fresh log), built, "
                  "and timed against onnxruntime: median of 5 interleaved rounds of 20 calls.", ""]
        erows = []
        for (model, threads), r in e2e.items():
            if "error" in r:
                erows.append([model, str(threads), "-", "-", "-", "-", "-", "-", f"FAILED: {r['error'][:200]}"])
                continue
            q = ratio(r["tunaflow_ms"], r["onnxruntime_ms"])
            erows.append([model, str(threads), str(r["trials"]), f"{r['tune_s']:.0f}", f"{r['tunaflow_ms']:.3f}",
                          f"{r['onnxruntime_ms']:.3f}", f"{q:.2f}", f"{r['rel_err']:.1e}", verdict(q, GOAL_E2E, False)])
        lines += markdown_table(["model", "threads", "trials", "tune s", "tunaflow ms", "onnxruntime ms",
                                 "tf/ort", "max rel diff vs ort", "goal"], erows)
    lines += ["", "## Versions and targets", ""] + versions(first.get("versions", {})) + [
        f"- numpy BLAS in the harness: {first.get('blas', '?')} (OPENBLAS_CORETYPE, OPENBLAS_L2_SIZE unset)",
        f"- tunaflow target: `{Target.host().to_string().split(' -mattr=')[0]}` (+ `-mattr=` the host's features)",
        f"- TVM target: `{json.dumps(tvm_target(args.threads))}` → `{tvm_info.get('target', '?')}`; "
        f"MetaSchedule from `{tvm_info.get('meta_schedule', '?')}` (tune_tir defaults; LocalBuilder timeout "
        f"{tvm_info.get('build_timeout_s', 30):g} s), TVM_NUM_THREADS={args.threads}",
        ""]
    PEERS_MD.write_text("\n".join(lines) + kept_notes())
    summary = ["See [PEERS.md](PEERS.md) for versions, targets and failures. Command:", "", "```", args.command,
               "```", ""] + markdown_table(header, rows)
    replace_section("peers", "Peers: TVM MetaSchedule, numpy, onnxruntime" + ("" if full else " (partial slice)"),
                    "\n".join(summary))


def kept_notes() -> str:
    """The hand-written analysis (between `<!-- notes -->` markers) survives a rerun of the script."""
    text = PEERS_MD.read_text() if PEERS_MD.exists() else ""
    if "<!-- notes -->" not in text or "<!-- /notes -->" not in text:
        return ""
    return "\n<!-- notes -->" + text.split("<!-- notes -->", 1)[1].split("<!-- /notes -->", 1)[0] + "<!-- /notes -->\n"


def failure_lines(results: dict) -> list[str]:
    out = []
    for name, r in results.items():
        if "error" in r["harness"]:
            out.append(f"- {name}: harness failed: {r['harness']['error']}")
        for (side, b), t in r["tuned"].items():
            if "error" in t:
                out.append(f"- {name}: {side} @ {b} trials failed: {t['error']}")
        for c, res in r["harness"].get("results", {}).items():
            if "error" in res:
                out.append(f"- {name}: {c} not timed: {res['error']}")
    return out


def details(results: dict) -> list[str]:
    out = []
    for name, r in results.items():
        for (side, b), t in r["tuned"].items():
            if side == "tunaflow" and "config" in t:
                out.append(f"- {name}: tunaflow @ {b}: {t['trials']} trials ({t['tuner']}), errors {t['errors']}, "
                           f"best during tuning {t['tuning_best_gflops']:.1f} GFLOPS, config `{t['config']}`")
            elif side == "tvm" and "trials" in t:
                best = t.get("tuning_best_s")
                g = f"{r['flops'] / best / 1e9:.1f}" if best else "-"
                out.append(f"- {name}: TVM @ {b}: {t['trials']} tuning records, {t['failed']} failed, "
                           f"best during tuning {g} GFLOPS")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--budgets", nargs="+", type=int, default=[64, 256])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds; each contender's best counts")
    ap.add_argument("--min-round-s", type=float, default=0.3, help="length of one contender's timing round")
    ap.add_argument("--timeout-base", type=float, default=120.0, help="tuning timeout = base + per-trial x trials")
    ap.add_argument("--timeout-per-trial", type=float, default=4.0)
    ap.add_argument("--harness-timeout", type=float, default=600.0)
    ap.add_argument("--tvm-build-timeout", type=float, default=None,
                    help="raise MetaSchedule's LocalBuilder timeout (default: TVM's 30 s) on a loaded machine")
    ap.add_argument("--e2e-trials", type=int, default=128, help="trials over all of a model's tasks, per thread count")
    ap.add_argument("--no-e2e", action="store_true", help="skip the end-to-end models")
    ap.add_argument("--peers-python", default=str(ROOT / ".venv-peers" / "bin" / "python"))
    ap.add_argument("--note", default="", help="a line printed at the top of PEERS.md (e.g. machine conditions)")
    ap.add_argument("--work", type=Path, default=None, help="keep libraries and logs here (default: a temp dir)")
    args = ap.parse_args()
    if not Path(args.peers_python).is_file():
        sys.exit(f"{args.peers_python} missing: `make bench-peers` creates the peers venv (.venv-peers)")
    args.command = "flock /tmp/bench.lock .venv/bin/python benchmarks/peers.py " + shlex.join(sys.argv[1:])
    started, load = time.time(), os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="tunaflow-peers-") as tmp:
        root = args.work or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        results = {name: run_workload(name, args, root) for name in args.workloads}
        e2e: dict = {}
        for model in () if args.no_e2e else E2E_MODELS:
            for threads in (1, 2):
                try:
                    e2e[(model, threads)] = run_e2e(model, threads, args.e2e_trials, args, root)
                except Exception as exc:  # reported, never dropped
                    e2e[(model, threads)] = {"error": f"{type(exc).__name__}: {exc}"}
                print(f"e2e {model} {threads}t: {e2e[(model, threads)]}", flush=True)
        if args.work:
            dump = {"results": {n: {**r, "tuned": {f"{s}@{b}": t for (s, b), t in r["tuned"].items()}}
                                for n, r in results.items()}, "e2e": {f"{m}@{t}": r for (m, t), r in e2e.items()}}
            (root / "results.json").write_text(json.dumps(dump, indent=1, default=str))
    write_report(results, e2e, args, started, load)
    print(PEERS_MD.read_text())


if __name__ == "__main__":
    main()
