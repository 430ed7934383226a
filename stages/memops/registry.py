"""Code generators for every memory-bound op, looked up by ONNX op type and the types it meets.

Most ops compute in float32 (`FLOAT_OPS`); data movement copies any type; `TYPED_OPS` take any type
(comparisons, logic, Where, Cast, ...), the gathers any data with integer indices, and a few float
ops have integer versions (`INT_OPS`). A float op reading an integer constant (Pow's exponent)
converts it as it loads; any other pairing is an UnsupportedOp naming the node and its types.
"""

from __future__ import annotations

from collections.abc import Callable

from stages.memops import (
    attention,
    conv_transpose,
    elementwise,
    indexing,
    layout,
    quant,
    quant_concat,
    quant_islands,
    reduce,
    resize,
    typed,
)
from stages.memops.opctx import OpCtx, UnsupportedOp

Generator = Callable[[OpCtx], None]
FLOAT_OPS: dict[str, Generator] = {**elementwise.OPS, **reduce.OPS, **conv_transpose.OPS, **attention.OPS}
ANY_TYPE: dict[str, Generator] = {**layout.OPS, **typed.TYPED_OPS, **indexing.OPS, **quant.OPS, **quant_islands.OPS,
                                  **quant_concat.OPS, **resize.OPS}
OPS: dict[str, Generator] = {**FLOAT_OPS, **ANY_TYPE}
ALIASES = layout.ALIASES


def generator(ctx: OpCtx) -> Generator:
    """The generator for ctx's node, given the types of its run-time tensors."""
    op = ctx.node.op
    if op in ANY_TYPE:
        return ANY_TYPE[op]
    names = [n for n in ctx.node.inputs if n and n not in ctx.graph.constants] + ctx.node.outputs
    types = sorted({ctx.dtype(n) for n in names})
    if types == ["float32"]:
        return FLOAT_OPS[op]
    if op in typed.INT_OPS and len(types) == 1 and types[0] in ("int64", "int32"):
        return typed.INT_OPS[op]
    if op in quant.INT8_OPS and len(types) == 1 and types[0] in ("uint8", "int8"):
        return quant.INT8_OPS[op]
    raise ctx.unsupported(f"its run-time tensors are {', '.join(types)}; this op runs on float32"
                          + (" or on int64/int32 throughout" if op in typed.INT_OPS else " only"))


def unsupported_nodes(nodes) -> list[str]:
    """`Op (node, node, ...)` for every op type that is neither an anchor nor has a generator."""
    missing: dict[str, list[str]] = {}
    for node in nodes:
        if node.task is None and node.op not in OPS:
            missing.setdefault(node.op, []).append(node.name)
    return [f"{op} ({', '.join(names)})" for op, names in sorted(missing.items())]


__all__ = ["ALIASES", "OPS", "OpCtx", "UnsupportedOp", "generator", "unsupported_nodes"]
