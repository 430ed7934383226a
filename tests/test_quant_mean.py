"""The vector NHWC-order qmean of one image (stages/memops/quant_mean.py): plane counts that are and are not
multiples of 16, plane sizes below, at and past a vector (full blocks and a masked tail), uint8 and int8, on 1
and 2 threads and on x86-64-avx2, bit for bit against the reference's running sum (which
tests/test_quant_islands.py checks against onnxruntime)."""

from __future__ import annotations

import numpy as np
import pytest

from schemas import Target
from schemas.target import preset
from stages.build.library import build_library
from stages.graph.ir import Graph, Node, Value
from stages.graph.reference_quant import QUANT_OPS
from stages.runtime import load

CASES = [(37, 1, 1), (16, 4, 4), (21, 3, 5), (48, 7, 7), (33, 17, 19), (40, 56, 56)]  # channels, h, w (the last split)


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_vector_qmean_sums_as_the_running_sum(tmp_path, dtype):
    rng = np.random.default_rng(11)
    info = np.iinfo(dtype)
    nodes, values, feeds = [], {}, {}
    for i, (c, h, w) in enumerate(CASES):
        attrs = {"x_scale": float(np.float32(0.0372 + 0.01 * i)), "x_zero_point": 9 if dtype == "uint8" else -7,
                 "y_scale": float(np.float32(0.0131)), "y_zero_point": 3, "y_dtype": "uint8", "order": "nhwc"}
        nodes.append(Node(f"m{i}", "qmean", [f"x{i}"], [f"y{i}"], attrs))
        values |= {f"x{i}": ((1, c, h, w), dtype), f"y{i}": ((1, c, 1, 1), "uint8")}
        feeds[f"x{i}"] = rng.integers(info.min, info.max + 1, (1, c, h, w)).astype(dtype)
    vals = {n: Value(n, shape, dt) for n, (shape, dt) in values.items()}
    graph = Graph("means", [vals[f"x{i}"] for i in range(len(CASES))], [vals[f"y{i}"] for i in range(len(CASES))],
                  nodes, vals, {})
    want = {node.outputs[0]: QUANT_OPS["qmean"]([feeds[node.inputs[0]]], node.attrs)[0] for node in nodes}
    for threads, target in ((1, Target.host()), (2, Target.host()), (2, preset("x86-64-avx2"))):
        out = tmp_path / f"lib-{threads}-{target.name}"
        build_library(graph, target, out, threads)
        got = load(out).run(**feeds)
        for name, value in want.items():
            np.testing.assert_array_equal(got[name], value, err_msg=f"{name}: {threads} thread(s) on {target.name}")
