"""Loading and calling a built library: real ONNX in, onnxruntime as the judge, and every refusal."""

import json
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from schemas import Target
from stages.build.library import build_library
from stages.extract import load_model
from stages.graph.passes import optimize
from stages.graph.twins import WINOGRAD
from stages.runtime import LoadError, load

RNG = np.random.default_rng(3)


def small_model(path):
    """x[2,3,8] → Transpose → LayerNorm → Add(bias) → Softmax, and a second output Concat(x, relu(x))."""
    scale = helper.make_tensor("scale", TensorProto.FLOAT, [3], RNG.uniform(0.5, 1.5, 3).astype(np.float32))
    bias = helper.make_tensor("bias", TensorProto.FLOAT, [3], RNG.uniform(-1, 1, 3).astype(np.float32))
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1]),
             helper.make_node("LayerNormalization", ["t", "scale", "bias"], ["ln"], axis=-1),
             helper.make_node("Add", ["ln", "bias"], ["a"]),
             helper.make_node("Softmax", ["a"], ["y"], axis=1),
             helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Concat", ["x", "r"], ["z"], axis=0)]
    graph = helper.make_graph(nodes, "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8, 3]),
                               helper.make_tensor_value_info("z", TensorProto.FLOAT, [4, 3, 8])],
                              [scale, bias])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("rt")
    model = small_model(root / "small.onnx")
    build_library(optimize(load_model(model)), Target.host(), root / "lib")
    return model, root / "lib"


def test_outputs_match_onnxruntime(built):
    import onnxruntime as ort

    model_path, lib = built
    x = RNG.standard_normal((2, 3, 8)).astype(np.float32)
    model = load(lib)
    y, z = model(x)
    ry, rz = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(y, ry, rtol=1e-3, atol=1e-5)
    np.testing.assert_allclose(z, rz, rtol=1e-3, atol=1e-5)
    assert set(model.run(x=x)) == {"y", "z"}
    assert len(model.bench(5, x)) == 5
    frozen = x.copy()
    frozen.flags.writeable = False  # its address comes another way: the call must read the same data
    np.testing.assert_array_equal(model(frozen)[0], y)
    np.testing.assert_array_equal(model(np.asfortranarray(x))[0], y)


def test_wrong_inputs_are_refused(built):
    model = load(built[1])
    with pytest.raises(LoadError, match=r"must have shape \[2, 3, 8\], got \[2, 3, 9\]"):
        model(np.zeros((2, 3, 9), np.float32))
    with pytest.raises(LoadError, match="must be float32, got float64"):
        model(np.zeros((2, 3, 8)))
    with pytest.raises(LoadError, match="inputs missing"):
        model.run(w=np.zeros((2, 3, 8), np.float32))


def test_tampered_artifact_is_refused(built, tmp_path):
    import shutil

    lib = tmp_path / "lib"
    shutil.copytree(built[1], lib)
    data = bytearray((lib / "weights.bin").read_bytes())
    data[0] ^= 0xFF
    (lib / "weights.bin").write_bytes(bytes(data))
    with pytest.raises(LoadError, match="weights.bin does not match the manifest"):
        load(lib)
    (lib / "model.so").unlink()
    with pytest.raises(LoadError, match="model.so is missing"):
        load(lib)
    with pytest.raises(LoadError, match="no manifest.json"):
        load(tmp_path)


def test_a_cpu_lacking_the_targets_features_is_refused(built, tmp_path):
    from stages.runtime.loader import host_features

    host = Target.host()
    absent = next((f for f in ("amx-tile", "avx512fp16", "sha512", "amx-complex") if f"+{f}" not in host_features()),
                  None)
    if absent is None:
        pytest.skip("this CPU has every candidate feature")
    other = host.model_copy(update={"features": host.features.replace(f"-{absent}", "") + f",+{absent}"})
    other = Target.model_validate(other.model_dump())
    build_library(optimize(load_model(built[0])), other, tmp_path / "lib")
    assert f"+{absent}" in json.loads((tmp_path / "lib" / "manifest.json").read_text())["target"]["features"]
    with pytest.raises(LoadError, match=f"needs features this CPU lacks: {absent}"):
        load(tmp_path / "lib")


@pytest.mark.parametrize("name,threads", [("cnn", 1), ("cnn", 2), ("mlp", 1), ("transformer", 1), ("transformer", 2)])
def test_bundled_models_match_onnxruntime(name, threads, tmp_path):
    """Threaded kernels too, and many calls in a row (workspace reuse) must stay right."""
    import onnxruntime as ort

    from tunaflow.commands.demo import DATA

    path = DATA / "models" / f"{name}.onnx"
    manifest = build_library(optimize(load_model(path)), Target.host(), tmp_path / "lib", threads=threads)
    if name == "cnn":  # two conv pairs hand over padded tensors (stages/build/halo.py); the 16x32x32 3x3 convs
        # run Winograd's default (`winograd_default_wins`), which keeps plain tensors
        layouts = {op.node: op.layout for op in manifest.ops if op.layout}
        assert layouts["Conv_64"] == "y padded 1,1,1,1" and layouts["Conv_75"] == "x padded" and len(layouts) == 4
        assert {op.task.split("(")[0] for op in manifest.ops if op.node in ("Conv_16", "Conv_27")} == {WINOGRAD}
        from stages.report.summary import build_summary

        assert build_summary(manifest, tmp_path / "lib")["padded_hand_offs"] == 2
    model = load(tmp_path / "lib")
    feeds = {i.name: RNG.standard_normal(i.shape).astype(np.float32) for i in model.inputs}
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    for _ in range(50):
        for got, expected in zip(model.run(**feeds).values(), want, strict=True):
            np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-4)


def test_compare_keeps_each_rounds_median_and_ratios_pair_rounds():
    from stages.runtime.compare import LOAD_WARMUP_S, compare, paired_ratio, ratio_quartiles

    calls = {"a": 0, "b": 0}

    def call(name):
        calls[name] += 1

    stats = compare({"a": lambda: call("a"), "b": lambda: call("b")}, number=4, rounds=3, warmup=1)
    assert calls == {"a": 15, "b": 15} and all(len(s["round_ms"]) == 3 and s["calls"] == 12 for s in stats.values())
    # Under load each turn warms up for LOAD_WARMUP_S (at least `warmup` calls) instead of waiting idle.
    calls.update(a=0, b=0)
    slow = {"a": lambda: (call("a"), time.sleep(0.001)), "b": lambda: call("b")}
    stats = compare(slow, number=4, rounds=2, warmup=1, idle_between=False)
    assert 2 * (4 + 1) < calls["a"] <= 2 * (4 + 1000 * LOAD_WARMUP_S + 1) and calls["b"] > 100
    # A machine twice as slow in the last round: the per-round ratio is still 2.
    drift = {"a": {"round_ms": [2.0, 2.0, 4.0]}, "b": {"round_ms": [1.0, 1.0, 2.0]}}
    assert paired_ratio(drift, "a", "b") == 2.0 and paired_ratio(drift, "b", "a") == 0.5
    spread = {"a": {"round_ms": [1.0, 2.0, 3.0, 4.0, 5.0]}, "b": {"round_ms": [1.0] * 5}}
    assert ratio_quartiles(spread, "a", "b") == (2.0, 4.0)


@pytest.mark.parametrize("attrs,x_shape,w_shape,out_hw", [
    (dict(strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1]), (1, 4, 5, 6), (4, 3, 3, 3), (10, 12)),
    (dict(strides=[2, 3], dilations=[2, 1], group=2, auto_pad="SAME_UPPER"), (2, 4, 4, 5), (4, 3, 3, 3), (8, 15)),
    (dict(strides=[3, 2], output_shape=[11, 9]), (1, 3, 4, 4), (3, 2, 2, 3), (11, 9)),
])
def test_conv_transpose_matches_onnxruntime(attrs, x_shape, w_shape, out_hw, tmp_path):
    """Output padding, groups with dilation and SAME_UPPER, and an explicit output_shape; with a bias."""
    import onnxruntime as ort

    m = w_shape[1] * attrs.get("group", 1)
    inits = [helper.make_tensor(n, TensorProto.FLOAT, a.shape, a.ravel()) for n, a in (
        ("w", RNG.standard_normal(w_shape).astype(np.float32)), ("b", RNG.standard_normal(m).astype(np.float32)))]
    graph = helper.make_graph([helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], **attrs)], "ct",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [x_shape[0], m, *out_hw])], inits)
    path = tmp_path / "ct.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    build_library(optimize(load_model(path)), Target.host(), tmp_path / "lib", threads=2)
    x = RNG.standard_normal(x_shape).astype(np.float32)
    got = load(tmp_path / "lib")(x)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert got.shape == (x_shape[0], m, *out_hw)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_model_runs_with_denormals_as_zero_and_gives_the_caller_its_mode_back(tmp_path, threads):
    """Denormal operands cost an FMA ~100x (EfficientNet-B0's SE blocks: 270 -> 36 ms once flushed): the
    library treats them as zero inside, in its workers too, and restores the caller's mode on return."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 16, 16])
    w = helper.make_tensor("w", TensorProto.FLOAT, [32, 32, 1, 1], np.eye(32, dtype=np.float32).ravel())
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Mul", ["c", "k"], ["y"])]
    k = helper.make_tensor("k", TensorProto.FLOAT, [1], [0.5])
    graph = helper.make_graph(nodes, "denormal", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [w, k])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    build_library(optimize(load_model(tmp_path / "m.onnx")), Target.host(), tmp_path / "lib", threads=threads)
    tiny = np.finfo(np.float32).tiny
    feed = np.full((1, 32, 16, 16), 3.0, dtype=np.float32)
    feed[0, :, :8] = tiny / 4  # denormal inputs: read as zero
    y = load(tmp_path / "lib")(feed)
    assert not y[0, :, :8].any() and np.all(y[0, :, 8:] == 1.5)
    assert np.float32(tiny) / np.float32(4) == np.float32(tiny / 4) > 0  # numpy still sees denormals
