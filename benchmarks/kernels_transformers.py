"""The dense and batch-matmul kernels of the transformer zoo (BERT, GPT-2, ViT-B/16 as `data/zoo/` exports
them) with their default schedule vs numpy/OpenBLAS, at 1 and 2 threads, same run.

Per shape and thread count: the default schedule, any `--baseline` schedules (a JSON file of
`{"shape": {"threads": knobs}}`, e.g. an earlier default, written by `--save-defaults`) and numpy
(OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE unset for this process) interleaved over `--rounds` rounds;
medians. `--cold` writes a 64 MB buffer before each timed call (as a model's other layers evict a
weight before its layer runs again) and times calls one at a time. Each kernel's answer is checked
against the numpy reference first. Prints a table and leaves RESULTS.md alone (the lead quotes it).

    flock /tmp/bench.lock .venv/bin/python benchmarks/kernels_transformers.py [--threads 1,2] [--cases 3072]
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):  # before numpy loads OpenBLAS
    os.environ.pop(_var, None)

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from kernel_bench import chosen, time_kernel  # noqa: E402
from kernels import time_numpy  # noqa: E402
from peak import fp32_peak_gflops  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

from schemas.target import Target  # noqa: E402
from schemas.task import TuningTask, parse_epilogue  # noqa: E402
from stages.codegen.compile import compile_ir  # noqa: E402
from stages.codegen.jit import LoadedKernel  # noqa: E402
from stages.measure.check import compare  # noqa: E402
from stages.measure.numpy_ref import blas_kernel  # noqa: E402
from stages.runtime.quiet import settle  # noqa: E402
from stages.templates import TEMPLATES, batch_matmul, dense  # noqa: E402

BATCH_S = 0.005
FLUSH_FLOATS = 16 * 1024 * 1024  # 64 MB: twice this machine's L3
COLD_CALLS = 7


def shapes() -> dict[str, TuningTask]:
    """The zoo's GEMM-family tasks (`tunaflow tasks` on the filled graphs), one per distinct shape and epilogue."""
    out: dict[str, TuningTask] = {}
    for m, n, k, epi, model in ((128, 768, 768, "bias", "bert"), (128, 3072, 768, "bias,gelu", "bert"),
                                (128, 768, 3072, "bias,residual_add", "bert"), (64, 2304, 768, "", "gpt2"),
                                (64, 768, 768, "residual_add", "gpt2"), (64, 3072, 768, "gelu_tanh", "gpt2"),
                                (64, 768, 3072, "residual_add", "gpt2"), (197, 2304, 768, "bias", "vit"),
                                (197, 768, 768, "residual_add", "vit"), (197, 3072, 768, "bias,gelu", "vit"),
                                (197, 768, 3072, "bias,residual_add", "vit"), (1, 1000, 768, "", "vit")):
        out[f"{model} dense {m}x{n}x{k}" + (f" +{epi}" if epi else "")] = dense.task(m, n, k, parse_epilogue(epi))
    for m, n, k, model in ((128, 128, 64, "bert"), (128, 64, 128, "bert"), (64, 64, 64, "gpt2"),
                           (197, 197, 64, "vit"), (197, 64, 197, "vit")):
        out[f"{model} batch_matmul 12x{m}x{n}x{k}"] = batch_matmul.task((1, 12, m, k), (1, 12, k, n))
    return out


def numpy_fn(task: TuningTask):
    """numpy's fastest spelling of the anchor (the epilogue is not counted: it is cheap next to the GEMM)."""
    if task.op == "dense":
        return lambda xs: xs[0] @ xs[1].T
    return lambda xs: np.matmul(xs[0], xs[1])


def default_knobs(task: TuningTask, target: Target, threads: int) -> dict:
    return dict(TEMPLATES[task.op].default_config(task, target).knobs)


def cold_numpy(fn, inputs: list[np.ndarray], threads: int, flush: np.ndarray) -> float:
    """Median seconds of single numpy calls, each after writing `flush`."""
    samples = []
    with threadpool_limits(limits=threads):
        for _ in range(COLD_CALLS):
            flush += 1.0
            start = time.perf_counter()
            fn(inputs)
            samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def cold_kernel(kernel: LoadedKernel, args: list[np.ndarray], flush: np.ndarray) -> float:
    return statistics.median(kernel.time(args, 1, flush) for _ in range(COLD_CALLS))


def measure(name: str, task: TuningTask, threads: int, configs: dict[str, dict], rounds: int,
            cold: bool = False) -> dict:
    target = Target.host()
    tpl = TEMPLATES[task.op]
    inputs = tpl.make_inputs(task)
    ref = tpl.reference(task, inputs)
    loaded = {}
    for label, knobs in configs.items():
        kernel = LoadedKernel(compile_ir(tpl.build_ir(task, knobs, target, threads), target).data, target)
        args = tpl.kernel_args(task, knobs, inputs)
        kernel(args)
        ok, err = compare(args[-1], ref, tpl.dims(task)[2])
        if not ok:
            raise RuntimeError(f"{name} x{threads} {label} {knobs}: wrong answer, max abs error {err:.3g}")
        loaded[label] = (kernel, args)
    costs: dict[str, list[float]] = {label: [] for label in [*loaded, "numpy"]}
    fn = numpy_fn(task)
    flush = np.zeros(FLUSH_FLOATS, dtype=np.float32) if cold else None
    for _ in range(rounds):
        costs["numpy"].append(cold_numpy(fn, inputs, threads, flush) if cold else time_numpy(fn, inputs, threads, 0.05))
        settle()
        for label, (kernel, args) in loaded.items():
            costs[label].append(cold_kernel(kernel, args, flush) if cold else time_kernel(kernel, args, 0.03, BATCH_S))
    gf = task.flops / 1e9
    return {label: gf / statistics.median(c) for label, c in costs.items()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--cases", default="", help="comma-separated substrings of shape names (default: all)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cold", action="store_true", help="evict the caches before each timed call")
    ap.add_argument("--baseline", type=Path, help="JSON {shape: {threads: knobs}} measured as `baseline`")
    ap.add_argument("--save-defaults", type=Path, help="write today's default knobs as such a JSON and exit")
    args = ap.parse_args(argv)
    target = Target.host()
    threads = [int(t) for t in args.threads.split(",")]
    tasks = {n: t for n, t in shapes().items() if n in chosen(list(shapes()), args.cases)}
    if args.save_defaults:
        saved = {n: {str(t): default_knobs(task, target, t) for t in threads} for n, task in tasks.items()}
        args.save_defaults.write_text(json.dumps(saved, indent=1))
        return
    base = json.loads(args.baseline.read_text()) if args.baseline else {}
    print(f"{target.cpu}, numpy {np.__version__} with {blas_kernel()}, medians of {args.rounds} interleaved rounds, "
          + ("caches evicted before each call" if args.cold else "hot"))
    peaks = {t: fp32_peak_gflops(target, t) for t in threads}
    print("FP32 peak (benchmarks/peak.py): " + ", ".join(f"{p:.0f} GFLOPS at {t} thread(s)" for t, p in peaks.items()))
    labels = ["baseline"] if base else []
    print("| shape | threads | " + " | ".join(f"{x} GFLOPS" for x in [*labels, "default", "numpy"])
          + " | default / peak | default / numpy |" + (" default / baseline |" if base else ""))
    print("|---" * (5 + len(labels) + (1 if base else 0)) + "|---|")
    for name, task in tasks.items():
        for t in threads:
            configs = {"default": default_knobs(task, target, t)}
            if name in base:
                configs = {"baseline": base[name][str(t)], **configs}
            g = measure(name, task, t, configs, args.rounds, args.cold)
            cells = [f"{g[x]:.1f}" for x in [*labels, "default", "numpy"]]
            extra = f" {g['default'] / g['baseline']:.2f}x |" if base else ""
            print(f"| {name} | {t} | " + " | ".join(cells) + f" | {g['default'] / peaks[t]:.0%} | "
                  f"{g['default'] / g['numpy']:.2f}x |" + extra,
                  flush=True)


if __name__ == "__main__":
    main()
