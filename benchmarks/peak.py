"""This CPU's FP32 peak, measured: independent vector FMA chains, no memory traffic, on the worker pool.

The ceiling every kernel's GFLOPS answers to, and what bounds a tuned build's gain over a default
one whose kernels already run near it (`benchmarks/models.py`).

    flock /tmp/bench.lock .venv/bin/python benchmarks/peak.py [--threads 2]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from llvmlite import ir

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from schemas import Target  # noqa: E402
from stages.codegen.compile import compile_ir  # noqa: E402
from stages.codegen.harness import add_harness  # noqa: E402
from stages.codegen.irb import fconst, fma, for_range, gep, i64, loop_carry, store_vec, vec  # noqa: E402
from stages.codegen.jit import LoadedKernel  # noqa: E402
from stages.codegen.parallel import body_args, emit_main, range_body  # noqa: E402

CHAINS = 12  # independent accumulators: more than FMA latency x FMA units, so the units never wait
STEPS = 1_000_000  # FMA steps per chain and thread: about 3 ms a call here


def peak_module(target: Target, threads: int) -> ir.Module:
    """`tf_main([out])`: each of `threads` items runs CHAINS x STEPS vector FMAs and stores its sums."""
    mod = ir.Module(name="fp32_peak")
    mod.triple = target.triple
    lanes = target.vector_lanes
    fn, b = range_body(mod, "tf_peak_item")
    out = body_args(b, fn, 1)[0]
    with for_range(b, fn.args[1], fn.args[2], name="item") as item:
        accs = [fconst(vec(lanes), float(i)) for i in range(CHAINS)]
        scale, shift = fconst(vec(lanes), 0.999), fconst(vec(lanes), 1e-3)
        with loop_carry(b, i64(0), i64(STEPS), accs, name="step", unroll=False):
            for i in range(CHAINS):
                accs[i] = fma(b, accs[i], scale, shift)
        total = accs[0]
        for a in accs[1:]:
            total = b.fadd(total, a)
        store_vec(b, total, gep(b, out, b.mul(item, i64(lanes))))
    b.ret_void()
    add_harness(mod, emit_main(mod, fn, threads, threads))
    return mod


def fp32_peak_gflops(target: Target, threads: int, repeats: int = 7) -> float:
    """Best of `repeats` timed calls: the peak is what the CPU can do, so noise only ever lowers it."""
    kernel = LoadedKernel(compile_ir(peak_module(target, threads), target).data, target)
    out = np.zeros(threads * target.vector_lanes, dtype=np.float32)
    flops = 2.0 * CHAINS * STEPS * target.vector_lanes * threads
    return max(flops / kernel.time([out], 1) / 1e9 for _ in range(repeats))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    target = Target.host()
    print(f"{target.cpu}, {args.threads} thread(s): FP32 peak {fp32_peak_gflops(target, args.threads):.1f} GFLOPS")


if __name__ == "__main__":
    main()
