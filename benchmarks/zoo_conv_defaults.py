"""The zoo's dense 3x3 stride-1 and 1x1 convs: the direct default, the Winograd default and onnxruntime, per layer.

The evidence behind the default build's choice between the two implementations
(`stages.graph.twins.winograd_default_wins`) and behind the direct template's default tiles: each distinct conv
task of the zoo's CNNs (data/zoo/, as the whole-model build extracts them, epilogue fused) timed
alone, the contenders interleaved in `--rounds` rounds at each thread count, with each kernel's
max abs error over the max abs float64 reference. `--cold` times single calls after evicting every
cache (a 96 MiB write) and touching the activations again: a whole model streams each layer's
weights from memory, and Winograd's transformed weights are 4x the direct ones, which warm
back-to-back calls hide. Prints a table; writes nothing.

    flock /tmp/bench.lock .venv/bin/python benchmarks/zoo_conv_defaults.py [--models resnet50] [--threads 1,2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from kernel_bench import time_kernel  # noqa: E402
from kernels_conv import ort_session, time_ort  # noqa: E402

from benchmarks.zoo import filled  # noqa: E402
from schemas.target import Target  # noqa: E402
from schemas.task import TuningTask  # noqa: E402
from stages.codegen.compile import compile_ir  # noqa: E402
from stages.codegen.jit import LoadedKernel  # noqa: E402
from stages.extract import load_model  # noqa: E402
from stages.graph.passes import optimize  # noqa: E402
from stages.graph.tasks import extract_tasks  # noqa: E402
from stages.graph.twins import winograd_default_wins, winograd_serves, winograd_twin  # noqa: E402
from stages.runtime.quiet import settle  # noqa: E402
from stages.templates import conv2d, template_for  # noqa: E402

MODELS = ("resnet50", "densenet121", "inception_v3")
BATCH_S = 0.01
EVICT_FLOATS = 96 * 2**20 // 4  # more than the L3 of the machines here
COLD_CALLS = 5  # single cold calls per round and contender (their median)


def zoo_convs(models: list[str], kinds: set[str]) -> list[tuple[str, TuningTask, int]]:
    """(model, task, occurrences) of each distinct dense conv of the `kinds` ("3x3s1", "1x1") in the models."""
    out: list[tuple[str, TuningTask, int]] = []
    seen: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="tf-convdef-") as tmp:
        for name in models:
            for t in extract_tasks(optimize(load_model(filled(name, Path(tmp))))):
                task = t.task
                if t.alternative_to is not None or task.op != "conv2d" or task.signature in seen:
                    continue
                kind = "3x3s1" if winograd_serves(task) else "1x1" if _gemm_1x1(task) else ""
                if kind in kinds:
                    seen.add(task.signature)
                    out.append((name, task, t.weight))
    return out


def _gemm_1x1(task: TuningTask) -> bool:
    w = task.inputs[1].shape
    return tuple(w[2:]) == (1, 1) and tuple(task.attrs["strides"]) == (1, 1) and int(task.attrs["group"]) == 1


def contender(task: TuningTask, knobs: dict, threads: int, target: Target, inputs: list[np.ndarray],
              ref: np.ndarray) -> tuple[LoadedKernel, list[np.ndarray], float]:
    """The loaded kernel, its arguments and its max abs error over the max abs reference."""
    tpl = template_for(task)
    kernel = LoadedKernel(compile_ir(tpl.build_ir(task, knobs, target, threads), target).data, target)
    args = tpl.kernel_args(task, knobs, inputs)
    kernel(args)
    err = float(np.max(np.abs(args[-1].astype(np.float64) - ref))) / max(float(np.max(np.abs(ref))), 1e-30)
    return kernel, args, err


def cold_time(call, activations: list[np.ndarray], evict: np.ndarray) -> float:
    """Median seconds of single calls, each after evicting the caches and reading the activations back in."""
    samples = []
    for _ in range(COLD_CALLS):
        np.add(evict, 1.0, out=evict)
        for a in activations:
            float(a.sum())
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def measure(task: TuningTask, threads: int, rounds: int, cold: bool = False) -> dict:
    """Median ms of the direct default, the Winograd default (3x3 stride 1) and onnxruntime, interleaved."""
    target = Target.host()
    inputs = conv2d.make_inputs(task)
    ref = conv2d.reference(task, inputs)
    named = {"direct": (task, conv2d.default_config(task, target).knobs)}
    if winograd_serves(task):
        twin = winograd_twin(task)
        named["winograd"] = (twin, template_for(twin).default_config(twin, target).knobs)
    loaded = {k: contender(t, kn, threads, target, inputs, ref) for k, (t, kn) in named.items()}
    sess, bound = ort_session(task, inputs, threads)
    sess.run_with_iobinding(bound[0])  # fills the bound output the cold timing reads back in
    costs: dict[str, list[float]] = {k: [] for k in [*loaded, "ort"]}
    evict = np.zeros(EVICT_FLOATS if cold else 1, dtype=np.float32)
    for r in range(rounds):
        for k, (kernel, args, _) in list(loaded.items())[::(-1) ** r]:
            costs[k].append(cold_time(partial(kernel, args), [args[0], args[-1]], evict) if cold
                            else time_kernel(kernel, args, 0.05, BATCH_S))
        costs["ort"].append(cold_time(partial(sess.run_with_iobinding, bound[0]), [inputs[0], bound[1]], evict)
                            if cold else time_ort(sess, bound, 0.05))
        settle()
    return {"ms": {k: statistics.median(v) * 1e3 for k, v in costs.items()},
            "err": {k: v[2] for k, v in loaded.items()}}


def describe(task: TuningTask) -> str:
    x, w = task.inputs[0].shape, task.inputs[1].shape
    return f"{x[1]}x{x[2]}x{x[3]} -> {w[0]} {w[2]}x{w[3]}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--kinds", default="3x3s1", help="comma list of 3x3s1, 1x1")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cold", action="store_true", help="weights cold, as in a whole model (see the module doc)")
    args = ap.parse_args()
    convs = zoo_convs(args.models.split(","), set(args.kinds.split(",")))
    print("| model | conv | n | threads | direct ms | winograd ms | ort ms | direct/ort | winograd/ort | "
          "winograd/direct | rule | error direct / winograd |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for threads in (int(t) for t in args.threads.split(",")):
        for model, task, n in convs:
            r = measure(task, threads, args.rounds, args.cold)
            ms, err = r["ms"], r["err"]
            wino = ms.get("winograd")
            rule = ("winograd" if winograd_default_wins(task) else "direct") if wino else "-"
            print(f"| {model} | {describe(task)} | {n} | {threads} | {ms['direct']:.3f} | "
                  f"{wino:.3f} | " if wino else f"| {model} | {describe(task)} | {n} | {threads} | "
                  f"{ms['direct']:.3f} | - | ", end="")
            print(f"{ms['ort']:.3f} | {ms['direct'] / ms['ort']:.2f} | "
                  + (f"{wino / ms['ort']:.2f} | {wino / ms['direct']:.2f} | " if wino else "- | - | ")
                  + f"{rule} | {err['direct']:.1e} / " + (f"{err['winograd']:.1e} |" if wino else "- |"), flush=True)


if __name__ == "__main__":
    main()
