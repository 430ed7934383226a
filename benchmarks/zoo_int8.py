"""Quantized zoo: tunaflow's int8 builds against onnxruntime's int8 run and tunaflow's own float32 build.

The zoo CNNs (data/zoo/, seeded random weights as in benchmarks/zoo.py) quantized by onnxruntime's
`quantize_static` (QDQ, per-channel int8 weights, uint8 activations, min/max over two random inputs:
testing/quantize.py). Per model and thread count, same run: tunaflow's int8 default build, its int8 tuned
build (`tunaflow tune --no-prefect` under --trials-per-task x tasks; logs resumed from --logs), onnxruntime's
int8 run, and tunaflow's float32 build of the unquantized model (tuned from --fp32-logs where a log exists,
as benchmarks/zoo.py leaves them, else the default build: the `fp32` column says which). The four are timed
interleaved (rounds x 10 calls; ratios are medians of per-round ratios). Correctness: every output element
of both int8 builds within `steps` quantization steps of onnxruntime's int8 output, and top-1 agreeing.
Writes the `zoo_int8` section of benchmarks/RESULTS.md.

    flock /tmp/bench.lock .venv/bin/python benchmarks/zoo_int8.py [--models resnet50,mobilenet_v2] [--threads 1,2]
"""

from __future__ import annotations

import argparse
import math
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.results import replace_section  # noqa: E402
from benchmarks.zoo import MODELS, NUMBER, ROUNDS, TRANSFORMERS, filled  # noqa: E402
from schemas import Target  # noqa: E402
from stages.build.library import build_library  # noqa: E402
from stages.extract import load_model  # noqa: E402
from stages.graph.passes import optimize  # noqa: E402
from stages.graph.tasks import extract_tasks  # noqa: E402
from stages.log import TuningLog  # noqa: E402
from stages.runtime import load  # noqa: E402
from stages.runtime.compare import compare, onnxruntime_runner, paired_ratio, random_feeds  # noqa: E402
from stages.tune.loop import tunable  # noqa: E402
from testing.quantize import quantize_dynamic, quantize_static  # noqa: E402

SECTION = ("zoo_int8", "Quantized zoo: int8 builds vs onnxruntime int8 (`benchmarks/zoo_int8.py`)")


def output_step(proto: onnx.ModelProto) -> float:
    """The scale of the DequantizeLinear that produces the model's output: one quantization step."""
    init = {t.name: t for t in proto.graph.initializer}
    last = next(n for n in proto.graph.node if n.output[0] == proto.graph.output[0].name)
    return float(numpy_helper.to_array(init[last.input[1]]))


def tune(path: Path, log: Path, out: Path, budget: int, threads: int) -> None:
    done = subprocess.run([str(ROOT / ".venv" / "bin" / "tunaflow"), "tune", str(path), "-o", str(out), "--log",
                           str(log), "--trials", str(budget), "--threads", str(threads), "--no-prefect", "--json"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"tunaflow tune {path.name} at {threads} thread(s) failed:\n{done.stderr[-2000:]}")


def bench_model(name: str, threads: int, per_task: int, logs: Path, fp32_logs: Path, target: Target, work: Path,
                rounds: int) -> dict:
    fp32_path = filled(name, work)
    dynamic = name in TRANSFORMERS  # what users do to a transformer: quantize_dynamic, float outputs
    proto = (quantize_dynamic if dynamic else quantize_static)(onnx.load(fp32_path))
    q_path = work / f"{name}-int8.onnx"
    onnx.save(proto, q_path)
    graph = optimize(load_model(q_path))
    tasks = [t for t in extract_tasks(graph) if tunable([t.task])[0]]
    log = logs / f"{name}-int8-t{threads}"
    start = time.perf_counter()
    if per_task and tasks:
        tune(q_path, log, work / "cli", per_task * len(tasks), threads)
    tune_s = time.perf_counter() - start
    records = len(TuningLog(log).records()) if log.exists() else 0
    build_library(graph, target, work / "int8-default", threads)
    build_library(graph, target, work / "int8-tuned", threads, log if log.exists() else None)
    fp32_log = fp32_logs / f"{name}-t{threads}"
    build_library(optimize(load_model(fp32_path)), target, work / "fp32", threads,
                  fp32_log if fp32_log.exists() else None)
    default, tuned, fp32 = (load(work / d) for d in ("int8-default", "int8-tuned", "fp32"))
    ort = onnxruntime_runner(q_path, threads)
    step = None if dynamic else output_step(proto)
    steps, top1 = 0.0, True
    for seed in range(5):
        feeds = random_feeds(tuned, seed)
        want = ort(feeds)[0]
        for lib in (default, tuned):
            got = next(iter(lib.run(**feeds).values()))
            steps = max(steps, float(np.abs(got - want).max()) / (step or float(np.abs(want).max())))
            top1 = top1 and (dynamic or int(got.argmax()) == int(want.argmax()))
    feeds = random_feeds(tuned)
    raw = compare({"default": lambda: default.run(**feeds), "tuned": lambda: tuned.run(**feeds),
                   "onnxruntime": lambda: ort(feeds), "fp32": lambda: fp32.run(**feeds)},
                  number=NUMBER, rounds=rounds, idle_between=False)
    return {"model": name, "threads": threads, "tasks": len(tasks), "records": records, "tune_s": tune_s,
            "fp32": "tuned" if fp32_log.exists() else "default", "steps": steps, "top1": top1, "rounds": rounds,
            "dynamic": dynamic,
            "ms": {k: v["median_ms"] for k, v in raw.items()},
            "default_ort": paired_ratio(raw, "default", "onnxruntime"),
            "tuned_ort": paired_ratio(raw, "tuned", "onnxruntime"), "tuned_fp32": paired_ratio(raw, "tuned", "fp32")}


def _accuracy(row: dict) -> str:
    """Output steps for a static model; for a dynamic one (float outputs) max abs error / max abs output."""
    return f"{row['steps']:.1e} rel" if row["dynamic"] else f"{row['steps']:.2f}"


def report(rows: list[dict], command: str) -> str:
    host = Target.host()
    lines = [f"Command: `{command}`", "",
             f"Machine: {platform.machine()}, CPU `{host.cpu}`, {host.cores} cores. Models: the zoo CNNs with "
             "seeded random weights, quantized by onnxruntime's `quantize_static` (QDQ, per-channel int8 weights, "
             "uint8 activations, min/max calibration on 2 random inputs), batch 1; BERT-2L (bert_2l, sequence 128) "
             "by `quantize_dynamic` (int8 weights, activations quantized at run time: DynamicQuantizeLinear, "
             "MatMulInteger), whose float output is judged by max abs error / max abs output (`rel`). "
             "Latency: median of "
             f"{rows[0]['rounds'] * NUMBER} calls, the four interleaved in {rows[0]['rounds']} rounds of {NUMBER}; "
             "ratios are medians of per-round ratios. `steps`: the worst element of either int8 build off "
             "onnxruntime's int8 output over 5 inputs, in output quantization steps; `top-1`: agreeing on all 5. "
             "`fp32`: tunaflow's float32 build of the unquantized model (tuned from benchmarks/zoo.py's log where "
             "one exists, else default).", "",
             "| model | threads | int8 tasks | int8 log records | tune s | int8 default ms | int8 tuned ms | "
             "onnxruntime int8 ms | fp32 ms (build) | default/ort | tuned/ort | tuned/fp32 | steps | top-1 |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ms = r["ms"]
        lines.append(f"| {r['model']} | {r['threads']} | {r['tasks']} | {r['records']} | {r['tune_s']:.0f} | "
                     f"{ms['default']:.2f} | {ms['tuned']:.2f} | {ms['onnxruntime']:.2f} | {ms['fp32']:.2f} "
                     f"({r['fp32']}) | {r['default_ort']:.2f}x | {r['tuned_ort']:.2f}x | {r['tuned_fp32']:.2f}x | "
                     f"{_accuracy(r)} | {'-' if r['dynamic'] else 'yes' if r['top1'] else 'NO'} |")
    lines.append("")
    for threads in sorted({r["threads"] for r in rows}):
        sub = [r for r in rows if r["threads"] == threads]
        gm = math.exp(sum(math.log(r["tuned_ort"]) for r in sub) / len(sub))
        lines.append(f"- {threads} thread(s): geometric mean int8 tuned/onnxruntime int8 {gm:.2f}x over "
                     f"{len(sub)} models; worst {max(r['tuned_ort'] for r in sub):.2f}x.")
    lines += ["", "Goals (issue 26): tuned int8 <= 0.85x onnxruntime int8 (geometric mean, none above 1.0) and "
              "<= 0.45x tunaflow's own tuned fp32 on the CNNs."]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join((*MODELS, "bert_2l")),
                    help="zoo CNNs (quantize_static) and transformers (quantize_dynamic), comma-separated")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--trials-per-task", type=int, default=0, help="int8 tuning budget = this x tasks (0: none)")
    ap.add_argument("--logs", type=Path, default=ROOT / "runs" / "bench-zoo-int8", help="int8 tuning logs (resumed)")
    ap.add_argument("--fp32-logs", type=Path, default=ROOT / "runs" / "bench-zoo", help="benchmarks/zoo.py's logs")
    ap.add_argument("--rounds", type=int, default=ROUNDS, help=f"timing rounds of {NUMBER} calls per contender")
    ap.add_argument("--no-write", action="store_true", help="print, do not update RESULTS.md")
    args = ap.parse_args()
    run(args.models.split(","), [int(t) for t in args.threads.split(",")], args.trials_per_task, args.logs,
        args.fp32_logs, args.rounds, ("flock /tmp/bench.lock .venv/bin/python benchmarks/zoo_int8.py "
                                      + " ".join(sys.argv[1:])).strip(), not args.no_write)


def run(names: list[str], threads: list[int], per_task: int, logs: Path, fp32_logs: Path, rounds: int, command: str,
        write: bool) -> None:
    """Every model at every thread count, then the section (written to RESULTS.md when `write`)."""
    target = Target.host()
    rows = []
    for name in names:
        for n in threads:
            with tempfile.TemporaryDirectory(prefix="tf-bench-zoo-int8-") as tmp:
                row = bench_model(name, n, per_task, logs, fp32_logs, target, Path(tmp), rounds)
            print(row, flush=True)
            rows.append(row)
    text = report(rows, command)
    print(text)
    if write:
        replace_section(*SECTION, text)


if __name__ == "__main__":
    main()
