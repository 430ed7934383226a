"""The shared epilogue emitter, compiled for real and run against `apply_reference`.

A small kernel walks a (rows, cols) output in vectors, applies a chain to each vector and stores
it once. Per-channel tensors are either vectors along the vectorised axis (channels = cols, as in
dense or NCHWc) or one splatted scalar per row (channels = rows, as in NCHW conv2d).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from llvmlite import ir

from schemas.target import Target
from schemas.task import EpilogueOp, parse_epilogue
from stages.codegen.compile import compile_ir
from stages.codegen.harness import add_harness
from stages.codegen.irb import F32P, I64, VOIDP, add, for_range, gep, i64, load_vec, mul, splat, store_vec
from stages.codegen.jit import LoadedKernel
from stages.codegen.parallel import emit_main
from stages.graph import epilogue
from stages.templates.epilogue import emit

VW = 8
HOST = Target.host()


def _kernel(ops: tuple[EpilogueOp, ...], rows: int, cols: int, channels_on_cols: bool) -> LoadedKernel:
    """args: x, *epilogue tensors, y."""
    mod = ir.Module(name="epi")
    mod.triple = HOST.triple
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [VOIDP, I64, I64]), name="tf_range")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    argv = b.bitcast(fn.args[0], F32P.as_pointer())
    n_ops = len(epilogue.operands(ops))
    ptrs = [b.load(b.gep(argv, [i64(i)])) for i in range(n_ops + 2)]
    x, tensors, y = ptrs[0], ptrs[1:-1], ptrs[-1]
    slots = epilogue.operands(ops)
    with for_range(b, fn.args[1], fn.args[2], name="r") as r:
        for j in range(0, cols, VW):
            valid = min(VW, cols - j)
            pos = add(b, mul(b, r, i64(cols)), i64(j))

            def load(slot: int, pos=pos, j=j, valid=valid, r=r) -> ir.Value:
                t = tensors[slot]
                if not slots[slot].per_channel:
                    return load_vec(b, gep(b, t, pos), VW, valid)
                if channels_on_cols:
                    return load_vec(b, gep(b, t, i64(j)), VW, valid)
                return splat(b, b.load(gep(b, t, r)), VW)

            acc = load_vec(b, gep(b, x, pos), VW, valid)
            store_vec(b, emit(b, ops, acc, load), gep(b, y, pos), valid)
    b.ret_void()
    add_harness(mod, emit_main(mod, fn, rows, 1))
    return LoadedKernel(compile_ir(mod, HOST).data, HOST)


def _run(ops: tuple[EpilogueOp, ...], rows: int, cols: int, channels_on_cols: bool, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-4, 4, size=(rows, cols)).astype(np.float32)
    axis = 1 if channels_on_cols else 0
    tensors = epilogue.make_operands(ops, (rows, cols), axis, rng)
    y = np.full((rows, cols), np.nan, dtype=np.float32)
    _kernel(ops, rows, cols, channels_on_cols)([x, *tensors, y])
    return y, epilogue.apply_reference(ops, x, tensors, channel_axis=axis)


_OPS = st.sampled_from([
    EpilogueOp(kind="bias"), EpilogueOp(kind="bias", attrs={"beta": 0.5}), EpilogueOp(kind="scale_shift"),
    EpilogueOp(kind="relu"), EpilogueOp(kind="clip", attrs={"min": 0.0, "max": 6.0}),
    EpilogueOp(kind="clip", attrs={"min": -1.5}), EpilogueOp(kind="leaky_relu", attrs={"alpha": 0.1}),
    EpilogueOp(kind="sigmoid"), EpilogueOp(kind="tanh"), EpilogueOp(kind="gelu"),
    EpilogueOp(kind="residual_add"), EpilogueOp(kind="residual_add", attrs={"beta": -2.0}),
    EpilogueOp(kind="gelu_tanh"), EpilogueOp(kind="swish"), EpilogueOp(kind="swish", attrs={"alpha": 1.7}),
    EpilogueOp(kind="hard_sigmoid"), EpilogueOp(kind="hard_sigmoid", attrs={"alpha": 0.3, "beta": 0.4}),
    EpilogueOp(kind="hard_swish"),
])


@settings(max_examples=25, deadline=None)
@given(chain=st.lists(_OPS, min_size=1, max_size=4).map(tuple), rows=st.integers(1, 5),
       cols=st.integers(1, 21), on_cols=st.booleans())
def test_random_chains_match_numpy(chain, rows, cols, on_cols):
    y, ref = _run(chain, rows, cols, on_cols)
    np.testing.assert_allclose(y, ref, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("op", [EpilogueOp(kind=k) for k in ("sigmoid", "tanh", "gelu", "gelu_tanh", "swish",
                                                             "hard_sigmoid", "hard_swish")]
                         + [EpilogueOp(kind="swish", attrs={"alpha": 0.5})], ids=lambda op: op.kind)
def test_transcendentals_are_accurate_over_a_wide_range(op):
    ops = (op,)
    x = np.concatenate([np.linspace(-100, 100, 4001), np.linspace(-1e-3, 1e-3, 999)]).astype(np.float32)
    x = x.reshape(-1, VW)
    y = np.empty_like(x)
    _kernel(ops, x.shape[0], VW, True)([x, y])
    ref = epilogue.apply_reference(ops, x, [])
    assert np.all(np.isfinite(y))
    np.testing.assert_allclose(y, ref, rtol=1e-6, atol=3e-7)


def test_operands_follow_epilogue_order_and_shapes():
    ops = parse_epilogue("relu,bias,scale_shift,residual_add")
    assert [(o.op_index, o.role) for o in epilogue.operands(ops)] == [
        (1, "bias"), (2, "scale"), (2, "shift"), (3, "residual")]
    specs = epilogue.operand_specs(ops, (2, 16, 5, 5), channel_axis=1)
    assert [s.shape for s in specs] == [(16,), (16,), (16,), (2, 16, 5, 5)]


def test_validate_rejects_unknown_attributes_and_bad_clip():
    with pytest.raises(ValueError, match="does not take"):
        epilogue.validate((EpilogueOp(kind="relu", attrs={"alpha": 1.0}),))
    with pytest.raises(ValueError, match="does not take"):
        epilogue.validate((EpilogueOp(kind="swish", attrs={"beta": 1.0}),))
    epilogue.validate((EpilogueOp(kind="hard_swish", attrs={"alpha": 0.2, "beta": 0.5}),))
    with pytest.raises(ValueError, match="exceeds max"):
        epilogue.validate((EpilogueOp(kind="clip", attrs={"min": 3.0, "max": 1.0}),))
