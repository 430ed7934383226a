"""The loop every direct-conv2d emitter uses: neither unrolled nor vectorized by LLVM."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from llvmlite import ir

from stages.codegen.irb import I1, for_range


@contextmanager
def loop(b: ir.IRBuilder, start: ir.Value, stop: ir.Value, step: int = 1, name: str = "i") -> Iterator[ir.Value]:
    """`for_range` that LLVM must not unroll: unrolling is the schedule's decision (knobs `unroll`,
    `uk`), and LLVM fully unrolling small constant trip counts around an inlined micro-kernel
    multiplies code size (and compile time) without a knob to undo it."""
    with for_range(b, start, stop, step, name) as idx:
        yield idx
    mod = b.module
    loop_id = mod.add_metadata([ir.MetaDataString(mod, f"tf.loop.{len(mod.metadata)}")])
    loop_id.operands = (loop_id, mod.add_metadata([ir.MetaDataString(mod, "llvm.loop.unroll.disable")]),
                        mod.add_metadata([ir.MetaDataString(mod, "llvm.loop.vectorize.enable"), ir.Constant(I1, 0)]))
    idx.incomings[-1][1].terminator.set_metadata("llvm.loop", loop_id)
