"""Whole transformer models, default builds: the dense layers' weight-streaming default vs the general GEMM rule.

The evidence behind `gemm_schedule._weight_blocks`: per zoo transformer (data/zoo/, seeded random weights)
and thread count, two default-schedule libraries — `new`, today's default (dense layers read their packed
weight once: all of M in one block, threads split N), and `general`, the same build with the dense tasks on
the general rule (threads split M, each M block streams the whole weight) — both checked against
onnxruntime (max abs error / max abs reference), then the three timed interleaved (`--rounds` rounds of 10
calls; ratios are medians of per-round ratios). Prints a table; writes nothing.

    flock /tmp/bench.lock .venv/bin/python benchmarks/zoo_dense_defaults.py [--models bert_2l] [--threads 1,2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.zoo import NUMBER, TRANSFORMERS, filled, matches  # noqa: E402
from schemas import Target  # noqa: E402
from schemas.config import Config  # noqa: E402
from schemas.task import TuningTask  # noqa: E402
from stages.build.library import build_library  # noqa: E402
from stages.extract import load_model  # noqa: E402
from stages.graph.passes import optimize  # noqa: E402
from stages.runtime import load  # noqa: E402
from stages.runtime.compare import compare, onnxruntime_runner, paired_ratio, random_feeds  # noqa: E402
from stages.templates import dense  # noqa: E402
from stages.templates.gemm_schedule import default_gemm  # noqa: E402


def general_rule(task: TuningTask, target: Target) -> Config:
    """A dense task's default as the general GEMM rule gives it (the weight-streaming path off)."""
    return default_gemm(*dense.dims(task), target, what=task.description)


def bench(name: str, threads: int, rounds: int, work: Path) -> dict:
    path = filled(name, work)
    graph = optimize(load_model(path))
    target = Target.host()
    build_library(graph, target, work / f"{name}-t{threads}-new", threads)
    with mock.patch.object(dense, "default_config", general_rule):
        build_library(graph, target, work / f"{name}-t{threads}-general", threads)
    new, general = load(work / f"{name}-t{threads}-new"), load(work / f"{name}-t{threads}-general")
    feeds = random_feeds(new)
    ort = onnxruntime_runner(path, threads)
    want = ort(feeds)
    errors = {"new": matches(new.run(**feeds), want), "general": matches(general.run(**feeds), want)}
    raw = compare({"general": lambda: general.run(**feeds), "new": lambda: new.run(**feeds),
                   "onnxruntime": lambda: ort(feeds)}, number=NUMBER, rounds=rounds, idle_between=False)
    return {"ms": {k: v["median_ms"] for k, v in raw.items()}, "errors": errors,
            "general_ort": paired_ratio(raw, "general", "onnxruntime"),
            "new_ort": paired_ratio(raw, "new", "onnxruntime"),
            "new_general": paired_ratio(raw, "new", "general")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(TRANSFORMERS))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    print(f"{Target.host().cpu}; medians of {args.rounds} x {NUMBER} calls, ratios medians of per-round ratios")
    print("| model | threads | general ms | new ms | onnxruntime ms | general/ort | new/ort | new/general | "
          "error general / new |")
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="tf-densedef-") as tmp:
        for name in args.models.split(","):
            for threads in (int(t) for t in args.threads.split(",")):
                r = bench(name, threads, args.rounds, Path(tmp))
                ms, err = r["ms"], r["errors"]
                print(f"| {name} | {threads} | {ms['general']:.2f} | {ms['new']:.2f} | {ms['onnxruntime']:.2f} | "
                      f"{r['general_ort']:.2f}x | {r['new_ort']:.2f}x | **{r['new_general']:.2f}x** | "
                      f"{err['general']:.1e} / {err['new']:.1e} |", flush=True)


if __name__ == "__main__":
    main()
