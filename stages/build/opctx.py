"""What a memory-bound op's code generator sees: its node, static shapes, constants, and pointers.

Every generated op is `void op(i8** args)`, the same calling convention as a template's
`tf_main`. The generator asks for pointers by value name; each first request appends a slot
to `slots`, and the library's `tf_run` fills slot k with where that value lives.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from llvmlite import ir

from stages.codegen.irb import F32, F32P, VOIDP, i64
from stages.graph.ir import Graph, Node


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
    _ptrs: dict[str, ir.Value] = field(default_factory=dict)
    _entry: ir.IRBuilder | None = None

    @classmethod
    def open(cls, module: ir.Module, graph: Graph, node: Node, symbol: str) -> OpCtx:
        fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [VOIDP.as_pointer()]), name=symbol)
        fn.linkage = "internal"
        entry, body = fn.append_basic_block("entry"), fn.append_basic_block("body")
        eb = ir.IRBuilder(entry)
        eb.position_before(eb.branch(body))
        return cls(graph, node, fn, ir.IRBuilder(body), _entry=eb)

    def close(self) -> None:
        self.b.ret_void()

    # shapes and attributes
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

    def local(self) -> ir.Value:
        """A float scalar variable (an entry-block alloca, promoted to a register by LLVM)."""
        assert self._entry is not None
        return self._entry.alloca(F32)

    # pointers
    def ptr(self, name: str) -> ir.Value:
        if name not in self._ptrs:
            if name in self.graph.constants and self.graph.constants[name].dtype != np.float32:
                raise self.unsupported(f"tensor {name!r} is {self.graph.constants[name].dtype}, kernels take float32")
            assert self._entry is not None
            slot = self._entry.load(self._entry.gep(self.fn.args[0], [i64(len(self.slots))]))
            self._ptrs[name] = self._entry.bitcast(slot, F32P)
            self.slots.append(name)
        return self._ptrs[name]

    def inp(self, i: int = 0) -> ir.Value:
        return self.ptr(self.node.inputs[i])

    def out(self, j: int = 0) -> ir.Value:
        return self.ptr(self.node.outputs[j])

    def weight(self, tag: str, array: np.ndarray) -> ir.Value:
        """A constant this op derives at build time (folded batch-norm scale, ...): stored with the weights."""
        name = f"{self.node.name}/{tag}"
        self.new_constants[name] = np.ascontiguousarray(array, dtype=np.float32)
        return self.ptr(name)
