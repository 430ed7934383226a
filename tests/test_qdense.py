"""The int8 dense template: exact equality with the spec's int64 numpy reference, on every
instruction path this machine runs (the host's VNNI ones, the x86-64-avx2 preset's widened
vpmaddwd fallback, and the generic path of a target without AVX), odd shapes, extremes, epilogues."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from schemas.target import Target, preset
from schemas.task import parse_epilogue
from stages.codegen.compile import assembly, compile_ir
from stages.codegen.jit import LoadedKernel
from stages.templates import TEMPLATES, qdense
from stages.templates.qgemm_isa import available

HOST = Target.host()
AVX2 = preset("x86-64-avx2")
NO_AVX = Target.parse("llvm -mtriple=x86_64-unknown-linux-gnu -mcpu=x86-64 -mattr=-avx,-avx2 -name=sse2")
PATHS = [(HOST, isa) for isa in available(HOST) if isa != "generic"] + [(AVX2, "avx2"), (NO_AVX, "generic")]
ROOT = Path(__file__).resolve().parent.parent


def _run(task, target: Target, knobs: dict, inputs: list[np.ndarray]) -> np.ndarray:
    args = qdense.kernel_args(task, knobs, inputs)
    args[-1][...] = 0x5A
    LoadedKernel(compile_ir(qdense.build_ir(task, knobs, target), target).data, HOST)(args)
    return args[-1]


def _on(target: Target, isa: str, task) -> dict:
    """The default schedule of `task` on `target`, moved to `isa` (a smaller tile when the path needs it)."""
    knobs = {**qdense.default_config(task, target).knobs, "isa": isa}
    sp = qdense.space(task, target)
    for mr, nv in ((knobs["mr"], knobs["nv"]), (4, 2), (3, 1), (1, 1)):
        cand = {**knobs, "mr": min(mr, task.inputs[0].shape[0]), "nv": nv}
        if sp.reason(cand) is None:
            return cand
    raise AssertionError(sp.reason(knobs))


@pytest.mark.parametrize(("target", "isa"), PATHS, ids=[f"{t.name}-{i}" for t, i in PATHS])
@pytest.mark.parametrize(("m", "n", "k", "x_dtype", "y_dtype", "epi"), [
    (37, 45, 29, "uint8", "uint8", ""),
    (1, 1, 1, "int8", "int8", "relu"),
    (5, 70, 8, "uint8", "int8", "clip:-20:90"),
    (13, 16, 130, "int8", "uint8", "relu"),
])
def test_exact_on_every_path(target, isa, m, n, k, x_dtype, y_dtype, epi):
    task = qdense.task(m, n, k, parse_epilogue(epi), x_dtype=x_dtype, y_dtype=y_dtype,
                       x_zero_point=-3 if x_dtype == "int8" else 131, y_zero_point=5)
    inputs = qdense.make_inputs(task, seed=m + n + k)
    ref = qdense.reference(task, inputs)
    assert len(np.unique(ref)) > min(3, ref.size - 1)  # the outputs spread over the range, not all saturated
    np.testing.assert_array_equal(_run(task, target, _on(target, isa, task), inputs), ref)


@pytest.mark.parametrize(("target", "isa"), PATHS, ids=[f"{t.name}-{i}" for t, i in PATHS])
def test_extremes_255_times_minus_128_are_exact(target, isa):
    """u8 255 x s8 -128 (and x 127): pairs of these overflow vpmaddubsw's saturating int16, so a
    fallback built on it would clamp; the sums must come out exact (here read through a scale that
    maps the exact sum to 0..255 only when it is exact)."""
    k = 515
    task = qdense.task(3, 20, k, y_zero_point=0)
    x = np.full((3, k), 255, dtype=np.uint8)
    w = np.where(np.arange(20)[:, None] % 2 == 0, -128, 127).astype(np.int8).repeat(k, axis=1)
    bias = np.where(np.arange(20) % 2 == 0, 255 * 128 * k, -255 * 127 * k).astype(np.int32) + np.arange(20)
    scale = np.ones(20, dtype=np.float32)
    out = _run(task, target, _on(target, isa, task), [x, w, bias, scale])
    np.testing.assert_array_equal(out, np.tile(np.arange(20, dtype=np.uint8), (3, 1)))


@pytest.mark.parametrize(("target", "isa"), PATHS, ids=[f"{t.name}-{i}" for t, i in PATHS])
def test_rounding_is_half_to_even_and_huge_sums_saturate(target, isa):
    """acc * 0.5 at every .5 rounds to the even neighbour (2.5 -> 2, 3.5 -> 4, -2.5 -> -2); sums near the
    int32 limits saturate instead of wrapping through an out-of-range conversion."""
    acc = np.array([5, 7, -5, -7, 1, 3, 2147483000, -2147483000, 0, 9], dtype=np.int64)
    task = qdense.task(1, len(acc), 1, y_dtype="int8", y_zero_point=10)
    x, w = np.ones((1, 1), dtype=np.uint8), np.ones((len(acc), 1), dtype=np.int8)
    bias, scale = (acc - 1).astype(np.int32), np.array([0.5] * 6 + [1.0, 1.0, 0.5, 0.5], dtype=np.float32)
    out = _run(task, target, _on(target, isa, task), [x, w, bias, scale])
    np.testing.assert_array_equal(out[0], np.array([12, 14, 8, 6, 10, 12, 127, -128, 10, 14], dtype=np.int8))


def test_the_fallback_and_vnni_paths_emit_their_instructions():
    task = qdense.task(16, 64, 64)
    assert "vpmaddwd" in assembly(qdense.build_ir(task, _on(AVX2, "avx2", task), AVX2), AVX2)
    assert "vpmaddubsw" not in assembly(qdense.build_ir(task, _on(AVX2, "avx2", task), AVX2), AVX2)
    if "vnni512" in available(HOST):
        asm = assembly(qdense.build_ir(task, _on(HOST, "vnni512", task), HOST), HOST)
        assert "vpdpbusd" in asm and "zmm" in asm


def test_isa_choice_follows_the_target():
    assert available(AVX2) == ("avx2", "generic")
    assert available(NO_AVX) == ("generic",)
    assert available(preset("aarch64")) == ("generic",)
    assert available(Target.parse("llvm -mtriple=x86_64-unknown-linux-gnu -mcpu=alderlake"))[0] == "vnni256"
    sp = qdense.space(qdense.task(8, 8, 8), AVX2)
    assert "not available" in sp.reason({**qdense.default_config(qdense.task(8, 8, 8), AVX2).knobs, "isa": "vnni512"})


@pytest.mark.parametrize("target", [HOST, AVX2, NO_AVX], ids=lambda t: t.name)
def test_default_config_is_valid_for_every_shape(target):
    for m in (1, 2, 3, 7, 64, 129):
        for n in (1, 5, 16, 17, 100, 768):
            for k in (1, 3, 4, 9, 768):
                task = qdense.task(m, n, k)
                assert qdense.space(task, target).reason(qdense.default_config(task, target).knobs) is None


def test_default_runs_exact_on_odd_shapes_threaded():
    for m, n, k in ((1, 3, 5), (7, 1, 2), (129, 33, 67)):
        task = qdense.task(m, n, k, x_zero_point=77, y_zero_point=200)
        knobs = qdense.default_config(task, HOST).knobs
        inputs = qdense.make_inputs(task, seed=k)
        args = qdense.kernel_args(task, knobs, inputs)
        LoadedKernel(compile_ir(qdense.build_ir(task, knobs, HOST, threads=2), HOST).data, HOST)(args)
        np.testing.assert_array_equal(args[-1], qdense.reference(task, inputs))


def test_registered_and_tune_op_runs_error_free(tmp_path):
    assert TEMPLATES["qdense"] is qdense
    r = subprocess.run([sys.executable, "-m", "tunaflow", "tune-op", "qdense", "--m", "24", "--n", "40", "--k", "52",
                        "--epilogue", "relu", "--trials", "6", "--batch-size", "3", "--log", str(tmp_path / "log"),
                        "--no-prefect", "--json", "--remeasure-top-k", "0"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["trials"] == 6 and out["best_gflops"] > 0 and not out["errors"], out
