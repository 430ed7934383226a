"""What a library says about its inputs: name, shape, type, and for integer inputs that index a table
(token ids into an embedding) how large that table is, so callers and random feeds stay in range."""

from __future__ import annotations

from schemas.manifest import TensorInfo
from stages.graph.ir import Graph

PASS_THROUGH = frozenset({"Reshape", "Flatten", "Identity", "Squeeze", "Unsqueeze"})
INDEXING = frozenset({"Gather", "GatherElements"})


def index_bounds(graph: Graph) -> dict[str, int]:
    """For each integer graph input that (through reshapes) is the indices of a Gather or GatherElements, the
    smallest extent it indexes: its values must lie in [-bound, bound)."""
    users = graph.consumers()
    bounds: dict[str, int] = {}
    for value in graph.inputs:
        if value.dtype not in ("int64", "int32"):
            continue
        todo, seen = [value.name], set()
        while todo:
            name = todo.pop()
            seen.add(name)
            for node in users.get(name, []):
                if node.op in PASS_THROUGH:
                    todo += [o for o in node.outputs if o not in seen]
                elif node.op in INDEXING and len(node.inputs) > 1 and node.inputs[1] == name:
                    data = graph.values[node.inputs[0]].shape
                    extent = data[int(node.attrs["axis"])]
                    bounds[value.name] = min(bounds.get(value.name, extent), extent)
    return bounds


def input_infos(graph: Graph) -> tuple[TensorInfo, ...]:
    bounds = index_bounds(graph)
    return tuple(TensorInfo(name=v.name, shape=v.shape, dtype=v.dtype, bound=bounds.get(v.name))
                 for v in graph.inputs)
