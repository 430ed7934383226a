"""Prefect's overhead: a 200-trial session through the `tune-op` flow vs the same stages called directly.

Same task, seed and tuner in both (so the same configs are measured); the two modes are
interleaved and repeated, and the flow is timed after a warm-up flow, on the temporary server the
CLI runs its flows against (`flows.server.local_server`, with its settings; its 10-20 s start-up is
reported separately). Writes its section of
benchmarks/RESULTS.md.

    flock /tmp/bench.lock .venv/bin/python benchmarks/orchestration.py [--trials 200] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from results import replace_section  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--m", type=int, default=256)
    args = parser.parse_args()
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")

    from flows.server import local_server
    from flows.tune_op import tune_op
    from schemas import Target, TuningOptions, matmul_task
    from stages.pipeline.op import tune_op as direct_tune_op

    task = matmul_task(args.m, args.m, args.m)
    target = Target.host()
    options = TuningOptions(n_trials=args.trials, batch_size=16, tuner="random", seed=7)

    start = time.perf_counter()
    with local_server():
        measure(args, task, target, options, tune_op, direct_tune_op, start)


def measure(args: argparse.Namespace, task, target, options, tune_op, direct_tune_op, start: float) -> None:
    """The interleaved rounds and the RESULTS section, on a running server (started at `start`)."""
    tmp = Path(tempfile.mkdtemp(prefix="tunaflow-orch-"))
    tune_op(task, target, options.model_copy(update={"n_trials": 2}), str(tmp / "warmup"), progress=False)
    startup = time.perf_counter() - start

    direct, flow = [], []
    for i in range(args.rounds):
        t0 = time.perf_counter()
        direct_tune_op(task, target, options, tmp / f"direct{i}")
        direct.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        tune_op(task, target, options, str(tmp / f"flow{i}"), progress=False)
        flow.append(time.perf_counter() - t0)
        print(f"round {i + 1}: direct {direct[-1]:.1f} s, flow {flow[-1]:.1f} s", flush=True)

    d, f = statistics.median(direct), statistics.median(flow)
    overhead = f / d - 1
    goal = "met" if overhead <= 0.10 else f"missed by {overhead - 0.10:.1%}"
    table = "\n".join([
        f"Command: `flock /tmp/bench.lock .venv/bin/python benchmarks/orchestration.py --trials {args.trials} "
        f"--rounds {args.rounds} --m {args.m}`",
        "",
        f"Task {task.description}, {args.trials} trials per session, random tuner, seed 7, batches of 16; "
        f"{args.rounds} interleaved rounds, medians.",
        "",
        "| mode | wall s (median) | all rounds |",
        "| --- | ---: | --- |",
        f"| stages called directly | {d:.1f} | {', '.join(f'{x:.1f}' for x in direct)} |",
        f"| `tune-op` Prefect flow | {f:.1f} | {', '.join(f'{x:.1f}' for x in flow)} |",
        "",
        f"Prefect overhead: **{overhead:+.1%}** (goal <= 10%: {goal}). Temporary server start-up plus the "
        f"first (2-trial) flow: {startup:.1f} s, paid once per process.",
    ])
    print(table)
    replace_section("orchestration", "Orchestration overhead (Prefect flow vs direct stages)", table)


if __name__ == "__main__":
    main()
