"""Task extraction on the bundled models, `tunaflow tasks` as a user runs it, and the models script."""

import json
import subprocess
import sys
from pathlib import Path

from stages.extract import load_model
from stages.graph.passes import optimize
from stages.graph.tasks import extract_tasks, untuned_ops

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "data" / "models"


def tunaflow(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tunaflow", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_cnn_tasks_are_deduplicated_with_occurrence_weights():
    g = optimize(load_model(MODELS / "cnn.onnx"))
    found = [e for e in extract_tasks(g) if e.alternative_to is None]  # twins: tests/test_conv2d_winograd.py
    assert len(found) == 10 and sum(e.weight for e in found) == 12
    assert len({e.task.signature for e in found}) == 10
    repeated = [e for e in found if e.weight == 2]
    assert [[op.kind for op in e.task.epilogue] for e in repeated] == [["bias", "relu"], ["bias", "residual_add",
                                                                                          "relu"]]
    assert all(len(e.nodes) == e.weight for e in found)
    assert {e.task.op for e in found} == {"conv2d", "dense"}
    assert untuned_ops(g) == {"MaxPool": 1, "GlobalAveragePool": 1, "Flatten": 1}
    stem = found[0].task
    assert stem.flops == 2 * 16 * 64 * 64 * 3 * 3 * 3 and found[0].flops == stem.flops


def test_transformer_tasks_cover_qkv_attention_and_ffn():
    graph = optimize(load_model(MODELS / "transformer.onnx"))
    found = extract_tasks(graph)
    summary = [(e.task.op, tuple(op.kind for op in e.task.epilogue), e.weight) for e in found]
    # The scores' scale runs in the AttentionSoftmax row kernel after Q K^T, not in the batch matmul's epilogue.
    assert "AttentionSoftmax" in {n.op for n in graph.nodes}
    assert summary == [("dense", ("bias",), 3), ("batch_matmul", (), 1), ("batch_matmul", (), 1),
                       ("dense", ("bias", "residual_add"), 1), ("dense", ("bias", "gelu"), 1),
                       ("dense", ("bias", "residual_add"), 1)]
    assert found[1].task.inputs[0].shape == (1, 4, 64, 32) and found[1].task.inputs[1].shape == (1, 4, 32, 64)


def test_tasks_command_prints_the_table_and_json_lines():
    r = tunaflow("tasks", str(MODELS / "mlp.onnx"))
    assert r.returncode == 0, r.stderr
    assert "3 tasks from 3 anchor ops" in r.stdout and "16x784" in r.stdout and "bias,relu" in r.stdout
    assert "Softmax x1" in r.stdout
    r = tunaflow("tasks", str(MODELS / "cnn.onnx"), "--json")
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(lines) == 15 and [x["weight"] for x in lines].count(2) == 4
    assert [x["op"] for x in lines if x["alternative_to"]] == ["conv2d_winograd"] * 5
    assert lines[0]["op"] == "conv2d" and lines[0]["flops"] == 3538944 and len(lines[0]["signature"]) == 16


def test_tasks_command_fails_clearly_on_a_bad_model_or_binding(tmp_path):
    r = tunaflow("tasks", str(MODELS / "cnn.onnx"), "--input-shape", "image=1x3x8x8")
    assert r.returncode == 2 and "the model's inputs are ['input']" in r.stderr
    r = tunaflow("tasks", str(tmp_path / "missing.onnx"))
    assert r.returncode == 2 and "no model file" in r.stderr


def test_models_script_is_seeded_and_reproduces_the_committed_files(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "data" / "make_models.py"), str(tmp_path)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    for name in ("cnn", "mlp", "transformer"):
        assert (tmp_path / f"{name}.onnx").read_bytes() == (MODELS / f"{name}.onnx").read_bytes(), name
    assert sum((MODELS / f"{n}.onnx").stat().st_size for n in ("cnn", "mlp", "transformer")) < 5 * 2**20


def test_tasks_command_lists_every_unsupported_op_and_exits_2(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    nodes = [helper.make_node("Round", ["x"], ["a"], name="r1"), helper.make_node("Hardmax", ["a"], ["y"], name="h1")]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", 1, [2])]))
    onnx.save(model, str(tmp_path / "bad.onnx"))
    r = tunaflow("tasks", str(tmp_path / "bad.onnx"))
    assert r.returncode == 2 and "2 unsupported operator type(s)" in r.stderr
    assert "Hardmax: h1" in r.stderr and "Round: r1" in r.stderr


def test_extracted_tasks_equal_the_templates_own_tasks_so_tune_op_logs_apply_to_models():
    from schemas.task import EpilogueOp
    from stages.templates import batch_matmul, dense
    from stages.templates.conv2d_shape import conv2d_task

    def ops(*kinds):
        return tuple(EpilogueOp(kind=k) for k in kinds)

    cnn = extract_tasks(optimize(load_model(MODELS / "cnn.onnx")))
    stem = conv2d_task((1, 3, 64, 64), (16, 3, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, ops("bias", "relu"))
    assert cnn[0].task == stem and cnn[0].task.signature == stem.signature
    mlp = extract_tasks(optimize(load_model(MODELS / "mlp.onnx")))
    assert mlp[0].task.signature == dense.task(16, 256, 784, ops("bias", "relu")).signature
    attn = extract_tasks(optimize(load_model(MODELS / "transformer.onnx")))
    assert attn[2].task.signature == batch_matmul.task((1, 4, 64, 64), (1, 4, 64, 32)).signature
