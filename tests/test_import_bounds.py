"""Bounded resources at import (issue 21, group 8): allocation bombs of a few hundred bytes are refused by
name before anything big is allocated, each imported in a child process under a 2 GiB address-space cap
so a regression fails instead of swapping; huge declared or inferred run-time tensors are refused (by
`tunaflow tasks` too); the budget options admit what their defaults refuse; unreadable external data
names the file."""

from __future__ import annotations

import os
from itertools import pairwise
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from stages.extract import ModelError, load_model
from testing import bombs
from testing.cli import QUIET, tunaflow
from testing.external_data import save_with_external_weight

CAP = 2 * 2**30
MiB = 2**20
ALL_BOMBS = {**bombs.CONSTANT_BOMBS, **bombs.TENSOR_BOMBS}


def _save(tmp_path: Path, model: onnx.ModelProto, name: str = "m") -> Path:
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    return path


def test_each_bomb_is_refused_by_name_without_allocating(tmp_path):
    """All bombs in one child under the cap (the doubling Concat last: it may spend the whole 256 MiB budget)."""
    names = sorted(ALL_BOMBS, key=lambda n: n.startswith("Concat"))
    paths = [_save(tmp_path, ALL_BOMBS[name](), f"bomb{i}") for i, name in enumerate(names)]
    for name, path, result in zip(names, paths, bombs.import_in_child(paths, limit_bytes=CAP), strict=True):
        assert path.stat().st_size < 1500  # the concat chain is 34 nodes; the others are about 100-300 bytes
        assert result["outcome"] == "ModelError", (name, result)
        message = result["message"]
        op = name.split()[0] if name in bombs.CONSTANT_BOMBS else ("input 'x'" if name == "declared input" else "Tile")
        assert message.startswith(op) and "\n" not in message, (name, message)
        option = "--max-constant-mb" if name in bombs.CONSTANT_BOMBS else "--max-tensor-mb"
        assert option in message, (name, message)
        limit = 456 * MiB if name.startswith("Concat") else 200 * MiB
        assert result["peak_rss"] < limit, (name, result)


@pytest.mark.parametrize("name", sorted(ALL_BOMBS))
def test_the_same_models_at_a_small_size_import_fine(name):
    model = ALL_BOMBS[name](5) if name.startswith("Concat") else ALL_BOMBS[name](8)
    graph = load_model(model)
    assert graph.nodes and graph.outputs


def test_messages_name_the_node_the_shape_and_the_limit(tmp_path):
    result, = bombs.import_in_child([_save(tmp_path, bombs.constant_of_shape())], limit_bytes=CAP, max_constant_mb=64)
    assert result["message"] == (
        "ConstantOfShape 'ConstantOfShape_0': folding it would make a constant of shape [100000, 100000] (float32, "
        "37.3 GiB), more than the 64.0 MiB left of the import's constant budget of 64.0 MiB; raise it with "
        "--max-constant-mb")
    with pytest.raises(ModelError, match=r"^Tile 'Tile_0': a tensor of shape \[100000, 100000\] would take 37.3 GiB "
                                         r"as float32, over the limit of 4.0 GiB per tensor; raise it with "
                                         r"--max-tensor-mb$"):
        load_model(bombs.runtime_tile())


def _big_constant(side: int) -> onnx.ModelProto:
    """A legit model folding a side x side float32 constant (ConstantOfShape of ones), reduced into y = x + sum."""
    one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
    nodes = [helper.make_node("ConstantOfShape", ["s"], ["bomb"], value=one)]
    model = bombs._model(nodes, [numpy_helper.from_array(np.array([side, side], np.int64), "s")])
    return model


def test_the_constant_option_admits_a_large_legit_constant_the_default_refuses(tmp_path):
    path = _save(tmp_path, _big_constant(9000))  # 309 MiB: over the 256 MiB default of a weightless model
    refused, = bombs.import_in_child([path], limit_bytes=CAP)
    assert refused["outcome"] == "ModelError" and "309.0 MiB" in refused["message"], refused
    admitted, = bombs.import_in_child([path], limit_bytes=CAP, max_constant_mb=512)
    assert admitted["outcome"] == "ok", admitted
    assert admitted["peak_rss"] > 300 * MiB  # it was really folded, not skipped


def test_the_default_budget_grows_with_the_model_s_own_weights(tmp_path):
    """100 MiB of weights: the default is 400 MiB, so folding three 100 MiB negations (300 MiB) passes where a
    weightless model's 256 MiB would not, and a fifth does not fit."""
    w = numpy_helper.from_array(np.ones((25 * 2**20,), np.float32), "w")

    def negations(k: int) -> onnx.ModelProto:
        names = ["w", *[f"n{i}" for i in range(k - 1)], "bomb"]
        return bombs._model([helper.make_node("Neg", [a], [b]) for a, b in pairwise(names)], [w])

    three, five = bombs.import_in_child([_save(tmp_path, negations(3), "three"), _save(tmp_path, negations(5), "five")],
                                        limit_bytes=CAP)
    assert three["outcome"] == "ok", three
    assert five["outcome"] == "ModelError" and five["message"].startswith("Neg 'Neg_4'"), five
    assert "constant budget of 400.0 MiB (the default: the larger of 256 MB and 4x the model's own tensors)" \
        in five["message"]


def test_the_tensor_option_moves_the_per_tensor_limit_both_ways():
    x = bombs.declared_input(2000)  # 1x3x2000x2000: 45.8 MiB
    assert load_model(x).inputs[0].shape == (1, 3, 2000, 2000)
    with pytest.raises(ModelError, match=r"^input 'x': a tensor of shape \[1, 3, 2000, 2000\] would take 45.8 MiB"):
        load_model(x, max_tensor_mb=40)
    big = bombs.runtime_tile(30_000)  # a [30000, 30000] intermediate: 3.4 GiB, under the 4 GiB default
    assert load_model(big).nodes
    with pytest.raises(ModelError, match="over the limit of 2.0 GiB per tensor"):
        load_model(big, max_tensor_mb=2048)
    assert load_model(bombs.runtime_tile(), max_tensor_mb=40_000).nodes  # 37.3 GiB admitted when asked


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf")])
def test_nonsense_limits_are_refused_naming_the_option(bad):
    with pytest.raises(ModelError, match=r"^--max-constant-mb .*: expected a positive number of MB$"):
        load_model(bombs.declared_input(4), max_constant_mb=bad)
    with pytest.raises(ModelError, match=r"^--max-tensor-mb .*: expected a positive number of MB$"):
        load_model(bombs.declared_input(4), max_tensor_mb=bad)


def test_run_time_scratch_is_bounded_too():
    """A run-time MaxPool with 100000 pixels of padding and a stride to match: a 2x2 output, but the reference that
    verifies the build would pad the input to 37 GiB first."""
    n = bombs.N
    model = bombs._wrap([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[1, 1], pads=[0, 0, n, n],
                                          strides=[n, n])], [], (1, 1, 1, 1), (1, 1, 2, 2))
    with pytest.raises(ModelError, match=r"^MaxPool 'MaxPool_0': a scratch array of shape \[1, 1, 200001, 200001\]"):
        load_model(model)


def test_folded_windows_and_lrn_plan_their_scratch(tmp_path):
    """ConvTranspose's full output before cropping and LRN's padded squares are checked before they are made."""
    x = numpy_helper.from_array(np.ones((1, 1, 2, 2), np.float32), "c")
    w = numpy_helper.from_array(np.ones((1, 1, 1, 1), np.float32), "k")
    n = bombs.N
    convt = bombs._model([helper.make_node("ConvTranspose", ["c", "k"], ["bomb"], strides=[n, n],
                                           pads=[0, 0, n, n])], [x, w])
    lrn = bombs._model([helper.make_node("LRN", ["c"], ["bomb"], size=2 * n * n + 1)], [x])
    results = bombs.import_in_child([_save(tmp_path, convt, "convt"), _save(tmp_path, lrn, "lrn")], limit_bytes=CAP)
    for op, result in zip(("ConvTranspose", "LRN"), results, strict=True):
        assert result["outcome"] == "ModelError" and result["message"].startswith(f"{op} '"), result
        assert "scratch array" in result["message"]


def test_tasks_refuses_a_huge_declared_input_in_one_line(tmp_path):
    result = tunaflow("tasks", _save(tmp_path, bombs.declared_input()), timeout=120, env={**os.environ, **QUIET})
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "input 'x': a tensor of shape [1, 3, 100000, 100000] would take 111.8 GiB" in result.stderr
    assert "--max-tensor-mb" in result.stderr


def _relocate(path: Path, location: str) -> None:
    proto = onnx.load(str(path), load_external_data=False)
    for entry in proto.graph.initializer[0].external_data:
        if entry.key == "location":
            entry.value = location
    onnx.save(proto, str(path))


def test_external_data_loads_and_every_failure_names_the_file(tmp_path):
    path = save_with_external_weight(tmp_path / "ext.onnx", "w.bin")
    graph = load_model(path)
    assert graph.constants["w"].reshape(-1).tolist() == list(range(16))
    data = tmp_path / "w.bin"
    data.rename(tmp_path / "moved.bin")
    with pytest.raises(ModelError, match=rf"^{path}: cannot read the external data of tensor 'w' from 'w.bin': "
                                         rf"{tmp_path}/w.bin does not exist$"):
        load_model(path)
    data.mkdir()
    with pytest.raises(ModelError, match=r"from 'w.bin': .*w.bin, but it is not regular file"):
        load_model(path)
    data.rmdir()
    (tmp_path / "moved.bin").rename(data)
    with data.open("r+b") as f:
        f.truncate(10)
    with pytest.raises(ModelError, match=r"from 'w.bin': External data length \(64\) exceeds available data"):
        load_model(path)
    _relocate(path, "../elsewhere/w.bin")
    with pytest.raises(ModelError, match=r"from '../elsewhere/w.bin': .*points outside the directory"):
        load_model(path)
    _relocate(path, "x" * 300)
    with pytest.raises(ModelError, match=r"cannot read the external data of tensor 'w' from 'xxx"):
        load_model(path)


def test_tasks_names_missing_external_data_in_one_line(tmp_path):
    path = save_with_external_weight(tmp_path / "ext.onnx", "w.bin")
    (tmp_path / "w.bin").unlink()
    result = tunaflow("tasks", path, timeout=120, env={**os.environ, **QUIET})
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "cannot read the external data of tensor 'w' from 'w.bin'" in result.stderr
    assert "w.bin does not exist" in result.stderr


@pytest.mark.parametrize("rank", [33, 64])
def test_a_tensor_of_more_than_32_dims_is_a_model_error_naming_the_node(rank):
    """A mutated file (fuzzing found one) expanded a tensor to 64 dims: numpy's broadcasting raised a RuntimeError
    out of the import; it is a ModelError that names the node and the limit."""
    nodes = [helper.make_node("Expand", ["x", "shape"], ["e"], name="grow"),
             helper.make_node("Relu", ["e"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.ones(rank, np.int64), "shape")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ModelError, match=r"Expand 'grow'.*at most 32"):
        load_model(model)


def test_an_attribute_string_that_is_not_utf8_is_a_model_error_naming_it():
    node = helper.make_node("Relu", ["x"], ["y"], name="r")
    node.attribute.append(helper.make_attribute("mode", b"\xff\xfe"))
    node.attribute.append(helper.make_attribute("names", [b"a", b"\xc3"]))
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    with pytest.raises(ModelError, match=r"Relu 'r': attribute 'mode' cannot be read"):
        load_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
