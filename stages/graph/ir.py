"""The graph representation shared by import, passes, task extraction and the library build.

Nodes are kept in topological order. After the fusion pass, an anchor node (conv2d, dense,
matmul, batch_matmul) carries its `TuningTask` (with the fused epilogue) in `task`, and the
element-wise nodes it absorbed are gone; every other node keeps its ONNX op type.
An anchor's node inputs are its task's inputs in order (X, W, then the epilogue tensors); a
tensor may be a contiguous reshape of its spec (a dense over [1, S, K] activations has an X spec
of (S, K)). Attributes are the importer's normalised ones, listed in stages/graph/reference.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from schemas.task import TuningTask


def contiguous_strides(shape: tuple[int, ...] | list[int]) -> tuple[int, ...]:
    """Row-major element strides of `shape` (the layout every buffer has; views are read against it)."""
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return tuple(reversed(strides))


@dataclass(frozen=True)
class Value:
    """A tensor flowing between nodes (static shape)."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"


@dataclass
class Node:
    name: str
    op: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict = field(default_factory=dict)
    task: TuningTask | None = None


@dataclass
class Graph:
    name: str
    inputs: list[Value]
    outputs: list[Value]
    nodes: list[Node]
    values: dict[str, Value]
    constants: dict[str, np.ndarray] = field(default_factory=dict)

    def producer(self) -> dict[str, Node]:
        return {out: node for node in self.nodes for out in node.outputs}

    def consumers(self) -> dict[str, list[Node]]:
        users: dict[str, list[Node]] = {}
        for node in self.nodes:
            for name in node.inputs:
                users.setdefault(name, []).append(node)
        return users

    def add_constant(self, name: str, value: np.ndarray) -> str:
        """Store a new float32 constant under `name` (suffixed if taken); returns the name used."""
        base, i = name, 0
        while name in self.values or name in self.constants:
            i += 1
            name = f"{base}.{i}"
        self.constants[name] = np.ascontiguousarray(value, dtype=np.float32)
        self.values[name] = Value(name, self.constants[name].shape)
        return name

    def sole_consumer(self, name: str, users: dict[str, list[Node]]) -> Node | None:
        """The one node reading `name` (given `consumers()`), if exactly one does and it is no graph output."""
        readers = users.get(name, [])
        if len(readers) != 1 or any(v.name == name for v in self.outputs):
            return None
        return readers[0]
