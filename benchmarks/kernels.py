"""GEMM-family kernels (matmul, dense + bias + relu, batch matmul) vs numpy/OpenBLAS, same run.

For every case: the default schedule and the best of a random sweep of the schedule space (each
candidate compiled in a pool of 2, checked against the numpy reference, timed natively), then
the default and the 5 fastest re-measured interleaved with numpy (medians of 5 rounds). numpy
runs with OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE unset (this process only) on the same thread
count. Writes the `kernels:gemm` section of benchmarks/RESULTS.md; `--conv` also runs the conv2d
section (benchmarks/kernels_conv.py).

    flock /tmp/bench.lock .venv/bin/python benchmarks/kernels.py [--configs 150] [--cases mm,dense] [--conv]
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):  # before numpy loads OpenBLAS
    os.environ.pop(_var, None)

import multiprocessing as mp  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernel_bench import Candidate, chosen, command_line, schedule_cell, sweep_parser, time_kernel  # noqa: E402
from results import markdown_table, publish  # noqa: E402

from schemas.target import Target  # noqa: E402
from schemas.task import TuningTask, parse_epilogue  # noqa: E402
from stages.codegen.compile import compile_ir  # noqa: E402
from stages.codegen.jit import LoadedKernel  # noqa: E402
from stages.measure.check import compare  # noqa: E402
from stages.measure.numpy_ref import blas_kernel  # noqa: E402
from stages.runtime.quiet import settle  # noqa: E402
from stages.templates import TEMPLATES, batch_matmul, dense, matmul  # noqa: E402

SECTION, TITLE = "kernels:gemm", "GEMM kernels vs numpy (`benchmarks/kernels.py`)"
BATCH_S = 0.005  # each timed batch of kernel calls lasts about this long
BIAS_RELU = parse_epilogue("bias,relu")


def _np_matmul(xs: list[np.ndarray]) -> np.ndarray:
    return np.matmul(xs[0], xs[1])


def _np_dense_bias_relu(xs: list[np.ndarray]) -> np.ndarray:
    return np.maximum(xs[0] @ xs[1].T + xs[2], 0)


@dataclass(frozen=True)
class Case:
    name: str
    task: TuningTask
    threads: int
    numpy_fn: Callable[[list[np.ndarray]], np.ndarray]


def cases() -> list[Case]:
    out = [Case(f"matmul {s}^3", matmul.task(s, s, s), t, _np_matmul) for s in (512, 1024) for t in (1, 2)]
    for m in (1, 128, 197):
        for k, n in ((768, 3072), (1024, 1000)):
            out.append(Case(f"dense+bias+relu {m}x{n}x{k}", dense.task(m, n, k, BIAS_RELU), 1, _np_dense_bias_relu))
    for b, m, n, k in ((12, 128, 128, 64), (12, 128, 64, 128)):
        for t in (1, 2):
            out.append(Case(f"batch_matmul {b}x{m}x{n}x{k}", batch_matmul.task((b, m, k), (b, k, n)), t, _np_matmul))
    return out


def _compile(args: tuple) -> tuple[dict, bytes, float]:
    task, knobs, threads = args
    target = Target.host()
    start = time.perf_counter()
    obj = compile_ir(TEMPLATES[task.op].build_ir(task, knobs, target, threads), target)
    return knobs, obj.data, time.perf_counter() - start


def time_numpy(fn: Callable, inputs: list[np.ndarray], threads: int, seconds: float) -> float:
    with threadpool_limits(limits=threads):
        fn(inputs)
        samples = []
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline or len(samples) < 5:
            start = time.perf_counter()
            fn(inputs)
            samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def sample_configs(task: TuningTask, target: Target, n: int, seed: int) -> list[dict]:
    """The default plus `n` random valid configs, drawn from the part of the space that uses the
    target's full vector width and at least 12 accumulator vectors (the rest cannot be fast)."""
    tpl = TEMPLATES[task.op]
    sp = tpl.space(task, target)
    default = tpl.default_config(task, target).knobs
    rng = random.Random(seed)
    picked = {sp.index_of(default)}
    tries = 0
    while len(picked) < n + 1 and tries < 200_000:
        tries += 1
        i = rng.randrange(sp.size)
        knobs = sp.knobs_at(i)
        wide = int(knobs["vw"]) == min(target.vector_lanes, int(default["vw"]))
        full = int(knobs["mr"]) * int(knobs["nv"]) >= min(12, int(default["mr"]) * int(default["nv"]))
        if wide and full and i not in picked and sp.is_valid(i):
            picked.add(i)
    return [default] + [sp.knobs_at(i) for i in sorted(picked - {sp.index_of(default)})]


def run_case(pool, case: Case, n_configs: int, seed: int) -> dict:
    target = Target.host()
    tpl = TEMPLATES[case.task.op]
    configs = sample_configs(case.task, target, n_configs, seed)
    built = pool.map(_compile, [(case.task, k, case.threads) for k in configs], chunksize=4)
    inputs = tpl.make_inputs(case.task)
    ref = tpl.reference(case.task, inputs)
    cands, wrong = [], 0
    for knobs, obj, cs in built:
        kernel = LoadedKernel(obj, target)
        args = tpl.kernel_args(case.task, knobs, inputs)
        kernel(args)
        ok, err = compare(args[-1], ref, tpl.dims(case.task)[2])
        if not ok:
            print(f"WRONG ANSWER {case.name} {knobs}: max abs error {err:.3g}", flush=True)
            wrong += 1
            continue
        c = Candidate(knobs, obj, cs)
        c.cost = time_kernel(kernel, args, 0.02, BATCH_S)
        cands.append(c)
    ranked = sorted(cands[1:], key=lambda c: c.cost)
    finalists = [cands[0], *ranked[:5]]
    loaded = [(LoadedKernel(c.obj, target), tpl.kernel_args(case.task, c.knobs, inputs)) for c in finalists]
    costs: list[list[float]] = [[] for _ in finalists]
    np_costs = []
    for _ in range(5):
        np_costs.append(time_numpy(case.numpy_fn, inputs, case.threads, 0.1))
        settle()  # OpenBLAS's threads spin after numpy: timed now, our kernels would share the cores
        for i, (k, a) in enumerate(loaded):
            costs[i].append(time_kernel(k, a, 0.05, BATCH_S))
    med = [statistics.median(c) for c in costs]
    np_cost = statistics.median(np_costs)
    best = min(range(len(finalists)), key=lambda i: med[i])
    gf = case.task.flops / 1e9
    return {"case": case.name, "threads": case.threads, "numpy_gflops": gf / np_cost, "default_gflops": gf / med[0],
            "best_gflops": gf / med[best], "default_ratio": np_cost / med[0], "best_ratio": np_cost / med[best],
            "best_knobs": finalists[best].knobs, "compile_s": [c.compile_s for c in cands], "wrong": wrong}


def goals(rows: list[dict]) -> list[str]:
    """The issue's targets, each with its measured value and verdict."""
    by = {(r["case"], r["threads"]): r for r in rows}
    lines = []

    def check(label: str, value: float | None, goal: float, unit: str = "x") -> None:
        if value is None:
            return
        verdict = "met" if value >= goal else f"**missed by {(goal - value) / goal:.0%}**"
        lines.append(f"| {label} | >= {goal:g}{unit} | {value:.2f}{unit} | {verdict} |")

    for s in (512, 1024):
        for t, goal in ((1, 0.95), (2, 0.9)):
            r = by.get((f"matmul {s}^3", t))
            check(f"matmul {s}^3, {t} thread(s), best / numpy", r and r["best_ratio"], goal)
    dense_rows = [r for r in rows if r["case"].startswith("dense")]
    if dense_rows:
        worst = min(dense_rows, key=lambda r: r["best_ratio"])
        check(f"dense+bias+relu, worst case ({worst['case']}) / numpy 3 ops", worst["best_ratio"], 1.2)
    bmm = [r for r in rows if r["case"].startswith("batch_matmul")]
    if bmm:
        worst = min(bmm, key=lambda r: r["best_ratio"])
        check(f"batch matmul, worst case ({worst['case']} x{worst['threads']}) / np.matmul", worst["best_ratio"], 1.0)
    r = by.get(("matmul 1024^3", 1))
    check("default schedule, matmul 1024^3 1 thread / numpy", r and r["default_ratio"], 0.5)
    r2 = by.get(("matmul 1024^3", 2))
    if r and r2:
        check("matmul 1024^3: best 2 threads / best 1 thread", r2["best_gflops"] / r["best_gflops"], 1.8)
    compile_ms = statistics.median(s for r in rows for s in r["compile_s"]) * 1e3
    verdict = "met" if compile_ms <= 100 else f"**missed by {(compile_ms - 100) / 100:.0%}**"
    lines.append(f"| median compile time per candidate | <= 100 ms | {compile_ms:.0f} ms | {verdict} |")
    return lines


def table(rows: list[dict], n_configs: int, command: str) -> str:
    """The section's body (RESULTS.md adds the markers and the title)."""
    target = Target.host()
    n_compiled = sum(len(r["compile_s"]) for r in rows)
    lines = [
        f"`{command}` — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {target.cpu}, numpy {np.__version__} "
        f"with {blas_kernel()} (OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE unset), same thread count. tunaflow: the default "
        f"schedule, and the best of the default plus {n_configs} random valid configs from the full-width, "
        "register-filling part of the space (each checked against numpy), the default and the 5 fastest "
        "re-measured interleaved with numpy (medians of 5 rounds). Ratios > 1 mean faster than numpy; dense's "
        "numpy reference is `np.maximum(x @ w.T + b, 0)`.",
        "",
        *markdown_table(
            ["case", "threads", "numpy GFLOPS", "default GFLOPS", "default / numpy", "best GFLOPS", "best / numpy",
             "best schedule"],
            [[r["case"], r["threads"], f"{r['numpy_gflops']:.1f}", f"{r['default_gflops']:.1f}",
              f"{r['default_ratio']:.2f}x", f"{r['best_gflops']:.1f}", f"**{r['best_ratio']:.2f}x**",
              schedule_cell(r["best_knobs"])] for r in rows]),
    ]
    lines += ["", "| goal (issue 9) | target | measured | verdict |", "|---|---|---|---|", *goals(rows), "",
              f"Compile time: IR build + LLVM O1 + codegen, wall clock, 2 compiles in parallel, over {n_compiled} "
              f"candidates. Candidates with a wrong answer: {sum(r['wrong'] for r in rows)}."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    ap = sweep_parser(__doc__, "case", "cases")
    ap.add_argument("--conv", action="store_true", help="also run the conv2d section (kernels_conv.py)")
    args = ap.parse_args(argv)
    names = chosen([c.name for c in cases()], args.cases)
    selected = [c for c in cases() if c.name in names]
    rows = []
    with mp.get_context("spawn").Pool(2) as pool:
        for i, case in enumerate(selected):
            r = run_case(pool, case, args.configs, args.seed + i)
            print(f"{case.name} x{case.threads}: numpy {r['numpy_gflops']:.1f} GFLOPS, "
                  f"default {r['default_ratio']:.2f}x, best {r['best_gflops']:.1f} GFLOPS {r['best_ratio']:.2f}x "
                  f"{r['best_knobs']}", flush=True)
            rows.append(r)
    command = command_line("kernels.py", args.configs, "cases", args.cases)
    publish(SECTION, TITLE, table(rows, args.configs, command), write=not args.no_write)
    if args.conv:
        import kernels_conv

        kernels_conv.main(["--no-write"] if args.no_write else [])
    return rows


if __name__ == "__main__":
    main()
