"""Differential fuzzing of whole CNN graphs: a fixed seeded set of random models, each built with default
schedules and with random valid tuned configs (Winograd twins included), must match onnxruntime.
`benchmarks/fuzz_models.py` runs the same generator on many more cases."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from onnx import helper
from support import fuzz_check
from support.fuzz_check import check, counts, run_cases
from support.fuzz_graphs import ACTS, make_case
from support.fuzz_transformers import make_transformer_case

from stages.build import verify

SEED = 20261201
CASES = 50
INT8_CASES = 20
TRANSFORMER_CASES = 16
INT8_TRANSFORMER_CASES = 8
TRANSFORMER_COVERED = ("ids<", "pad", "causal", "attn[qkv", "kT", "ln*", "ln>", ">ln", "cls>pool", "+gelu",
                       "+gelu_tanh", "+relu", "t1 ", "t2 ", " 2x")
# Blocks and attributes the fixed set must reach, by their words in the case descriptions.
COVERED = ("res[", "down[", "mb[", "cat[", "se[", "gap", "fc>", "max", "avg", "ceil", "incl", "dw", "+bn", "d2",
           "s2", "out:", "t1 ", "t2 ") + tuple(f"+{a}" for a in ACTS)


def test_cases_are_reproducible_and_described():
    a, b = make_case(SEED, 3), make_case(SEED, 3)
    assert a.model.SerializeToString() == b.model.SerializeToString() and a.description == b.description
    assert np.array_equal(a.feeds["x"], b.feeds["x"])
    assert make_case(SEED, 4).model.SerializeToString() != a.model.SerializeToString()
    assert all(len(make_case(SEED, i).description) < 400 for i in range(CASES))
    text = " ".join(make_case(SEED, i).description for i in range(CASES))
    assert [w for w in COVERED if w not in text] == []


def test_the_checker_sees_a_wrong_output_and_an_unsupported_op(tmp_path, monkeypatch):
    case = make_case(SEED, 2)
    want = fuzz_check.reference(case)
    monkeypatch.setattr(fuzz_check, "reference", lambda c: {k: v * 1.01 for k, v in want.items()})
    out = check(case, tmp_path / "a")
    assert out.status == "mismatch" and out.detail.startswith("default: output"), out
    monkeypatch.undo()
    case.model.graph.node.append(helper.make_node("Hardmax", [case.model.graph.output[0].name], ["hs"], name="hs"))
    case.model.graph.output[0].name = "hs"
    out = check(case, tmp_path / "b")
    assert out.status == "unsupported" and "Hardmax" in out.detail, out


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_seeded_random_models_match_onnxruntime():
    outcomes = sorted(run_cases(SEED, range(CASES), jobs=2), key=lambda o: o.index)
    failed = [f"{o.status} seed {o.seed} case {o.index}: {o.description}\n    {o.detail}"
              for o in outcomes if o.status != "pass"]
    assert not failed, f"{counts(outcomes)}\n" + "\n".join(failed)
    assert sum(o.winograd > 0 for o in outcomes) >= 5 and sum(o.halo > 0 for o in outcomes) >= 5


def test_the_int8_checker_counts_steps_and_falls_back_to_the_onnx_reference(tmp_path, monkeypatch):
    """Two steps off onnxruntime alone passes (onnxruntime's rounding, counted); off both, it is a mismatch."""
    case = fuzz_check.quantized(make_case(SEED, 2))
    steps = fuzz_check.output_steps(case.model)
    assert steps and all(v > 0 for v in steps.values())
    want = fuzz_check.reference(case)
    shifted = {k: v + 2 * steps.get(k, 0.0) for k, v in want.items()}
    monkeypatch.setattr(fuzz_check, "quantized", lambda c: case)
    monkeypatch.setattr(fuzz_check, "reference", lambda c: shifted)
    out = check(case, tmp_path / "a", int8=True)
    assert out.status == "pass" and out.ort_off == 3, out
    monkeypatch.setattr(fuzz_check, "spec_outputs", lambda model, feeds: shifted)
    out = check(case, tmp_path / "b", int8=True)
    assert out.status == "mismatch" and "2 quantization steps" in out.detail, out


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_seeded_random_quantized_models_match_onnxruntime_int8():
    """The same generator's graphs quantized by onnxruntime's quantize_static, built (default and random tuned
    configs on the host, default on the x86-64-avx2 preset) and judged within one quantization step."""
    outcomes = sorted(run_cases(SEED, range(INT8_CASES), jobs=2, int8=True), key=lambda o: o.index)
    failed = [f"{o.status} seed {o.seed} case {o.index}: {o.description}\n    {o.detail}"
              for o in outcomes if o.status != "pass"]
    assert not failed, f"{counts(outcomes)}\n" + "\n".join(failed)
    assert sum(o.anchors for o in outcomes) >= INT8_CASES


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_seeded_random_transformer_graphs_match_onnxruntime():
    """Encoder/decoder layers as exporters write them (token ids or hidden states in, padding and causal
    masks, both LayerNorm forms, fused or separate Q/K/V), default and random tuned configs."""
    a, b = make_transformer_case(SEED, 5), make_transformer_case(SEED, 5)
    assert a.model.SerializeToString() == b.model.SerializeToString() and a.description == b.description
    text = " ".join(make_transformer_case(SEED, i).description for i in range(TRANSFORMER_CASES))
    assert [w for w in TRANSFORMER_COVERED if w not in text] == []
    outcomes = sorted(run_cases(SEED, range(TRANSFORMER_CASES), jobs=2, family="transformer"), key=lambda o: o.index)
    failed = [f"{o.status} seed {o.seed} case {o.index}: {o.description}\n    {o.detail}"
              for o in outcomes if o.status != "pass"]
    assert not failed, f"{counts(outcomes)}\n" + "\n".join(failed)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_seeded_random_transformer_graphs_quantized_dynamically_match_onnxruntime_int8():
    """The transformer generator's graphs quantized as users quantize transformers (`quantize_dynamic`: int8
    weights in MatMulInteger, activations quantized at run time), built on the host (default and random tuned
    configs) and the x86-64-avx2 preset, and judged against onnxruntime's int8 run by the float rule."""
    ops = {n.op_type for n in fuzz_check.quantized_dynamic(make_transformer_case(SEED, 0)).model.graph.node}
    assert {"MatMulInteger", "DynamicQuantizeLinear"} <= ops
    outcomes = sorted(run_cases(SEED, range(INT8_TRANSFORMER_CASES), jobs=2, int8=True, family="transformer"),
                      key=lambda o: o.index)
    failed = [f"{o.status} seed {o.seed} case {o.index}: {o.description}\n    {o.detail}"
              for o in outcomes if o.status != "pass"]
    assert not failed, f"{counts(outcomes)}\n" + "\n".join(failed)
    assert all(o.description.startswith("qd ") for o in outcomes)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_rounding_tie_flipped_by_an_ulp_passes_only_with_every_kernel_right_alone(tmp_path, monkeypatch):
    """Seed 1 case 5 (dynamically quantized): one LayerNorm element is -33.499996 steps in the build and -33.5
    in onnxruntime, so one uint8 differs and two layers later the output is 6.5e-3 off every reference. It
    passes (counted in `ulp_off`) because the interpreter agrees with onnxruntime and every node is right on its
    own inputs; a kernel one step off alone, or an interpreter that disagrees, makes it a mismatch."""
    out = check(make_transformer_case(1, 5), tmp_path / "a", int8=True, family="transformer")
    assert out.status == "pass" and out.ulp_off >= 1, out

    real = fuzz_check.interpreter

    def one_step_off(node, args):
        outs = real.run_node(node, args)
        return [outs[0] + np.uint8(1), *outs[1:]] if node.op == "DynamicQuantizeLinear" else outs

    monkeypatch.setattr(verify, "run_node", one_step_off)  # what every kernel is checked against alone
    out = check(make_transformer_case(1, 5), tmp_path / "b", int8=True, family="transformer")
    assert out.status == "mismatch" and "(DynamicQuantizeLinear) output" in out.detail, out

    def off_meaning(graph, feeds):
        return {k: v * 1.01 for k, v in real.run(graph, feeds).items()}

    monkeypatch.undo()
    monkeypatch.setattr(fuzz_check, "interpreter", SimpleNamespace(run=off_meaning, run_node=real.run_node))
    out = check(make_transformer_case(1, 5), tmp_path / "c", int8=True, family="transformer")
    assert out.status == "mismatch" and "the interpreter vs onnxruntime" in out.detail, out
