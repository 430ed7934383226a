"""Multi-core execution from generated code: `tf_main` hands its parallel loop to the native
runtime's persistent worker pool (`tf_parallel_for` in `runtime.c`), one contiguous chunk per
thread, so no Python runs in the hot path and no thread starts per call.
"""

from __future__ import annotations

from llvmlite import ir

from stages.codegen.irb import I64, VOIDP, i64, intrinsic

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
