"""Resize and Upsample against onnxruntime: every mode, coordinate transform and nearest rounding, up- and
downscaled by integer and fractional factors, from `scales` or `sizes` (opset 18's `axes` and aspect policies),
built into a library and run by the numpy reference; Resize between two convs on two threads; what is refused.

torchvision's segmentation models (bilinear, half_pixel, `sizes`) and U-Net / FPN / YOLO upsampling (nearest,
asymmetric, floor, `scales`) were refused as an unsupported operator."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from schemas import Target
from stages.build.library import build_library
from stages.extract import ModelError, load_model
from stages.graph import reference
from stages.graph.passes import optimize
from stages.runtime import load

ort.set_default_logger_severity(3)  # tf_half_pixel_for_nn is deprecated, and onnxruntime says so per node
F, I64 = TensorProto.FLOAT, TensorProto.INT64
N = helper.make_node
X_SHAPE = (2, 3, 5, 7)
TRANSFORMS = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_half_pixel_for_nn",
              "half_pixel_symmetric"]
ROUNDINGS = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
# (tag, scales, sizes): up by integers, down, fractional (scales are not output / input then), H up and W down,
# and one axis left alone (its rows or columns copied as they are)
RESIZES = [("up", [1, 1, 2, 3], None), ("down", [1, 1, 0.6, 0.45], None), ("frac", [1, 1, 1.7, 2.3], None),
           ("sizes", None, [2, 3, 9, 4]), ("rows", [1, 1, 2, 1], None), ("cols", None, [2, 3, 5, 11])]


def _model(nodes, inputs, outputs, inits=(), opset: int = 19) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "resize", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                              [helper.make_tensor_value_info(n, t, None) for n, t in outputs], list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _const(name: str, value, dtype) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


def _resize(out: str, scales, sizes, inits: list, src: str = "x", axes=None, **attrs) -> onnx.NodeProto:
    ins = [src, ""]
    if scales is not None:
        inits.append(_const(f"{out}_scales", scales, np.float32))
        ins.append(f"{out}_scales")
    if sizes is not None:
        ins += ["", f"{out}_sizes"] if scales is None else [f"{out}_sizes"]
        inits.append(_const(f"{out}_sizes", sizes, np.int64))
    return N("Resize", ins, [out], name=out, **({"axes": axes} if axes else {}), **attrs)


def _every_resize() -> onnx.ModelProto:
    nodes, inits, outs = [], [], []
    for mode, rounding in [*(("nearest", r) for r in ROUNDINGS), ("linear", "round_prefer_floor")]:
        for transform in TRANSFORMS:
            for tag, scales, sizes in RESIZES:
                out = f"{mode}_{transform}_{rounding}_{tag}"
                nodes.append(_resize(out, scales, sizes, inits, mode=mode, coordinate_transformation_mode=transform,
                                     nearest_mode=rounding))
                outs.append(out)
    for mode in ("nearest", "linear"):  # opset 18: sizes or scales for some axes, and the aspect policies
        for out, scales, sizes, axes, policy in [
                (f"{mode}_not_larger", None, [10, 12], [2, 3], "not_larger"),
                (f"{mode}_not_smaller", None, [14, 4], [3, 2], "not_smaller"),
                (f"{mode}_axes_scales", [0.5, 1.5], None, [3, 2], "stretch")]:
            nodes.append(_resize(out, scales, sizes, inits, axes=axes, mode=mode, keep_aspect_ratio_policy=policy))
            outs.append(out)
    return _model(nodes, [("x", F, X_SHAPE)], [(o, F) for o in outs], inits)


def _onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))


def _assert_matches(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    """Nearest copies exactly; linear blends up to float32 rounding."""
    assert set(got) == set(want)
    for name, ref in want.items():
        assert got[name].shape == ref.shape, (name, got[name].shape, ref.shape)
        if name.startswith("nearest"):
            np.testing.assert_array_equal(got[name], ref, err_msg=name)
        else:
            np.testing.assert_allclose(got[name], ref, rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.fixture(scope="module")
def every_resize(tmp_path_factory):
    model = _every_resize()
    x = np.random.default_rng(0).standard_normal(X_SHAPE).astype(np.float32)
    graph = optimize(load_model(model))
    out = tmp_path_factory.mktemp("resize") / "lib"
    build_library(graph, Target.host(), out)
    return model, graph, load(out), {"x": x}


def test_every_mode_transform_and_rounding_matches_onnxruntime(every_resize):
    model, _, library, feeds = every_resize
    _assert_matches(library.run(**feeds), _onnxruntime(model, feeds))


def test_the_reference_interpreter_matches_onnxruntime(every_resize):
    model, graph, _, feeds = every_resize
    assert {n.op for n in graph.nodes} == {"Resize"}
    _assert_matches(reference.run(graph, feeds), _onnxruntime(model, feeds))


def test_a_coordinate_a_float32_rounding_away_from_half_way_is_a_tie():
    """20 -> 6 pixels (half_pixel) puts output 4 at exactly 14.5, which float32 computes as 14.4999994: still a
    tie, so round_prefer_ceil reads pixel 15 as onnxruntime does (4.5 and 15 likewise; 7 -> 4 pixels, asymmetric:
    3.5 as 3.4999998)."""
    inits: list = []
    nodes = [_resize("wide", None, [1, 1, 1, 6], inits, mode="nearest", nearest_mode="round_prefer_ceil"),
             _resize("short", None, [1, 1, 1, 4], inits, src="s", mode="nearest", nearest_mode="round_prefer_ceil",
                     coordinate_transformation_mode="asymmetric")]
    model = _model(nodes, [("x", F, (1, 1, 1, 20)), ("s", F, (1, 1, 1, 7))], [("wide", F), ("short", F)], inits)
    feeds = {"x": np.arange(20, dtype=np.float32).reshape(1, 1, 1, 20),
             "s": np.arange(7, dtype=np.float32).reshape(1, 1, 1, 7)}
    got = reference.run(load_model(model), feeds)
    np.testing.assert_array_equal(got["wide"].ravel(), [1, 5, 8, 11, 15, 18])
    np.testing.assert_array_equal(got["short"].ravel(), [0, 2, 4, 5])
    _assert_matches({f"nearest_{k}": v for k, v in got.items()},
                    {f"nearest_{k}": v for k, v in _onnxruntime(model, feeds).items()})


@pytest.mark.parametrize(("opset", "op"), [(7, "Upsample"), (9, "Upsample"), (10, "Resize")])
def test_upsample_and_resize_10_use_asymmetric_coordinates_and_simple_rounding(tmp_path, opset, op):
    """Upsample (scales an attribute before opset 9, an input from 9) and Resize-10 floor nearest coordinates when
    upscaling and ceil them when downscaling (Resize-10)."""
    nodes, inits, outs = [], [], []
    cases = [("up", [1, 1, 2, 3]), ("frac", [1, 1, 1.5, 2.5])] + ([("down", [1, 1, 0.6, 0.45])] if op == "Resize"
                                                                   else [])
    for mode in ("nearest", "linear"):
        for tag, scales in cases:
            out = f"{mode}_{tag}"
            if opset < 9:
                nodes.append(N(op, ["x"], [out], mode=mode, scales=[float(s) for s in scales]))
            else:
                inits.append(_const(f"{out}_scales", scales, np.float32))
                nodes.append(N(op, ["x", f"{out}_scales"], [out], mode=mode))
            outs.append(out)
    model = _model(nodes, [("x", F, X_SHAPE)], [(o, F) for o in outs], inits, opset=opset)
    feeds = {"x": np.random.default_rng(opset).standard_normal(X_SHAPE).astype(np.float32)}
    graph = optimize(load_model(model))
    build_library(graph, Target.host(), tmp_path / "lib")
    want = _onnxruntime(model, feeds)
    _assert_matches(load(tmp_path / "lib").run(**feeds), want)
    _assert_matches(reference.run(graph, feeds), want)


def test_resize_between_convs_on_two_threads_matches_onnxruntime(tmp_path):
    """conv -> Resize -> conv, bilinear and nearest: the convs hand their plain NCHW tensors to the generated op,
    which splits its 1024 output rows over the worker pool."""
    rng = np.random.default_rng(3)
    inits = [_const("w1", rng.standard_normal((16, 8, 3, 3)) / 9, np.float32),
             _const("w2", rng.standard_normal((8, 16, 3, 3)) / 12, np.float32),
             _const("b2", rng.standard_normal(8), np.float32)]
    nodes = [N("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]), N("Relu", ["c1"], ["r1"])]
    for mode, transform, scales, sizes in [("linear", "half_pixel", None, [1, 16, 64, 64]),
                                           ("nearest", "asymmetric", [1, 1, 2, 2], None)]:
        nodes += [_resize(f"up_{mode}", scales, sizes, inits, src="r1", mode=mode, nearest_mode="floor",
                          coordinate_transformation_mode=transform),
                  N("Conv", [f"up_{mode}", "w2", "b2"], [f"{mode}_y"], pads=[1, 1, 1, 1])]
    model = _model(nodes, [("x", F, (1, 8, 32, 32))], [("linear_y", F), ("nearest_y", F)], inits)
    feeds = {"x": rng.standard_normal((1, 8, 32, 32)).astype(np.float32)}
    build_library(optimize(load_model(model)), Target.host(), tmp_path / "lib", threads=2)
    got, want = load(tmp_path / "lib").run(**feeds), _onnxruntime(model, feeds)
    for name, ref in want.items():
        np.testing.assert_allclose(got[name], ref, rtol=1e-4, atol=1e-4, err_msg=name)


def test_nearest_copies_integer_tensors(tmp_path):
    inits: list = []
    model = _model([_resize("y", [1, 1, 2, 1.5], None, inits, mode="nearest")],
                   [("x", TensorProto.INT32, (1, 2, 3, 4))], [("y", TensorProto.INT32)], inits)
    feeds = {"x": np.arange(24, dtype=np.int32).reshape(1, 2, 3, 4)}
    build_library(optimize(load_model(model)), Target.host(), tmp_path / "lib")
    got = load(tmp_path / "lib").run(**feeds)["y"]
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, _onnxruntime(model, feeds)["y"])


def test_negative_axes_count_from_the_end():
    """(onnxruntime 1.32 ignores negative axes under an aspect policy, so this is checked on the import alone.)"""
    def attrs(axes):
        inits: list = []
        node = _resize("r", None, [14, 4], inits, axes=axes, keep_aspect_ratio_policy="not_smaller")
        return load_model(_model([node], [("x", F, X_SHAPE)], [("r", F)], inits)).nodes[0].attrs

    assert attrs([-1, -2]) == attrs([3, 2])
    assert attrs([-1, -2])["sizes"] == [2, 3, 10, 14]


def test_a_resize_of_a_constant_folds_at_import():
    inits = [_const("c", np.arange(6).reshape(1, 1, 2, 3), np.float32)]
    model = _model([_resize("big", [1, 1, 2, 2], None, inits, src="c", mode="linear"), N("Add", ["x", "big"], ["y"])],
                   [("x", F, (1, 1, 4, 6))], [("y", F)], inits)
    graph = load_model(model)
    assert [n.op for n in graph.nodes] == ["Add"]
    feeds = {"x": np.zeros((1, 1, 4, 6), np.float32)}
    np.testing.assert_allclose(reference.run(graph, feeds)["y"], _onnxruntime(model, feeds)["y"], rtol=1e-6)


@pytest.mark.parametrize(("attrs", "scales", "sizes", "shape", "message"), [
    ({"mode": "cubic"}, [1, 1, 2, 2], None, X_SHAPE,
     r"Resize 'r': mode 'cubic' is not supported \(nearest and linear are\)"),
    ({"coordinate_transformation_mode": "tf_crop_and_resize"}, [1, 1, 2, 2], None, X_SHAPE,
     "Resize 'r': coordinate_transformation_mode 'tf_crop_and_resize' is not supported"),
    ({"mode": "linear", "antialias": 1}, [1, 1, 0.5, 0.5], None, X_SHAPE, "Resize 'r': antialias=1 is not supported"),
    ({"exclude_outside": 1}, [1, 1, 2, 2], None, X_SHAPE, "Resize 'r': exclude_outside=1 is not supported"),
    ({"nearest_mode": "nearest"}, [1, 1, 2, 2], None, X_SHAPE, "Resize 'r': nearest_mode 'nearest' is not supported"),
    ({}, [1, 2, 2, 2], None, X_SHAPE, r"Resize 'r': only 4-D NCHW inputs resized on H and W are supported; this one "
                                      r"resizes \[2, 3, 5, 7\] to \[2, 6, 10, 14\]"),
    ({}, [1, 1, 2], None, (1, 3, 8), "Resize 'r': only 4-D NCHW inputs resized on H and W are supported"),
    ({}, [1, 1, 2, 2], [2, 3, 10, 14], X_SHAPE,
     "Resize 'r': exactly one of scales and sizes must be given, it has both"),
    ({}, [1, 1, 2], None, X_SHAPE, "Resize 'r': scales has 3 values for 4 axes of its 4-D input"),
])
def test_what_resize_cannot_run_is_refused_naming_the_node_and_attribute(attrs, scales, sizes, shape, message):
    inits: list = []
    node = _resize("r", scales, sizes, inits, **attrs)
    with pytest.raises(ModelError, match=message):
        load_model(_model([node], [("x", F, shape)], [("r", F)], inits))


def test_run_time_scales_and_linear_integers_are_refused():
    node = N("Resize", ["x", "", "s"], ["r"], name="r")
    with pytest.raises(ModelError, match=r"Resize 'r': its scales \('s'\) must be a constant, but it is computed"):
        load_model(_model([node], [("x", F, X_SHAPE), ("s", F, [4])], [("r", F)]))
    inits: list = []
    node = _resize("r", [1, 1, 2, 2], None, inits, mode="linear")
    with pytest.raises(ModelError, match="Resize 'r': mode 'linear' runs on float tensors; its input is int32"):
        load_model(_model([node], [("x", TensorProto.INT32, X_SHAPE)], [("r", TensorProto.INT32)], inits))
    with pytest.raises(ModelError, match="Upsample 'u': the experimental Upsample of opset < 7 is not supported"):
        load_model(_model([N("Upsample", ["x"], ["u"], name="u", height_scale=2.0, width_scale=2.0)],
                          [("x", F, X_SHAPE)], [("u", F)], opset=6))
