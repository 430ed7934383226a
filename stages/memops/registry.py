"""Code generators for every memory-bound op, looked up by ONNX op type."""

from __future__ import annotations

from collections.abc import Callable

from stages.memops import conv_transpose, elementwise, layout, reduce
from stages.memops.opctx import OpCtx, UnsupportedOp

OPS: dict[str, Callable[[OpCtx], None]] = {**elementwise.OPS, **layout.OPS, **reduce.OPS,
                                           **conv_transpose.OPS}
ALIASES = layout.ALIASES


def unsupported_nodes(nodes) -> list[str]:
    """`Op (node, node, ...)` for every op type that is neither an anchor nor has a generator."""
    missing: dict[str, list[str]] = {}
    for node in nodes:
        if node.task is None and node.op not in OPS:
            missing.setdefault(node.op, []).append(node.name)
    return [f"{op} ({', '.join(names)})" for op, names in sorted(missing.items())]


__all__ = ["ALIASES", "OPS", "OpCtx", "UnsupportedOp", "unsupported_nodes"]
