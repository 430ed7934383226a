"""LLVM target machines for a `Target`, created once per process and target."""

from __future__ import annotations

import functools

import llvmlite.binding as llvm

from schemas.target import Target


@functools.cache
def _init() -> None:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()


def target_machine(target: Target, jit: bool = False) -> llvm.TargetMachine:
    """A fresh machine: MCJIT takes ownership of the one it is given, so never share it."""
    _init()
    try:
        llvm_target = llvm.Target.from_triple(target.triple)
    except RuntimeError as exc:
        raise ValueError(f"LLVM cannot target triple {target.triple!r}: {exc}") from exc
    return llvm_target.create_target_machine(
        cpu=target.cpu, features=target.features, opt=3, reloc="pic", codemodel="default", jit=jit
    )


@functools.cache
def cached_machine(target: Target) -> llvm.TargetMachine:
    """A per-process machine for emitting objects (never handed to an engine)."""
    return target_machine(target)
