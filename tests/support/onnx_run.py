"""Build an ONNX model with default schedules and run it beside onnxruntime: the op tests' one comparison."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from schemas import Target
from stages.build.library import build_library
from stages.extract import load_model
from stages.graph.passes import optimize
from stages.runtime import load


def build_and_run(tmp_path: Path, graph: onnx.GraphProto, feeds: dict[str, np.ndarray], names: list[str],
                  opset: int = 18) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(tunaflow's outputs, onnxruntime's) named `names`, for `graph` saved as an opset-`opset` model."""
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), path)
    build_library(optimize(load_model(path)), Target.host(), tmp_path / "lib", 1, None)
    got = load(tmp_path / "lib").run(**feeds)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(names, feeds)
    return [got[n] for n in names], want
