"""Winograd conv2d: the transform matrices, real compiles of every valid schedule on awkward shapes
against the numpy reference, task extraction's twins, and the build keeping the faster implementation."""

from __future__ import annotations

import numpy as np
import pytest

from schemas import MeasureOptions, TuningOptions
from schemas.target import Target
from schemas.task import parse_epilogue
from stages.build.apply_best import Choice, implementations
from stages.build.library import build_library
from stages.codegen.compile import compile_ir
from stages.codegen.jit import LoadedKernel
from stages.graph import reference
from stages.graph.ir import Graph, Node, Value
from stages.graph.tasks import extract_tasks
from stages.graph.twins import alternatives, winograd_default_wins, winograd_twin
from stages.log import TuningLog
from stages.log.store import rank_key
from stages.measure.check import compare, reduction_size
from stages.runtime import load
from stages.templates import conv2d, conv2d_winograd, template_for
from stages.templates.winograd_kernel import AT, BT, G
from stages.tune.loop import tune_task

HOST = Target.host()


def wino_task(x, w, pads=(1, 1, 1, 1), chain=""):
    return winograd_twin(conv2d.conv2d_task(x, w, (1, 1), pads, (1, 1), 1, parse_epilogue(chain)))


def run(task, knobs, inputs, threads=1):
    kernel = LoadedKernel(compile_ir(conv2d_winograd.build_ir(task, knobs, HOST, threads), HOST).data, HOST)
    args = conv2d_winograd.kernel_args(task, knobs, inputs)
    kernel(args)
    return args[-1]


@pytest.mark.parametrize("m", [2, 4])
def test_the_transforms_compute_a_3_tap_correlation(m):
    """A^T [(G g G^T) * (B^T d B)] A is the valid 3x3 correlation of an (m+2)^2 patch."""
    rng = np.random.default_rng(m)
    d, g = rng.standard_normal((m + 2, m + 2)), rng.standard_normal((3, 3))
    bt, gm, at = (np.array(x[m], dtype=np.float64) for x in (BT, G, AT))
    y = at @ ((gm @ g @ gm.T) * (bt @ d @ bt.T)) @ at.T
    direct = np.array([[np.sum(d[i:i + 3, j:j + 3] * g) for j in range(m)] for i in range(m)])
    np.testing.assert_allclose(y, direct, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(("x", "w", "pads", "chain"), [
    ((1, 16, 32, 32), (16, 16, 3, 3), (1, 1, 1, 1), "bias,residual_add"),
    ((1, 3, 17, 13), (5, 3, 3, 3), (0, 0, 0, 0), ""),  # channels and width below one vector, odd sizes
    ((2, 20, 9, 21), (33, 20, 3, 3), (1, 2, 0, 1), "bias,relu"),  # two images, asymmetric pads, 3 k vectors
    ((1, 64, 8, 8), (64, 64, 3, 3), (1, 1, 1, 1), "bias,residual_add,relu"),
])
def test_every_valid_schedule_matches_the_reference(x, w, pads, chain):
    task = wino_task(x, w, pads, chain)
    inputs = conv2d_winograd.make_inputs(task, seed=3)
    ref = conv2d_winograd.reference(task, inputs)
    space = conv2d_winograd.space(task, HOST)
    valid = [space.knobs_at(i) for i in space.valid_indices()]
    assert {k["m"] for k in valid} == {2, 4} and {k["pack"] for k in valid} == {"phase", "item"} and len(valid) >= 14
    for knobs in _covering(valid):
        ok, err = compare(run(task, knobs, inputs), ref, reduction_size(task))
        assert ok, f"{task.description} {knobs}: max abs error {err:.3g}"
    default = conv2d_winograd.default_config(task, HOST).knobs
    ok, err = compare(run(task, default, inputs, threads=2), ref, reduction_size(task))
    assert ok, f"2 threads {default}: max abs error {err:.3g}"


def _covering(valid: list[dict]) -> list[dict]:
    """Schedules until every value of every knob has run with each (m, pack): all the code paths, a
    fraction of the compiles."""
    seen: set = set()
    out = []
    for knobs in valid:
        keys = {(knobs["m"], knobs["pack"], name, value) for name, value in knobs.items()}
        if keys - seen:
            seen |= keys
            out.append(knobs)
    return out


def test_only_3x3_stride_1_single_group_convs_get_a_winograd_twin():
    served = conv2d.conv2d_task((1, 8, 10, 10), (8, 8, 3, 3), (1, 1), (1, 1, 1, 1))
    twin = alternatives(served)
    assert [t.op for t in twin] == ["conv2d_winograd"] and twin[0].inputs == served.inputs
    assert twin[0].flops == served.flops and twin[0].signature != served.signature
    for other in (conv2d.conv2d_task((1, 8, 10, 10), (8, 8, 3, 3), (2, 2), (1, 1, 1, 1)),
                  conv2d.conv2d_task((1, 8, 10, 10), (8, 4, 3, 3), (1, 1), (1, 1, 1, 1), group=2),
                  conv2d.conv2d_task((1, 8, 10, 10), (8, 8, 1, 1))):
        assert alternatives(other) == []
        with pytest.raises(ValueError, match="3x3 stride-1"):
            winograd_twin(other)


def test_the_bundled_cnn_brings_a_twin_for_each_3x3_stride_1_conv():
    from stages.extract import load_model
    from stages.graph.passes import optimize
    from tunaflow.commands.demo import DATA

    found = extract_tasks(optimize(load_model(DATA / "models" / "cnn.onnx")))
    own = {e.task.signature: e for e in found if e.alternative_to is None}
    twins = [e for e in found if e.alternative_to is not None]
    assert len(own) == 10 and len(twins) == 5
    for e in twins:
        base = own[e.alternative_to]
        assert e.task == winograd_twin(base.task) and (e.weight, e.nodes) == (base.weight, base.nodes)


def _conv_graph(c: int = 16, size: int = 16) -> tuple[Graph, dict[str, np.ndarray]]:
    rng = np.random.default_rng(5)
    task = conv2d.conv2d_task((1, c, size, size), (c, c, 3, 3), (1, 1), (1, 1, 1, 1))
    x = rng.uniform(-1, 1, (1, c, size, size)).astype(np.float32)
    w = rng.uniform(-1, 1, (c, c, 3, 3)).astype(np.float32)
    values = {"x": Value("x", (1, c, size, size)), "w": Value("w", (c, c, 3, 3)), "y": Value("y", (1, c, size, size))}
    graph = Graph("conv", [values["x"]], [values["y"]], [Node("conv", "Conv", ["x", "w"], ["y"], task=task)], values,
                  {"w": w})
    return graph, {"x": x}


def test_the_build_runs_whichever_implementation_measured_faster(tmp_path, host):
    graph, feeds = _conv_graph()
    task = graph.nodes[0].task
    (twin,) = alternatives(task)
    log = TuningLog(tmp_path / "log")
    options = TuningOptions(n_trials=3, batch_size=3, tuner="random", measure=MeasureOptions(threads=1))
    for t in (task, twin):
        tune_task(t, host, options, log)
    best = {t.op: log.best(t.signature, host.key, threads=1) for t in (task, twin)}
    faster = min(best, key=lambda op: rank_key(best[op]))
    expected = reference.run(graph, feeds)["y"]
    manifest = build_library(graph, host, tmp_path / "lib", log=tmp_path / "log")
    assert manifest.ops[0].task.startswith(faster + "(") and manifest.ops[0].kind == "tuned"
    np.testing.assert_allclose(load(tmp_path / "lib")(**feeds), expected, rtol=1e-3, atol=1e-4)
    # a record making the other implementation faster flips the choice; the caller's graph is untouched
    slower = next(op for op in best if op != faster)
    quick = best[slower].model_copy(update={"trial": 99, "combined_s": None, "result": best[slower].result.model_copy(
        update={"costs": (best[faster].cost_s / 10,)})})
    log.append([quick])
    manifest = build_library(graph, host, tmp_path / "lib2", log=tmp_path / "log")
    assert manifest.ops[0].task.startswith(slower + "(") and graph.nodes[0].task == task
    np.testing.assert_allclose(load(tmp_path / "lib2")(**feeds), expected, rtol=1e-3, atol=1e-4)
    # without a log the default build keeps the direct kernel on a 16x16 output (`winograd_default_wins`)
    assert build_library(graph, host, tmp_path / "lib3").ops[0].task.startswith("conv2d(")


@pytest.mark.parametrize(("c", "size", "op"), [(16, 24, "conv2d_winograd"), (16, 20, "conv2d"), (8, 32, "conv2d")])
def test_the_default_build_runs_winograd_where_its_default_wins(tmp_path, host, c, size, op):
    """No log: a 24x24 output with 16 channels runs the Winograd twin's default schedule; a 20x20 one, or
    8 channels, the direct default; either way the library computes the conv."""
    graph, feeds = _conv_graph(c, size)
    assert winograd_default_wins(graph.nodes[0].task) == (op == "conv2d_winograd")
    manifest = build_library(graph, host, tmp_path / "lib")
    assert manifest.ops[0].task.startswith(op + "(") and manifest.ops[0].kind == "default"
    expected = reference.run(graph, feeds)["y"]
    got = load(tmp_path / "lib")(**feeds)
    assert np.max(np.abs(got - expected)) <= 1e-5 * np.max(np.abs(expected))


def test_winograd_default_bounds():
    def task(c, k, size, stride=1):
        return conv2d.conv2d_task((1, c, size, size), (k, c, 3, 3), (stride, stride), (1, 1, 1, 1))

    assert winograd_default_wins(task(64, 64, 56)) and winograd_default_wins(task(256, 256, 28))
    assert not winograd_default_wins(task(256, 256, 14))  # transformed weights cost more than the multiplies saved
    assert not winograd_default_wins(task(320, 320, 56))  # transformed weights spill the cache
    assert not winograd_default_wins(task(15, 64, 56)) and not winograd_default_wins(task(64, 8, 56))
    assert not winograd_default_wins(task(64, 64, 56, stride=2))  # Winograd does not serve it


def test_a_tuned_record_of_either_implementation_outranks_the_default_rule(host):
    """The rule only decides between two defaults: a tuned direct conv stays direct, a tuned twin runs."""
    task = conv2d.conv2d_task((1, 64, 56, 56), (64, 64, 3, 3), (1, 1), (1, 1, 1, 1))
    (twin,) = alternatives(task)
    default = {t.signature: Choice(t, template_for(t).default_config(t, host), None) for t in (task, twin)}
    assert implementations([task], default)[task.signature] == twin
    record = object()  # `implementations` compares records only when both implementations have one
    direct_tuned = {**default, task.signature: Choice(task, default[task.signature].config, record)}
    assert implementations([task], direct_tuned)[task.signature] == task
    twin_tuned = {**default, twin.signature: Choice(twin, default[twin.signature].config, record)}
    assert implementations([task], twin_tuned)[task.signature] == twin
    no_twin_schedule = {**default, twin.signature: Choice(twin, None, None, "no schedule")}
    assert implementations([task], no_twin_schedule)[task.signature] == task


def test_tune_op_runs_winograd_and_names_what_it_cannot_serve(tmp_path):
    import subprocess
    import sys

    def tunaflow(*args):
        return subprocess.run([sys.executable, "-m", "tunaflow", "tune-op", "conv2d_winograd", *args, "--log",
                               str(tmp_path / "log"), "--no-prefect"], capture_output=True, text=True, timeout=300)

    r = tunaflow("--input", "1x8x12x12", "--weight", "8x8x3x3", "--pad", "1", "--trials", "3")
    assert r.returncode == 0, r.stderr
    trials = [rec for rec in TuningLog(tmp_path / "log").records() if rec.tuner != "remeasure"]
    assert "best schedule : m=" in r.stdout and len(trials) == 3 and all(t.task.op == "conv2d_winograd" for t in trials)
    r = tunaflow("--input", "1x8x12x12", "--weight", "8x8x3x3", "--stride", "2")
    assert r.returncode == 2 and "does not take --stride" in r.stderr
    r = tunaflow("--input", "1x8x12x12", "--weight", "8x8x1x1")
    assert r.returncode == 2 and "serves 3x3 stride-1" in r.stderr and "8x8x1x1" in r.stderr
