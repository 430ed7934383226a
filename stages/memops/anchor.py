"""Generic (untuned) kernels for matmul-like anchors a template cannot serve in this graph.

A template may pack its weight operand at build time, so it cannot take a weight computed at
run time (a MatMul or Gemm of two activations), and an op may have no template. Those anchors
get this kernel instead: the row loop `out[m, :] += x[m, k] * w[k, :]` (unit stride,
vectorised by LLVM) followed by the task's fused epilogue, so the layer stays correct.
"""

from __future__ import annotations

import math

from llvmlite import ir

from stages.codegen.irb import add, for_range, gep, i64, mul
from stages.graph.epilogue import operands
from stages.memops.loops import f32, loop_nest
from stages.memops.opctx import OpCtx
from stages.templates.epilogue import emit

GENERIC_OPS = frozenset({"matmul", "dense", "batch_matmul"})


def generic_anchor(ctx: OpCtx) -> None:
    task = ctx.node.task
    if task.op not in GENERIC_OPS:
        raise ctx.unsupported(f"no generic kernel for {task.description}")
    xs, ws = task.inputs[0].shape, task.inputs[1].shape
    m, k = xs[-2], xs[-1]
    if task.op == "dense":
        n, batch, w_batch = ws[0], 1, 1
        w_row, w_col = 1, k  # w[n, k]: element (kk, j) at kk + j*k
    else:
        n, batch = ws[-1], math.prod(xs[:-2])
        w_batch = math.prod(ws[:-2])
        if w_batch not in (1, batch):
            raise ctx.unsupported(f"batch dims {list(xs[:-2])} and {list(ws[:-2])} do not match")
        w_row, w_col = n, 1
    b, x, w, y = ctx.b, ctx.inp(0), ctx.inp(1), ctx.out()
    slots = operands(task.epilogue)
    tensors = [ctx.inp(2 + i) for i in range(len(slots))]
    with loop_nest(b, (batch, m), "bm") as (bi, mi):
        row = mul(b, add(b, mul(b, bi, i64(m)), mi), i64(n))
        xrow = mul(b, add(b, mul(b, bi, i64(m)), mi), i64(k))
        wbase = mul(b, bi, i64(k * n)) if w_batch > 1 else i64(0)
        with for_range(b, i64(0), i64(n), name="z") as j:
            b.store(f32(0), gep(b, y, add(b, row, j)), align=4)
        with for_range(b, i64(0), i64(k), name="k") as kk:
            a = b.load(gep(b, x, add(b, xrow, kk)), align=4)
            wk = add(b, wbase, mul(b, kk, i64(w_row)))
            with for_range(b, i64(0), i64(n), name="n") as j:
                p = gep(b, y, add(b, row, j))
                wv = b.load(gep(b, w, add(b, wk, mul(b, j, i64(w_col)))), align=4)
                b.store(b.fadd(b.load(p, align=4), b.fmul(a, wv)), p, align=4)
        if task.epilogue:
            with for_range(b, i64(0), i64(n), name="e") as j:
                p = gep(b, y, add(b, row, j))

                def load(slot: int, j: ir.Value = j, row: ir.Value = row) -> ir.Value:
                    at = j if slots[slot].per_channel else add(b, row, j)
                    return b.load(gep(b, tensors[slot], at), align=4)
                b.store(emit(b, task.epilogue, b.load(p, align=4), load), p, align=4)
