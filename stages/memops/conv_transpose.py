"""ConvTranspose as a generated op: correct and untuned (no template serves it yet).

Gather form: each output pixel sums, over its group's input channels and the window, the input
pixels whose scattered window lands on it (`oy + pad - ky*dilation` a non-negative multiple of the
stride, inside the input), so output planes are independent and split over the worker pool.
Weights are read as they are (IOHW), so they may also be computed at run time.
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir

from stages.codegen.irb import add, for_range, gep, i64, mul
from stages.memops.loops import contiguous_strides, f32, offset
from stages.memops.opctx import OpCtx


def conv_transpose(ctx: OpCtx) -> None:
    n, c, h, w = ctx.in_shape(0)
    _, mg, kh, kw = ctx.in_shape(1)
    _, m, oh, ow = ctx.out_shape()
    g = int(ctx.attr("group", 1))
    cg = c // g
    (sh, sw), (dh, dw) = ctx.attr("strides"), ctx.attr("dilations")
    pt, pl = ctx.attr("pads")[:2]
    x_strides, w_strides = contiguous_strides((n, c, h, w)), contiguous_strides((c, mg, kh, kw))
    with ctx.parallel(n * m) as plane:
        b, x, wt, y = ctx.b, ctx.inp(0), ctx.inp(1), ctx.out()
        bias = ctx.inp(2) if ctx.has_input(2) else None
        acc = ctx.local()
        image, mo = b.udiv(plane, i64(m)), b.urem(plane, i64(m))
        group, ml = b.udiv(mo, i64(mg)), b.urem(mo, i64(mg))

        def source(o: ir.Value, pad: int, k: ir.Value, dil: int, stride: int, size: int) -> tuple[ir.Value, ir.Value]:
            """(input index, whether tap k of output o reads one)."""
            t = b.sub(add(b, o, i64(pad)), mul(b, k, i64(dil)))
            ok = b.and_(b.icmp_signed(">=", t, i64(0)), b.icmp_signed("<", t, i64(stride * size)))
            if stride > 1:
                ok = b.and_(ok, b.icmp_unsigned("==", b.urem(t, i64(stride)), i64(0)))
            return b.udiv(t, i64(stride)), ok

        with for_range(b, i64(0), i64(oh), name="oy") as oy, for_range(b, i64(0), i64(ow), name="ox") as ox:
            b.store(b.load(gep(b, bias, mo)) if bias is not None else f32(0.0), acc)
            with for_range(b, i64(0), i64(kh), name="ky") as ky:
                iy, ok_y = source(oy, pt, ky, dh, sh, h)
                with b.if_then(ok_y), for_range(b, i64(0), i64(kw), name="kx") as kx:
                    ix, ok_x = source(ox, pl, kx, dw, sw, w)
                    with b.if_then(ok_x), for_range(b, i64(0), i64(cg), name="ci") as ci:
                        channel = add(b, mul(b, group, i64(cg)), ci)
                        xi = offset(b, (image, channel, iy, ix), x_strides)
                        wi = offset(b, (channel, ml, ky, kx), w_strides)
                        term = b.fmul(b.load(gep(b, x, xi)), b.load(gep(b, wt, wi)))
                        b.store(b.fadd(b.load(acc), term), acc)
            b.store(b.load(acc), gep(b, y, offset(b, (plane, oy, ox), (oh * ow, ow, 1))))


OPS: dict[str, Callable[[OpCtx], None]] = {"ConvTranspose": conv_transpose}
