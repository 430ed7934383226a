"""A native timing loop that flushes given buffers from every cache level before each call of a kernel.

The model's cache state before an anchor runs: its activations were just written by the layer before
(hot), its weights were last read one inference ago and the other layers have evicted them since. Flushing
just the kernel's own weight lines (x86 `clflushopt` over each line, then `mfence`) reproduces that at a cost
proportional to the weights (on Zen 4 about 2 ns per 64-byte line: 30 us for 1 MiB), where writing a 64 MB
buffer costs milliseconds and also evicts the activations the model has hot. The loop is native because a
Python loop around single timed calls costs about 20 us per call (ctypes and numpy's `.ctypes`), which
would make tuning small kernels several times slower.
"""

from __future__ import annotations

import ctypes
import platform
from collections.abc import Sequence

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir

from stages.codegen.harness import ret_mean_time
from stages.codegen.irb import F64, I64, VOIDP, for_range, i64

LINE = 64
NAME = "tf_bench_evicting"
MAIN = ir.FunctionType(ir.VoidType(), [VOIDP])


def supported() -> bool:
    """Only x86-64 has a user-mode flush of one line here; elsewhere the caller flushes everything."""
    return platform.machine() in ("x86_64", "AMD64")


def _module(flush_name: str) -> ir.Module:
    """`double tf_bench_evicting(void (*main)(i8*), i8* args, i64 number, i8** ptrs, i64* bytes, i64 n)`: the mean
    seconds of `number` calls of `main(args)`, each after every line of the n ranges is flushed (not timed)."""
    mod = ir.Module(name="evict")
    mod.triple = llvm.get_process_triple()
    sig = ir.FunctionType(F64, [MAIN.as_pointer(), VOIDP, I64, VOIDP.as_pointer(), I64.as_pointer(), I64])
    fn = ir.Function(mod, sig, name=NAME)
    flush = ir.Function(mod, ir.FunctionType(ir.VoidType(), [VOIDP]), name=flush_name)
    fence = ir.Function(mod, ir.FunctionType(ir.VoidType(), []), name="llvm.x86.sse2.mfence")
    main, args, number, ptrs, sizes, n = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))

    def evict() -> None:
        with for_range(b, i64(0), n, name="r") as r:
            base = b.load(b.gep(ptrs, [r]))
            lines = b.udiv(b.add(b.load(b.gep(sizes, [r])), i64(LINE - 1)), i64(LINE))
            with for_range(b, i64(0), lines, name="l") as j:
                b.call(flush, [b.gep(base, [b.mul(j, i64(LINE))])])
        b.call(fence, [])

    ret_mean_time(b, number, lambda: b.call(main, [args]), evict)
    return mod


class Evictor:
    """Compiled once per process (about 80 ms); `time` runs one kernel with the buffers it was `aim`ed at flushed
    before each call."""

    def __init__(self) -> None:
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        target = llvm.Target.from_default_triple()
        opt = llvm.get_host_cpu_features().get("clflushopt", False)  # older x86 has only the serialising clflush
        tm = target.create_target_machine(cpu=llvm.get_host_cpu_name(), features="+clflushopt" if opt else "",
                                          opt=2, jit=True)
        name = "llvm.x86.clflushopt" if opt else "llvm.x86.sse2.clflush"
        self._engine = llvm.create_mcjit_compiler(llvm.parse_assembly(str(_module(name))), tm)
        self._engine.finalize_object()
        self._fn = ctypes.CFUNCTYPE(ctypes.c_double, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                    ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(
            self._engine.get_function_address(NAME))
        self._aimed: tuple = ()

    def aim(self, main: int, args: Sequence[np.ndarray], flushed: Sequence[np.ndarray]) -> None:
        """Remember the kernel (`main`: the address of its `tf_main`), its arguments and the buffers to flush;
        the arrays must stay alive while `time` is called."""
        pointers = (ctypes.c_void_p * len(args))(*[a.ctypes.data for a in args])
        ptrs = (ctypes.c_void_p * max(1, len(flushed)))(*[a.ctypes.data for a in flushed])
        sizes = (ctypes.c_int64 * max(1, len(flushed)))(*[a.nbytes for a in flushed])
        self._aimed = (main, pointers, ptrs, sizes, len(flushed))

    def time(self, number: int) -> float:
        """Mean seconds per call of the aimed kernel over `number` calls, each started with its buffers flushed."""
        main, pointers, ptrs, sizes, n = self._aimed
        return self._fn(main, ctypes.cast(pointers, ctypes.c_void_p), number, ctypes.cast(ptrs, ctypes.c_void_p),
                        ctypes.cast(sizes, ctypes.c_void_p), n)
