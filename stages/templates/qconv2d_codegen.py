"""LLVM IR of the int8 direct convolution: a parallel input pack, then register-tiled micro-kernels.

Pack phase (items: image x group x channel block): 16 columns at a time, 4 masked byte loads (one
per channel; out-of-image columns, rows and channels read as the zero point), one shuffle that
picks the stride phase's columns and interleaves the 4 channels, one 64-byte store.
Compute phase (items: image x group x channel tile x row tile, in the schedule's order): per
column tile, an `mr` channels x `rh` rows x `nv` column vectors tile of int32 accumulators over
every channel block and window tap (taps unrolled: each is a constant offset into the packed
block), each tap one weight broadcast per channel and one vector load per row and column vector;
then the requantize epilogue in registers and one masked byte store per vector, into NCHW.
Kernel arguments: `[X, W packed, B folded, S, workspace, Y]`.
"""

from __future__ import annotations

from llvmlite import ir

from stages.codegen.harness import add_harness
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
    loop_carry,
    mul,
    prefix_mask,
    smin,
    store_ints,
    transpose_square,
)
from stages.codegen.parallel import body_args, emit_main, emit_phases, range_body
from stages.templates import qconv2d_amx
from stages.templates import qgemm_amx as amx_
from stages.templates import qgemm_isa as isa_
from stages.templates import qgemm_requant as rq_
from stages.templates.qconv2d_dw import emit_dw
from stages.templates.qconv2d_plan import PACK_COLS, QConvPlan
from stages.templates.qgemm_codegen import row_mask
from stages.templates.qgemm_isa import I8, PARTS, ivec

I8P = I8.as_pointer()


def _bvec(n: int) -> ir.VectorType:
    return ir.VectorType(I8, n)


def _in_range(b: ir.IRBuilder, v: ir.Value, hi: int) -> ir.Value:
    """0 <= v < hi for a signed i64 (one unsigned compare)."""
    return b.icmp_unsigned("<", v, i64(hi))


def emit_pack(mod: ir.Module, p: QConvPlan, zx_raw: int, signed: bool) -> ir.Function:
    g, cols = p.g, PACK_COLS
    fn, b = range_body(mod, "tf_qpack_range")
    x, ws = (b.bitcast(v, I8P) for v in body_args(b, fn, 5)[0:5:4])
    width = cols * g.sw
    lane = ir.Constant(ir.VectorType(I64, width), list(range(width)))
    zpad = ir.Constant(_bvec(width), [zx_raw & 0xFF] * width)
    masked_load = intrinsic(mod, f"llvm.masked.load.v{width}i8.p0", _bvec(width),
                            [_bvec(width).as_pointer(), I32, ir.VectorType(I1, width), _bvec(width)])
    with for_range(b, fn.args[1], fn.args[2], name="pi", unroll=False) as item:
        ng, cb = b.sdiv(item, i64(p.cb)), b.srem(item, i64(p.cb))
        n, grp = b.sdiv(ng, i64(g.groups)), b.srem(ng, i64(g.groups))
        chans, cvalid = [], []
        for c in range(4):
            ch = add(b, mul(b, cb, i64(4)), i64(c))
            ok = b.icmp_signed("<", ch, i64(g.icg))
            cvalid.append(ok)
            glob = b.select(ok, add(b, mul(b, grp, i64(g.icg)), ch), i64(0))
            chans.append(gep(b, x, mul(b, add(b, mul(b, n, i64(g.c)), glob), i64(g.h * g.w))))
        dst0 = gep(b, ws, mul(b, item, i64(p.plane)))
        with for_range(b, i64(0), i64(p.hp), name="ih", unroll=False) as ih:
            src_row = b.sub(ih, i64(g.pt))
            row_ok = _in_range(b, src_row, g.h)
            rows = [gep(b, ch, mul(b, b.select(row_ok, src_row, i64(0)), i64(g.w))) for ch in chans]
            for ph in range(g.sw):
                dst_row = gep(b, dst0, mul(b, add(b, mul(b, ih, i64(g.sw)), i64(ph)), i64(p.wq * 4)))
                with for_range(b, i64(0), i64(p.wq // cols), name="wb", unroll=False) as wb:
                    col0 = b.sub(add(b, mul(b, wb, i64(width)), i64(ph)), i64(g.pl))
                    colv = b.add(_splat64(b, col0, width), lane)
                    cmask = b.icmp_unsigned("<", colv, ir.Constant(ir.VectorType(I64, width), [g.w] * width))
                    parts = []
                    for c in range(4):
                        ok = b.and_(row_ok, cvalid[c])
                        mask = b.and_(cmask, b.select(ok, ir.Constant(cmask.type, [1] * width),
                                                      ir.Constant(cmask.type, [0] * width)))
                        ptr = b.bitcast(b.gep(rows[c], [col0]), _bvec(width).as_pointer())
                        parts.append(b.call(masked_load, [ptr, ir.Constant(I32, 1), mask, zpad]))
                    lo = b.shuffle_vector(parts[0], parts[1], ir.Constant(ivec(2 * width), list(range(2 * width))))
                    hi = b.shuffle_vector(parts[2], parts[3], ir.Constant(ivec(2 * width), list(range(2 * width))))
                    pick = [c * width + col * g.sw for col in range(cols) for c in range(4)]
                    out = b.shuffle_vector(lo, hi, ir.Constant(ivec(4 * cols), pick))
                    if signed:
                        out = b.xor(out, ir.Constant(_bvec(4 * cols), [0x80] * (4 * cols)))
                    dst = b.bitcast(gep(b, dst_row, mul(b, wb, i64(4 * cols))), _bvec(4 * cols).as_pointer())
                    b.store(out, dst, align=1)
    b.ret_void()
    return fn


def _splat64(b: ir.IRBuilder, x: ir.Value, lanes: int) -> ir.Value:
    ty = ir.VectorType(I64, lanes)
    v = b.insert_element(ir.Constant(ty, ir.Undefined), x, ir.Constant(I32, 0))
    return b.shuffle_vector(v, ir.Constant(ty, ir.Undefined), ir.Constant(ivec(lanes), None))


def _micro_fn(mod: ir.Module, name: str) -> tuple[ir.Function, ir.IRBuilder]:
    """An internal micro-kernel `(w, bias, scale, ws, y: ptr noalias; n, grp, ot, rt, ct: i64)` and its builder."""
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [VOIDP] * 5 + [I64] * 5), name=name)
    fn.linkage = "internal"
    for arg in fn.args[:5]:
        arg.add_attribute("noalias")
    return fn, ir.IRBuilder(fn.append_basic_block("entry"))


class _Conv:
    def __init__(self, p: QConvPlan, rq: rq_.Requant):
        self.p, self.rq = p, rq

    def emit(self, mod: ir.Module) -> ir.Function:
        p, g, s = self.p, self.p.g, self.p.s
        fn, b = range_body(mod, "tf_qconv_range")
        x, w, bias, scale, ws, y = (b.bitcast(v, VOIDP) for v in body_args(b, fn, 6))
        micro = {"amx": self._micro_amx, "w": self._micro, "oc": self._micro_oc}[
            "amx" if s.isa == "amx" else s.axis](mod)
        if s.isa == "amx":
            amx_.enter(b)
        with for_range(b, fn.args[1], fn.args[2], name="item", unroll=False) as item:
            ng, rest = b.sdiv(item, i64(p.ot * p.rt)), b.srem(item, i64(p.ot * p.rt))
            if s.order == "ot_rt":
                ot, rt = b.sdiv(rest, i64(p.rt)), b.srem(rest, i64(p.rt))
            else:
                rt, ot = b.sdiv(rest, i64(p.ot)), b.srem(rest, i64(p.ot))
            n, grp = b.sdiv(ng, i64(g.groups)), b.srem(ng, i64(g.groups))
            with for_range(b, i64(0), i64(p.ct), name="ct", unroll=False) as ct:
                b.call(micro, [w, bias, scale, ws, y, n, grp, ot, rt, ct])
        if s.isa == "amx":
            amx_.leave(b)
        b.ret_void()
        return fn

    def _micro_amx(self, mod: ir.Module) -> ir.Function:
        """AMX tiles (`qconv2d_amx`): `mr` output channels x `nv` 16-column vectors of one output row."""
        p, g, s = self.p, self.p.g, self.p.s
        fn, b = _micro_fn(mod, "qconv_micro_amx")
        w, bias, scale, ws, y, n, grp, ot, rt, ct = fn.args
        tile = add(b, mul(b, grp, i64(p.ot)), ot)
        block = gep(b, b.bitcast(ws, I8P), mul(b, add(b, mul(b, n, i64(g.groups)), grp), i64(p.cb * p.plane)))
        oh0, ow0 = rt, mul(b, ct, i64(p.nr))  # rh = 1
        sums = amx_.scratch(b, s.mr, s.nv)
        col = add(b, mul(b, oh0, i64(g.sh * g.sw * p.wq)), ow0)
        qconv2d_amx.accumulate(b, p, qconv2d_amx.tile_weights(b, p, w, tile), block, col, sums)
        sptr = b.bitcast(sums, ivec(s.lanes).as_pointer())
        accs = [b.load(b.gep(sptr, [i64(i * s.nv + j)]), align=64) for i in range(s.mr) for j in range(s.nv)]
        self._store(b, accs, lambda i, r, j: i * s.nv + j, bias, scale, y, n, grp, tile, ot, oh0, ow0)
        b.ret_void()
        return fn

    def _micro(self, mod: ir.Module) -> ir.Function:
        p, g, s = self.p, self.p.g, self.p.s
        lanes, parts = s.lanes, PARTS[s.isa]
        taps = g.kh * g.kw
        fn, b = _micro_fn(mod, "qconv_micro")
        w, bias, scale, ws, y, n, grp, ot, rt, ct = fn.args
        vty = ivec(lanes)
        tile = add(b, mul(b, grp, i64(p.ot)), ot)  # channel tile among all groups'
        wtile = gep(b, b.bitcast(w, I32.as_pointer()), mul(b, tile, i64(p.cb * taps * s.mr)))
        block = gep(b, b.bitcast(ws, I8P), mul(b, add(b, mul(b, n, i64(g.groups)), grp), i64(p.cb * p.plane)))
        oh0, ow0 = mul(b, rt, i64(s.rh)), mul(b, ct, i64(p.nr))
        # column offset (in 4-byte groups) of row r's first vector, for each row of the tile (clamped to OH)
        row_base = [mul(b, mul(b, smin(b, add(b, oh0, i64(r)), i64(g.oh - 1)), i64(g.sh)), i64(g.sw * p.wq))
                    for r in range(s.rh)]
        accs = [v for _ in range(s.mr * s.rh * s.nv) for v in isa_.zero_acc(s.isa)]

        def at(i: int, r: int, j: int) -> int:
            return ((i * s.rh + r) * s.nv + j) * parts

        with loop_carry(b, i64(0), i64(p.cb), accs, name="cb", unroll=s.uk if s.uk > 1 else False) as cb:
            cbase = b.bitcast(gep(b, block, mul(b, cb, i64(p.plane))), I32.as_pointer())
            wcb = gep(b, wtile, mul(b, cb, i64(taps * s.mr)))
            for kh in range(g.kh):
                for kw in range(g.kw):
                    off = (kh * g.dh * g.sw + (kw * g.dw) % g.sw) * p.wq + (kw * g.dw) // g.sw
                    acts = {}
                    for r in range(s.rh):
                        for j in range(s.nv):
                            ptr = gep(b, cbase, add(b, add(b, row_base[r], ow0), i64(off + j * lanes)))
                            acts[r, j] = b.load(b.bitcast(ptr, vty.as_pointer()), align=4)
                    for i in range(s.mr):
                        wv = isa_.splat_i32(b, b.load(gep(b, wcb, i64((kh * g.kw + kw) * s.mr + i)), align=4), lanes)
                        for r in range(s.rh):
                            for j in range(s.nv):
                                k = at(i, r, j)
                                accs[k:k + parts] = isa_.dot4(b, s.isa, accs[k:k + parts], acts[r, j], wv)
        self._store(b, accs, at, bias, scale, y, n, grp, tile, ot, oh0, ow0)
        b.ret_void()
        return fn

    def _micro_oc(self, mod: ir.Module) -> ir.Function:
        """Lanes on output channels: an `mr` pixels x `nv` channel vectors tile (pixels of the flattened
        output, each its own address, broadcast), for narrow layers whose rows would leave lanes idle;
        its bytes are stored lane by lane (one channel plane each), a small cost beside the long sums."""
        p, g, s = self.p, self.p.g, self.p.s
        lanes, parts, taps, pixels = s.lanes, PARTS[s.isa], g.kh * g.kw, g.oh * g.ow
        fn, b = _micro_fn(mod, "qconv_micro_oc")
        w, bias, scale, ws, y, n, grp, ot, rt, _ = fn.args
        vty = ivec(lanes)
        tile = add(b, mul(b, grp, i64(p.ot)), ot)
        wpanel = gep(b, b.bitcast(w, vty.as_pointer()), mul(b, tile, i64(p.cb * taps * s.nv)))
        block = gep(b, b.bitcast(ws, I8P), mul(b, add(b, mul(b, n, i64(g.groups)), grp), i64(p.cb * p.plane)))
        pix0 = mul(b, rt, i64(s.mr))
        bases = []
        for i in range(s.mr):
            pix = smin(b, add(b, pix0, i64(i)), i64(pixels - 1))
            oh, ow = b.sdiv(pix, i64(g.ow)), b.srem(pix, i64(g.ow))
            bases.append(add(b, mul(b, oh, i64(g.sh * g.sw * p.wq)), ow))
        accs = [v for _ in range(s.mr * s.nv) for v in isa_.zero_acc(s.isa)]
        with loop_carry(b, i64(0), i64(p.cb), accs, name="cb", unroll=s.uk if s.uk > 1 else False) as cb:
            cbase = b.bitcast(gep(b, block, mul(b, cb, i64(p.plane))), I32.as_pointer())
            wcb = gep(b, wpanel, mul(b, cb, i64(taps * s.nv)))
            for kh in range(g.kh):
                for kw in range(g.kw):
                    off = (kh * g.dh * g.sw + (kw * g.dw) % g.sw) * p.wq + (kw * g.dw) // g.sw
                    wv = [b.load(gep(b, wcb, i64((kh * g.kw + kw) * s.nv + j)), align=4) for j in range(s.nv)]
                    for i in range(s.mr):
                        a = b.load(gep(b, cbase, add(b, bases[i], i64(off))), align=4)
                        av = isa_.splat_i32(b, a, lanes)
                        for j in range(s.nv):
                            k = (i * s.nv + j) * parts
                            accs[k:k + parts] = isa_.dot4(b, s.isa, accs[k:k + parts], av, wv[j])
        self._store_oc(b, accs, bias, scale, y, n, grp, tile, ot, pix0)
        b.ret_void()
        return fn

    def _store_oc(self, b, accs, bias, scale, y, n, grp, tile, ot, pix0) -> None:
        p, g, s = self.p, self.p.g, self.p.s
        lanes, parts, pixels = s.lanes, PARTS[s.isa], g.oh * g.ow
        vty, fty = ivec(lanes), ir.VectorType(F32, lanes)
        bptr = gep(b, b.bitcast(bias, vty.as_pointer()), mul(b, tile, i64(s.nv)))
        sptr = gep(b, b.bitcast(scale, fty.as_pointer()), mul(b, tile, i64(s.nv)))
        oc0 = mul(b, ot, i64(p.nr))
        plane0 = gep(b, b.bitcast(y, I8P), mul(b, add(b, mul(b, n, i64(g.oc)), add(b, mul(b, grp, i64(g.ocg)), oc0)),
                                                i64(pixels)))
        bj = [b.load(gep(b, bptr, i64(j)), align=4) for j in range(s.nv)]
        sj = [b.load(gep(b, sptr, i64(j)), align=4) for j in range(s.nv)]

        def out(i: int, j: int) -> ir.Value:
            k = (i * s.nv + j) * parts
            total = b.add(isa_.finish(b, s.isa, accs[k:k + parts]), bj[j])
            return rq_.emit(b, self.rq, total, sj[j], s.isa != "generic")
        outs = [[out(i, j) for j in range(s.nv)] for i in range(s.mr)]
        if s.isa == "vnni512":
            self._store_oc_rows(b, outs, plane0, oc0, pix0)
            return
        for i in range(s.mr):
            pix = add(b, pix0, i64(i))
            with b.if_then(b.icmp_signed("<", pix, i64(pixels)) if pixels % s.mr else ir.Constant(I1, 1)):
                for j in range(s.nv):
                    for lane in range(lanes):
                        c = j * lanes + lane
                        dst = gep(b, plane0, add(b, mul(b, i64(c), i64(pixels)), pix))
                        byte = b.extract_element(outs[i][j], ir.Constant(I32, lane))
                        if g.ocg % p.nr:
                            with b.if_then(b.icmp_signed("<", add(b, oc0, i64(c)), i64(g.ocg))):
                                b.store(byte, dst)
                        else:
                            b.store(byte, dst)

    def _store_oc_rows(self, b, outs, plane0, oc0, pix0) -> None:
        """The tile's bytes transposed in registers (16 x 16 bytes by byte shuffles), then each channel's `mr`
        consecutive pixels one byte-masked store: 16 stores a channel vector instead of 16 x mr single bytes,
        which on ResNet-50's 14x14 and 7x7 1x1 convs (sums of 256-512 channels) were a third of the
        instructions."""
        p, g, s = self.p, self.p.g, self.p.s
        pixels, zero = g.oh * g.ow, ir.Constant(_bvec(16), None)
        count = b.trunc(smin(b, b.sub(i64(pixels), pix0), i64(s.mr)), I32) if pixels % s.mr else None
        mask = prefix_mask(b, count, 16) if count is not None else ir.Constant(ir.VectorType(I1, 16),
                                                                               [int(i < s.mr) for i in range(16)])
        for j in range(s.nv):
            cols = transpose_square(b, [outs[i][j] for i in range(s.mr)] + [zero] * (16 - s.mr))
            for lane, col in enumerate(cols):
                c = j * 16 + lane
                dst = gep(b, plane0, add(b, mul(b, i64(c), i64(pixels)), pix0))
                if g.ocg % p.nr:
                    with b.if_then(b.icmp_signed("<", add(b, oc0, i64(c)), i64(g.ocg))):
                        store_ints(b, col, dst, mask)
                else:
                    store_ints(b, col, dst, mask)

    def _store(self, b, accs, at, bias, scale, y, n, grp, tile, ot, oh0, ow0) -> None:
        p, g, s = self.p, self.p.g, self.p.s
        lanes, parts = s.lanes, PARTS[s.isa]
        bptr = b.bitcast(bias, I32.as_pointer())
        sptr = b.bitcast(scale, F32.as_pointer())
        ybase = gep(b, b.bitcast(y, I8P), mul(b, add(b, mul(b, n, i64(g.oc)), mul(b, grp, i64(g.ocg))),
                                              i64(g.oh * g.ow)))
        cols = b.trunc(smin(b, i64(p.nr), b.sub(i64(g.ow), ow0)), I32)
        oc0 = mul(b, ot, i64(s.mr))
        cmasks = [prefix_mask(b, cols, lanes, j * lanes) if g.ow % p.nr else None for j in range(s.nv)]
        for i in range(s.mr):
            ci = add(b, mul(b, tile, i64(s.mr)), i64(i))
            bi = isa_.splat_i32(b, b.load(gep(b, bptr, ci), align=4), lanes)
            si = b.load(gep(b, sptr, ci), align=4)
            sv = b.shuffle_vector(b.insert_element(ir.Constant(ir.VectorType(F32, lanes), ir.Undefined), si,
                                                   ir.Constant(I32, 0)),
                                  ir.Constant(ir.VectorType(F32, lanes), ir.Undefined), ir.Constant(ivec(lanes), None))
            oc = add(b, oc0, i64(i))
            oc_ok = b.icmp_signed("<", oc, i64(g.ocg)) if g.ocg % s.mr else None
            for r in range(s.rh):
                oh = add(b, oh0, i64(r))
                oh_ok = b.icmp_signed("<", oh, i64(g.oh)) if (g.oh % s.rh and r) else None
                ok = oh_ok if oc_ok is None else (oc_ok if oh_ok is None else b.and_(oc_ok, oh_ok))
                row = gep(b, ybase, add(b, mul(b, oc, i64(g.oh * g.ow)), add(b, mul(b, oh, i64(g.ow)), ow0)))
                for j in range(s.nv):
                    k = at(i, r, j)
                    v = b.add(isa_.finish(b, s.isa, accs[k:k + parts]), bi)
                    store_ints(b, rq_.emit(b, self.rq, v, sv, s.isa != "generic"), gep(b, row, i64(j * lanes)),
                                row_mask(b, ok, cmasks[j], lanes))


def build_module(name: str, p: QConvPlan, rq: rq_.Requant, zx_raw: int, signed: bool, triple: str,
                 threads: int) -> ir.Module:
    """`tf_main(args)`: the pack, then the compute phase, each over its items on `threads` threads (the
    depthwise path: its compute phase alone)."""
    mod = ir.Module(name=name)
    mod.triple = triple
    g = p.g
    if p.s.axis == "dw":
        add_harness(mod, emit_phases(mod, [emit_main(mod, emit_dw(mod, p, rq, zx_raw, signed), p.items, threads,
                                                     name="tf_qconv")]))
        return mod
    pack = emit_main(mod, emit_pack(mod, p, zx_raw, signed), g.n * g.groups * p.cb, threads, name="tf_qpack")
    conv = emit_main(mod, _Conv(p, rq).emit(mod), p.items, threads, name="tf_qconv")
    main = emit_phases(mod, [pack, conv])
    if p.s.isa == "amx":
        amx_.request_permission(main)
    add_harness(mod, main)
    return mod
