"""Int8 kernels' masked edge stores write exactly their bytes: output zero point 0 (where the requantize is a
plain truncation the backend can fold into the store), a last vector of one column, and a sentinel after the
output buffer; and the masked byte store every int8 kernel and loop uses. The int8 fuzzer found LLVM turning
such one-lane stores into 4-byte stores (three bytes of the next channel zeroed: a 1x1 and a 3x3 stride-2
conv of a random quantized CNN 59 steps off)."""

from __future__ import annotations

import numpy as np
import pytest
from llvmlite import ir

from schemas.target import Target, preset
from stages.codegen.compile import compile_ir
from stages.codegen.harness import add_harness
from stages.codegen.irb import I1, I32, VOIDP, gep, i64, store_ints
from stages.codegen.jit import LoadedKernel
from stages.templates import qconv2d, qdense
from stages.templates.qgemm_isa import LANES, available

HOST = Target.host()
AVX2 = preset("x86-64-avx2")
PATHS = [(HOST, isa) for isa in available(HOST)] + [(AVX2, "avx2")]
SENTINEL = 0x5A
SLACK = 64


def _run(template, task, target: Target, knobs: dict, inputs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's output and the bytes after it, both first filled with SENTINEL."""
    args = template.kernel_args(task, knobs, inputs)
    out = args[-1]
    buf = np.full(out.size + SLACK, SENTINEL, dtype=out.dtype)
    args[-1] = buf[:out.size].reshape(out.shape)
    ir = template.build_ir(task, knobs, target, 2) if template is qconv2d else template.build_ir(task, knobs, target)
    LoadedKernel(compile_ir(ir, target).data, HOST)(args)
    return args[-1], buf[out.size:]


@pytest.mark.parametrize(("target", "isa"), PATHS, ids=[f"{t.name}-{i}" for t, i in PATHS])
@pytest.mark.parametrize("axis", ["w", "oc", "dw"])
def test_qconv2d_one_column_edges(target, isa, axis):
    lanes = LANES[isa]
    for ow in (1, lanes + 1, 2 * lanes + 1):
        depthwise = axis == "dw"
        c, oc = (6, 6) if depthwise else (5, 7)
        task = qconv2d.task((1, c, 9, 2 * ow - 1), (oc, 1 if depthwise else c, 3, 3), (2, 2), (1, 1, 1, 1),
                            group=c if depthwise else 1, x_zero_point=122, y_zero_point=0)
        knobs = {"isa": isa, "mr": 1 if depthwise else 2, "rh": 1, "nv": 2 if ow > lanes else 1, "uk": 1,
                 "order": "ot_rt", "axis": axis}
        if axis == "oc":
            knobs["nv"] = 1
        assert qconv2d.space(task, target).reason(knobs) is None, (ow, knobs)
        inputs = qconv2d.make_inputs(task, seed=ow)
        ref = qconv2d.reference(task, inputs)
        assert 0 < np.count_nonzero(ref) < ref.size  # zero point 0: some outputs saturate at 0, most do not
        got, after = _run(qconv2d, task, target, knobs, inputs)
        np.testing.assert_array_equal(got, ref, err_msg=f"ow={ow} {knobs}")
        assert (after == SENTINEL).all(), f"ow={ow} {knobs}: wrote past the output: {after[:8]}"


@pytest.mark.parametrize(("target", "isa"), PATHS, ids=[f"{t.name}-{i}" for t, i in PATHS])
def test_qdense_one_column_edges(target, isa):
    lanes = LANES[isa]
    for n in (1, lanes + 1, 2 * lanes + 1):
        task = qdense.task(16, n, 40, x_zero_point=131, y_zero_point=0)
        knobs = {**qdense.default_config(task, target).knobs, "isa": isa, "mr": 1, "nv": 1}
        assert qdense.space(task, target).reason(knobs) is None, (n, knobs)
        inputs = qdense.make_inputs(task, seed=n)
        ref = qdense.reference(task, inputs)
        assert 0 < np.count_nonzero(ref) < ref.size
        got, after = _run(qdense, task, target, knobs, inputs)
        np.testing.assert_array_equal(got, ref, err_msg=f"n={n} {knobs}")
        assert (after == SENTINEL).all(), f"n={n} {knobs}: wrote past the output: {after[:8]}"


@pytest.mark.parametrize("lanes", [8, 16, 32])
@pytest.mark.parametrize("kept", [1, 2, 5])
def test_masked_byte_store_of_a_truncation_writes_only_its_lanes(lanes, kept):
    """`irb.store_ints` of `trunc <lanes x i32>` under a constant mask of `kept` lanes, the shape LLVM folds
    (a QuantizeLinear tail, a kernel's last column): exactly `kept` bytes change."""
    mod = ir.Module(name="edge")
    mod.triple = HOST.triple
    main = ir.Function(mod, ir.FunctionType(ir.VoidType(), [VOIDP]), name="tf_main")
    b = ir.IRBuilder(main.append_basic_block("entry"))
    slots = b.bitcast(main.args[0], VOIDP.as_pointer())
    src = b.bitcast(b.load(gep(b, slots, i64(0))), ir.VectorType(I32, lanes).as_pointer())
    dst = b.load(gep(b, slots, i64(1)))
    narrow = b.trunc(b.load(src, align=4), ir.VectorType(ir.IntType(8), lanes))
    store_ints(b, narrow, dst, ir.Constant(ir.VectorType(I1, lanes), [int(k < kept) for k in range(lanes)]))
    b.ret_void()
    add_harness(mod, main)
    values = np.arange(1, lanes + 1, dtype=np.int32) * 3
    out = np.full(lanes + SLACK, SENTINEL, dtype=np.uint8)
    LoadedKernel(compile_ir(mod, HOST).data, HOST)([values, out])
    np.testing.assert_array_equal(out[:kept], values[:kept].astype(np.uint8))
    assert (out[kept:] == SENTINEL).all(), out[:lanes + 4]
