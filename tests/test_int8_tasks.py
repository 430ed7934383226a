"""Int8 anchors tuned and built by their templates: a quantized model's qconv2d / qdense nodes carry tuning
tasks, a short tuning session logs error-free trials for them, and the library runs the template kernels
(not the loop kernels) and matches onnxruntime's int8 run within one quantization step."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from schemas import Target, TuningOptions
from stages.build.library import build_library
from stages.extract import load_model
from stages.graph.passes import optimize
from stages.log import TuningLog
from stages.pipeline.model import tunable_tasks
from stages.runtime import load
from stages.tune.loop import tune_tasks
from testing.quantize import onnxruntime_run, quantize_static, random_inputs


def small_cnn() -> onnx.ModelProto:
    """Conv 3x3 (8 -> 16, pad 1) -> Relu -> Conv 1x1 stride 2 (16 -> 24) -> Flatten -> Gemm (600 -> 10)."""
    rng = np.random.default_rng(0)

    def init(name, *shape):
        return numpy_helper.from_array(rng.normal(0, 0.3, shape).astype(np.float32), name)

    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], strides=[2, 2]),
             helper.make_node("Flatten", ["c2"], ["f"]),
             helper.make_node("Gemm", ["f", "w3", "b3"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "small_cnn",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 10, 10])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
                              [init("w1", 16, 8, 3, 3), init("b1", 16), init("w2", 24, 16, 1, 1), init("b2", 24),
                               init("w3", 10, 600), init("b3", 10)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_int8_anchors_are_tuned_and_built_by_their_templates(tmp_path):
    model = quantize_static(small_cnn())
    graph = optimize(load_model(model))
    anchors = [n for n in graph.nodes if n.op in ("qconv2d", "qdense")]
    assert [n.op for n in anchors] == ["qconv2d", "qconv2d", "qdense"]
    assert all(n.task is not None and n.task.op == n.op for n in anchors)
    tasks = tunable_tasks(graph)
    assert sorted(t.task.op for t in tasks) == ["qconv2d", "qconv2d", "qdense"]

    target, log = Target.host(), TuningLog(tmp_path / "log")
    options = TuningOptions(n_trials=4, batch_size=4, seed=1, top_k_remeasure=0)
    summaries = tune_tasks([t.task for t in tasks], [t.weight for t in tasks], target, options, log, 12)
    assert sum(s.trials for s in summaries) == 12, [s.trials for s in summaries]
    assert all(s.trials >= 2 and not s.errors for s in summaries), [(s.trials, s.errors) for s in summaries]

    manifest = build_library(graph, target, tmp_path / "lib", log=tmp_path / "log")
    kinds = {op.node: op.kind for op in manifest.ops}
    assert all(kinds[n.name] == "tuned" for n in anchors), kinds

    library = load(tmp_path / "lib")
    step = float(numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == next(
        n for n in model.graph.node if n.output[0] == "y").input[1])))
    for seed in range(5):
        feeds = random_inputs(model, seed)
        want, got = onnxruntime_run(model, feeds)["y"], library.run(**feeds)["y"]
        assert np.abs(got - want).max() <= step * (1 + 1e-4)
