"""A tiny ONNX model whose names are rich markup and emoji codes, for the CLI's odd-input tests and attacks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ODD = "[/]:a:"  # a closing tag with nothing to close, and rich's emoji code for 🅰


def odd_model(path: Path) -> Path:
    """x → Conv (node `[/]`) → Relu (`[bold]`, fused away) → MaxPool (`:a:`) → output `y:a:`; graph `[/]:a:`."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], name="[/]"),
             helper.make_node("Relu", ["c"], ["r"], name="[bold]"),
             helper.make_node("MaxPool", ["r"], ["y:a:"], kernel_shape=[2, 2], strides=[2, 2], name=":a:")]
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")]
    graph = helper.make_graph(nodes, ODD, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y:a:", TensorProto.FLOAT, [1, 4, 4, 4])], inits)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path
