"""A native timing loop around a kernel's `tf_main`, so no Python runs between timed calls.

`double tf_bench(ptr args, i64 number, float* flush, i64 flush_len)` calls `tf_main(args)`
`number` times and returns the mean seconds per call (CLOCK_MONOTONIC). With a flush buffer,
each call is preceded by writing the buffer (evicting caches) and only the call is timed.
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir

from stages.codegen.irb import F32, F32P, F64, I32, I64, VOIDP, for_range, gep, i64, intrinsic

TIMESPEC = ir.LiteralStructType([I64, I64])
CLOCK_MONOTONIC = 1


def monotonic_clock(b: ir.IRBuilder) -> Callable[[], ir.Value]:
    """A `now()` emitting a CLOCK_MONOTONIC read, in seconds as a double, at the builder's position."""
    clock = intrinsic(b.module, "clock_gettime", I32, [I32, TIMESPEC.as_pointer()])
    ts = b.alloca(TIMESPEC)

    def now() -> ir.Value:
        b.call(clock, [ir.Constant(I32, CLOCK_MONOTONIC), ts])
        sec = b.load(b.gep(ts, [ir.Constant(I32, 0), ir.Constant(I32, 0)]))
        nsec = b.load(b.gep(ts, [ir.Constant(I32, 0), ir.Constant(I32, 1)]))
        return b.fadd(b.sitofp(sec, F64), b.fmul(b.sitofp(nsec, F64), ir.Constant(F64, 1e-9)))

    return now


def ret_mean_time(b: ir.IRBuilder, number: ir.Value, call: Callable[[], object],
                  before: Callable[[], None]) -> None:
    """Emit `number` rounds of `before()` (untimed) then `call()` (timed) and return the mean seconds per call."""
    now = monotonic_clock(b)
    total = b.alloca(F64)
    b.store(ir.Constant(F64, 0.0), total)
    with for_range(b, i64(0), number, name="call"):
        before()
        t0 = now()
        call()
        t1 = now()
        b.store(b.fadd(b.load(total), b.fsub(t1, t0)), total)
    b.ret(b.fdiv(b.load(total), b.sitofp(number, F64)))


def add_harness(module: ir.Module, main: ir.Function) -> ir.Function:
    fn = ir.Function(module, ir.FunctionType(F64, [VOIDP, I64, F32P, I64]), name="tf_bench")
    args, number, flush, flush_len = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))

    def evict() -> None:
        with for_range(b, i64(0), flush_len, name="f") as j:
            p = gep(b, flush, j)
            b.store(b.fadd(b.load(p), ir.Constant(F32, 1.0)), p)

    ret_mean_time(b, number, lambda: b.call(main, [args]), evict)
    return fn
