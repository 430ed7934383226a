"""A one-MatMul ONNX model whose 4x4 weight lives in a file beside it, the ground for external-data faults
(a missing, truncated, relocated or non-regular data file)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def save_with_external_weight(path: Path, location: str) -> Path:
    """y = x @ w with w = arange(16) as 4x4 float32 (64 bytes) saved to `location`, relative to `path`'s folder."""
    w = numpy_helper.from_array(np.arange(16, dtype=np.float32).reshape(4, 4), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "ext",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path), save_as_external_data=True, location=location, size_threshold=0)
    return path
