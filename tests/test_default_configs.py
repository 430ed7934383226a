"""Every template's default config is one its own space accepts, for every task the template accepts:
a wide hypothesis sweep of conv2d and GEMM-family tasks on a 16-lane, an 8-lane and the host target
(no compilation), real compiles of a seeded sample against the numpy reference, and the CLI on a
model whose 96-channel 3x3 conv used to crash the default build."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from typer.testing import CliRunner

from schemas.target import Target, preset
from schemas.task import parse_epilogue
from stages.build.library import build_library
from stages.codegen.compile import compile_ir
from stages.codegen.jit import LoadedKernel
from stages.extract import load_model
from stages.graph.passes import optimize
from stages.graph.twins import winograd_serves, winograd_twin
from stages.measure.check import compare, reduction_size
from stages.runtime import load
from stages.templates import batch_matmul, conv2d, conv2d_winograd, dense, matmul
from stages.templates.conv2d import PROBE
from stages.templates.gemm_schedule import SMALLEST, gemm_space
from stages.templates.space import NoValidConfig, first_valid

ROOT = Path(__file__).resolve().parent.parent
HOST = Target.host()
TARGETS = [preset("x86-64-avx512"), preset("x86-64-avx2"), HOST]
CHAINS = ["", "bias", "bias,relu", "scale_shift,clip:0:6", "bias,residual_add,relu", "gelu"]
SWEEP = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def assert_default_accepted(tpl, task) -> None:
    for target in TARGETS:
        knobs = tpl.default_config(task, target).knobs
        why = tpl.space(task, target).reason(knobs)
        assert why is None, f"{tpl.NAME} {task.description} {task.attrs} on {target.name}: {knobs}: {why}"


@st.composite
def conv_tasks(draw):
    kind = draw(st.sampled_from(["dense", "dense", "grouped", "depthwise"]))
    if kind == "depthwise":
        c = draw(st.integers(1, 300))
        groups, icg, oc = c, 1, c * draw(st.sampled_from([1, 2]))
    elif kind == "grouped":
        groups, icg = draw(st.integers(2, 8)), draw(st.integers(1, 40))
        c, oc = groups * icg, groups * draw(st.integers(1, 40))
    else:
        groups, c, oc = 1, draw(st.one_of(st.integers(1, 300), st.sampled_from([1024, 1536, 2048]))), \
            draw(st.integers(1, 300))
        icg = c
    kh, kw = draw(st.sampled_from([1, 3, 5, 7])), draw(st.sampled_from([1, 3, 5, 7]))
    sh, sw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    pads = tuple(draw(st.integers(0, 3)) for _ in range(4))
    h_min = max(1, dh * (kh - 1) + 1 - pads[0] - pads[2])
    w_min = max(1, dw * (kw - 1) + 1 - pads[1] - pads[3])
    h, w = draw(st.integers(h_min, max(h_min, 80))), draw(st.integers(w_min, max(w_min, 80)))
    chain = parse_epilogue(draw(st.sampled_from(CHAINS)))
    return conv2d.conv2d_task((draw(st.integers(1, 2)), c, h, w), (oc, icg, kh, kw), (sh, sw), pads, (dh, dw),
                              groups, chain)


@SWEEP
@given(conv_tasks())
def test_conv2d_defaults_are_in_their_space(task):
    assert_default_accepted(conv2d, task)
    if winograd_serves(task):
        assert_default_accepted(conv2d_winograd, winograd_twin(task))
    # The last fallback, so no accepted conv is unservable: the smallest tile passes every rule.
    for target in TARGETS:
        assert conv2d.space(task, target).reason(PROBE) is None


@st.composite
def gemm_tasks(draw):
    dim = st.one_of(st.integers(1, 24), st.integers(1, 2000))
    m, n, k = draw(dim), draw(dim), draw(dim)
    chain = parse_epilogue(draw(st.sampled_from(["", "bias", "bias,relu", "residual_add,gelu"])))
    which = draw(st.sampled_from(["matmul", "dense", "batch_matmul"]))
    if which == "matmul":
        return matmul, matmul.task(m, n, k, chain)
    if which == "dense":
        return dense, dense.task(m, n, k, chain, trans_a=draw(st.booleans()), trans_b=draw(st.booleans()))
    batch = draw(st.sampled_from([(), (3,), (2, 3)]))
    b_batch = draw(st.sampled_from([batch, batch[1:], (1,) * len(batch)]))  # broadcasts
    return batch_matmul, batch_matmul.task((*batch, m, k), (*b_batch, k, n), chain)


@SWEEP
@given(gemm_tasks())
def test_gemm_family_defaults_are_in_their_space(case):
    tpl, task = case
    assert_default_accepted(tpl, task)
    for target in TARGETS:
        assert tpl.space(task, target).reason(SMALLEST) is None


def test_the_shapes_that_crashed_get_channel_vectors_with_every_channel_in_one_block():
    avx512 = preset("x86-64-avx512")
    for c in (17, 20, 24, 40, 48, 96, 192, 1000):
        task = conv2d.conv2d_task((1, c, 28, 28), (c, c, 3, 3), pads=(1, 1, 1, 1))
        knobs = conv2d.default_config(task, avx512).knobs
        assert knobs["axis"] == "oc" and knobs["icb"] >= c > knobs["icb"] // 2, (c, knobs)
    # 2048 channels fit one block; no channel block holds 5000: column vectors, the reduction split into blocks.
    assert conv2d.default_config(conv2d.conv2d_task((1, 2048, 14, 14), (512, 2048, 1, 1), strides=(2, 2)),
                                 avx512).knobs["axis"] == "oc"
    wide = conv2d.conv2d_task((1, 5000, 6, 6), (64, 5000, 1, 1), strides=(2, 2))
    assert conv2d.default_config(wide, avx512).knobs["axis"] == "w"


def test_no_valid_candidate_names_the_task_and_every_reason():
    task = conv2d.conv2d_task((1, 96, 8, 8), (96, 96, 3, 3), pads=(1, 1, 1, 1))
    sp = conv2d.space(task, HOST)
    bad = [{**PROBE, "mr": 128}, {**PROBE, "axis": "oc", "vw": 16, "mr": 16, "icb": 64}]
    with pytest.raises(NoValidConfig, match=r"fits conv2d\(1x96x8x8.*: knob mr=128 is not one of .*; channel "
                                            r"vectors keep the whole reduction in registers: icb=64 < 96 channels$"):
        first_valid(sp, bad, task.description)
    assert first_valid(gemm_space(5, 7, 3, HOST), [SMALLEST], "gemm").knobs == SMALLEST


def _conv(x, w, strides=(1, 1), pads=(0, 0, 0, 0), dil=(1, 1), groups=1, chain=""):
    return conv2d, conv2d.conv2d_task(x, w, strides, pads, dil, groups, parse_epilogue(chain))


SAMPLE = [
    _conv((1, 96, 14, 14), (96, 96, 3, 3), pads=(1, 1, 1, 1), chain="bias,relu"),
    _conv((1, 48, 20, 20), (48, 48, 3, 3), pads=(1, 1, 1, 1)),
    _conv((1, 20, 16, 16), (20, 20, 3, 3), pads=(1, 1, 1, 1), chain="bias"),
    _conv((1, 17, 12, 12), (17, 17, 3, 3), pads=(1, 1, 1, 1)),
    _conv((2, 40, 9, 11), (25, 40, 3, 3), pads=(0, 1, 2, 1), chain="residual_add"),  # once mr=32 > 25 channels
    _conv((1, 2048, 7, 7), (32, 2048, 1, 1)),  # a GEMM over the image
    _conv((1, 2048, 8, 8), (16, 2048, 1, 1), strides=(2, 2)),  # packed, past the largest channel block
    _conv((1, 32, 20, 20), (32, 1, 5, 5), strides=(2, 2), pads=(2, 2, 2, 2), groups=32, chain="bias,relu"),
    _conv((1, 24, 20, 20), (24, 24, 3, 3), pads=(2, 2, 2, 2), dil=(2, 2)),
    _conv((1, 170, 10, 10), (85, 34, 3, 3), pads=(1, 1, 1, 1), groups=5),  # 17 channels per group
    (conv2d_winograd, winograd_twin(conv2d.conv2d_task((1, 96, 10, 10), (96, 96, 3, 3), pads=(1, 1, 1, 1)))),
    (dense, dense.task(17, 1000, 3, parse_epilogue("bias,gelu"), trans_a=True)),
    (batch_matmul, batch_matmul.task((2, 3, 33, 7), (3, 7, 19))),
]


@pytest.mark.parametrize("case", SAMPLE, ids=[f"{tpl.NAME}:{t.description}" for tpl, t in SAMPLE])
def test_default_kernels_match_numpy(case):
    tpl, task = case
    knobs = tpl.default_config(task, HOST).knobs
    kernel = LoadedKernel(compile_ir(tpl.build_ir(task, knobs, HOST, 2), HOST).data, HOST)
    inputs = tpl.make_inputs(task, seed=3)
    args = tpl.kernel_args(task, knobs, inputs)
    kernel(args)
    ok, err = compare(args[-1], tpl.reference(task, inputs), reduction_size(task))
    assert ok, f"{task.description} {knobs}: max abs error {err:.3g}"


def tunaflow(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tunaflow", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


@pytest.fixture(scope="module")
def conv96(tmp_path_factory) -> Path:
    """x[1,96,10,10] → Conv(96, 3x3, pad 1) + bias → Relu."""
    rng = np.random.default_rng(2)
    path = tmp_path_factory.mktemp("m") / "conv96.onnx"
    inits = [helper.make_tensor(name, TensorProto.FLOAT, a.shape, a.ravel())
             for name, a in (("w", rng.uniform(-0.1, 0.1, (96, 96, 3, 3)).astype(np.float32)),
                             ("b", rng.uniform(-1, 1, 96).astype(np.float32)))]
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])],
        "conv96", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 96, 10, 10])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 96, 10, 10])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_tasks_tune_op_and_build_of_a_96_channel_conv(conv96, tmp_path):
    r = tunaflow("tasks", str(conv96), "--json")
    assert r.returncode == 0, r.stderr
    assert "1x96x10x10" in r.stdout
    r = tunaflow("tune-op", "conv2d", "--input", "1x96x10x10", "--weight", "96x96x3x3", "--pad", "1", "--epilogue",
                 "bias,relu", "--trials", "1", "--batch-size", "1", "--remeasure-top-k", "0", "--no-prefect", "--json",
                 "--log", str(tmp_path / "log"))
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["default_gflops"] > 0 and not result["errors"], result
    lib = tmp_path / "lib"
    r = tunaflow("build", str(conv96), "-o", str(lib), "--json")
    assert r.returncode == 0, r.stderr
    assert "conv2d(1x96x10x10,96x96x3x3" in json.loads(r.stdout)["fallback"]
    import onnxruntime as ort

    x = np.random.default_rng(0).uniform(-1, 1, (1, 96, 10, 10)).astype(np.float32)
    want = ort.InferenceSession(str(conv96), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(load(lib)(x=x), want, rtol=1e-4, atol=1e-4)


def test_an_unservable_task_is_one_line_from_tune_op_and_the_generic_kernel_in_a_build(monkeypatch, tmp_path):
    """No shipped template has such a task (the sweeps above); a template whose default finds none is
    simulated here to check what the user sees."""
    def none_fits(task, target):
        raise NoValidConfig(f"no schedule of the space fits {task.description}: for this test")

    monkeypatch.setattr(dense, "default_config", none_fits)
    from tunaflow.cli import app

    r = CliRunner().invoke(app, ["tune-op", "dense", "--m", "4", "--n", "8", "--k", "16", "--no-prefect",
                                 "--log", str(tmp_path / "log")])
    assert r.exit_code == 2 and "no schedule of the space fits dense(4x16,8x16): for this test" in r.output
    assert isinstance(r.exception, SystemExit) and "Traceback" not in r.output

    rng = np.random.default_rng(4)
    w, b = rng.uniform(-1, 1, (8, 16)).astype(np.float32), rng.uniform(-1, 1, 8).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w", "b"], ["g"], transB=1), helper.make_node("Relu", ["g"], ["y"])],
        "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor(n, TensorProto.FLOAT, a.shape, a.ravel()) for n, a in (("w", w), ("b", b))])
    path = tmp_path / "mlp.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    notes: list[str] = []
    manifest = build_library(optimize(load_model(path)), HOST, tmp_path / "lib", on_fallback=notes.append)
    assert [op.kind for op in manifest.ops] == ["generic"]
    assert "1 anchor task(s) run the generic untuned kernel" in notes[0] and "for this test" in notes[0]
    x = rng.uniform(-1, 1, (4, 16)).astype(np.float32)
    np.testing.assert_allclose(load(tmp_path / "lib")(x=x), np.maximum(x @ w.T + b, 0), rtol=1e-5, atol=1e-5)
