"""Integer and boolean tensors at run time: the index, mask and type ops transformer exports use, each built
into one library and compared with onnxruntime (exactly for integers and bools), negative and out-of-range
indices, wrong input types, and what still folds or is refused at import."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from schemas import Target
from stages.build.inputs import index_bounds
from stages.build.library import build_library
from stages.build.verify import build_verified, random_feeds
from stages.extract import ModelError, load_model
from stages.graph.passes import optimize
from stages.runtime import LoadError, RunError, load

F, I64, I32, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32, TensorProto.BOOL
SHAPE = [3, 4, 5]
TABLE = np.arange(60, dtype=np.float32).reshape(10, 6) / 7


def _const(name: str, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


def _model(nodes, inputs, outputs, inits=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "typed", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                              [helper.make_tensor_value_info(n, t, None) for n, t in outputs], list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


N = helper.make_node
OPS_MODEL = _model(
    [N("Gather", ["table", "ids"], ["gather_table"], name="emb"),
     N("Cast", ["ids"], ["ids32"]),  # replaced below: a Cast needs its `to`
     N("Gather", ["table", "ids32"], ["gather_i32"]),
     N("Gather", ["x", "cols"], ["gather_runtime"], axis=1),
     N("GatherElements", ["x", "along"], ["gather_elements"], axis=2),
     N("GatherND", ["x", "tuples"], ["gather_nd"]),
     N("GatherND", ["x", "per_batch"], ["gather_nd_batch"], batch_dims=1),
     N("Where", ["mask", "x", "y"], ["where"]),
     *(N(op, ["x", "y"], [f"{op.lower()}_f"]) for op in ("Equal", "Less", "Greater", "LessOrEqual",
                                                          "GreaterOrEqual")),
     *(N(op, ["k", "three"], [f"{op.lower()}_i"]) for op in ("Equal", "Less", "GreaterOrEqual")),
     N("Cast", ["k"], ["k_bool"], to=B),
     *(N(op, ["mask", "k_bool"], [op.lower()]) for op in ("And", "Or", "Xor")),
     N("Not", ["mask"], ["not"]),
     N("IsNaN", ["x"], ["isnan"]),
     N("IsInf", ["x"], ["isinf"]),
     N("IsInf", ["x"], ["isposinf"], detect_negative=0),
     N("Cast", ["y"], ["y_int64"], to=I64), N("Cast", ["y"], ["y_int32"], to=I32), N("Cast", ["k"], ["k_float"], to=F),
     N("Cast", ["mask"], ["mask_float"], to=F), N("Cast", ["k"], ["k_int32"], to=I32),
     N("Cast", ["x"], ["x_bool"], to=B),
     N("Expand", ["column", "full"], ["expand"]),
     N("Trilu", ["y", "one"], ["triu"]), N("Trilu", ["k", "minus_one"], ["tril"], upper=0),
     N("CumSum", ["y", "one"], ["cumsum"]), N("CumSum", ["k", "two"], ["cumsum_ex_rev"], exclusive=1, reverse=1),
     *(N(op, ["k", "three"], [f"{op.lower()}_int"]) for op in ("Add", "Sub", "Mul", "Max", "Min")),
     N("Neg", ["k"], ["neg_int"]), N("Abs", ["k"], ["abs_int"])],
    [("x", F, SHAPE), ("y", F, SHAPE), ("ids", I64, [2, 3]), ("cols", I64, [2]), ("along", I64, [3, 4, 2]),
     ("tuples", I64, [2, 2]), ("per_batch", I64, [3, 1]), ("mask", B, SHAPE), ("k", I64, SHAPE),
     ("column", F, [4, 1])],
    [(n, t) for n, t in [("gather_table", F), ("gather_i32", F), ("gather_runtime", F), ("gather_elements", F),
                         ("gather_nd", F), ("gather_nd_batch", F), ("where", F),
                         *((f"{op}_f", B) for op in ("equal", "less", "greater", "lessorequal", "greaterorequal")),
                         *((f"{op}_i", B) for op in ("equal", "less", "greaterorequal")),
                         ("and", B), ("or", B), ("xor", B), ("not", B), ("isnan", B), ("isinf", B), ("isposinf", B),
                         ("y_int64", I64), ("y_int32", I32), ("k_float", F), ("mask_float", F), ("k_int32", I32),
                         ("x_bool", B), ("expand", F), ("triu", F), ("tril", I64), ("cumsum", F),
                         ("cumsum_ex_rev", I64),
                         *((f"{op}_int", I64) for op in ("add", "sub", "mul", "max", "min")),
                         ("neg_int", I64), ("abs_int", I64)]],
    [_const("table", TABLE), _const("three", np.int64(3)), _const("one", np.int64(1)),
     _const("minus_one", np.int64(-1)), _const("two", np.int64(2)), _const("full", np.array(SHAPE, np.int64))])
OPS_MODEL.graph.node[1].CopyFrom(N("Cast", ["ids"], ["ids32"], to=I32))


def _feeds(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(SHAPE).astype(np.float32)
    x.reshape(-1)[[3, 11, 17]] = [np.nan, np.inf, -np.inf]
    y = (rng.standard_normal(SHAPE) * 4).astype(np.float32)
    y.reshape(-1)[:3] = x.reshape(-1)[:3]  # some equal pairs
    return {"x": x, "y": y, "ids": np.array([[0, 9, -1], [-10, 4, 4]], np.int64), "cols": np.array([3, -4], np.int64),
            "along": rng.integers(-5, 5, (3, 4, 2)), "tuples": np.array([[2, -1], [0, 3]], np.int64),
            "per_batch": np.array([[3], [-4], [1]], np.int64), "mask": rng.random(SHAPE) < 0.5,
            "k": rng.integers(-6, 7, SHAPE), "column": rng.standard_normal((4, 1)).astype(np.float32)}


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    out = tmp_path_factory.mktemp("typed") / "lib"
    build_library(optimize(load_model(OPS_MODEL)), Target.host(), out)
    return load(out)


def test_every_typed_op_matches_onnxruntime_exactly_on_integers_and_bools(library):
    feeds = _feeds()
    session = ort.InferenceSession(OPS_MODEL.SerializeToString(), providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))
    got = library.run(**feeds)
    assert set(got) == set(want)
    for name, ref in want.items():
        assert got[name].dtype == ref.dtype and got[name].shape == ref.shape, name
        if ref.dtype.kind == "f":
            np.testing.assert_allclose(got[name], ref, rtol=1e-6, atol=1e-6, err_msg=name)
        else:
            np.testing.assert_array_equal(got[name], ref, err_msg=name)


def test_the_manifest_gives_each_input_its_type_and_the_table_size_an_index_input_reaches(library):
    infos = {i.name: (i.dtype, i.bound) for i in library.manifest.inputs}
    assert infos["ids"] == ("int64", 10) and infos["cols"] == ("int64", 4) and infos["along"] == ("int64", 5)
    assert infos["mask"] == ("bool", None) and infos["x"] == ("float32", None)
    assert infos["tuples"] == ("int64", None)  # a GatherND tuple indexes several axes: checked by the kernel


@pytest.mark.parametrize(("name", "bad", "message"), [
    ("ids", 10, r"input 'ids' holds 10 at \[1, 2\], out of range for the table of 10 entries it indexes"),
    ("cols", -5, r"input 'cols' holds -5 at \[1\], out of range for the table of 4 entries"),
])
def test_an_index_input_out_of_range_is_refused_before_the_library_runs(library, name, bad, message):
    feeds = _feeds()
    feeds[name].reshape(-1)[-1] = bad
    with pytest.raises(LoadError, match=message):
        library.run(**feeds)


@pytest.mark.parametrize(("name", "at", "bad", "extent"), [("tuples", (1, 1), 4, 4), ("tuples", (0, 0), -4, 3),
                                                           ("per_batch", (2, 0), 4, 4)])
def test_a_gather_nd_index_out_of_range_stops_the_run_in_the_kernel_naming_the_node(library, name, at, bad, extent):
    feeds = _feeds()
    feeds[name][at] = bad
    with pytest.raises(RunError, match=rf"the run stopped at GatherND '.+': index {bad} is out of range for an "
                                       rf"axis of {extent} \(valid: -{extent}..{extent - 1}\); no output"):
        library.run(**feeds)
    library.run(**_feeds())  # the next call runs normally


@pytest.mark.parametrize(("name", "value", "message"), [
    ("ids", np.zeros((2, 3), np.float32), "input 'ids' must be int64, got float32"),
    ("mask", np.zeros(SHAPE, np.int64), "input 'mask' must be bool, got int64"),
    ("x", np.zeros(SHAPE, np.float64), "input 'x' must be float32, got float64"),
])
def test_a_wrong_input_type_is_a_clear_error_naming_the_input(library, name, value, message):
    with pytest.raises(LoadError, match=message):
        library.run(**{**_feeds(), name: value})


def _shifted_embedding() -> onnx.ModelProto:
    """Token ids + 1 into a table of 10: the ids input reaches the Gather through arithmetic, so only the
    kernel can check the index."""
    return _model([N("Add", ["ids", "one"], ["shifted"], name="shift"),
                   N("Gather", ["table", "shifted"], ["e"], name="emb"), N("Relu", ["e"], ["y"], name="relu")],
                  [("ids", I64, [4])], [("y", F)], [_const("table", TABLE), _const("one", np.int64(1))])


def test_an_index_computed_out_of_range_stops_the_run_in_the_kernel_and_the_self_check_passes(tmp_path):
    model = tmp_path / "shifted.onnx"
    onnx.save(_shifted_embedding(), model)
    graph = optimize(load_model(model))
    assert index_bounds(graph) == {}
    _, verification = build_verified(model, graph, Target.host(), tmp_path / "lib")
    assert verification.status == "passed"
    lib = load(tmp_path / "lib")
    np.testing.assert_allclose(lib(ids=np.array([0, 8, -2, -11], np.int64)), TABLE[[1, 9, 9, 0]], rtol=0)
    with pytest.raises(RunError, match=r"the run stopped at Gather 'emb': index 10 is out of range for an axis of 10 "
                                       r"\(valid: -10..9\)"):
        lib(ids=np.array([0, 9, 1, 2], np.int64))
    with pytest.raises(RunError, match="index -11 is out of range"):
        lib(ids=np.array([0, -12, 1, 2], np.int64))


def test_the_self_check_feeds_token_ids_within_their_table_and_masks_with_padding():
    graph = load_model(_model([N("Gather", ["table", "ids"], ["e"]), N("Cast", ["mask"], ["m"], to=F),
                               N("Reshape", ["m", "column"], ["m3"]), N("Mul", ["e", "m3"], ["y"])],
                              [("ids", I64, [1, 64]), ("mask", I64, [1, 64])], [("y", F)],
                              [_const("table", TABLE), _const("column", np.array([1, 64, 1]))]))
    feeds = random_feeds(graph)
    assert feeds["ids"].dtype == np.int64 and 0 <= feeds["ids"].min() and feeds["ids"].max() < 10
    assert len(np.unique(feeds["ids"])) == 10
    np.testing.assert_array_equal(feeds["mask"], [[1] * 48 + [0] * 16])


def test_constant_only_index_ops_fold_at_import():
    model = _model([N("GatherElements", ["c", "gi"], ["g"], axis=1), N("CumSum", ["g", "zero"], ["s"]),
                    N("Equal", ["s", "s"], ["same"]), N("Where", ["same", "s", "s"], ["w"]),
                    N("Trilu", ["w"], ["t"]), N("Add", ["x", "t"], ["y"])],
                   [("x", F, [2, 2])], [("y", F)],
                   [_const("c", np.array([[1, 2], [3, 4]], np.float32)), _const("gi", np.array([[1, 0], [-1, 1]])),
                    _const("zero", np.int64(0))])
    graph = load_model(model)
    assert [n.op for n in graph.nodes] == ["Add"]
    np.testing.assert_array_equal(graph.constants[graph.nodes[0].inputs[1]], [[2, 1], [0, 5]])


@pytest.mark.parametrize(("nodes", "inputs", "message"), [
    ([N("Range", ["s", "n", "d"], ["r"], name="rng")], [("s", I64, []), ("n", I64, []), ("d", I64, [])],
     r"Range 'rng': its input 0 \('s'\) must be a constant, but it is computed at run time"),
    ([N("Expand", ["x", "n"], ["r"], name="ex")], [("x", F, [2]), ("n", I64, [1])],
     r"Expand 'ex': its shape \('n'\) must be a constant, but it is computed at run time"),
    ([N("Gather", ["t", "x"], ["r"], name="g")], [("t", F, [4]), ("x", F, [2])],
     "Gather 'g': its indices are float32, not int64 or int32"),
    ([N("Cast", ["x"], ["r"], name="c", to=TensorProto.UINT16)], [("x", F, [2])],
     r"Cast 'c': its output 'r' is uint16 at run time; tunaflow's kernels take float32, int64, int32, bool, uint8, "
     "int8"),
])
def test_what_cannot_run_is_refused_at_import_naming_the_op_type(nodes, inputs, message):
    with pytest.raises(ModelError, match=message):
        load_model(_model(nodes, inputs, [("r", F)]))


def test_an_input_of_another_type_is_refused_naming_it():
    with pytest.raises(ModelError, match="input 'h' is float16; tunaflow's inputs are float32, int64, int32, bool"):
        load_model(_model([N("Cast", ["h"], ["r"], to=F)], [("h", TensorProto.FLOAT16, [2])], [("r", F)]))
