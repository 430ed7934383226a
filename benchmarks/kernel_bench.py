"""What the kernel benchmarks (kernels.py, kernels_conv.py) share: their options and command line, a compiled
candidate, the native timing of a loaded kernel (so GEMM and conv2d figures come from the same clock and
statistic) and how a schedule is shown."""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

import numpy as np

from stages.codegen.jit import LoadedKernel

DEFAULT_CONFIGS = 150


def sweep_parser(doc: str, per: str, names: str) -> argparse.ArgumentParser:
    """--configs (random configs per `per`), --<names> (substrings of the names to run), --seed, --no-write."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--configs", type=int, default=DEFAULT_CONFIGS, help=f"random configs per {per}")
    ap.add_argument(f"--{names}", default="", help=f"comma-separated substrings of {names[:-1]} names (default: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-write", action="store_true", help="print the table, leave RESULTS.md alone")
    return ap


def chosen(names: list[str], wanted: str) -> list[str]:
    """The names holding any of the comma-separated substrings of `wanted` (all of them when it is empty)."""
    parts = [w for w in wanted.split(",") if w]
    return [n for n in names if not parts or any(w in n for w in parts)]


def command_line(script: str, configs: int, names: str, wanted: str) -> str:
    """The command that reproduces a run, as its section quotes it."""
    return (f"flock /tmp/bench.lock .venv/bin/python benchmarks/{script}"
            + (f" --configs {configs}" if configs != DEFAULT_CONFIGS else "")
            + (f" --{names} {wanted}" if wanted else ""))


@dataclass
class Candidate:
    knobs: dict
    obj: bytes
    compile_s: float
    cost: float = float("inf")


def schedule_cell(knobs: dict) -> str:
    """A schedule as one table cell: `k=v k=v ...` in code font."""
    return "`" + " ".join(f"{k}={v}" for k, v in knobs.items()) + "`"


def time_kernel(kernel: LoadedKernel, args: list[np.ndarray], seconds: float, batch_s: float) -> float:
    """Median seconds per call over batches of calls lasting about `batch_s` each, filling `seconds` (3 at least)."""
    one = max(kernel.time(args, 1), 1e-7)
    number = max(1, int(batch_s / one))
    samples = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(samples) < 3:
        samples.append(kernel.time(args, number))
    return statistics.median(samples)
