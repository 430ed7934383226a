"""Latency of built libraries next to onnxruntime on the same inputs, measured interleaved.

This machine is noisy, so the contenders take turns (`rounds` rounds of `number` calls each, the
starting contender rotating) and each reports the median and p90 of all its calls. Two regimes:
- after an idle pause (`idle_between`, the default): before each turn the other threads of the
  process (onnxruntime's, OpenBLAS's, our pool's) are let go quiet, then a few untimed calls;
- under load: turns back to back, each starting with `LOAD_WARMUP_S` of untimed calls, longer than
  the previous contender's threads spin (onnxruntime's: 30-40 ms), so the machine never idles.
Either way no turn pays for the previous one's spinning. On this VM they differ: after each idle
pause 2-thread calls settle at one of several speeds and keep it while the machine stays busy (the
host's placement of the vCPUs, by all signs; the same 2-thread CNN's turns at 0.13 to 0.21 ms
after pauses, 0.15 back to back).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from stages.runtime.feeds import sample_inputs
from stages.runtime.loader import Model, latency_stats
from stages.runtime.quiet import settle


def onnxruntime_runner(model: Path, threads: int) -> Callable[[dict[str, np.ndarray]], list[np.ndarray]]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
    return lambda feeds: sess.run(None, feeds)


def random_feeds(model: Model, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs the model accepts (token ids within their table, masks with padding: feeds.py)."""
    return sample_inputs(model.inputs, seed)


# Untimed calls that start a turn under load: longer than the previous contender's threads keep a core. Measured
# (2-thread MobileNetV2, Zen 5): onnxruntime's pool keeps spinning 30-40 ms after its last call, and our pinned
# worker, sharing its core with that spinner, made our calls 6-8 ms instead of 2.2 for that long; with 10 ms
# of warm-up the zoo table had this model at 1.30x onnxruntime, with 100 ms 0.95-1.00x (each alone: 0.95x).
LOAD_WARMUP_S = 0.1


def compare(contenders: dict[str, Callable[[], object]], number: int = 20, rounds: int = 5,
            warmup: int = 3, idle_between: bool = True) -> dict[str, dict]:
    """Latency stats (ms) per contender over all its calls, plus `round_ms`: its median in each round
    (see `paired_ratio`); each callable runs the model once. `warmup` untimed calls start each turn,
    under load (`idle_between=False`) as many more as `LOAD_WARMUP_S` takes."""
    times: dict[str, list[list[float]]] = {name: [] for name in contenders}
    names = list(contenders)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            fn = contenders[name]
            if idle_between:
                settle()
            start = time.perf_counter()
            calls = 0
            while calls < warmup or (not idle_between and time.perf_counter() - start < LOAD_WARMUP_S):
                fn()
                calls += 1
            turn = []
            for _ in range(number):
                t0 = time.perf_counter()
                fn()
                turn.append(time.perf_counter() - t0)
            times[name].append(turn)
    return {name: {**latency_stats([t for turn in turns for t in turn]),
                   "round_ms": [float(np.median(turn) * 1e3) for turn in turns]}
            for name, turns in times.items()}


def paired_ratio(stats: dict[str, dict], a: str, b: str) -> float:
    """Median over rounds of a's latency / b's in the same round: the machine's speed drifts by more
    than the gaps measured here (whole runs 10-15% apart), and a round's contenders share its drift."""
    return float(np.median(_round_ratios(stats, a, b)))


def ratio_quartiles(stats: dict[str, dict], a: str, b: str) -> tuple[float, float]:
    """The middle half of the per-round ratios `paired_ratio` takes the median of: how far one round
    could mislead (on this VM a 2-thread turn may start with the second vCPU elsewhere for a while)."""
    lo, hi = np.percentile(_round_ratios(stats, a, b), [25, 75])
    return float(lo), float(hi)


def _round_ratios(stats: dict[str, dict], a: str, b: str) -> np.ndarray:
    return np.array(stats[a]["round_ms"]) / np.array(stats[b]["round_ms"])


def max_rel_error(got: np.ndarray, want: np.ndarray) -> float:
    """Largest |got - want| relative to the largest |want| (a scale-aware closeness figure)."""
    return float(np.abs(got.astype(np.float64) - want).max() / max(float(np.abs(want).max()), 1e-30))
