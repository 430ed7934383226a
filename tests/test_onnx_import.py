"""ONNX import on real .onnx files: errors first, shape binding, constant folding, opset differences,
the bundled models against onnxruntime, and every importable ONNX backend test case."""

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from stages.extract import ModelError, UnsupportedOpsError, load_model, parse_input_shapes
from stages.graph import reference
from stages.graph.passes import optimize
from testing.backend_cases import discover

MODELS = Path(__file__).resolve().parent.parent / "data" / "models"


def save(tmp_path: Path, nodes, inputs, outputs, inits=(), opset: int = 17, name: str = "m") -> Path:
    graph = helper.make_graph(nodes, name, inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    return path


def vi(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def test_every_unsupported_op_is_listed_with_its_nodes_in_one_error(tmp_path):
    nodes = [helper.make_node("Round", ["x"], ["a"], name="round1"), helper.make_node("Relu", ["a"], ["b"], name="r"),
             helper.make_node("Round", ["b"], ["c"], name="round2"),
             helper.make_node("Hardmax", ["c"], ["y"], name="hm")]
    path = save(tmp_path, nodes, [vi("x", ["N", 4])], [vi("y", ["N", 4])])
    with pytest.raises(UnsupportedOpsError) as err:
        load_model(path)  # the unbound N is not reported: unsupported ops come before anything else
    assert err.value.unsupported == {"Round": ["round1", "round2"], "Hardmax": ["hm"]}
    assert "2 unsupported operator type(s)" in str(err.value) and "round1, round2" in str(err.value)


def test_dynamic_dims_bound_by_input_or_by_symbol_and_unbound_is_an_error(tmp_path):
    path = save(tmp_path, [helper.make_node("Relu", ["x"], ["y"])], [vi("x", ["batch", 3, "h", 8])],
                [vi("y", ["batch", 3, "h", 8])])
    with pytest.raises(ModelError, match=r"dynamic dimension \('batch', axis 0\).*--input-shape x=Nx3xNx8"):
        load_model(path)
    g = load_model(path, parse_input_shapes(["x=2x3x5x8"]))
    assert g.inputs[0].shape == (2, 3, 5, 8) and g.values["y"].shape == (2, 3, 5, 8)
    assert load_model(path, parse_input_shapes(["batch=4", "h=6"])).values["y"].shape == (4, 3, 6, 8)
    with pytest.raises(ModelError, match="does not fit"):
        load_model(path, {"x": (2, 4, 5, 8)})
    with pytest.raises(ModelError, match="inputs are \\['x'\\]"):
        load_model(path, {"z": (1,)})
    with pytest.raises(ModelError, match="NAME=1x3x224x224"):
        parse_input_shapes(["x=1xax3"])


def test_shape_subgraphs_and_initializer_arithmetic_fold_away(tmp_path):
    i64 = np.int64
    inits = [numpy_helper.from_array(np.array(2, i64), "two"), numpy_helper.from_array(np.array([0], i64), "ax0"),
             numpy_helper.from_array(np.array([-1], i64), "minus1"),
             numpy_helper.from_array(np.full((4,), 2, np.float32), "w")]
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "two"], ["d1"], axis=0),
        helper.make_node("Unsqueeze", ["d1", "ax0"], ["d1u"]),
        helper.make_node("Concat", ["minus1", "d1u"], ["shape"], axis=0),
        helper.make_node("Cast", ["shape"], ["shape_i"], to=TensorProto.INT64),
        helper.make_node("ConstantOfShape", ["d1u"], ["zeros"],
                         value=numpy_helper.from_array(np.array([3.0], np.float32))),
        helper.make_node("Mul", ["w", "zeros"], ["w6"]),  # 2 * 3: folded
        helper.make_node("Reshape", ["x", "shape_i"], ["flat"]),
        helper.make_node("Add", ["flat", "w6"], ["y"]),
    ]
    path = save(tmp_path, nodes, [vi("x", [2, 2, 4])], [vi("y", [4, 4])], inits)
    g = load_model(path)
    assert [n.op for n in g.nodes] == ["Reshape", "Add"]
    assert g.nodes[0].attrs["shape"] == [4, 4]
    (c,) = [g.constants[i] for i in g.nodes[1].inputs if i in g.constants]
    np.testing.assert_array_equal(c, np.full(4, 6.0, np.float32))
    x = np.arange(16, dtype=np.float32).reshape(2, 2, 4)
    np.testing.assert_array_equal(reference.run(g, {"x": x})["y"], x.reshape(4, 4) + 6)


def test_run_time_input_to_a_fold_only_op_is_a_clear_error(tmp_path):
    path = save(tmp_path, [helper.make_node("ConstantOfShape", ["x"], ["y"], name="g")], [vi("x", [3])],
                [vi("y", [2, 3, 2])])
    with pytest.raises(ModelError, match="ConstantOfShape 'g': its input 0 \\('x'\\) must be a constant, but it is "
                                         "computed at run time"):
        load_model(path)


@pytest.mark.parametrize("opset", [9, 11, 13, 18, 21])
def test_opset_specific_forms_normalise_to_the_same_graph(tmp_path, opset):
    """Clip bounds, Split sizes, ReduceMean axes and Softmax's axis moved between attributes and inputs."""
    i64 = np.int64
    inits, nodes = [], []
    if opset < 11:
        nodes.append(helper.make_node("Clip", ["x"], ["c"], min=-0.5, max=0.5))
    else:
        inits += [numpy_helper.from_array(np.array(-0.5, np.float32), "lo"),
                  numpy_helper.from_array(np.array(0.5, np.float32), "hi")]
        nodes.append(helper.make_node("Clip", ["x", "lo", "hi"], ["c"]))
    if opset < 13:
        nodes.append(helper.make_node("Split", ["c"], ["s1", "s2"], axis=1, split=[2, 4]))
    else:
        inits.append(numpy_helper.from_array(np.array([2, 4], i64), "sizes"))
        nodes.append(helper.make_node("Split", ["c", "sizes"], ["s1", "s2"], axis=1))
    if opset < 18:
        nodes.append(helper.make_node("ReduceMean", ["s2"], ["m"], axes=[1], keepdims=1))
    else:
        inits.append(numpy_helper.from_array(np.array([1], i64), "axes"))
        nodes.append(helper.make_node("ReduceMean", ["s2", "axes"], ["m"], keepdims=1))
    nodes.append(helper.make_node("Softmax", ["s1"], ["p"], axis=1))
    nodes.append(helper.make_node("Mul", ["p", "m"], ["y"]))
    path = save(tmp_path, nodes, [vi("x", [3, 6])], [vi("y", [3, 2])], inits, opset=opset)
    g = load_model(path)
    assert [(n.op, n.attrs) for n in g.nodes] == [
        ("Clip", {"min": -0.5, "max": 0.5}), ("Split", {"axis": 1, "split": [2, 4]}),
        ("ReduceMean", {"axes": [1], "keepdims": 1}), ("Softmax", {"axis": 1}), ("Mul", {})]
    x = np.random.default_rng(0).standard_normal((3, 6)).astype(np.float32)
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(reference.run(g, {"x": x})["y"], expected, rtol=1e-5, atol=1e-6)


def test_old_softmax_over_trailing_axes_becomes_reshape_softmax_reshape(tmp_path):
    path = save(tmp_path, [helper.make_node("Softmax", ["x"], ["y"], axis=1)], [vi("x", [2, 3, 4])],
                [vi("y", [2, 3, 4])], opset=11)
    g = load_model(path)
    assert [n.op for n in g.nodes] == ["Reshape", "Softmax", "Reshape"] and g.nodes[0].attrs["shape"] == [2, 12]
    x = np.random.default_rng(1).standard_normal((2, 3, 4)).astype(np.float32)
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(reference.run(g, {"x": x})["y"], expected, rtol=1e-5, atol=1e-6)


def test_auto_pad_and_ceil_mode_resolve_to_explicit_pads(tmp_path):
    w = numpy_helper.from_array(np.random.default_rng(2).standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], auto_pad="SAME_UPPER", strides=[2, 2]),
             helper.make_node("MaxPool", ["c"], ["y"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)]
    path = save(tmp_path, nodes, [vi("x", [1, 3, 9, 10])], [vi("y", [1, 4, 3, 3])], [w])
    g = load_model(path)
    assert g.nodes[0].attrs["pads"] == [1, 0, 1, 1] and g.values["c"].shape == (1, 4, 5, 5)
    assert g.values["y"].shape == (1, 4, 3, 3)
    x = np.random.default_rng(3).standard_normal((1, 3, 9, 10)).astype(np.float32)
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(reference.run(g, {"x": x})["y"], expected, rtol=1e-4, atol=1e-5)


def test_opset_outside_the_supported_range_is_refused(tmp_path):
    path = save(tmp_path, [helper.make_node("Relu", ["x"], ["y"])], [vi("x", [2])], [vi("y", [2])], opset=5)
    with pytest.raises(ModelError, match="opset 5; tunaflow imports opsets 6 to"):
        load_model(path)


@pytest.mark.parametrize("name", ["cnn", "mlp", "transformer"])
def test_bundled_models_match_onnxruntime(name):
    path = MODELS / f"{name}.onnx"
    g = load_model(path)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {v.name: np.random.default_rng(4).standard_normal(v.shape).astype(np.float32) for v in g.inputs}
    expected = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))
    assert {v.name: v.shape for v in g.outputs} == {k: v.shape for k, v in expected.items()}
    for graph in (g, optimize(g)):
        got = reference.run(graph, feeds)
        for k, v in expected.items():
            np.testing.assert_allclose(got[k], v, rtol=1e-3, atol=1e-5)


def test_every_importable_backend_case_infers_its_shapes_and_matches_expected_outputs():
    cases, skipped = discover()
    assert len(cases) >= 90, f"only {len(cases)} importable backend cases"
    assert "pytorch-converted/test_Conv2d_depthwise" in {c.id for c in cases}
    assert "Conv3d" in "".join(skipped) and "unsupported operator" in skipped["simple/test_sequence_model1"]
    assert {"pytorch-converted/test_SELU", "pytorch-converted/test_PReLU_2d_multiparam",
            "pytorch-converted/test_ConvTranspose2d"} <= {c.id for c in cases}
    for case in cases:
        g = optimize(case.graph())
        assert {v.name: v.shape for v in g.outputs} == {k: v.shape for k, v in case.outputs.items()}, case.id
        got = reference.run(g, case.inputs)
        for k, v in case.outputs.items():
            np.testing.assert_allclose(got[k], v, rtol=1e-3, atol=1e-4, err_msg=case.id)


@pytest.mark.parametrize("opset", [9, 13])
def test_slice_with_negative_steps_and_pad_modes_match_onnxruntime(tmp_path, opset):
    i64 = np.int64
    if opset < 10:
        nodes = [helper.make_node("Slice", ["x"], ["s"], starts=[1, -4], ends=[100, -1], axes=[1, 2])]
        inits = []
    else:
        inits = [numpy_helper.from_array(np.array(v, i64), n) for n, v in
                 (("st", [-1, 1, 7]), ("en", [-100, 100, 1]), ("ax", [2, 1, 3]), ("sp", [-2, 1, -3]))]
        nodes = [helper.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["s"])]
    if opset < 11:
        nodes.append(helper.make_node("Pad", ["s"], ["y"], mode="reflect", pads=[0, 0, 1, 1, 0, 0, 1, 1]))
    else:
        inits.append(numpy_helper.from_array(np.array([0, 0, 1, 2, 0, -1, 1, 0], i64), "pads"))
        nodes.append(helper.make_node("Pad", ["s", "pads"], ["y"], mode="edge"))
    path = save(tmp_path, nodes, [vi("x", [2, 5, 6, 8])], [vi("y", None)], inits, opset=opset)
    g = load_model(path)
    x = np.random.default_rng(5).standard_normal((2, 5, 6, 8)).astype(np.float32)
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert g.outputs[0].shape == expected.shape
    np.testing.assert_array_equal(reference.run(g, {"x": x})["y"], expected)


@pytest.mark.parametrize("name", ["shufflenet", "squeezenet"])
def test_real_architectures_shipped_with_onnx_match_onnxruntime_after_optimisation(tmp_path, name):
    """The package's 'light' models generate their weights with ConstantOfShape (all equal values):
    random weights instead make the comparison mean something."""
    from testing.backend_cases import DATA

    model = onnx.load(str(DATA / "light" / f"light_{name}.onnx"))
    rng = np.random.default_rng(6)
    consts = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    kept = []
    for node in model.graph.node:
        if node.op_type == "ConstantOfShape":
            shape = tuple(int(d) for d in consts[node.input[0]])
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
            value = rng.uniform(-1, 1, shape) / np.sqrt(fan_in) if len(shape) > 1 else rng.uniform(0.5, 1.5, shape)
            model.graph.initializer.append(numpy_helper.from_array(value.astype(np.float32), node.output[0]))
        else:
            kept.append(node)
    del model.graph.node[:]
    model.graph.node.extend(kept)
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    g = optimize(load_model(path))
    assert sum(n.task is not None for n in g.nodes) >= 26
    feeds = {v.name: rng.standard_normal(v.shape).astype(np.float32) for v in g.inputs}
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    expected = sess.run(None, {i.name: feeds[i.name] for i in sess.get_inputs() if i.name in feeds})[0]
    np.testing.assert_allclose(reference.run(g, feeds)[g.outputs[0].name], expected, rtol=1e-3, atol=1e-6)


def test_secondary_outputs_are_fine_unless_something_reads_them(tmp_path):
    pool = helper.make_node("MaxPool", ["x"], ["p", "idx"], kernel_shape=[2, 2], name="pool")
    path = save(tmp_path, [pool, helper.make_node("Relu", ["p"], ["y"])], [vi("x", [1, 2, 4, 4])],
                [vi("y", [1, 2, 3, 3])])
    assert [n.op for n in load_model(path).nodes] == ["MaxPool", "Relu"]
    path = save(tmp_path, [pool, helper.make_node("Relu", ["p"], ["y"])], [vi("x", [1, 2, 4, 4])],
                [vi("y", [1, 2, 3, 3]), vi("idx", [1, 2, 3, 3], TensorProto.INT64)])
    with pytest.raises(ModelError, match="MaxPool 'pool': the Indices output is not supported"):
        load_model(path)


def test_a_causal_mask_built_from_shapes_folds_to_a_constant(tmp_path):
    i64 = np.int64
    inits = [numpy_helper.from_array(np.array(v, dtype), n) for n, v, dtype in (
        ("one", 1, i64), ("zero", 0, i64), ("ax0", [0], i64), ("ax1", [1], i64), ("neg", -1e4, np.float32),
        ("nothing", 0.0, np.float32))]
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "one"], ["n"], axis=0),
             helper.make_node("Range", ["zero", "n", "one"], ["idx"]),
             helper.make_node("Unsqueeze", ["idx", "ax0"], ["row"]),
             helper.make_node("Unsqueeze", ["idx", "ax1"], ["col"]),
             helper.make_node("Less", ["col", "row"], ["future"]), helper.make_node("Not", ["future"], ["past"]),
             helper.make_node("Where", ["past", "nothing", "neg"], ["mask"]),
             helper.make_node("Size", ["mask"], ["count"]), helper.make_node("Cast", ["count"], ["countf"], to=1),
             helper.make_node("Div", ["mask", "countf"], ["scaled"]),
             helper.make_node("Add", ["x", "scaled"], ["y"])]
    path = save(tmp_path, nodes, [vi("x", [2, 5, 5])], [vi("y", [2, 5, 5])], inits, opset=13)
    g = load_model(path)
    assert [n.op for n in g.nodes] == ["Add"]
    x = np.random.default_rng(8).standard_normal((2, 5, 5)).astype(np.float32)
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(reference.run(g, {"x": x})["y"], expected, rtol=1e-6)


def test_tile_repeats_must_be_one_count_per_axis(tmp_path):
    reps = numpy_helper.from_array(np.array([1, 2], np.int64), "reps")
    path = save(tmp_path, [helper.make_node("Tile", ["x", "reps"], ["y"], name="tile")], [vi("x", [2, 3, 4])],
                [vi("y", [2, 6, 4])], [reps], opset=13)
    with pytest.raises(ModelError, match=r"Tile 'tile': repeats \[1, 2\] must be one non-negative count per axis "
                                         r"of its 3-D input"):
        load_model(path)


def test_conv_transpose_output_shape_beyond_its_reach_is_named(tmp_path):
    w = numpy_helper.from_array(np.zeros((2, 2, 3, 3), np.float32), "w")
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="up", strides=[2, 2], output_shape=[20, 20])
    path = save(tmp_path, [node], [vi("x", [1, 2, 4, 4])], [vi("y", [1, 2, 20, 20])], [w])
    with pytest.raises(ModelError, match=r"ConvTranspose 'up': output shape \[20, 20\] exceeds the \[9, 9\]"):
        load_model(path)
