"""Multi-core execution from generated code: `tf_main` hands its parallel loop to the native
runtime's persistent worker pool (`tf_parallel_for` in `runtime.c`), one contiguous chunk per
thread, so no Python runs in the hot path and no thread starts per call.
"""

from __future__ import annotations

from llvmlite import ir

from stages.codegen.irb import F32P, I64, VOIDP, i64, intrinsic

PARALLEL_FOR = "tf_parallel_for"


def emit_main(module: ir.Module, body: ir.Function, extent: int, threads: int,
              name: str = "tf_main") -> ir.Function:
    """`void tf_main(ptr args)` running `body(args, begin, end)` over [0, extent) on `threads` threads.

    `body` must be safe to run on disjoint ranges concurrently. Another `name` gives one parallel
    phase of a multi-phase `tf_main` (e.g. pack the input, then compute).
    """
    main = ir.Function(module, ir.FunctionType(ir.VoidType(), [VOIDP]), name=name)
    b = ir.IRBuilder(main.append_basic_block("entry"))
    args = main.args[0]
    threads = max(1, min(threads, extent))
    if threads == 1:
        b.call(body, [args, i64(0), i64(extent)])
    else:
        pfor = intrinsic(module, PARALLEL_FOR, ir.VoidType(), [body.type, VOIDP, I64, I64])
        b.call(pfor, [body, args, i64(extent), i64(threads)])
    b.ret_void()
    return main


def emit_phases(module: ir.Module, phases: list[ir.Function]) -> ir.Function:
    """`void tf_main(ptr args)` running the phases (each an `emit_main` under another name) in order."""
    main = ir.Function(module, ir.FunctionType(ir.VoidType(), [VOIDP]), name="tf_main")
    b = ir.IRBuilder(main.append_basic_block("entry"))
    for phase in phases:
        phase.linkage = "internal"
        b.call(phase, [main.args[0]])
    b.ret_void()
    return main


def range_body(module: ir.Module, name: str) -> tuple[ir.Function, ir.IRBuilder]:
    """An internal `void name(ptr args, i64 begin, i64 end)`, the body `emit_main` splits, and its builder."""
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [VOIDP, I64, I64]), name=name)
    fn.linkage = "internal"
    return fn, ir.IRBuilder(fn.append_basic_block("entry"))


def body_args(b: ir.IRBuilder, fn: ir.Function, count: int) -> list[ir.Value]:
    """The first `count` float pointers of a body's `args` array."""
    argv = b.bitcast(fn.args[0], F32P.as_pointer())
    return [b.load(b.gep(argv, [i64(i)])) for i in range(count)]
