"""The build-time self-check (stages/build/verify.py): real builds, real onnxruntime, kernels broken in-process."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from typer.testing import CliRunner

from schemas import Target
from stages.build import library
from stages.build.verify import REL_TOL, VerifyError, build_verified, unrunnable
from stages.extract import load_model
from stages.graph.passes import optimize
from stages.runtime import load
from stages.runtime.loader import host_features
from stages.templates import conv2d

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """x[1,4,12,12] → conv_a+relu_a → conv_b+relu_b → conv_c → GAP → Flatten → fc: three 3x3 convs, so the
    default build hands conv_a's and conv_b's outputs over padded (stages/build/halo.py)."""
    rng = np.random.default_rng(1)

    def init(name, shape):
        return helper.make_tensor(name, TensorProto.FLOAT, shape, rng.standard_normal(shape).astype(np.float32).ravel())

    nodes = [helper.make_node("Conv", ["x", "wa", "ba"], ["ca"], pads=[1, 1, 1, 1], name="conv_a"),
             helper.make_node("Relu", ["ca"], ["ra"], name="relu_a"),
             helper.make_node("Conv", ["ra", "wb", "bb"], ["cb"], pads=[1, 1, 1, 1], name="conv_b"),
             helper.make_node("Relu", ["cb"], ["rb"], name="relu_b"),
             helper.make_node("Conv", ["rb", "wc"], ["cc"], pads=[1, 1, 1, 1], name="conv_c"),
             helper.make_node("GlobalAveragePool", ["cc"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], transB=1, name="fc")]
    inits = [init("wa", (8, 4, 3, 3)), init("ba", (8,)), init("wb", (16, 8, 3, 3)), init("bb", (16,)),
             init("wc", (16, 16, 3, 3)), init("fw", (5, 16)), init("fb", (5,))]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])], inits)
    path = tmp_path_factory.mktemp("m") / "chain.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _break_conv_b(monkeypatch) -> None:
    """conv_b's kernel (the only 16x8x3x3 conv) computes with its packed weights scaled by 1.5."""
    original = conv2d.kernel_args

    def wrong(task, knobs, inputs, **layout):
        args = original(task, knobs, inputs, **layout)
        if task.inputs[1].shape == (16, 8, 3, 3):
            args[1] = args[1] * 1.5
        return args

    monkeypatch.setattr(conv2d, "kernel_args", wrong)


@pytest.fixture
def broken_conv_b(monkeypatch):
    _break_conv_b(monkeypatch)


def _build(model: Path, out: Path, **kw):
    return build_verified(model, optimize(load_model(model)), kw.pop("target", Target.host()), out, **kw)


def _siblings(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir())


def test_a_wrong_kernel_fails_the_build_naming_its_node_and_writes_no_library(model, tmp_path, broken_conv_b):
    out = tmp_path / "lib"
    with pytest.raises(VerifyError) as info:
        _build(model, out)
    msg = str(info.value)
    assert "output 'y' is off by" in msg and "onnxruntime" in msg
    assert "First diverging node: 'conv_b' (ONNX Conv 'conv_b' fused up to Relu 'relu_b'" in msg
    assert "its kernel is off by" in msg and f"{out} has no library written" in msg
    assert not out.exists() and _siblings(out) == []  # nor a staging directory left behind


def test_a_failed_check_keeps_the_previous_library_and_other_files(model, tmp_path, monkeypatch):
    out = tmp_path / "lib"
    _build(model, out)
    (out / "notes.txt").write_text("mine")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    original = conv2d.kernel_args
    monkeypatch.setattr(conv2d, "kernel_args", lambda task, knobs, inputs, **kw: [
        a * 2 if i == 1 else a for i, a in enumerate(original(task, knobs, inputs, **kw))])
    with pytest.raises(VerifyError, match=f"{out} keeps its previous library"):
        _build(model, out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before and _siblings(out) == ["lib"]
    load(out)  # still the good one, digests and all


def test_a_fault_only_in_the_padded_hand_off_is_localised_by_bisection(model, tmp_path, monkeypatch):
    """conv_b writes its output for conv_c shifted (bottom-right instead of centred in the zero border): only
    a build that keeps 'rb' internal plans that hand-off, so the all-outputs checking build is right."""
    original = library.plan_halos

    def shifted(graph, choices):
        plan = original(graph, choices)
        h = plan.halos.get("conv_b", conv2d.NO_HALO)
        t, left, b, r = h.y_pad
        if any(h.y_pad):  # planned only while 'rb' is internal
            plan.halos["conv_b"] = conv2d.Halo(h.x_padded, (0, 0, t + b, left + r))
        return plan

    monkeypatch.setattr(library, "plan_halos", shifted)
    with pytest.raises(VerifyError) as info:
        _build(model, tmp_path / "lib")
    msg = str(info.value)
    assert "Every node's output is right when the intermediate tensors are also graph outputs" in msg
    assert "node 'conv_b' (ONNX Conv 'conv_b' fused up to Relu 'relu_b') keeps its output 'rb' internal" in msg
    assert "y padded 0,0,2,2; read by 'conv_c'" in msg and "First diverging node: 'conv_c'" in msg
    assert not (tmp_path / "lib").exists()


def test_a_correct_build_passes_and_reports_the_check_and_its_cost(model, tmp_path):
    out = tmp_path / "new" / "lib"
    manifest, v = _build(model, out)
    assert v.status == "passed" and v.reference.startswith("onnxruntime ") and v.reason is None
    assert 0 < v.verify_s < manifest.build_s and 0 <= v.max_error < REL_TOL
    assert _siblings(out) == ["lib"] and {p.name for p in out.iterdir()} == {"manifest.json", "model.so", "weights.bin"}
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o777 & ~umask  # as a plain mkdir would have made it
    x = np.random.default_rng(3).standard_normal((1, 4, 12, 12)).astype(np.float32)
    import onnxruntime as ort

    want = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(load(out)(x), want, rtol=1e-3, atol=1e-4)

    (out / "notes.txt").write_text("mine")  # a rebuild replaces the library's files, nothing else
    manifest, v = _build(model, out, threads=2)
    assert v.status == "passed" and load(out).manifest.threads == 2 and (out / "notes.txt").read_text() == "mine"
    assert _siblings(out) == ["lib"]


def test_without_onnxruntime_onnx_reference_evaluator_checks(model, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime → ImportError
    _, v = _build(model, tmp_path / "good")
    assert v.status == "passed" and v.reference == f"onnx.reference {onnx.__version__}"
    _break_conv_b(monkeypatch)
    with pytest.raises(VerifyError, match=r"onnx\.reference .*\n.*First diverging node: 'conv_b'"):
        _build(model, tmp_path / "bad")


def test_a_reference_that_cannot_run_the_model_fails_the_build_clearly(model, tmp_path, monkeypatch):
    import onnxruntime

    def refuse(*args, **kw):
        raise onnxruntime.capi.onnxruntime_pybind11_state.NotImplemented("no kernel for op Foo")

    monkeypatch.setattr(onnxruntime, "InferenceSession", refuse)
    with pytest.raises(VerifyError, match=f"the reference could not run {model} to check the library: "
                                          "NotImplemented: no kernel for op Foo\n.* has no library written"):
        _build(model, tmp_path / "lib")
    assert not (tmp_path / "lib").exists()


def test_no_verify_skips_the_check(model, tmp_path, broken_conv_b):
    _, v = _build(model, tmp_path / "lib", verify=False)
    assert v.status == "skipped" and v.reason == "--no-verify" and v.reference is None and v.verify_s == 0
    assert (tmp_path / "lib" / "model.so").is_file()  # built, wrong kernel and all: nobody checked


def test_a_target_this_machine_cannot_run_skips_with_the_reason(model, tmp_path):
    assert unrunnable(Target.host()) is None and unrunnable(Target.parse("x86-64-avx2")) is None
    assert "aarch64-unknown-linux-gnu does not run on this x86_64 machine" in unrunnable(Target.parse("aarch64"))
    lacking = next(f for f in ("+sse4a", "+amx-tile", "+avx512vp2intersect", "+tbm") if f not in host_features())
    target = Target.parse(f"llvm -mtriple=x86_64-unknown-linux-gnu -mcpu=x86-64 -mattr={lacking}")
    _, v = _build(model, tmp_path / "lib", target=target)
    assert v.status == "skipped" and f"needs features this CPU lacks ({lacking[1:]})" in v.reason
    assert (tmp_path / "lib" / "model.so").is_file()


def test_cli_build_checks_reports_and_can_skip(model, tmp_path):
    def tunaflow(*args):
        return subprocess.run([sys.executable, "-m", "tunaflow", "build", str(model), *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)

    r = tunaflow("-o", str(tmp_path / "lib"), "--json")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["verify"]["status"] == "passed" and s["verify"]["reference"].startswith("onnxruntime")
    assert 0 < s["verify"]["verify_s"] < s["build_s"] and s["verify"]["max_error"] < REL_TOL
    r = tunaflow("-o", str(tmp_path / "lib"))
    assert r.returncode == 0 and "verified : matches onnxruntime" in r.stdout and "of the build" in r.stdout
    r = tunaflow("-o", str(tmp_path / "lib2"), "--no-verify", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["verify"]["reason"] == "--no-verify"


def test_cli_build_fails_on_a_wrong_kernel(model, tmp_path, broken_conv_b):
    from tunaflow.cli import app

    r = CliRunner().invoke(app, ["build", str(model), "-o", str(tmp_path / "lib")])
    assert r.exit_code != 0 and "First diverging node: 'conv_b'" in r.output and not (tmp_path / "lib").exists()
    r = CliRunner().invoke(app, ["build", str(model), "-o", str(tmp_path / "lib"), "--no-verify", "--json"])
    assert r.exit_code == 0, r.output


def test_tune_checks_its_build_directly_and_in_the_prefect_flow(model, tmp_path, prefect_server, monkeypatch):
    from flows.tune_model import tune_model
    from schemas import MeasureOptions, TuningOptions
    from stages.pipeline.model import tune_model as direct

    options = TuningOptions(n_trials=3, batch_size=3, tuner="random", measure=MeasureOptions(threads=1))
    r, _ = direct(model, Target.host(), options, tmp_path / "log", tmp_path / "direct", budget=3)
    assert r.build["verify"]["status"] == "passed" and r.build["verify"]["verify_s"] > 0
    r = tune_model(str(model), Target.host(), options, str(tmp_path / "log"), str(tmp_path / "flow"), budget=3,
                   compare_default=False)
    assert r.build["verify"]["status"] == "passed" and (tmp_path / "flow" / "model.so").is_file()
    _break_conv_b(monkeypatch)  # the log is complete: the rerun only builds, in this process
    with pytest.raises(VerifyError, match="First diverging node: 'conv_b'"):
        tune_model(str(model), Target.host(), options, str(tmp_path / "log"), str(tmp_path / "bad"), budget=3,
                   compare_default=False)
    assert not (tmp_path / "bad").exists()


def _imprecise_reference(monkeypatch, noise: float) -> None:
    """A reference whose float32 answer is `noise` (of its max abs) off the true one, as onnxruntime's is on an
    ill-conditioned model (EfficientNet-B3 with random weights: 0.42 off a float64 evaluation), while its two
    kernel sets agree with each other."""
    from stages.build import verify

    real = verify.reference_runner

    def noisy(model, threads):
        name, run = real(model, threads)

        def run_noisy(feeds, names):
            out = run(feeds, names)
            rng = np.random.default_rng(5)
            return {k: (v + noise * np.abs(v).max() * rng.choice([-1, 1], v.shape)).astype(v.dtype)
                    for k, v in out.items()}
        return name, run_noisy

    monkeypatch.setattr(verify, "reference_runner", noisy)
    monkeypatch.setattr(verify, "reference_spread", lambda *a, **k: {})


def test_an_imprecise_reference_is_judged_against_a_float64_evaluation(model, tmp_path, monkeypatch):
    from stages.build.verify import SPREAD_FLOAT64

    _imprecise_reference(monkeypatch, 0.05)
    _, v = _build(model, tmp_path / "lib")
    assert v.status == "passed" and v.spread_basis == SPREAD_FLOAT64
    assert 0.04 < v.spread < 0.06 and v.max_error < REL_TOL  # the library, against the float64 answer


def test_a_wrong_kernel_still_fails_against_the_float64_evaluation(model, tmp_path, monkeypatch, broken_conv_b):
    _imprecise_reference(monkeypatch, 0.01)
    with pytest.raises(VerifyError, match=r"output 'y' is off by 0\.[1-9]\d* of its max abs reference value "
                                          r"\(tolerance 0\.02\)"):
        _build(model, tmp_path / "lib")


def _vanishing_model(path: Path, gain: float) -> Path:
    """x * 1e-20 -> conv (weights * `gain`) -> conv: with gain 1e-19 the products are float32 denormals, which the
    library flushes to zero and onnxruntime keeps (an untrained MobileViT's activations fall as low)."""
    rng = np.random.default_rng(4)
    w = [helper.make_tensor(n, TensorProto.FLOAT, (4, 4, 3, 3), (rng.standard_normal((4, 4, 3, 3)) * g)
                            .astype(np.float32).ravel()) for n, g in (("w1", gain), ("w2", 1.0))]
    nodes = [helper.make_node("Mul", ["x", "tiny"], ["t"]), helper.make_node("Conv", ["t", "w1"], ["c"], pads=[1] * 4),
             helper.make_node("Conv", ["c", "w2"], ["y"], pads=[1] * 4, name="second")]
    graph = helper.make_graph(nodes, "vanish", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [*w, helper.make_tensor("tiny", TensorProto.FLOAT, (), [1e-20])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_outputs_that_vanish_into_denormals_pass_within_the_flush_floor(tmp_path, monkeypatch):
    """The reference's outputs here are ~1e-38, the library's 0: float32 cannot tell them apart once denormals
    are flushed, so the check allows 1e-30 absolute there (it once failed the build, blaming a conv)."""
    path = _vanishing_model(tmp_path / "vanish.onnx", 1e-19)
    import onnxruntime as ort

    x = np.random.default_rng(0).standard_normal((1, 4, 8, 8)).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert 0 < np.abs(want).max() < 1e-36
    manifest, v = _build(path, tmp_path / "lib")
    assert v.status == "passed" and v.max_error < REL_TOL
    scaled = tmp_path / "normal"  # the same chain at a normal scale, one kernel broken: still a failure
    scaled.mkdir()
    _vanishing_model(scaled / "m.onnx", 1e19)
    original = conv2d.kernel_args
    monkeypatch.setattr(conv2d, "kernel_args", lambda task, knobs, inputs, **kw: [
        a * 1.5 if i == 1 else a for i, a in enumerate(original(task, knobs, inputs, **kw))])
    with pytest.raises(VerifyError, match="First diverging node"):
        _build(scaled / "m.onnx", scaled / "lib")
