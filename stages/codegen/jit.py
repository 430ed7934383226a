"""Load a compiled object into this process and call its entry points through ctypes."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import llvmlite.binding as llvm
import numpy as np

from schemas.target import Target
from stages.codegen import runtime
from stages.codegen.machine import target_machine
from stages.codegen.parallel import PARALLEL_FOR

KERNEL_DTYPES = (np.float32, np.int32, np.uint8, np.int8)  # float kernels, and the int8 anchors' operands
MAIN = "tf_main"
BENCH = "tf_bench"


class LoadedKernel:
    """Owns its engine: the machine code lives as long as this object."""

    def __init__(self, obj: bytes, target: Target):
        if PARALLEL_FOR.encode() in obj or runtime.AMX_REQUEST.encode() in obj:  # only these need the runtime
            runtime.load()
        tm = target_machine(target, jit=True)
        self._engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), tm)
        self._engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
        self._engine.finalize_object()
        self._main = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(self._address(MAIN))
        self._bench = ctypes.CFUNCTYPE(ctypes.c_double, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                                       ctypes.c_int64)(self._address(BENCH))

    def _address(self, name: str) -> int:
        addr = self._engine.get_function_address(name)
        if not addr:
            raise ValueError(f"compiled object has no symbol {name!r}")
        return addr

    @property
    def main_address(self) -> int:
        """Where `tf_main` is, for a timing loop compiled elsewhere (stages/measure/evict.py)."""
        return self._address(MAIN)

    def __call__(self, args: Sequence[np.ndarray]) -> None:
        self._main(ctypes.cast(_pointer_array(args), ctypes.c_void_p))

    def time(self, args: Sequence[np.ndarray], number: int, flush: np.ndarray | None = None) -> float:
        """Mean seconds per call over `number` calls, timed in native code (CLOCK_MONOTONIC)."""
        fptr, flen = (flush.ctypes.data, flush.size) if flush is not None else (None, 0)
        return self._bench(ctypes.cast(_pointer_array(args), ctypes.c_void_p), number, fptr, flen)


def _pointer_array(args: Sequence[np.ndarray]) -> ctypes.Array:
    for a in args:
        if not (a.flags.c_contiguous and a.dtype in KERNEL_DTYPES):
            raise ValueError("kernel arguments must be C-contiguous float32, int32, uint8 or int8 arrays")
    return (ctypes.c_void_p * len(args))(*[a.ctypes.data for a in args])
