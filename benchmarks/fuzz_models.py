"""Differential fuzzing of whole CNN graphs against onnxruntime; writes the `fuzz` section of RESULTS.md.

    flock /tmp/bench.lock .venv/bin/python benchmarks/fuzz_models.py [--cases 1000] [--seed 0] [--jobs 2]

Each case (tests/support/fuzz_graphs.py) is a seeded random CNN, built with default schedules and with a
log of random valid configs (tests/support/fuzz_check.py), and compared with onnxruntime on 1 thread:
pass iff max abs error <= 1e-3 x max |reference| on every output. Prints the counts and every failure
(seed, case, description, error); `make_case(seed, case)` rebuilds any of them.

`--int8` quantizes each case first (`quantize_static`, as users quantize) and judges the int8 builds
(default and random tuned configs on the host, default on the x86-64-avx2 preset) by onnxruntime's int8 run
within one quantization step, or by `onnx.reference` where onnxruntime's own rounding is off it; writes the
`fuzz_int8` section. `--family transformer` fuzzes encoder/decoder graphs instead
(tests/support/fuzz_transformers.py; section `fuzz_transformers`); with `--int8` they are quantized by
`quantize_dynamic` (MatMulInteger, DynamicQuantizeLinear) and judged by the float rule against onnxruntime's
int8 run (section `fuzz_int8_transformers`).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))

from results import replace_section  # noqa: E402
from support.fuzz_check import STATUSES, Outcome, counts, run_cases  # noqa: E402

COMMAND = "flock /tmp/bench.lock .venv/bin/python benchmarks/fuzz_models.py"


def failure_class(o: Outcome) -> str:
    """A failure's kind with its numbers blanked, so one bug's cases group together."""
    return f"{o.status}: " + re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "N", o.detail)[:160]


def report(outcomes: list[Outcome], wall_s: float, args, command: str) -> str:
    tally = counts(outcomes)
    failures = [o for o in outcomes if o.status != "pass"]
    groups: dict[str, list[Outcome]] = defaultdict(list)
    for o in failures:
        groups[failure_class(o)].append(o)
    lines = [f"`{command}` ({time.strftime('%Y-%m-%d')}, {args.jobs} job(s) on 2 cores; a failure rebuilds with "
             f"`{'make_transformer_case' if args.family == 'transformer' else 'make_case'}(seed, case)` from "
             f"`tests/support/{'fuzz_transformers' if args.family == 'transformer' else 'fuzz_graphs'}.py`).", "",
             "| cases | " + " | ".join(STATUSES) + " | median s/case | wall s/case |",
             "|---" * (len(STATUSES) + 3) + "|",
             f"| {len(outcomes)} | " + " | ".join(str(tally[s]) for s in STATUSES)
             + f" | {statistics.median(o.seconds for o in outcomes):.2f} | {wall_s / len(outcomes):.2f} |", "",
             f"Tuned builds that ran a Winograd twin: {sum(o.winograd > 0 for o in outcomes)}; builds with padded "
             f"conv hand-offs: {sum(o.halo > 0 for o in outcomes)}; with strided batch-matmul views: "
             f"{sum(o.views > 0 for o in outcomes)}; with element-wise chains in one pass: "
             f"{sum(o.chains > 0 for o in outcomes)}; anchors per build: "
             f"{statistics.mean(o.anchors for o in outcomes):.1f} on average."]
    if args.int8 and args.family == "transformer":
        lines[-1] += (f" Builds off onnxruntime's int8 output but within the float rule of its basic level (no "
                      f"fusions) or of `onnx.reference`: {sum(o.ort_off for o in outcomes)} in "
                      f"{sum(o.ort_off > 0 for o in outcomes)} cases. Off every reference, yet with the "
                      f"interpreter agreeing with onnxruntime and every node of the build right on its own inputs "
                      f"(an ulp landing on a run-time quantization's rounding tie): {sum(o.ulp_off for o in outcomes)}"
                      f" in {sum(o.ulp_off > 0 for o in outcomes)} cases.")
    elif args.int8:
        lines[-1] += (f" Builds off onnxruntime's int8 output by more than a step but within a step of "
                      f"`onnx.reference` (onnxruntime's Tanh/Erf rounding): {sum(o.ort_off for o in outcomes)} "
                      f"in {sum(o.ort_off > 0 for o in outcomes)} cases.")
    if groups:
        lines += ["", "| failure class | cases | examples (seed:case) |", "|---|---|---|"]
        for key, members in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            examples = ", ".join(f"{o.seed}:{o.index}" for o in members[:6])
            lines.append(f"| `{key.replace('|', '/')}` | {len(members)} | {examples} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[Outcome]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2, help="cases run in parallel, one process each")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds before a case counts as a hang")
    ap.add_argument("--int8", action="store_true", help="quantize each case and judge the int8 builds")
    ap.add_argument("--family", choices=["cnn", "transformer"], default="cnn",
                    help="graph generator: CNNs (fuzz_graphs) or transformer layers (fuzz_transformers)")
    ap.add_argument("--no-write", action="store_true", help="print the section, leave RESULTS.md alone")
    args = ap.parse_args(argv)
    start = time.monotonic()
    outcomes = []
    for o in run_cases(args.seed, range(args.cases), args.jobs, args.timeout, args.int8, args.family):
        outcomes.append(o)
        if o.status != "pass":
            print(f"{o.status.upper()} seed {o.seed} case {o.index} ({o.seconds:.1f} s): {o.description}\n"
                  f"    {o.detail}", flush=True)
        if len(outcomes) % 25 == 0:
            print(f"[{len(outcomes)}/{args.cases}] {counts(outcomes)} {time.monotonic() - start:.0f} s", flush=True)
    outcomes.sort(key=lambda o: o.index)
    command = COMMAND + "".join(f" --{k} {v}" for k, v, d in (("cases", args.cases, 1000), ("seed", args.seed, 0),
                                                              ("jobs", args.jobs, 2)) if v != d)
    command += (" --int8" if args.int8 else "") + (f" --family {args.family}" if args.family != "cnn" else "")
    body = report(outcomes, time.monotonic() - start, args, command)
    print(body)
    if not args.no_write:
        if args.family == "transformer" and args.int8:
            replace_section("fuzz_int8_transformers", "Differential fuzzing of dynamically quantized transformer "
                                                      "graphs (`benchmarks/fuzz_models.py --int8 --family "
                                                      "transformer`)", body)
        elif args.family == "transformer":
            replace_section("fuzz_transformers", "Differential fuzzing of transformer graphs (`benchmarks/"
                                                 "fuzz_models.py --family transformer`)", body)
        elif args.int8:
            replace_section("fuzz_int8", "Differential fuzzing of quantized CNN graphs (`benchmarks/fuzz_models.py "
                                         "--int8`)", body)
        else:
            replace_section("fuzz", "Differential fuzzing of whole CNN graphs (`benchmarks/fuzz_models.py`)", body)
    return outcomes


if __name__ == "__main__":
    main()
