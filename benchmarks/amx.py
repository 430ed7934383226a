"""AMX (issue 26): the quantized zoo built with AMX tiles against the same build with them taken away.

Same host, same run: each model's int8 build with the templates' default schedules for the host
target (AMX where `qconv2d`, `qdense` and `qmatmul` take it) and for the host with `-amx-int8` (the
VNNI paths; a tuning log's records are keyed by target, so defaults keep the two comparable), both
checked against onnxruntime's int8 output first, then timed interleaved with onnxruntime's int8 run.
Needs a CPU with AMX-INT8.

    flock /tmp/bench.lock .venv/bin/python benchmarks/amx.py [--models resnet50,bert_2l] [--threads 1,2]
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.results import replace_section  # noqa: E402
from benchmarks.zoo import NUMBER, ROUNDS, TRANSFORMERS, filled  # noqa: E402
from benchmarks.zoo_int8 import output_step  # noqa: E402
from schemas import Target  # noqa: E402
from stages.build.library import build_library  # noqa: E402
from stages.extract import load_model  # noqa: E402
from stages.graph.passes import optimize  # noqa: E402
from stages.runtime import load  # noqa: E402
from stages.runtime.compare import compare, onnxruntime_runner, paired_ratio, random_feeds  # noqa: E402
from stages.templates.qgemm_isa import gemm_paths  # noqa: E402
from testing.quantize import quantize_dynamic, quantize_static  # noqa: E402

SECTION = ("amx", "AMX tiles vs the VNNI paths, whole int8 models (`benchmarks/amx.py`)")


def without_amx(target: Target) -> Target:
    return Target(**{**target.model_dump(), "features": target.features.replace("+amx-int8", "-amx-int8"),
                     "name": f"{target.name}-no-amx"})


def bench(name: str, threads: int, work: Path, rounds: int) -> dict:
    dynamic = name in TRANSFORMERS
    proto = (quantize_dynamic if dynamic else quantize_static)(onnx.load(filled(name, work)))
    path = work / f"{name}-int8.onnx"
    onnx.save(proto, path)
    graph = optimize(load_model(path))
    host = Target.host()
    build_library(graph, host, work / "amx", threads)
    build_library(graph, without_amx(host), work / "vnni", threads)
    amx, vnni = load(work / "amx"), load(work / "vnni")
    ort = onnxruntime_runner(path, threads)
    step = None if dynamic else output_step(proto)
    worst = 0.0
    for seed in range(3):
        feeds = random_feeds(amx, seed)
        want = ort(feeds)[0]
        for lib in (amx, vnni):
            got = next(iter(lib.run(**feeds).values()))
            worst = max(worst, float(np.abs(got - want).max()) / (step or float(np.abs(want).max())))
    feeds = random_feeds(amx)
    raw = compare({"amx": lambda: amx.run(**feeds), "vnni": lambda: vnni.run(**feeds),
                   "onnxruntime": lambda: ort(feeds)}, number=NUMBER, rounds=rounds, idle_between=False)
    return {"model": name, "threads": threads, "worst": worst,
            "dynamic": dynamic, "ms": {k: v["median_ms"] for k, v in raw.items()},
            "amx_vnni": paired_ratio(raw, "amx", "vnni"), "amx_ort": paired_ratio(raw, "amx", "onnxruntime"),
            "vnni_ort": paired_ratio(raw, "vnni", "onnxruntime"), "rounds": rounds}


def report(rows: list[dict], command: str) -> str:
    host = Target.host()
    lines = [f"Command: `{command}`", "",
             f"Machine: {platform.machine()}, CPU `{host.cpu}`, {host.cores} cores. The same quantized graph "
             "(benchmarks/zoo_int8.py's quantization) built with the templates' default schedules for the host "
             "and for the host with `-amx-int8`. Latency: median of "
             f"{rows[0]['rounds'] * NUMBER} calls, the three interleaved in rounds of {NUMBER}; ratios are medians "
             "of per-round ratios. `off`: the worst element of either build off onnxruntime's int8 output over 3 "
             "inputs, in output steps (BERT: max abs error / max abs output).", "",
             "| model | threads | AMX ms | VNNI ms | onnxruntime int8 ms | AMX/VNNI | AMX/ort | VNNI/ort | off |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ms = r["ms"]
        off = f"{r['worst']:.1e} rel" if r["dynamic"] else f"{r['worst']:.2f}"
        lines.append(f"| {r['model']} | {r['threads']} | {ms['amx']:.2f} | {ms['vnni']:.2f} | "
                     f"{ms['onnxruntime']:.2f} | {r['amx_vnni']:.2f}x | {r['amx_ort']:.2f}x | {r['vnni_ort']:.2f}x | "
                     f"{off} |")
    lines.append("")
    for threads in sorted({r["threads"] for r in rows}):
        sub = [r for r in rows if r["threads"] == threads]
        gm = math.exp(sum(math.log(r["amx_vnni"]) for r in sub) / len(sub))
        lines.append(f"- {threads} thread(s): geometric mean AMX/VNNI {gm:.2f}x over {len(sub)} models.")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet50,mobilenet_v2,bert_2l", help="zoo models, comma-separated")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=ROUNDS, help=f"timing rounds of {NUMBER} calls per contender")
    ap.add_argument("--no-write", action="store_true", help="print, do not update RESULTS.md")
    args = ap.parse_args()
    if "amx" not in gemm_paths(Target.host()):
        sys.exit("benchmarks/amx.py: this CPU has no AMX-INT8 tiles (or LLVM does not report them)")
    rows = []
    for name in args.models.split(","):
        for n in (int(t) for t in args.threads.split(",")):
            with tempfile.TemporaryDirectory(prefix="tf-bench-amx-") as tmp:
                rows.append(bench(name, n, Path(tmp), args.rounds))
            print(rows[-1], flush=True)
    text = report(rows, ("flock /tmp/bench.lock .venv/bin/python benchmarks/amx.py " + " ".join(sys.argv[1:])).strip())
    print(text)
    if not args.no_write:
        replace_section(*SECTION, text)


if __name__ == "__main__":
    main()
