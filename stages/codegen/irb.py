"""Small IR-building helpers: types, constant folding of i64 arithmetic, counted loops."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

from llvmlite import ir

I1 = ir.IntType(1)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
F32 = ir.FloatType()
F64 = ir.DoubleType()
F32P = F32.as_pointer()
VOIDP = ir.IntType(8).as_pointer()


def i64(v: int) -> ir.Constant:
    return ir.Constant(I64, v)


def vec(lanes: int) -> ir.VectorType:
    return ir.VectorType(F32, lanes)


def const_value(v: ir.Value) -> int | None:
    return v.constant if isinstance(v, ir.Constant) and isinstance(v.constant, int) else None


def add(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    cx, cy = const_value(x), const_value(y)
    if cx is not None and cy is not None:
        return i64(cx + cy)
    if cx == 0:
        return y
    if cy == 0:
        return x
    return b.add(x, y)


def mul(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    cx, cy = const_value(x), const_value(y)
    if cx is not None and cy is not None:
        return i64(cx * cy)
    if cx == 1:
        return y
    if cy == 1:
        return x
    if cx == 0 or cy == 0:
        return i64(0)
    return b.mul(x, y)


def smin(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    cx, cy = const_value(x), const_value(y)
    if cx is not None and cy is not None:
        return i64(min(cx, cy))
    return b.select(b.icmp_signed("<", x, y), x, y)


def gep(b: ir.IRBuilder, ptr: ir.Value, offset: ir.Value) -> ir.Value:
    if const_value(offset) == 0:
        return ptr
    return b.gep(ptr, [offset], inbounds=True)


@contextmanager
def for_range(b: ir.IRBuilder, start: ir.Value, stop: ir.Value, step: int = 1,
              name: str = "i", unroll: bool = True) -> Iterator[ir.Value]:
    """`for (i = start; i < stop; i += step)`; the builder ends positioned after the loop.

    `unroll=False` forbids LLVM to unroll the loop: unrolling is the schedule's decision, and LLVM
    fully unrolling small trip counts around an inlined micro-kernel multiplies compile time.
    """
    with loop_carry(b, start, stop, [], step, name, unroll) as idx:
        yield idx


def _loop_md(mod: ir.Module, hint: list) -> ir.MDValue:
    loop_id = mod.add_metadata([ir.MetaDataString(mod, f"tf.loop.{len(mod.metadata)}")])
    loop_id.operands = (loop_id, mod.add_metadata(hint))
    return loop_id


def splat(b: ir.IRBuilder, scalar: ir.Value, lanes: int) -> ir.Value:
    v = b.insert_element(ir.Constant(vec(lanes), ir.Undefined), scalar, ir.Constant(I32, 0))
    mask = ir.Constant(ir.VectorType(I32, lanes), None)  # zeroinitializer: far cheaper to print than N zeros
    return b.shuffle_vector(v, ir.Constant(vec(lanes), ir.Undefined), mask)


def intrinsic(module: ir.Module, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
    fn = module.globals.get(name)
    if fn is None:
        fn = ir.Function(module, ir.FunctionType(ret, args), name=name)
    return fn


def fma(b: ir.IRBuilder, x: ir.Value, y: ir.Value, z: ir.Value) -> ir.Value:
    ty = x.type
    lanes = ty.count if isinstance(ty, ir.VectorType) else 0
    name = f"llvm.fma.v{lanes}f32" if lanes else "llvm.fma.f32"
    return b.call(intrinsic(b.module, name, ty, [ty, ty, ty]), [x, y, z])


def lanes_of(ty: ir.Type) -> int:
    """Vector lanes of a float type (0 for a scalar)."""
    return ty.count if isinstance(ty, ir.VectorType) else 0


def fconst(ty: ir.Type, value: float) -> ir.Constant:
    """A float constant of a scalar or vector float type (splatted; zero as zeroinitializer)."""
    n = lanes_of(ty)
    if n and value == 0.0 and math.copysign(1.0, value) > 0:
        return ir.Constant(ty, None)
    return ir.Constant(ty, [value] * n) if n else ir.Constant(ty, value)


def call_math(b: ir.IRBuilder, name: str, *xs: ir.Value) -> ir.Value:
    """An overloaded float intrinsic (`llvm.maxnum`, `llvm.rint`, ...) at the operands' type."""
    ty = xs[0].type
    n = lanes_of(ty)
    full = f"{name}.v{n}f32" if n else f"{name}.f32"
    return b.call(intrinsic(b.module, full, ty, [ty] * len(xs)), list(xs))


def lane_mask(lanes: int, valid: int) -> ir.Constant:
    return ir.Constant(ir.VectorType(I1, lanes), [int(i < valid) for i in range(lanes)])


def prefix_mask(b: ir.IRBuilder, count: ir.Value, lanes: int, first: int = 0) -> ir.Value:
    """`<lanes x i1>` of `first + lane < count` for a run-time i32 `count` (e.g. the columns left)."""
    ity = ir.VectorType(I32, lanes)
    v = b.insert_element(ir.Constant(ity, ir.Undefined), count, ir.Constant(I32, 0))
    n = b.shuffle_vector(v, ir.Constant(ity, ir.Undefined), ir.Constant(ity, None))
    return b.icmp_signed("<", ir.Constant(ity, [first + lane for lane in range(lanes)]), n)


def transpose_square(b: ir.IRBuilder, rows: list[ir.Value]) -> list[ir.Value]:
    """Square transpose of `len(rows)` vectors of as many lanes, by block swaps of halving size."""
    n = len(rows)
    s = n // 2
    while s >= 1:
        out = list(rows)
        for i in (i for i in range(n) if not i & s):
            lo, hi = rows[i], rows[i + s]
            keep = [n + c - s if c & s else c for c in range(n)]
            swap = [n + c if c & s else c + s for c in range(n)]
            out[i] = b.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(I32, n), keep))
            out[i + s] = b.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(I32, n), swap))
        rows, s = out, s // 2
    return rows


def load_vec(b: ir.IRBuilder, ptr: ir.Value, lanes: int, valid: int | ir.Value | None = None) -> ir.Value:
    """`lanes` floats from `ptr`; only the first `valid` are read (masked load, zeros elsewhere).

    `valid` is a constant count, an `<lanes x i1>` mask value, or None for a full vector.
    """
    vty = vec(lanes)
    vptr = b.bitcast(ptr, vty.as_pointer())
    if valid is None or (isinstance(valid, int) and valid >= lanes):
        return b.load(vptr, align=4)
    mask = lane_mask(lanes, valid) if isinstance(valid, int) else valid
    fn = intrinsic(b.module, f"llvm.masked.load.v{lanes}f32.p0", vty,
                   [vty.as_pointer(), I32, mask.type, vty])
    return b.call(fn, [vptr, ir.Constant(I32, 4), mask, ir.Constant(vty, None)])


def store_vec(b: ir.IRBuilder, value: ir.Value, ptr: ir.Value, valid: int | ir.Value | None = None) -> None:
    """Store a vector at `ptr`, only its first `valid` lanes when given (masked store)."""
    vty = value.type
    lanes = vty.count
    vptr = b.bitcast(ptr, vty.as_pointer())
    if valid is None or (isinstance(valid, int) and valid >= lanes):
        b.store(value, vptr, align=4)
        return
    mask = lane_mask(lanes, valid) if isinstance(valid, int) else valid
    fn = intrinsic(b.module, f"llvm.masked.store.v{lanes}f32.p0", ir.VoidType(),
                   [vty, vty.as_pointer(), I32, mask.type])
    b.call(fn, [value, vptr, ir.Constant(I32, 4), mask])


@contextmanager
def loop_carry(b: ir.IRBuilder, start: ir.Value, stop: ir.Value, values: list[ir.Value], step: int = 1,
               name: str = "i", unroll: bool | int = True) -> Iterator[ir.Value]:
    """`for_range` carrying SSA values (e.g. accumulators) as phis instead of memory.

    The body replaces `values[i]` in place with the next iteration's values; after the loop,
    `values` holds the exit values. Keeping accumulators out of allocas keeps the IR small.
    """
    pre = b.block
    header = b.append_basic_block(f"{name}.head")
    body = b.append_basic_block(f"{name}.body")
    done = b.append_basic_block(f"{name}.done")
    b.branch(header)
    b.position_at_end(header)
    idx = b.phi(I64, name=name)
    idx.add_incoming(start, pre)
    phis = []
    for v in values:
        phi = b.phi(v.type)
        phi.add_incoming(v, pre)
        phis.append(phi)
    b.cbranch(b.icmp_signed("<", idx, stop), body, done)
    b.position_at_end(body)
    values[:] = phis
    yield idx
    nxt = b.add(idx, i64(step), name=f"{name}.next")
    idx.add_incoming(nxt, b.block)
    for phi, v in zip(phis, values, strict=True):
        phi.add_incoming(v, b.block)
    latch = b.branch(header)
    if unroll is False:
        latch.set_metadata("llvm.loop", _loop_md(b.module, [ir.MetaDataString(b.module, "llvm.loop.unroll.disable")]))
    elif unroll is not True:
        latch.set_metadata("llvm.loop", _loop_md(b.module, [ir.MetaDataString(b.module, "llvm.loop.unroll.count"),
                                                            ir.Constant(I32, unroll)]))
    b.position_at_end(done)
    values[:] = phis


def store_ints(b: ir.IRBuilder, value: ir.Value, ptr: ir.Value, mask: ir.Value | None) -> None:
    """Store a `<lanes x i8>` or `<lanes x i32>` at the byte pointer `ptr`, only the lanes `mask` selects when
    given (every masked integer store goes through here; bytes through `opaque_on_x86`)."""
    vty = value.type
    size = vty.element.width // 8
    vptr = b.bitcast(ptr, vty.as_pointer())
    if mask is None:
        b.store(value, vptr, align=size)
        return
    fn = intrinsic(b.module, f"llvm.masked.store.v{vty.count}i{8 * size}.p0", ir.VoidType(),
                   [vty, vty.as_pointer(), I32, mask.type])
    b.call(fn, [opaque_on_x86(b, value) if size == 1 else value, vptr, ir.Constant(I32, size), mask])


def opaque_on_x86(b: ir.IRBuilder, value: ir.Value) -> ir.Value:
    """`value` passed through an empty inline asm on x86, so the backend cannot see that it is a truncation.

    LLVM's x86 backend folds a masked byte store of `trunc <n x i32>` into a truncating masked store and,
    when the mask folds to a single lane (a tile's last column, e.g. 17 or 33 output columns on 16 lanes),
    turns that into a scalar store of the untruncated i32: 4 bytes for 1, three bytes of the next row,
    channel or tensor overwritten with zeros (found by the int8 fuzzer: wrong outputs when the output zero
    point is 0). The asm costs one register copy at a masked edge and hides nothing else."""
    if "x86" not in b.module.triple:
        return value
    bits = value.type.count * value.type.element.width
    if bits >= 128:
        return b.asm(ir.FunctionType(value.type, [value.type]), "", "=v,0", [value], side_effect=False)
    word = ir.IntType(bits)  # a vector register cannot hold an 8-byte vector operand: a general one can
    hidden = b.asm(ir.FunctionType(word, [word]), "", "=r,0", [b.bitcast(value, word)], side_effect=False)
    return b.bitcast(hidden, value.type)
