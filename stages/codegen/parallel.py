"""Multi-core execution from generated code: `tf_main` splits the parallel loop into one
contiguous chunk per thread, starts threads with pthread_create and runs the first chunk
itself, so no Python runs in the hot path.
"""

from __future__ import annotations

from llvmlite import ir

from stages.codegen.irb import I32, I64, VOIDP, for_range, i64, intrinsic

_CTX = ir.LiteralStructType([VOIDP, I64, I64])  # args, begin, end


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
        b.ret_void()
        return main
    tramp = _trampoline(module, body)
    create = intrinsic(module, "pthread_create", I32, [I64.as_pointer(), VOIDP, tramp.type, VOIDP])
    join = intrinsic(module, "pthread_join", I32, [I64, VOIDP.as_pointer()])
    ctxs = b.alloca(_CTX, size=i64(threads))
    tids = b.alloca(I64, size=i64(threads))
    bounds = [extent * t // threads for t in range(threads + 1)]
    for t in range(1, threads):
        ctx = b.gep(ctxs, [i64(t)])
        b.store(args, b.gep(ctx, [ir.Constant(I32, 0), ir.Constant(I32, 0)]))
        b.store(i64(bounds[t]), b.gep(ctx, [ir.Constant(I32, 0), ir.Constant(I32, 1)]))
        b.store(i64(bounds[t + 1]), b.gep(ctx, [ir.Constant(I32, 0), ir.Constant(I32, 2)]))
        b.call(create, [b.gep(tids, [i64(t)]), ir.Constant(VOIDP, None), tramp, b.bitcast(ctx, VOIDP)])
    b.call(body, [args, i64(bounds[0]), i64(bounds[1])])
    with for_range(b, i64(1), i64(threads), name="join") as t:
        b.call(join, [b.load(b.gep(tids, [t])), ir.Constant(VOIDP.as_pointer(), None)])
    b.ret_void()
    return main


def _trampoline(module: ir.Module, body: ir.Function) -> ir.Function:
    fn = ir.Function(module, ir.FunctionType(VOIDP, [VOIDP]), name=f"{body.name}.thread")
    fn.linkage = "internal"
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    ctx = b.bitcast(fn.args[0], _CTX.as_pointer())
    fields = [b.load(b.gep(ctx, [ir.Constant(I32, 0), ir.Constant(I32, i)])) for i in range(3)]
    b.call(body, fields)
    b.ret(ir.Constant(VOIDP, None))
    return fn
