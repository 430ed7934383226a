"""LLVM IR of the depthwise int8 conv (`qconv2d` with one input channel a group, `axis="dw"`).

The direct kernel's 4-byte channel groups hold one real channel here, so 3/4 of every `vpdpbusd`
is spent on zeros, and its pack writes 4 bytes per input byte. This path skips the pack: lanes hold
output columns of one channel; each window tap is one masked byte load straight from the NCHW input
(`lanes x sw` bytes, out-of-image columns and rows read as the zero point, then one shuffle picks the
stride phase), widened to int32 and multiplied by the tap's weight (broadcast). Input rows are loaded
once per register tile of `rh` rows x `nv` vectors and shared by the taps that reach them. The
requantize epilogue runs in registers, one masked byte store per vector into NCHW.
Items: image x output channel x row tile; kernel arguments `[X, W (int32 [oc][kh*kw]), B folded, S,
workspace (unused), Y]`.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from stages.codegen.irb import (
    F32,
    I1,
    I32,
    I64,
    VOIDP,
    add,
    for_range,
    gep,
    i64,
    intrinsic,
    mul,
    opaque_on_x86,
    prefix_mask,
    smin,
    store_ints,
)
from stages.codegen.parallel import body_args, range_body
from stages.templates import qgemm_requant as rq_
from stages.templates.qconv2d_plan import QConvPlan
from stages.templates.qgemm_codegen import row_mask
from stages.templates.qgemm_isa import I8, dot4, ivec, splat_i32
from stages.templates.qgemm_pack import aligned

I8P = I8.as_pointer()


def pack_weights_dw(w: np.ndarray) -> np.ndarray:
    """OIHW int8 (I == 1) → int32 [oc][kh * kw], one scalar per tap for the broadcast."""
    out = aligned((w.shape[0], w.shape[2] * w.shape[3]), "int32")
    out[...] = w.reshape(w.shape[0], -1)
    return out


def _splat(b: ir.IRBuilder, x: ir.Value, ty: ir.VectorType) -> ir.Value:
    v = b.insert_element(ir.Constant(ty, ir.Undefined), x, ir.Constant(I32, 0))
    return b.shuffle_vector(v, ir.Constant(ty, ir.Undefined), ir.Constant(ivec(ty.count), None))


def emit_dw(mod: ir.Module, p: QConvPlan, rq: rq_.Requant, zx_raw: int, signed: bool) -> ir.Function:
    """The range body over items (image, output channel, row tile), each looping over its column tiles."""
    g, s = p.g, p.s
    lanes, nr, taps = s.lanes, p.nr, g.kh * g.kw
    width = lanes * g.sw
    bty = ir.VectorType(I8, width)
    vty, fty = ivec(lanes), ir.VectorType(F32, lanes)
    load = intrinsic(mod, f"llvm.masked.load.v{width}i8.p0", bty,
                     [bty.as_pointer(), I32, ir.VectorType(I1, width), bty])
    zpad = ir.Constant(bty, [zx_raw & 0xFF] * width)
    wide_lane = ir.Constant(ir.VectorType(I64, width), list(range(width)))
    fn, b = range_body(mod, "tf_qconv_dw_range")
    x, w, bias, scale, _, y = (b.bitcast(v, VOIDP) for v in body_args(b, fn, 6))
    with for_range(b, fn.args[1], fn.args[2], name="item", unroll=False) as item:
        no, rt = b.sdiv(item, i64(p.rt)), b.srem(item, i64(p.rt))
        n, oc = b.sdiv(no, i64(g.oc)), b.srem(no, i64(g.oc))
        grp = b.sdiv(oc, i64(g.ocg))
        xplane = gep(b, b.bitcast(x, I8P), mul(b, add(b, mul(b, n, i64(g.c)), grp), i64(g.h * g.w)))
        yplane = gep(b, b.bitcast(y, I8P), mul(b, add(b, mul(b, n, i64(g.oc)), oc), i64(g.oh * g.ow)))
        wrow = gep(b, b.bitcast(w, I32.as_pointer()), mul(b, oc, i64(taps)))
        grouped = _groups_fit(p)
        wv = [] if grouped else [splat_i32(b, b.load(gep(b, wrow, i64(t)), align=4), lanes) for t in range(taps)]
        w4 = [_row_weights(b, wrow, kh, g.kw, lanes) for kh in range(g.kh)] if grouped else []
        bv = splat_i32(b, b.load(gep(b, b.bitcast(bias, I32.as_pointer()), oc), align=4), lanes)
        sv = _splat(b, b.load(gep(b, b.bitcast(scale, F32.as_pointer()), oc), align=4), fty)
        oh0 = mul(b, rt, i64(s.rh))
        ohs = [smin(b, add(b, oh0, i64(r)), i64(g.oh - 1)) for r in range(s.rh)]
        with for_range(b, i64(0), i64(p.ct), name="ct", unroll=False) as ct:
            ow0 = mul(b, ct, i64(nr))
            accs = {(r, j): ir.Constant(vty, [0] * lanes) for r in range(s.rh) for j in range(s.nv)}
            rows: dict[int, tuple[ir.Value, ir.Value]] = {}
            loads: dict[tuple[int, int, int], ir.Value] = {}
            groups: dict[tuple[int, int], ir.Value] = {}
            for r in range(s.rh):
                for kh in range(g.kh):
                    ro = r * g.sh + kh * g.dh  # input row offset from the tile's first window row
                    if ro not in rows:
                        ih = add(b, b.sub(mul(b, oh0, i64(g.sh)), i64(g.pt)), i64(ro))
                        ok = b.icmp_unsigned("<", ih, i64(g.h))
                        rows[ro] = (ok, gep(b, xplane, mul(b, b.select(ok, ih, i64(0)), i64(g.w))))
                    ok, src = rows[ro]
                    if grouped:
                        for j in range(s.nv):
                            if (ro, j) not in groups:
                                groups[ro, j] = _row_groups(b, ok, src, ow0, j * lanes, p, signed, zx_raw)
                            accs[r, j] = dot4(b, s.isa, [accs[r, j]], groups[ro, j], w4[kh])[0]
                        continue
                    for kw in range(g.kw):
                        for j in range(s.nv):
                            key = (ro, kw, j)
                            if key not in loads:
                                loads[key] = _tap(b, load, zpad, wide_lane, ok, src, ow0, j * lanes, kw, p, signed)
                            k = (r, j)
                            accs[k] = b.add(accs[k], b.mul(loads[key], wv[kh * g.kw + kw]))
            cols = b.trunc(smin(b, i64(nr), b.sub(i64(g.ow), ow0)), I32)
            for r in range(s.rh):
                ok = b.icmp_signed("<", add(b, oh0, i64(r)), i64(g.oh)) if (g.oh % s.rh and r) else None
                row = gep(b, yplane, add(b, mul(b, ohs[r], i64(g.ow)), ow0))
                for j in range(s.nv):
                    cm = prefix_mask(b, cols, lanes, j * lanes) if g.ow % nr else None
                    out = rq_.emit(b, rq, b.add(accs[r, j], bv), sv, s.isa != "generic")
                    store_ints(b, out, gep(b, row, i64(j * lanes)), row_mask(b, ok, cm, lanes))
    b.ret_void()
    return fn


GROUP_BYTES = 64  # one row load: the bytes 16 lanes of 4-tap groups draw from


def _groups_fit(p: QConvPlan) -> bool:
    """Whether a kernel row's taps fit one `vpdpbusd` group and the 16 lanes' windows one 64-byte row load;
    AVX-512 only (the row load is a byte-masked load), and 3-tap rows only: LLVM 22's x86 back end never
    finished compiling the byte shuffle of some 1- and 2-tap rows (a 1x1 depthwise conv, the differential
    fuzzer's case 11:19, hung `tunaflow build`), so only the widths measured and swept are taken."""
    g, s = p.g, p.s
    return s.isa == "vnni512" and s.lanes == 16 and g.kw == 3 \
        and (s.lanes - 1) * g.sw + (g.kw - 1) * g.dw + 1 <= GROUP_BYTES


def _row_weights(b: ir.IRBuilder, wrow: ir.Value, kh: int, kw: int, lanes: int) -> ir.Value:
    """Kernel row kh's taps as the signed bytes of one int32 (the 4th byte, and any past kw, zero), splat."""
    word = ir.Constant(I32, 0)
    for t in range(kw):
        tap = b.and_(b.load(gep(b, wrow, i64(kh * kw + t)), align=4), ir.Constant(I32, 0xFF))
        word = b.or_(word, b.shl(tap, ir.Constant(I32, 8 * t)))
    return splat_i32(b, word, lanes)


def _row_groups(b: ir.IRBuilder, row_ok: ir.Value, src: ir.Value, ow0: ir.Value, j0: int, p: QConvPlan,
                signed: bool, zx_raw: int) -> ir.Value:
    """`<16 x i32>` whose lane L holds the input bytes of output column ow0 + j0 + L's window taps in one input
    row (byte t = tap t, as `_row_weights` orders them): one byte-masked 64-byte load (columns outside the
    image, and a row outside it, read as the zero point) and one constant byte shuffle, where the tap-by-tap
    path loads, widens and multiplies each of kw taps."""
    g, lanes = p.g, p.s.lanes
    bty = ir.VectorType(I8, GROUP_BYTES)
    col0 = b.sub(mul(b, add(b, ow0, i64(j0)), i64(g.sw)), i64(g.pl))
    lo = smin(b, b.select(b.icmp_signed("<", col0, i64(0)), b.neg(col0), i64(0)), i64(GROUP_BYTES))
    hi = smin(b, b.select(b.icmp_signed("<", col0, i64(g.w)), b.sub(i64(g.w), col0), i64(0)), i64(GROUP_BYTES))
    below_hi = b.select(b.icmp_signed(">=", hi, i64(GROUP_BYTES)), i64(-1), b.sub(b.shl(i64(1), hi), i64(1)))
    from_lo = b.select(b.icmp_signed(">=", lo, i64(GROUP_BYTES)), i64(0), b.shl(i64(-1), lo))
    bits = b.select(row_ok, b.and_(below_hi, from_lo), i64(0))
    mask = b.bitcast(bits, ir.VectorType(I1, GROUP_BYTES))
    load = intrinsic(b.module, f"llvm.masked.load.v{GROUP_BYTES}i8.p0", bty,
                     [bty.as_pointer(), I32, mask.type, bty])
    v = b.call(load, [b.bitcast(b.gep(src, [col0]), bty.as_pointer()), ir.Constant(I32, 1), mask,
                      ir.Constant(bty, [zx_raw & 0xFF] * GROUP_BYTES)])
    idx = [L * g.sw + t * g.dw if t < g.kw else L * g.sw for L in range(lanes) for t in range(4)]
    picked = b.shuffle_vector(v, ir.Constant(bty, ir.Undefined), ir.Constant(ir.VectorType(I32, 4 * lanes), idx))
    if signed:  # flipped behind an asm barrier: LLVM 22 folding the flip into the shuffle never finished
        # compiling for Intel CPUs (Emerald Rapids, Skylake-AVX512: stride-1 rows of int8 inputs; Zen 5 did)
        picked = b.xor(opaque_on_x86(b, picked), ir.Constant(bty, [0x80] * GROUP_BYTES))
    return b.bitcast(picked, ivec(lanes))


def _tap(b: ir.IRBuilder, load: ir.Function, zpad: ir.Constant, wide_lane: ir.Constant, row_ok: ir.Value,
         src: ir.Value, ow0: ir.Value, j0: int, kw: int, p: QConvPlan, signed: bool) -> ir.Value:
    """`<lanes x i32>` inputs one tap reads for output columns `ow0 + j0 + [0, lanes)` of a row."""
    g, lanes = p.g, p.s.lanes
    width = lanes * g.sw
    col0 = add(b, b.sub(mul(b, add(b, ow0, i64(j0)), i64(g.sw)), i64(g.pl)), i64(kw * g.dw))
    colv = b.add(_splat(b, col0, ir.VectorType(I64, width)), wide_lane)
    mask = b.icmp_unsigned("<", colv, ir.Constant(ir.VectorType(I64, width), [g.w] * width))
    mask = b.and_(mask, b.select(row_ok, ir.Constant(mask.type, [1] * width), ir.Constant(mask.type, [0] * width)))
    ptr = b.bitcast(b.gep(src, [col0]), zpad.type.as_pointer())
    v = b.call(load, [ptr, ir.Constant(I32, 1), mask, zpad])
    if g.sw > 1:
        v = b.shuffle_vector(v, ir.Constant(v.type, ir.Undefined), ir.Constant(ivec(lanes), [c * g.sw
                                                                                           for c in range(lanes)]))
    if signed:
        v = b.xor(v, ir.Constant(v.type, [0x80] * lanes))
    return b.zext(v, ivec(lanes))
