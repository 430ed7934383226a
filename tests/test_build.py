"""The library build on hand-made graphs: every generated op against the numpy reference, apply-best
from a real tuning log, the memory plan, and the build's errors."""

import numpy as np
import pytest
from llvmlite import ir

from schemas import Config, EpilogueOp, MeasureOptions, TensorSpec, TuningOptions, TuningTask, matmul_task
from stages.build.library import BuildError, build_library
from stages.build.memplan import Step, plan_workspace
from stages.graph import reference
from stages.graph.ir import Graph, Node, Value
from stages.log import TuningLog
from stages.memops import reduce
from stages.memops.opctx import OpCtx
from stages.memops.registry import OPS
from stages.runtime import load
from stages.tune.loop import tune_task

RNG = np.random.default_rng(7)


def _const(shape, lo=-1.0, hi=1.0):
    return RNG.uniform(lo, hi, size=shape).astype(np.float32)


class _G:
    """A tiny graph builder: `add` infers the output shape by running the reference op."""

    def __init__(self, **inputs):
        self.inputs = [Value(k, v.shape) for k, v in inputs.items()]
        self.env = dict(inputs)
        self.nodes: list[Node] = []
        self.values = {v.name: v for v in self.inputs}
        self.constants: dict[str, np.ndarray] = {}

    def const(self, name, arr):
        self.constants[name] = self.env[name] = arr
        self.values[name] = Value(name, arr.shape)
        return name

    def add(self, op, ins, n_out=1, task=None, **attrs):
        outs = [f"{op.lower()}{len(self.nodes)}_{j}" for j in range(n_out)]
        node = Node(f"n{len(self.nodes)}_{op}", op, list(ins), outs, attrs, task)
        for name, arr in zip(outs, reference.run_node(node, [self.env[i] for i in ins]), strict=True):
            self.env[name] = arr
            self.values[name] = Value(name, arr.shape)
        self.nodes.append(node)
        return outs[0] if n_out == 1 else outs

    def graph(self, outputs):
        return Graph("t", self.inputs, [self.values[o] for o in outputs], self.nodes, self.values, self.constants)


def _every_op_graph():
    x = _const((1, 4, 6, 6))
    g = _G(x=x)
    mp = g.add("MaxPool", ["x"], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1], dilations=[1, 1])
    ap = g.add("AveragePool", ["x"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1,
               count_include_pad=0)
    ap2 = g.add("AveragePool", ["x"], kernel_shape=[2, 3], strides=[2, 2], pads=[0, 1, 1, 1], count_include_pad=1)
    lrn = g.add("LRN", [mp], size=3, alpha=1e-3, beta=0.75, bias=1.0)
    bn = g.add("BatchNormalization", [lrn, g.const("s", _const(4)), g.const("b", _const(4)), g.const("m", _const(4)),
                                      g.const("v", _const(4, 0.5, 2))], epsilon=1e-5)
    gap = g.add("GlobalAveragePool", [bn])
    add = g.add("Add", [bn, gap])
    sub = g.add("Sub", [add, g.const("c", _const((4, 1, 1)))])
    mul = g.add("Mul", [sub, g.const("c2", _const((6,)))])
    div = g.add("Div", [mul, g.const("d", _const((1, 4, 1, 1), 1, 2))])
    relu = g.add("Relu", [div])
    sq = g.add("Sqrt", [relu])
    p2 = g.add("Pow", [div, g.const("two", np.array(2.0, dtype=np.float32))])
    pw = g.add("Pow", [sq, g.const("e", np.array(1.5, dtype=np.float32))])
    clip = g.add("Clip", [div], min=-0.5, max=0.5)
    lk = g.add("LeakyRelu", [div], alpha=0.1)
    sg = g.add("Sigmoid", [lk])
    th = g.add("Tanh", [clip])
    er = g.add("Erf", [div])
    ge = g.add("Gelu", [div], approximate="none")
    gt = g.add("Gelu", [div], approximate="tanh")
    total = g.add("Sum", [sg, th, er, ge, gt, p2, pw])
    tr = g.add("Transpose", [total], perm=[0, 2, 3, 1])
    rs = g.add("Reshape", [tr], shape=[1, 36, 4])
    sm = g.add("Softmax", [rs], axis=1)
    lsm = g.add("LogSoftmax", [rs], axis=2)
    ln = g.add("LayerNormalization", [rs, g.const("ls", _const((4,))), g.const("lb", _const((4,)))], axis=2,
               epsilon=1e-5)
    rm = g.add("ReduceMean", [ln], axes=[1], keepdims=0)
    cat = g.add("Concat", [sm, lsm, ln], axis=2)
    a, b = g.add("Split", [cat], n_out=2, axis=2, split=[5, 7])
    sl = g.add("Slice", [b], starts=[0, 30, 1], steps=[1, -3, 2], sizes=[1, 10, 3])
    pc = g.add("Pad", [sl], pads=[0, 2, -1, 0, 1, 2], mode="constant", value=0.25)
    pe = g.add("Pad", [sl], pads=[0, 2, 1, 0, 3, 1], mode="edge")
    pr = g.add("Pad", [sl], pads=[0, 2, 1, 0, 3, 1], mode="reflect")
    fl = g.add("Flatten", [a], shape=[1, 180])
    task = matmul_task(1, 10, 180)
    mm = g.add("MatMul", [fl, g.const("w", _const((180, 10)))], task=task)
    out = g.add("Softmax", [mm], axis=1)
    outs = [ap, ap2, rm, pc, pe, pr, out]
    return g.graph(outs), {"x": x}


def test_every_generated_op_matches_the_reference(tmp_path, host):
    graph, feeds = _every_op_graph()
    fallbacks = []
    manifest = build_library(graph, host, tmp_path / "lib", on_fallback=fallbacks.append)
    assert len(fallbacks) == 1 and "matmul(1x180,180x10)" in fallbacks[0] and "no log given" in fallbacks[0]
    kinds = {op.op: op.kind for op in manifest.ops}
    assert kinds["MatMul"] == "default" and kinds["Reshape"] == "alias" and kinds["Softmax"] == "generated"
    assert 0 < manifest.workspace_bytes < manifest.naive_workspace_bytes
    got = load(tmp_path / "lib").run(**feeds)
    want = reference.run(graph, feeds)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-3, atol=1e-4, err_msg=name)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # Exp(100) is inf for both
def test_the_smaller_element_wise_and_reduction_ops_match_the_reference(tmp_path, host):
    """Ops the backend cases do not reach: unary maths, HardSigmoid, variadic Max/Min/Mean with
    broadcasting, GlobalMaxPool, Tile, InstanceNormalization, ReduceSum/Max/Min; Softplus stays finite
    where e^x overflows."""
    x = _const((2, 3, 5, 4), -3, 3)
    x[0, 0, 0, :2] = (100.0, -100.0)
    g = _G(x=x)
    pos = g.add("Abs", ["x"])
    outs = [g.add(op, ["x"]) for op in ("Neg", "Exp", "Floor", "Ceil", "Sign", "Softplus", "Softsign")]
    outs += [g.add("Log", [pos]), g.add("Reciprocal", [g.add("Add", [pos, g.const("one", np.ones(1, np.float32))])])]
    outs.append(g.add("HardSigmoid", ["x"], alpha=0.3, beta=0.4))
    outs.append(g.add("Shrink", ["x"], lambd=1.0, bias=0.5))
    outs.append(g.add("Selu", ["x"], alpha=1.6, gamma=1.05))
    outs.append(g.add("PRelu", ["x", g.const("slope", _const((3, 1, 1)))]))
    c = g.const("row", _const((4,)))
    outs += [g.add("Max", ["x", c, pos]), g.add("Min", ["x", c]), g.add("Mean", ["x", c, pos])]
    outs += [g.add("GlobalMaxPool", ["x"]), g.add("Tile", ["x"], repeats=[1, 2, 1, 3])]
    outs.append(g.add("InstanceNormalization", ["x", g.const("s", _const((3,))), g.const("t", _const((3,)))],
                      epsilon=1e-5))
    outs += [g.add(op, ["x"], axes=[1, 3], keepdims=k) for op, k in (("ReduceSum", 1), ("ReduceMax", 0),
                                                                       ("ReduceMin", 1))]
    graph = g.graph(outs)
    build_library(graph, host, tmp_path / "lib")
    got = load(tmp_path / "lib").run(x=x)
    want = reference.run(graph, {"x": x})
    assert np.isfinite(got[outs[5]]).all() and got[outs[5]][0, 0, 0, 0] == pytest.approx(100.0)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)


POOLS = [("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
         ("MaxPool", dict(kernel_shape=[2, 3], strides=[1, 2], pads=[0, 1, 1, 2], dilations=[2, 1], ceil_mode=1)),
         ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=0)),
         ("AveragePool", dict(kernel_shape=[5, 2], strides=[3, 1], pads=[2, 0, 1, 1], count_include_pad=1)),
         ("MaxPool", dict(kernel_shape=[3, 4], strides=[2, 3], pads=[1, 1, 1, 2]))]


@pytest.mark.parametrize("n", [3, 16, 37])
def test_softmax_rows_in_vectors_match_the_reference_with_a_tail_and_large_or_negative_rows(tmp_path, host, n):
    """Contiguous rows run in 16-lane vectors with a masked tail: the tail must not count in the max
    (an all-negative row) or the sum, and large values must not overflow."""
    x = _const((3, 4, n), -3, 3)
    x[0, 0] -= 50.0  # an all-negative row
    x[0, 1] += 1e4  # exp would overflow without subtracting the max
    g = _G(x=x)
    outs = [g.add("Softmax", ["x"], axis=-1), g.add("LogSoftmax", ["x"], axis=2), g.add("Softmax", ["x"], axis=1)]
    graph = g.graph(outs)
    build_library(graph, host, tmp_path / "lib")
    got, want = load(tmp_path / "lib").run(x=x), reference.run(graph, {"x": x})
    for name in want:
        assert np.isfinite(got[name]).all(), name
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("n", [5, 16, 37, 768])
def test_layer_norm_rows_in_vectors_match_the_reference_with_a_tail_and_an_offset_row(tmp_path, host, n):
    """LayerNormalization over rows of `n` in 16-lane vectors with a masked tail (the tail must not count in the
    mean or the variance), a normalised axis of two dims, rows far from zero
    (the variance is taken about the mean), and InstanceNormalization's one scale per row."""
    x = _const((3, 4, n), -2, 2)
    x[1, 2] += 300.0
    g = _G(x=x)
    outs = [g.add("LayerNormalization", ["x", g.const("sc", _const((n,))), g.const("bi", _const((n,)))], axis=2,
                  epsilon=1e-5),
            g.add("LayerNormalization", ["x", g.const("sc2", _const((4, n)))], axis=1, epsilon=1e-3),
            g.add("InstanceNormalization", ["x", g.const("s", _const((4,))), g.const("t", _const((4,)))],
                  epsilon=1e-5)]
    graph = g.graph(outs)
    build_library(graph, host, tmp_path / "lib")
    got, want = load(tmp_path / "lib").run(x=x), reference.run(graph, {"x": x})
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4, err_msg=name)  # float32 of 300


@pytest.mark.parametrize("shape", [(2, 3, 5, 5), (1, 64, 8, 8), (2, 3, 37)])
def test_trailing_axis_sums_match_the_reference_with_vector_tails(tmp_path, host, shape):
    """GlobalAveragePool and ReduceMean/ReduceSum over the trailing axes: rows of 25, 64 and 37 floats
    (16-lane vectors, masked tails); a reduction over a leading axis keeps the element-wise path."""
    g = _G(x=_const(shape, -3, 3))
    outs = [g.add("ReduceMean", ["x"], axes=[-1]), g.add("ReduceSum", ["x"], axes=[1, 2], keepdims=0),
            g.add("ReduceSum", ["x"], axes=[0])]
    if len(shape) == 4:
        outs.append(g.add("GlobalAveragePool", ["x"]))
    graph = g.graph(outs)
    build_library(graph, host, tmp_path / "lib")
    got, want = load(tmp_path / "lib").run(x=g.env["x"]), reference.run(graph, {"x": g.env["x"]})
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5, err_msg=name)
    vectorised = []
    for node in graph.nodes:
        module = ir.Module()
        ctx = OpCtx.open(module, graph, node, "op")
        OPS[node.op](ctx)
        ctx.close()
        vectorised.append("llvm.vector.reduce.fadd.v16f32" in str(module))
    assert vectorised == [True, len(shape) == 3, False] + [True] * (len(shape) == 4)


@pytest.mark.parametrize("op,attrs", POOLS)
def test_pools_split_over_the_worker_pool_match_the_reference(tmp_path, host, op, attrs):
    """Output rows split over two threads; borders, dilation, ceil mode and pad counting; column strides
    1, 2 and 3."""
    g = _G(x=_const((2, 6, 64, 70)))
    graph = g.graph([g.add(op, ["x"], **attrs)])
    build_library(graph, host, tmp_path / "lib", threads=2)
    assert b"tf_op0_range" in (tmp_path / "lib" / "model.so").read_bytes()  # the planes run on the pool
    got = load(tmp_path / "lib").run(x=g.env["x"])
    want = reference.run(graph, {"x": g.env["x"]})
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)


NARROW_POOLS = [((1, 7, 35, 35), "AveragePool", dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1],
                                                         count_include_pad=0)),
                ((1, 5, 8, 8), "AveragePool", dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1],
                                                   count_include_pad=1)),
                ((2, 3, 9, 5), "AveragePool", dict(kernel_shape=[7, 7], strides=[1, 1], pads=[3, 3, 3, 3])),  # borders
                ((1, 6, 11, 13), "MaxPool", dict(kernel_shape=[3, 4], strides=[1, 1], pads=[0, 1, 2, 2])),
                ((1, 4, 10, 9), "AveragePool", dict(kernel_shape=[4, 2], strides=[1, 1], pads=[2, 0, 1, 1],
                                                    count_include_pad=1)),
                ((1, 4, 13, 17), "MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[0, 1, 2, 0],
                                                 dilations=[2, 2], ceil_mode=1)),
                ((1, 2, 6, 70), "AveragePool", dict(kernel_shape=[1, 65], strides=[1, 1], pads=[0, 32, 0, 31],
                                                    count_include_pad=1)),
                ((1, 128, 17, 17), "AveragePool", dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1]))]


@pytest.mark.parametrize("shape,op,attrs", NARROW_POOLS)
def test_narrow_pools_run_whole_planes_or_unrolled_borders_and_match_the_reference(tmp_path, host, shape, op, attrs,
                                                                                   monkeypatch):
    """Stride-1 pools whose output keeps the input's size (Inception's 3x3 pad-1 pools on 35- and 8-wide maps,
    asymmetric pads) run a plane at a time as flat loops (`_same_pool`), bit for bit the row-at-a-time kernel;
    the others go a row at a time, their border columns' taps and counts fixed at build time, except past
    `BORDER_UNROLL` taps a row (a 65-wide window), where the tap loop stays."""
    g = _G(x=_const(shape))
    graph = g.graph([g.add(op, ["x"], **attrs)])
    module = ir.Module()
    ctx = OpCtx.open(module, graph, graph.nodes[0], "op")
    OPS[op](ctx)
    ctx.close()
    text = str(module)
    same = graph.values[graph.nodes[0].outputs[0]].shape == shape
    assert ("hcol.head" in text, "kw.head" in text) == (same, attrs["kernel_shape"][1] == 65)
    for threads in (1, 2):
        build_library(graph, host, tmp_path / "lib", threads=threads)
        if threads == 2 and shape[1] == 128:  # enough planes to split: the kernel's body runs on the pool
            assert b"tf_op0_range" in (tmp_path / "lib" / "model.so").read_bytes()
        got = load(tmp_path / "lib").run(x=g.env["x"])
        want = reference.run(graph, {"x": g.env["x"]})
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-7, err_msg=name)
        if same:
            with monkeypatch.context() as m:
                m.setattr(reduce, "SAME_POOL_FLOATS", 0)
                build_library(graph, host, tmp_path / "rows", threads=threads)
            rows = load(tmp_path / "rows").run(x=g.env["x"])
            assert all(np.array_equal(got[name].view(np.uint32), rows[name].view(np.uint32)) for name in want)


def _mm_graph(m=16, n=24, k=32):
    g = _G(x=_const((m, k)))
    y = g.add("MatMul", ["x", g.const("w", _const((k, n)))], task=matmul_task(m, n, k))
    return g.graph([g.add("Relu", [y])]), {"x": g.env["x"]}


def test_library_kernels_leave_out_the_tuners_timing_harness(tmp_path, host):
    graph, feeds = _mm_graph()
    build_library(graph, host, tmp_path / "lib")
    so = (tmp_path / "lib" / "model.so").read_bytes()
    assert b"tf_op0_main" in so and b"bench" not in so
    np.testing.assert_allclose(load(tmp_path / "lib").run(**feeds)[graph.outputs[0].name],
                               np.maximum(feeds["x"] @ graph.constants["w"], 0), rtol=1e-5, atol=1e-5)


def test_identical_anchor_kernels_are_compiled_once_and_each_reads_its_own_weights(tmp_path, host):
    g = _G(x=_const((16, 32)))
    y = g.add("MatMul", ["x", g.const("w1", _const((32, 32)))], task=matmul_task(16, 32, 32))
    z = g.add("MatMul", [g.add("Relu", [y]), g.const("w2", _const((32, 32)))], task=matmul_task(16, 32, 32))
    graph = g.graph([z])
    build_library(graph, host, tmp_path / "lib")
    so = (tmp_path / "lib" / "model.so").read_bytes()
    assert b"tf_op0_main" in so and b"tf_op2_main" not in so
    want = np.maximum(g.env["x"] @ graph.constants["w1"], 0) @ graph.constants["w2"]
    np.testing.assert_allclose(load(tmp_path / "lib").run(x=g.env["x"])[z], want, rtol=1e-4, atol=1e-5)


def test_apply_best_takes_the_fastest_accepted_record_and_says_who_fell_back(tmp_path, host):
    graph, feeds = _mm_graph()
    task = graph.nodes[0].task
    log = TuningLog(tmp_path / "log")
    tune_task(task, host, TuningOptions(n_trials=6, batch_size=3, tuner="random",
                                          measure=MeasureOptions(threads=1)), log)
    best = log.best(task.signature, host.key, threads=1)
    # a faster record the template no longer accepts must be passed over, not used
    bogus = best.model_copy(update={"config": Config(index=0, knobs={"nonsense": 1}), "trial": 99,
                                    "result": best.result.model_copy(update={"costs": (1e-9,)})})
    log.append([bogus])
    notes = []
    manifest = build_library(graph, host, tmp_path / "tuned", log=tmp_path / "log", on_fallback=notes.append)
    assert notes == []
    op = manifest.ops[0]
    assert op.kind == "tuned" and op.knobs == best.config.knobs
    assert op.record["session_id"] == best.session_id and op.record["trial"] == best.trial
    assert manifest.log_digest and manifest.target_key == host.key
    np.testing.assert_allclose(load(tmp_path / "tuned")(**feeds), reference.run(graph, feeds)[graph.outputs[0].name],
                               rtol=1e-4, atol=1e-5)
    # records were measured on 1 thread: a 2-thread build falls back, once, naming the task
    manifest2 = build_library(graph, host, tmp_path / "t2", threads=2, log=tmp_path / "log",
                              on_fallback=notes.append)
    assert manifest2.ops[0].kind == "default" and len(notes) == 1 and task.signature in notes[0]


def test_anchors_with_run_time_weights_take_the_generic_kernel(tmp_path, host):
    x, y, w = _const((6, 8)), _const((8, 5)), _const((3, 5))
    g = _G(x=x, y=y, w=w)
    mm = TuningTask(op="matmul", inputs=(TensorSpec(shape=(6, 8)), TensorSpec(shape=(8, 5)), TensorSpec(shape=(5,))),
                    outputs=(TensorSpec(shape=(6, 5)),), epilogue=(EpilogueOp(kind="bias"), EpilogueOp(kind="relu")))
    h = g.add("MatMul", ["x", "y", g.const("bias", _const((5,)))], task=mm)
    dense = TuningTask(op="dense", inputs=(TensorSpec(shape=(6, 5)), TensorSpec(shape=(3, 5))),
                       outputs=(TensorSpec(shape=(6, 3)),), epilogue=(EpilogueOp(kind="tanh"),))
    out = g.add("Gemm", [h, "w"], task=dense)
    graph = g.graph([out])
    notes = []
    manifest = build_library(graph, host, tmp_path / "lib", on_fallback=notes.append)
    assert [op.kind for op in manifest.ops] == ["generic", "generic"]
    assert "2 anchor task(s) run the generic untuned kernel" in notes[0] and "computes at run time" in notes[0]
    feeds = {"x": x, "y": y, "w": w}
    np.testing.assert_allclose(load(tmp_path / "lib")(**feeds), reference.run(graph, feeds)[out], rtol=1e-4,
                               atol=1e-5)


def test_memory_plan_reuses_buffers_without_overlapping_live_ones():
    steps = [Step((), ("a",)), Step(("a",), ("b",)), Step(("b",), ("c",)), Step(("a", "c"), ("d",)),
             Step(("d",), ("e",))]
    sizes = {"a": 100, "b": 640, "c": 64, "d": 300, "e": 64}
    plan = plan_workspace(steps, sizes)
    assert plan.size < plan.naive_size
    live = {n: (min(i for i, s in enumerate(steps) if n in s.writes),
                max(i for i, s in enumerate(steps) if n in s.reads + s.writes)) for n in sizes}
    for x in sizes:
        for y in sizes:
            overlap_time = x < y and live[x][0] <= live[y][1] and live[y][0] <= live[x][1]
            ox, oy = plan.offsets[x], plan.offsets[y]
            if overlap_time:
                assert ox + sizes[x] <= oy or oy + sizes[y] <= ox, (x, y)
    assert all(off % 64 == 0 for off in plan.offsets.values())


def test_build_errors_are_clear(tmp_path, host):
    graph, _ = _mm_graph()
    with pytest.raises(BuildError, match="no C compiler found"):
        build_library(graph, host, tmp_path / "a", cc="no-such-compiler-tunaflow")
    graph.nodes.append(Node("weird1", "NonZero", [graph.outputs[0].name], ["z"]))
    graph.nodes.append(Node("weird2", "NonZero", ["x"], ["z2"]))
    with pytest.raises(BuildError, match=r"NonZero \(weird1, weird2\)"):
        build_library(graph, host, tmp_path / "b")


def test_convs_hand_padded_outputs_only_to_a_sole_stride_1_conv_reader(host):
    """The bundled CNN: each block's first conv feeds only the second (padded hand-off); a conv
    whose output is also a residual, a pool's output, and the strided convs' inputs are left alone."""
    from stages.build.apply_best import choose
    from stages.build.halo import plan_halos
    from stages.extract import load_model
    from stages.graph.passes import optimize
    from tunaflow.commands.demo import DATA

    graph = optimize(load_model(DATA / "models" / "cnn.onnx"))
    choices = choose([n.task for n in graph.nodes if n.task is not None], None, host, 1)
    plan = plan_halos(graph, choices)
    pairs = {("Conv_16", "Conv_27"), ("Conv_40", "Conv_51"), ("Conv_64", "Conv_75"), ("Conv_97", "Conv_108")}
    assert {(a, b) for a, b in pairs if plan.halos[a].y_pad == (1, 1, 1, 1) and plan.halos[b].x_padded} == pairs
    assert set(plan.halos) == {n for pair in pairs for n in pair}
    outputs = {n.name: n.outputs[0] for n in graph.nodes}
    for first, _ in pairs:
        c, h, w = graph.values[outputs[first]].shape[1:]
        assert plan.floats[outputs[first]] >= c * (h + 2) * (w + 2)


def test_a_rebuild_compiles_only_the_anchor_kernels_that_changed(tmp_path, host, monkeypatch):
    import stages.build.library as library

    graph, feeds = _mm_graph()
    build_library(graph, host, tmp_path / "a")
    compiled = []
    real = library.compile_ir
    monkeypatch.setattr(library, "compile_ir", lambda module, *a: compiled.append(isinstance(module, str))
                        or real(module, *a))
    build_library(graph, host, tmp_path / "b")
    assert compiled == [False]  # the generated ops' module only: the anchor's object came from the first build
    np.testing.assert_array_equal(load(tmp_path / "b")(**feeds), load(tmp_path / "a")(**feeds))
