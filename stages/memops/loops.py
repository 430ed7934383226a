"""Loop nests over static shapes, the one primitive every memory-bound kernel is written with.

`emit_map` walks an output region and combines strided reads of its operands element by
element. Strides are compile-time constants, adjacent dimensions that are contiguous for
every operand are merged first, so the innermost loop is usually one long unit-stride (or
broadcast, stride 0) loop that LLVM's loop vectoriser turns into vector code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

from llvmlite import ir

from schemas.task import EpilogueOp
from stages.codegen.irb import F32, I32, add, for_range, gep, i64, intrinsic, mul
from stages.graph.ir import contiguous_strides
from stages.templates.epilogue import emit


@dataclass(frozen=True)
class Operand:
    """A strided view of a float buffer: element (i0, i1, ...) is at base + sum(i_d * strides[d])."""

    ptr: ir.Value
    strides: tuple[int, ...]
    base: int = 0


def broadcast_strides(shape: Sequence[int], out_shape: Sequence[int]) -> tuple[int, ...]:
    """Strides reading `shape` broadcast (numpy rules) to `out_shape`: 0 along broadcast dims."""
    pad = len(out_shape) - len(shape)
    if pad < 0:
        raise ValueError(f"cannot broadcast shape {list(shape)} to {list(out_shape)}")
    full = (1,) * pad + tuple(shape)
    for d, (s, o) in enumerate(zip(full, out_shape, strict=True)):
        if s not in (1, o):
            raise ValueError(f"cannot broadcast shape {list(shape)} to {list(out_shape)} (dim {d})")
    own = contiguous_strides(full)
    return tuple(0 if s == 1 else st for s, st in zip(full, own, strict=True))


def collapse(extents: Sequence[int], operands: Sequence[Operand]) -> tuple[tuple[int, ...], list[Operand]]:
    """Drop unit dims and merge dims that are contiguous for every operand (fewer, longer loops)."""
    keep = [d for d, e in enumerate(extents) if e != 1]
    ext = [extents[d] for d in keep]
    strides = [[op.strides[d] for d in keep] for op in operands]
    d = len(ext) - 1
    while d > 0:
        if all(s[d - 1] == s[d] * ext[d] for s in strides):
            ext[d - 1] *= ext[d]
            del ext[d]
            for s in strides:
                s[d - 1] = s[d]
                del s[d]
        d -= 1
    return tuple(ext), [Operand(op.ptr, tuple(s), op.base) for op, s in zip(operands, strides, strict=True)]


@contextmanager
def loop_nest(b: ir.IRBuilder, extents: Sequence[int], name: str = "d") -> Iterator[list[ir.Value]]:
    with ExitStack() as stack:
        yield [stack.enter_context(for_range(b, i64(0), i64(e), name=f"{name}{k}")) for k, e in enumerate(extents)]


def offset(b: ir.IRBuilder, idx: Sequence[ir.Value], strides: Sequence[int], base: int = 0) -> ir.Value:
    total: ir.Value = i64(base)
    for i, s in zip(idx, strides, strict=True):
        total = add(b, total, mul(b, i, i64(s)))
    return total


def align_of(ptr: ir.Value) -> int:
    """The alignment an element of `ptr` is guaranteed: its own size (float, i64, i32, a bool's i8)."""
    ty = ptr.type.pointee
    return 4 if isinstance(ty, ir.FloatType) else max(1, ty.width // 8)


def const_like(ptr: ir.Value, value: float) -> ir.Constant:
    """`value` as an element of `ptr` (a bool's i8 holds 0 or 1)."""
    ty = ptr.type.pointee
    if isinstance(ty, ir.FloatType):
        return ir.Constant(ty, float(value))
    return ir.Constant(ty, int(bool(value)) if ty.width == 8 else int(value))


def load(b: ir.IRBuilder, op: Operand, idx: Sequence[ir.Value]) -> ir.Value:
    return b.load(gep(b, op.ptr, offset(b, idx, op.strides, op.base)), align=align_of(op.ptr))


def store(b: ir.IRBuilder, value: ir.Value, op: Operand, idx: Sequence[ir.Value]) -> None:
    b.store(value, gep(b, op.ptr, offset(b, idx, op.strides, op.base)), align=align_of(op.ptr))


Combine = Callable[[ir.IRBuilder, list[ir.Value]], ir.Value]


def emit_map(b: ir.IRBuilder, extents: Sequence[int], out: Operand, ins: Sequence[Operand], fn: Combine) -> None:
    """out[i] = fn(ins[0][i], ins[1][i], ...) for every i in the box `extents`."""
    ext, ops = collapse(extents, [out, *ins])
    with loop_nest(b, ext) as idx:
        store(b, fn(b, [load(b, op, idx) for op in ops[1:]]), ops[0], idx)


def f32(v: float) -> ir.Constant:
    return ir.Constant(F32, float(v))


def call_f32(b: ir.IRBuilder, name: str, *args: ir.Value) -> ir.Value:
    """An LLVM float intrinsic (`llvm.exp.f32`) or a libm function (`tanhf`) on scalars."""
    return b.call(intrinsic(b.module, name, F32, [F32] * len(args)), list(args))


def fadd_reassoc(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    """A sum LLVM may reorder: lets the loop vectoriser turn an accumulation into a vector reduction."""
    total = b.fadd(x, y)
    total.flags.append("reassoc")
    return total


def epilogue_op(b: ir.IRBuilder, kind: str, x: ir.Value, **attrs: float) -> ir.Value:
    """One op of the shared fused-epilogue emitter (inline polynomials, so loops stay vectorisable)."""
    return emit(b, (EpilogueOp(kind=kind, attrs=attrs),), x, lambda slot: x)


def select_max(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.fcmp_unordered(">", x, y), x, y)


def select_min(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.fcmp_unordered("<", x, y), x, y)


def i32(v: int) -> ir.Constant:
    return ir.Constant(I32, v)
