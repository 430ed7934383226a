"""Graph passes on real ONNX files: batch-norm folding, epilogue fusion (and where it must stop),
the Gelu pattern, Gemm's attributes, dead-node removal — each checked against onnxruntime."""

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from stages.extract import load_model
from stages.graph import reference
from stages.graph.ir import Graph
from stages.graph.passes import optimize

RNG = np.random.default_rng(7)


def const(name: str, shape, lo=-1.0, hi=1.0):
    return numpy_helper.from_array(RNG.uniform(lo, hi, shape).astype(np.float32), name)


def scalar(name: str, v: float):
    return numpy_helper.from_array(np.array(v, np.float32), name)


def build(tmp_path: Path, nodes, x_shape, inits, outputs=("y",), opset=17) -> Path:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    return path


def check(path: Path, x_shape) -> Graph:
    """Optimise, check topological order and outputs vs onnxruntime; return the optimised graph."""
    g = load_model(path)
    opt = optimize(g)
    defined = {v.name for v in opt.inputs} | set(opt.constants)
    for node in opt.nodes:
        assert all(i in defined for i in node.inputs), f"{node.name} reads a value before it is computed"
        defined.update(node.outputs)
    x = RNG.standard_normal(x_shape).astype(np.float32)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    expected = sess.run(None, {"x": x})
    got = reference.run(opt, {"x": x})
    for o, e in zip(sess.get_outputs(), expected, strict=True):
        np.testing.assert_allclose(got[o.name], e, rtol=1e-4, atol=1e-5)
    return opt


def epilogues(g: Graph) -> list[tuple[str, list[str]]]:
    return [(n.op, [e.kind for e in n.task.epilogue]) for n in g.nodes if n.task is not None]


def bn_inits(prefix: str, c: int) -> list:
    return [const(f"{prefix}s", c, 0.5, 1.5), const(f"{prefix}b", c), const(f"{prefix}m", c),
            const(f"{prefix}v", c, 0.5, 1.5)]


def bn(prefix: str, x: str, y: str):
    return helper.make_node("BatchNormalization", [x, f"{prefix}s", f"{prefix}b", f"{prefix}m", f"{prefix}v"], [y])


def test_resnet_block_folds_batchnorm_and_fuses_bias_residual_relu(tmp_path):
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]), bn("a", "c1", "b1"),
             helper.make_node("Relu", ["b1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]), bn("b", "c2", "b2"),
             helper.make_node("Add", ["b2", "x"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    inits = [const("w1", (8, 8, 3, 3)), const("w2", (8, 8, 3, 3)), *bn_inits("a", 8), *bn_inits("b", 8)]
    g = check(build(tmp_path, nodes, (1, 8, 6, 6), inits), (1, 8, 6, 6))
    assert epilogues(g) == [("conv2d", ["bias", "relu"]), ("conv2d", ["bias", "residual_add", "relu"])]
    assert len(g.nodes) == 2 and g.nodes[1].inputs[-1] == "x" and g.nodes[1].outputs == ["y"]
    task = g.nodes[1].task
    assert [s.shape for s in task.inputs] == [(1, 8, 6, 6), (8, 8, 3, 3), (8,), (1, 8, 6, 6)]
    assert task.attrs == {"strides": (1, 1), "pads": (1, 1, 1, 1), "dilations": (1, 1), "group": 1}


def test_batchnorm_after_gemm_folds_and_a_lone_batchnorm_becomes_scale_shift(tmp_path):
    nodes = [helper.make_node("Gemm", ["x", "w", "bias"], ["g"], transB=1, alpha=0.5, beta=2.0),
             bn("a", "g", "b"), helper.make_node("Relu", ["b"], ["r"]), bn("c", "r", "y")]
    inits = [const("w", (6, 5)), const("bias", (6,)), *bn_inits("a", 6), *bn_inits("c", 6)]
    g = check(build(tmp_path, nodes, (3, 5), inits), (3, 5))
    assert epilogues(g) == [("dense", ["bias", "relu", "scale_shift", "bias"])]
    assert len(g.nodes) == 1


def test_residual_of_another_anchor_is_fused_into_the_earlier_anchor_in_graph_order(tmp_path):
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"]), helper.make_node("Tanh", ["x"], ["t"]),
             helper.make_node("MatMul", ["t", "w2"], ["b"]), helper.make_node("Add", ["a", "b"], ["y"])]
    g = check(build(tmp_path, nodes, (4, 8), [const("w1", (8, 8)), const("w2", (8, 8))]), (4, 8))
    assert epilogues(g) == [("dense", []), ("dense", ["residual_add"])]
    assert g.nodes[-1].outputs == ["y"] and [n.op for n in g.nodes] == ["Tanh", "dense", "dense"]


@pytest.mark.parametrize("order", ["x*erf_then_half", "half*erf_then_x", "x*half_then_erf"])
def test_gelu_erf_pattern_becomes_a_fused_gelu(tmp_path, order):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "bias"], ["h"]),
             helper.make_node("Div", ["h", "sqrt2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["p"])]
    if order == "x*erf_then_half":
        nodes += [helper.make_node("Mul", ["h", "p"], ["q"]), helper.make_node("Mul", ["q", "half"], ["y"])]
    elif order == "half*erf_then_x":
        nodes += [helper.make_node("Mul", ["p", "half"], ["q"]), helper.make_node("Mul", ["h", "q"], ["y"])]
    else:
        nodes += [helper.make_node("Mul", ["h", "half"], ["q"]), helper.make_node("Mul", ["q", "p"], ["y"])]
    inits = [const("w", (8, 16)), const("bias", (16,)), scalar("sqrt2", np.sqrt(2)), scalar("one", 1.0),
             scalar("half", 0.5)]
    g = check(build(tmp_path, nodes, (1, 5, 8), inits), (1, 5, 8))
    assert epilogues(g) == [("dense", ["bias", "gelu"])] and len(g.nodes) == 1
    assert [s.shape for s in g.nodes[0].task.inputs] == [(5, 8), (16, 8), (16,)]


def test_fusion_stops_at_a_value_read_twice_and_keeps_clip_and_leaky_relu_parameters(tmp_path):
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], strides=[2, 2]),
             helper.make_node("Clip", ["c", "lo", "hi"], ["k"]),
             helper.make_node("LeakyRelu", ["k"], ["l"], alpha=0.2),
             helper.make_node("Sigmoid", ["l"], ["y"]), helper.make_node("Tanh", ["l"], ["z"])]
    inits = [const("w", (4, 3, 3, 3)), scalar("lo", 0.0), scalar("hi", 0.6)]
    g = check(build(tmp_path, nodes, (2, 3, 9, 9), inits, outputs=("y", "z")), (2, 3, 9, 9))
    assert epilogues(g) == [("conv2d", ["clip", "leaky_relu"])]
    ops = g.nodes[0].task.epilogue
    assert ops[0].attrs == {"min": 0.0, "max": pytest.approx(0.6)} and ops[1].attrs == {"alpha": pytest.approx(0.2)}
    assert sorted(n.op for n in g.nodes[1:]) == ["Sigmoid", "Tanh"]


def test_attention_scores_fuse_the_scale_and_gemm_with_run_time_c_gets_a_residual(tmp_path):
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["x", "xt"], ["s"]), helper.make_node("Div", ["s", "d"], ["y"]),
             helper.make_node("Reshape", ["x", "shape"], ["x2"]),
             helper.make_node("Gemm", ["x2", "x2", "x2"], ["z"], transA=1, alpha=2.0, beta=0.5)]
    inits = [scalar("d", 4.0), numpy_helper.from_array(np.array([4, 4], np.int64), "shape")]
    g = check(build(tmp_path, nodes, (2, 2, 4), inits, outputs=("y", "z")), (2, 2, 4))
    assert epilogues(g) == [("batch_matmul", ["scale_shift"]), ("batch_matmul", ["scale_shift", "residual_add"])]
    mm = g.nodes[-1]
    assert mm.task.epilogue[1].attrs == {"beta": 0.5}


def test_dead_nodes_and_constants_are_removed_and_the_input_graph_is_untouched(tmp_path):
    nodes = [helper.make_node("Sigmoid", ["x"], ["unused"]), helper.make_node("Add", ["unused", "c1"], ["unused2"]),
             helper.make_node("Relu", ["x"], ["y"])]
    path = build(tmp_path, nodes, (3,), [const("c1", (3,))])
    g = load_model(path)
    opt = optimize(g)
    assert [n.op for n in opt.nodes] == ["Relu"] and opt.constants == {} and "unused" not in opt.values
    assert [n.op for n in g.nodes] == ["Sigmoid", "Add", "Relu"] and "c1" in g.constants


def test_two_gemms_sharing_a_run_time_transposed_operand_get_their_own_transposes(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Gemm", ["x", "r"], ["a"], transB=1),
             helper.make_node("Gemm", ["r", "r"], ["b"], transB=1),
             helper.make_node("Add", ["a", "b"], ["y"])]
    g = check(build(tmp_path, nodes, (4, 4), []), (4, 4))
    transposes = [n for n in g.nodes if n.op == "Transpose"]
    assert len(transposes) == 2 and len({n.outputs[0] for n in transposes}) == 2
    assert epilogues(g) == [("batch_matmul", []), ("batch_matmul", ["residual_add"])]


@pytest.mark.parametrize("square", ["pow", "mul"])
def test_decomposed_layer_norm_becomes_one_layer_normalization(tmp_path, square):
    sq = (helper.make_node("Pow", ["d", "two"], ["p"]) if square == "pow"
          else helper.make_node("Mul", ["d", "d"], ["p"]))
    nodes = [helper.make_node("ReduceMean", ["x"], ["mean"], axes=[-1]), helper.make_node("Sub", ["x", "mean"], ["d"]),
             sq, helper.make_node("ReduceMean", ["p"], ["var"], axes=[-1]),
             helper.make_node("Add", ["var", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["std"]),
             helper.make_node("Div", ["d", "std"], ["n"]), helper.make_node("Mul", ["n", "gamma"], ["m"]),
             helper.make_node("Add", ["m", "beta"], ["y"])]
    inits = [scalar("two", 2.0), scalar("eps", 1e-5), const("gamma", (16,), 0.5, 1.5), const("beta", (16,))]
    g = check(build(tmp_path, nodes, (2, 3, 16), inits, opset=13), (2, 3, 16))
    assert [(n.op, n.attrs) for n in g.nodes] == [("LayerNormalization", {"axis": 2, "epsilon": pytest.approx(1e-5)})]
    assert g.nodes[0].outputs == ["y"] and len(g.nodes[0].inputs) == 3


ANCHOR_CASES = {  # anchor node(s) from x to "a", initializers, x shape, channel axis of "a"
    "conv": ([helper.make_node("Conv", ["x", "w"], ["a"], pads=[1, 0, 1, 0], group=2)], [("w", (6, 2, 3, 2))],
             (1, 4, 5, 5), 1),
    "gemm": ([helper.make_node("Gemm", ["x", "w"], ["a"], transB=1)], [("w", (6, 5))], (3, 5), 1),
    "dense3d": ([helper.make_node("MatMul", ["x", "w"], ["a"])], [("w", (5, 6))], (1, 3, 5), 2),
    "batch": ([helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1]), helper.make_node("MatMul", ["x", "t"],
                                                                                              ["a"])], [], (2, 3, 4),
              2),
}


@settings(max_examples=40, deadline=None)
@given(anchor=st.sampled_from(sorted(ANCHOR_CASES)), chain=st.lists(st.sampled_from(
    ["Relu", "Sigmoid", "Tanh", "Clip", "LeakyRelu", "Add/channel", "Add/scalar", "Add/full", "Sub/channel",
     "Mul/channel", "Div/scalar", "Add/residual", "Sum/residual"]), max_size=5), swap=st.booleans())
def test_any_element_wise_chain_after_any_anchor_fuses_whole_and_keeps_the_meaning(anchor, chain, swap):
    """Every link fuses into the one anchor, and the optimised graph computes what the imported one does."""
    nodes, weights, x_shape, axis = ANCHOR_CASES[anchor]
    nodes, inits = list(nodes), [const(n, s) for n, s in weights]
    out_shape = {"conv": (1, 6, 5, 4), "gemm": (3, 6), "dense3d": (1, 3, 6), "batch": (2, 3, 3)}[anchor]
    channel = [1] * len(out_shape)
    channel[axis] = out_shape[axis]
    cur = "a"
    for i, link in enumerate(chain):
        op, _, kind = link.partition("/")
        nxt = f"v{i}"
        if not kind:
            ins = [cur, "lo", "hi"] if op == "Clip" else [cur]
            nodes.append(helper.make_node(op, ins, [nxt], **({"alpha": 0.3} if op == "LeakyRelu" else {})))
        else:
            other = "r"
            if kind != "residual":
                other = f"c{i}"
                shape = {"channel": channel[-(len(out_shape) - 1):] if axis else channel, "scalar": [],
                         "full": out_shape}[kind]
                inits.append(const(other, tuple(shape), 0.5, 1.5))
            commutes = op in ("Add", "Sum", "Mul")
            nodes.append(helper.make_node(op, [other, cur] if swap and commutes else [cur, other], [nxt]))
        cur = nxt
    nodes.append(helper.make_node("Identity", [cur], ["y"]))
    inits += [scalar("lo", -0.4), scalar("hi", 0.7)]
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in (("x", x_shape), ("r", out_shape))]
    model = helper.make_model(helper.make_graph(nodes, "g", ins, [helper.make_tensor_value_info("y", 1, None)], inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    g = load_model(model)
    opt = optimize(g)
    assert [n.op for n in opt.nodes if n.op != "Transpose"] == [opt.nodes[-1].op] and opt.nodes[-1].task is not None
    assert len(opt.nodes[-1].task.epilogue) >= len(chain)
    feeds = {"x": RNG.standard_normal(x_shape).astype(np.float32),
             "r": RNG.standard_normal(out_shape).astype(np.float32)}
    np.testing.assert_allclose(reference.run(opt, feeds)["y"], reference.run(g, feeds)["y"], rtol=1e-5, atol=1e-6)
