"""What a memory-bound op's code generator sees: its node, static shapes, constants, and pointers.

Every generated op is `void op(i8** args)`, the same calling convention as a template's
`tf_main`. The generator asks for pointers by value name; each first request appends a slot
to `slots`, and the library's `tf_run` fills slot k with where that value lives. A pointer has
its tensor's element type (float, i64, i32; bool as i8 holding 0 or 1). An op that can meet bad
data at run time (an index out of range) asks for the STATUS slot, writes what went wrong there
and returns; `tf_run` stops after it and returns the call's number (stages/build/library.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
from llvmlite import ir

from stages.codegen.irb import F32, I32, I64, VOIDP, for_range, i64, intrinsic
from stages.codegen.parallel import PARALLEL_FOR
from stages.graph.ir import Graph, Node

ELEMENT: dict[str, ir.Type] = {"float32": F32, "int64": I64, "int32": I32, "bool": ir.IntType(8),
                               "uint8": ir.IntType(8), "int8": ir.IntType(8)}
STATUS = "\0status"  # the slot of tf_run's i64[3] status: (failed, the bad value, the extent it had to be in)


class UnsupportedOp(ValueError):
    """An op (or an attribute value of it) the library build has no kernel for."""


@dataclass
class OpCtx:
    graph: Graph
    node: Node
    fn: ir.Function
    b: ir.IRBuilder
    slots: list[str] = field(default_factory=list)
    new_constants: dict[str, np.ndarray] = field(default_factory=dict)
    threads: int = 1
    int8_isa: str = "generic"  # the target's fastest u8 x s8 dot-product path (stages/templates/qgemm_isa.py)
    byte_permute: bool = False  # the target has AVX-512 VBMI's 64-lane byte permutes (qgemm_isa.byte_permute)
    _ptrs: dict[str, ir.Value] = field(default_factory=dict)
    _entry: ir.IRBuilder | None = None
    _args: ir.Value | None = None

    @classmethod
    def open(cls, module: ir.Module, graph: Graph, node: Node, symbol: str, threads: int = 1,
             int8_isa: str = "generic", byte_permute: bool = False) -> OpCtx:
        fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [VOIDP.as_pointer()]), name=symbol)
        fn.linkage = "internal"
        fn.attributes.add("noinline")  # each op optimised alone, not inlined into tf_run's one huge function
        b, eb = _entry_and_body(fn)
        return cls(graph, node, fn, b, threads=threads, int8_isa=int8_isa, byte_permute=byte_permute, _entry=eb,
                   _args=fn.args[0])

    def close(self) -> None:
        self.b.ret_void()

    @contextmanager
    def parallel(self, extent: int, min_items: int = 1) -> Iterator[ir.Value]:
        """`for i in range(extent)` whose iterations are independent: with more than one thread and at
        least `min_items` per thread, the range is split over the native worker pool (the body moves
        into a range function, so the anchor kernels' threads also run the memory-bound ops)."""
        threads = min(self.threads, extent // max(1, min_items))
        if threads < 2:
            with for_range(self.b, i64(0), i64(extent), name="par") as i:
                yield i
            return
        module = self.fn.module
        body = ir.Function(module, ir.FunctionType(ir.VoidType(), [VOIDP, I64, I64]), name=f"{self.fn.name}_range")
        body.linkage = "internal"
        outer = (self.b, self._entry, self._ptrs, self._args)
        self.b, self._entry = _entry_and_body(body)
        self._ptrs, self._args = {}, self._entry.bitcast(body.args[0], VOIDP.as_pointer())
        with for_range(self.b, body.args[1], body.args[2], name="par") as i:
            yield i
        self.b.ret_void()
        self.b, self._entry, self._ptrs, self._args = outer
        pfor = intrinsic(module, PARALLEL_FOR, ir.VoidType(), [body.type, VOIDP, I64, I64])
        self.b.call(pfor, [body, self.b.bitcast(self._args, VOIDP), i64(extent), i64(threads)])

    # shapes and attributes
    def dtype(self, name: str) -> str:
        for consts in (self.new_constants, self.graph.constants):
            if name in consts:
                return consts[name].dtype.name
        return self.graph.values[name].dtype

    def in_dtype(self, i: int = 0) -> str:
        return self.dtype(self.node.inputs[i])

    def out_dtype(self, j: int = 0) -> str:
        return self.dtype(self.node.outputs[j])

    def shape(self, name: str) -> tuple[int, ...]:
        if name in self.graph.constants:
            return tuple(self.graph.constants[name].shape)
        return tuple(self.graph.values[name].shape)

    def in_shape(self, i: int = 0) -> tuple[int, ...]:
        return self.shape(self.node.inputs[i])

    def out_shape(self, j: int = 0) -> tuple[int, ...]:
        return self.shape(self.node.outputs[j])

    def attr(self, name: str, default=None):
        return self.node.attrs.get(name, default)

    def has_input(self, i: int) -> bool:
        return i < len(self.node.inputs) and bool(self.node.inputs[i])

    def const(self, i: int) -> np.ndarray | None:
        """Input i's value when it is a constant (shape tensors, pads, clip bounds), else None."""
        if not self.has_input(i):
            return None
        return self.graph.constants.get(self.node.inputs[i])

    def unsupported(self, why: str) -> UnsupportedOp:
        return UnsupportedOp(f"{self.node.op} node {self.node.name!r}: {why}")

    def local(self, ty: ir.Type = F32) -> ir.Value:
        """A float (or `ty`) variable: an entry-block alloca, promoted to a register by LLVM."""
        assert self._entry is not None
        return self._entry.alloca(ty)

    def buffer(self, count: int) -> ir.Value:
        """A float array of `count` elements on the stack of the function being emitted."""
        assert self._entry is not None
        return self._entry.alloca(F32, size=i64(count))

    # pointers
    def ptr(self, name: str) -> ir.Value:
        """Where tensor `name` is, as a pointer to its element type."""
        if name == STATUS:
            return self._slot(name, I64)
        dtype = self.dtype(name)
        if dtype not in ELEMENT:
            raise self.unsupported(f"tensor {name!r} is {dtype}; kernels take {', '.join(ELEMENT)}")
        return self._slot(name, ELEMENT[dtype])

    def _slot(self, name: str, ty: ir.Type) -> ir.Value:
        if name not in self.slots:
            self.slots.append(name)
        if name not in self._ptrs:
            assert self._entry is not None
            slot = self._entry.load(self._entry.gep(self._args, [i64(self.slots.index(name))]))
            self._ptrs[name] = self._entry.bitcast(slot, ty.as_pointer())
        return self._ptrs[name]

    def fail_unless(self, ok: ir.Value, value: ir.Value, extent: ir.Value) -> None:
        """Unless `ok` (i1): record (value, extent) in the status and return from the op at once (not from
        inside `parallel`: that would return from the range function only)."""
        status = self.ptr(STATUS)
        with self.b.if_then(self.b.not_(ok), likely=False):
            self.b.store(value, self.b.gep(status, [i64(1)]))
            self.b.store(extent, self.b.gep(status, [i64(2)]))
            self.b.store(i64(1), status)
            self.b.ret_void()

    def inp(self, i: int = 0) -> ir.Value:
        return self.ptr(self.node.inputs[i])

    def out(self, j: int = 0) -> ir.Value:
        return self.ptr(self.node.outputs[j])

    def weight(self, tag: str, array: np.ndarray) -> ir.Value:
        """A constant this op derives at build time (folded batch-norm scale, ...): stored with the weights."""
        name = f"{self.node.name}/{tag}"
        self.new_constants[name] = np.ascontiguousarray(array, dtype=np.float32)
        return self.ptr(name)


def _entry_and_body(fn: ir.Function) -> tuple[ir.IRBuilder, ir.IRBuilder]:
    """A builder at the start of `fn`'s body, and one in its entry block (allocas, pointer loads)."""
    entry, body = fn.append_basic_block("entry"), fn.append_basic_block("body")
    eb = ir.IRBuilder(entry)
    eb.position_before(eb.branch(body))
    return ir.IRBuilder(body), eb
