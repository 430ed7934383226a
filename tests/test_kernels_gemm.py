"""GEMM-family templates (matmul, dense, batch matmul): real LLVM compiles run against numpy.

Property tests draw odd and tiny shapes, epilogue chains and random valid configs; the rest
pins the spaces (size, reasons), threads, cross-target emission and the CLI's task parsing.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.target import Target, preset
from schemas.task import EpilogueOp, TuningTask, parse_epilogue
from stages.codegen.compile import compile_ir
from stages.codegen.jit import LoadedKernel
from stages.measure.check import compare
from stages.templates import TEMPLATES, batch_matmul, dense, matmul
from stages.templates.space import InvalidConfig

HOST = Target.host()

_OPS = st.sampled_from([
    EpilogueOp(kind="bias"), EpilogueOp(kind="scale_shift"), EpilogueOp(kind="relu"),
    EpilogueOp(kind="clip", attrs={"min": 0.0, "max": 6.0}), EpilogueOp(kind="leaky_relu", attrs={"alpha": 0.2}),
    EpilogueOp(kind="sigmoid"), EpilogueOp(kind="tanh"), EpilogueOp(kind="gelu"), EpilogueOp(kind="residual_add"),
])
_CHAINS = st.lists(_OPS, max_size=3).map(tuple)
_DIM = st.one_of(st.integers(1, 4), st.integers(5, 40))


def _run(task: TuningTask, knobs: dict | None = None, threads: int = 1, seed: int = 0) -> tuple[bool, float]:
    tpl = TEMPLATES[task.op]
    knobs = tpl.default_config(task, HOST).knobs if knobs is None else knobs
    inputs = tpl.make_inputs(task, seed=seed)
    args = tpl.kernel_args(task, knobs, inputs)
    args[-1][...] = np.nan
    LoadedKernel(compile_ir(tpl.build_ir(task, knobs, HOST, threads), HOST).data, HOST)(args)
    return compare(args[-1], tpl.reference(task, inputs), tpl.dims(task)[2])


def _random_valid(task: TuningTask, seed: int) -> dict:
    sp = TEMPLATES[task.op].space(task, HOST)
    rnd = random.Random(seed)
    while True:
        knobs = sp.knobs_at(rnd.randrange(sp.size))
        if sp.reason(knobs) is None:
            return knobs


@settings(max_examples=12, deadline=None)
@given(m=_DIM, n=_DIM, k=_DIM, chain=_CHAINS, seed=st.integers(0, 2**16), threads=st.sampled_from([1, 2]))
def test_matmul_random_configs_match_numpy(m, n, k, chain, seed, threads):
    task = matmul.task(m, n, k, chain)
    assert _run(task, _random_valid(task, seed), threads)[0]


@settings(max_examples=12, deadline=None)
@given(m=_DIM, n=_DIM, k=_DIM, chain=_CHAINS, seed=st.integers(0, 2**16), trans_a=st.booleans(),
       trans_b=st.booleans(), alpha=st.sampled_from([1.0, 0.5, -2.0]))
def test_dense_random_configs_match_numpy(m, n, k, chain, seed, trans_a, trans_b, alpha):
    task = dense.task(m, n, k, chain, trans_a=trans_a, trans_b=trans_b, alpha=alpha)
    assert _run(task, _random_valid(task, seed))[0]


_BATCH_SHAPES = st.sampled_from([
    ((3,), (3,)), ((3,), (1,)), ((1,), (2,)), ((2, 3), (3,)), ((2, 1), (1, 2)), ((), (2,))])


@settings(max_examples=12, deadline=None)
@given(m=_DIM, n=_DIM, k=_DIM, chain=_CHAINS, seed=st.integers(0, 2**16), batch=_BATCH_SHAPES,
       threads=st.sampled_from([1, 2]))
def test_batch_matmul_broadcasting_matches_numpy(m, n, k, chain, seed, batch, threads):
    task = batch_matmul.task((*batch[0], m, k), (*batch[1], k, n), chain)
    assert _run(task, _random_valid(task, seed), threads)[0]


@pytest.mark.parametrize("m,n,k", [(1, 1000, 768), (3, 17, 1024), (197, 1000, 17), (17, 3072, 3)])
def test_dense_default_schedule_on_model_shapes(m, n, k):
    task = dense.task(m, n, k, (EpilogueOp(kind="bias"), EpilogueOp(kind="relu")))
    ok, err = _run(task)
    assert ok, err


def test_attention_batch_matmul_4d_default_two_threads():
    task = batch_matmul.task((2, 12, 33, 64), (12, 64, 33))
    assert task.outputs[0].shape == (2, 12, 33, 33)
    assert _run(task, threads=2)[0]


@pytest.mark.parametrize("par", ["m", "n", "none"])
@pytest.mark.parametrize("order", ["jr_ir", "ir_jr"])
def test_both_parallel_axes_and_orders_with_blocking_edges(par, order):
    task = matmul.task(101, 77, 300, (EpilogueOp(kind="bias"),))
    knobs = {"mr": 6, "nv": 2, "vw": 8, "kc": 128, "mc": 4, "nc": 2, "uk": 4, "order": order, "pack_a": 1,
             "par": par}
    assert matmul.space(task, HOST).reason(knobs) is None
    assert _run(task, knobs, threads=2)[0]


@pytest.mark.parametrize("order", ["jr_ir", "ir_jr"])
@pytest.mark.parametrize("task", [
    batch_matmul.task((1, 3, 37, 40), (1, 3, 40, 69), (EpilogueOp(kind="bias"),)),  # 69 = 64 + 5: 1 of 4 vectors
    dense.task(23, 105, 150, (EpilogueOp(kind="residual_add"), EpilogueOp(kind="gelu"))),  # 105 = 64 + 41: 3 of 4
    matmul.task(30, 197, 64)])  # ViT's score shape: 197 = 3 x 64 + 5
def test_a_part_last_panel_gets_a_narrower_micro_kernel(task, order):
    knobs = {"mr": 6, "nv": 4, "vw": 16, "kc": 64 if task.op != "dense" else 32, "mc": 2, "nc": 2, "uk": 4,
             "order": order, "pack_a": 1, "par": "m"}
    tpl = TEMPLATES[task.op]
    assert tpl.space(task, HOST).reason(knobs) is None
    assert "define internal void @\"micro_edge\"" in str(tpl.build_ir(task, knobs, HOST, 2))
    ok, err = _run(task, knobs, threads=2)
    assert ok, err


@pytest.mark.parametrize("task", [matmul.task(1024, 1024, 1024), dense.task(128, 3072, 768),
                                  batch_matmul.task((12, 128, 64), (12, 64, 128))], ids=lambda t: t.description)
def test_large_spaces_hold_over_ten_thousand_valid_configs(task):
    sp = TEMPLATES[task.op].space(task, HOST)
    rnd = random.Random(0)
    samples = 3000
    valid = sum(sp.is_valid(rnd.randrange(sp.size)) for _ in range(samples))
    assert valid / samples * sp.size > 3e4


def test_invalid_configs_are_rejected_with_reasons():
    task = matmul.task(64, 64, 64)
    sp = matmul.space(task, HOST)
    good = dict(matmul.default_config(task, HOST).knobs)
    assert "vector registers" in sp.reason({**good, "mr": 16, "nv": 4, "vw": 4})
    small = matmul.task(3, 64, 64)
    assert "exceeds M=3" in matmul.space(small, HOST).reason({**good, "mr": 4, "pack_a": 0})
    assert "does not pay" in matmul.space(small, HOST).reason({**good, "mr": 3, "mc": 1, "pack_a": 1})
    with pytest.raises(InvalidConfig, match="not one of"):
        sp.from_knobs({**good, "order": "k_first"})


@pytest.mark.parametrize("name", ["x86-64-avx2", "aarch64"])
@pytest.mark.parametrize("task", [dense.task(17, 100, 64, (EpilogueOp(kind="bias"), EpilogueOp(kind="gelu"))),
                                  batch_matmul.task((2, 9, 16), (2, 16, 20), (EpilogueOp(kind="sigmoid"),))],
                         ids=lambda t: t.op)
def test_objects_emit_for_other_targets(name, task):
    target = preset(name)
    tpl = TEMPLATES[task.op]
    knobs = tpl.default_config(task, target).knobs
    assert int(knobs["vw"]) <= target.vector_lanes
    obj = compile_ir(tpl.build_ir(task, knobs, target, threads=2), target)
    assert obj.data[:4] == b"\x7fELF"
    machine = int.from_bytes(obj.data[18:20], "little")
    assert machine == (183 if name == "aarch64" else 62)


def test_cli_tasks():
    d = dense.task_from_cli({"m": 128, "n": 1024, "k": 1024, "epilogue": "bias,relu"})
    assert d.inputs[1].shape == (1024, 1024) and [e.kind for e in d.epilogue] == ["bias", "relu"]
    assert d.inputs[2].shape == (1024,)
    bm = batch_matmul.task_from_cli({"b": 12, "m": 128, "n": 64, "k": 128})
    assert bm.outputs[0].shape == (12, 128, 64) and bm.flops == 2 * 12 * 128 * 64 * 128
    with pytest.raises(ValueError, match="--b"):
        batch_matmul.task_from_cli({"m": 1, "n": 1, "k": 1})
    with pytest.raises(ValueError, match="do not broadcast"):
        batch_matmul.task((2, 3, 4), (3, 4, 5))
    assert "batch_matmul" in TEMPLATES and "dense" in TEMPLATES


@pytest.mark.e2e
def test_cli_tunes_dense_with_epilogue(tmp_path):
    """`tune-op dense ... --epilogue bias,relu` end to end (stages directly, real measurements)."""
    import json
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "tunaflow", "tune-op", "dense", "--m", "8", "--n", "40", "--k", "16",
           "--epilogue", "bias,relu", "--trials", "4", "--batch-size", "4", "--no-prefect", "--json",
           "--log", str(tmp_path / "log")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["task"] == "dense(8x16,40x16,40)+bias+relu"
    assert result["trials"] == 4 and not result["errors"]
    assert result["best_gflops"] > 0 and result["numpy_gflops"] > 0


@pytest.mark.parametrize("name", ["host", "x86-64-avx2", "x86-64-avx512", "aarch64"])
def test_default_schedule_is_sound_per_target(name):
    """Full vector width, a register tile using most of the register file, blocks within the caches,
    and at least two parallel blocks per core on a large matmul."""
    target = preset(name)
    task = matmul.task(1024, 1024, 1024)
    k = matmul.default_config(task, target).knobs
    mr, nv, vw, kc, mc = (int(k[x]) for x in ("mr", "nv", "vw", "kc", "mc"))
    assert vw == target.vector_lanes
    assert 0.75 * target.vector_registers <= mr * nv + nv + 1 <= target.vector_registers
    assert mc * mr * kc * 4 <= target.l2_bytes and int(k["pack_a"]) == 1
    from stages.templates.gemm_codegen import GemmSpec, Schedule, work_items

    assert work_items(GemmSpec(m=1024, n=1024, k=1024), Schedule.from_knobs(k)) >= 2 * target.cores


def test_default_runs_small_work_on_one_thread():
    assert dense.default_config(dense.task(1, 256, 256), HOST).knobs["par"] == "none"
    assert dense.default_config(dense.task(1, 3072, 768), HOST).knobs["par"] != "none"
    assert matmul.default_config(matmul.task(512, 512, 512), HOST).knobs["par"] != "none"
    big_batch = batch_matmul.task((12, 128, 64), (12, 64, 128))
    assert batch_matmul.default_config(big_batch, HOST).knobs["par"] != "none"


def test_k_is_unrolled_by_uk_in_the_machine_code():
    """`uk` reaches LLVM as an unroll count: the FMAs of the K loop body multiply by it, and a K
    that is not a multiple of uk still computes the right product."""
    from stages.codegen.compile import assembly

    task = matmul.task(100, 96, 70)
    knobs = dict(matmul.default_config(task, HOST).knobs)
    fmas = {}
    for uk in (1, 4):
        knobs["uk"] = uk
        fmas[uk] = assembly(matmul.build_ir(task, knobs, HOST, 1), HOST).count("vfmadd")
        inputs = matmul.make_inputs(task)
        args = matmul.kernel_args(task, knobs, inputs)
        LoadedKernel(compile_ir(matmul.build_ir(task, knobs, HOST, 1), HOST).data, HOST)(args)
        np.testing.assert_allclose(args[-1], inputs[0] @ inputs[1], rtol=1e-4, atol=1e-4)
    assert fmas[1] > 0 and fmas[4] >= 4 * fmas[1]


@pytest.mark.parametrize("name", ["x86-64-avx512", "x86-64-avx2", "host"])
@pytest.mark.parametrize("m,n,k", [(128, 3072, 768), (128, 768, 3072), (64, 2304, 768), (197, 3072, 768),
                                   (197, 768, 768)])
def test_transformer_dense_defaults_stream_the_weight_once(name, m, n, k):
    """A dense layer with few rows: one M block holds all of A (in half of L2), read in place (packing
    it again for every N block cost BERT and ViT 6-7% end to end), threads split N in blocks that give
    both cores the same number of panels, and B is read once (one item per N block)."""
    from stages.templates.gemm_codegen import GemmSpec, Schedule, work_items

    target = preset(name)
    task = dense.task(m, n, k, (EpilogueOp(kind="bias"),))
    knobs = dense.default_config(task, target).knobs
    s = Schedule.from_knobs(knobs)
    assert dense.space(task, target).reason(knobs) is None
    assert s.par == "n" and s.mc * s.mr >= m and not s.pack_a
    assert -(-m // s.mr) * s.mr * s.kc * 4 <= target.l2_bytes // 2
    panels = -(-n // s.nr)
    items = work_items(GemmSpec(m=m, n=n, k=k), s)
    assert items == -(-panels // s.nc) and items % target.cores == 0
    assert -(-k // s.kc) * s.kc - k < s.kc // 2  # even K blocks: no short tail block


@settings(max_examples=60, deadline=None)
@given(m=st.integers(1, 400), n=st.integers(1, 5000), k=st.integers(1, 5000), trans_a=st.booleans())
def test_dense_defaults_never_fall_back_to_the_smallest_schedule(m, n, k, trans_a):
    """Every default of the weight path passes the space's rule on its first try: the fallback (one row
    of 4 lanes) would be correct but slow."""
    from stages.templates.gemm_schedule import SMALLEST

    for target in (preset("x86-64-avx512"), preset("x86-64-avx2"), HOST):
        task = dense.task(m, n, k, trans_a=trans_a)
        knobs = dense.default_config(task, target).knobs
        assert dense.space(task, target).reason(knobs) is None
        assert knobs != SMALLEST or n <= 4


@pytest.mark.parametrize("m,n,k,chain", [(40, 520, 200, "bias,gelu"), (13, 300, 96, "residual_add"),
                                         (7, 1000, 33, "")])
@pytest.mark.parametrize("threads", [1, 2])
def test_dense_weight_streaming_default_matches_numpy(m, n, k, chain, threads):
    """The transformer-like default (all of M in one block, N split, even K blocks, ragged M/N/K edges)."""
    task = dense.task(m, n, k, parse_epilogue(chain))
    knobs = dense.default_config(task, HOST).knobs
    assert knobs["par"] == "n" and int(knobs["mc"]) * int(knobs["mr"]) >= m
    ok, err = _run(task, threads=threads)
    assert ok, err


def test_matrix_vector_products_keep_the_general_rule():
    """One row tile (BERT's pooler, ViT's head): the weight-streaming blocks measured 0.87x cold there."""
    from stages.templates.gemm_schedule import default_gemm

    for m, n, k in ((1, 1000, 768), (1, 768, 768), (5, 4096, 1024)):
        task = dense.task(m, n, k)
        assert dense.default_config(task, HOST).knobs == default_gemm(m, n, k, HOST).knobs
