"""Hostile model files: mutated bundled ONNX models through import, passes and task extraction end in
a result or a ModelError naming what is wrong, never another exception or a hang; plus the bugs the
fuzzer found, each as a small hand-made model."""

from __future__ import annotations

import random

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper, numpy_helper
from test_onnx_import import save, vi

from stages.extract import ModelError, load_model
from stages.graph import reference
from stages.graph.passes import optimize
from testing.mutate_onnx import bundled_models, import_case, mutate, run_seeds

MODELS = bundled_models()
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(sorted(MODELS)), rng=st.randoms(use_true_random=False))
def test_mutated_models_fail_only_with_model_errors(tmp_path, name: str, rng: random.Random):
    path = tmp_path / "case.onnx"
    path.write_bytes(mutate(MODELS[name], rng))
    assert import_case(path, time_limit_s=10.0) in ("ok", "ModelError")


def test_seeded_cases_are_reproducible_and_keep_only_failures(tmp_path):
    out = run_seeds(range(60), tmp_path)
    assert out.keys() == set(range(60)) and all(o in ("ok", "ModelError") for o, _ in out.values())
    assert {o for o, _ in out.values()} == {"ok", "ModelError"} and not list(tmp_path.iterdir())
    assert mutate(MODELS["cnn"], random.Random(7)) == mutate(MODELS["cnn"], random.Random(7))


def _const(name, arr):
    return numpy_helper.from_array(np.asarray(arr, np.float32), name)


def test_garbage_and_truncated_files_are_model_errors(tmp_path):
    path = tmp_path / "bad.onnx"
    for data in (b"\xff" * 64, MODELS["mlp"][:1000]):
        path.write_bytes(data)
        with pytest.raises(ModelError, match="not a readable ONNX model"):
            load_model(path)


def test_text_that_is_not_utf8_is_a_model_error_naming_the_field(tmp_path):
    """protobuf parses a string field with non-UTF-8 bytes as `bytes` (the mutation fuzzer's find: an op type
    b'\\x80ather' broke the sort of unsupported op types); each text field is named, the model is refused."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="r1"), helper.make_node("Xelu", ["a"], ["y"], name="r2")]
    data = save(tmp_path, nodes, [vi("x", [2, 4])], [vi("y", [2, 4])]).read_bytes()
    path = tmp_path / "bad.onnx"
    for old, new, field in ((b"Xelu", b"\x80elu", r"graph\.node\[1\]\.op_type"),
                            (b"r1", b"r\xff", r"graph\.node\[0\]\.name"),
                            (b"\x12\x01a", b"\x12\x01\xc3", r"graph\.node\[0\]\.output\[0\]")):
        assert data.count(old) == 1
        path.write_bytes(data.replace(old, new))
        with pytest.raises(ModelError, match=rf"bad\.onnx: {field} is not valid UTF-8 text"):
            load_model(path)
        assert import_case(path, time_limit_s=10.0) == "ModelError"


def test_a_value_written_twice_is_refused(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="r1"), helper.make_node("Tanh", ["x"], ["a"], name="t"),
             helper.make_node("Relu", ["a"], ["y"], name="r2")]
    with pytest.raises(ModelError, match=r"Tanh 't' writes \['a'\], which the model already defines"):
        load_model(save(tmp_path, nodes, [vi("x", [2, 4])], [vi("y", [2, 4])]))


def test_malformed_nodes_are_named(tmp_path):
    w = _const("w", np.ones((4, 3, 3, 3)))
    conv = helper.make_node("Conv", ["x", "w"], ["y"], name="c", strides=[0, 1], pads=[1, 1, 1, 1])
    with pytest.raises(ModelError, match="Conv 'c'"):
        load_model(save(tmp_path, [conv], [vi("x", [1, 3, 8, 8])], [vi("y", [1, 4, 8, 8])], [w]))
    pool = helper.make_node("MaxPool", ["x"], ["y"], name="p")  # kernel_shape is required
    with pytest.raises(ModelError, match="MaxPool 'p' is malformed: missing attribute or input 'kernel_shape'"):
        load_model(save(tmp_path, [pool], [vi("x", [1, 3, 8, 8])], [vi("y", [1, 3, 8, 8])]))
    axes = helper.make_node("Constant", [], ["ax"], name="k",
                            value=numpy_helper.from_array(np.zeros(5000, np.int64)))
    unsq = helper.make_node("Unsqueeze", ["x", "ax"], ["y"], name="u")
    with pytest.raises(ModelError, match="Unsqueeze 'u': axes .* are not distinct"):
        load_model(save(tmp_path, [axes, unsq], [vi("x", [2, 4])], [vi("y", [1, 2, 4])]))


def test_parameter_shapes_that_do_not_fit_are_refused_at_import(tmp_path):
    w, b = _const("w", np.ones((4, 3, 1, 1))), _const("b", np.ones(3))
    conv = helper.make_node("Conv", ["x", "w", "b"], ["y"], name="c")
    with pytest.raises(ModelError, match=r"bias \[3\] does not match the 4 output channels"):
        load_model(save(tmp_path, [conv], [vi("x", [1, 3, 8, 8])], [vi("y", [1, 4, 8, 8])], [w, b]))
    params = [_const(n, np.ones(5)) for n in ("s", "t", "m", "v")]
    bn = helper.make_node("BatchNormalization", ["x", "s", "t", "m", "v"], ["y"], name="bn")
    with pytest.raises(ModelError, match="BatchNormalization 'bn': parameters"):
        load_model(save(tmp_path, [bn], [vi("x", [1, 3, 8, 8])], [vi("y", [1, 3, 8, 8])], params))
    gemm = helper.make_node("Gemm", ["a", "wg", "cg"], ["y"], name="g")
    inits = [_const("wg", np.ones((4, 6))), _const("cg", np.ones((3, 1, 6)))]
    with pytest.raises(ModelError, match=r"Gemm 'g': C \[3, 1, 6\] does not broadcast to the output \[2, 6\]"):
        load_model(save(tmp_path, [gemm], [vi("a", [2, 4])], [vi("y", [2, 6])], inits))


def test_batchnorm_after_a_conv_with_a_computed_bias_is_kept_not_folded(tmp_path):
    w = _const("w", np.ones((3, 3, 1, 1)))
    params = [_const(n, np.full(3, v)) for n, v in (("s", 2.0), ("t", 0.5), ("m", 0.0), ("v", 1.0))]
    nodes = [helper.make_node("ReduceMean", ["x"], ["bias"], axes=[0, 2, 3], keepdims=0, name="mean"),
             helper.make_node("Conv", ["x", "w", "bias"], ["c"], name="c"),
             helper.make_node("BatchNormalization", ["c", "s", "t", "m", "v"], ["y"], name="bn", epsilon=0.0)]
    path = save(tmp_path, nodes, [vi("x", [1, 3, 4, 4])], [vi("y", [1, 3, 4, 4])], [w, *params])
    x = np.random.default_rng(0).standard_normal((1, 3, 4, 4)).astype(np.float32)
    want = ort.InferenceSession(str(path)).run(None, {"x": x})[0]
    np.testing.assert_allclose(reference.run(optimize(load_model(path)), {"x": x})["y"], want, rtol=1e-5, atol=1e-5)
