"""The transformer zoo (data/zoo/: Hugging Face BERT and GPT-2, 2 layers, as both of torch.onnx.export's
exporters write them, weights stripped): seeded weights filled in, imported with token ids and an attention mask
(int64) at run time, built with default schedules, and judged by onnxruntime on every output, with token ids
over the whole vocabulary and a mask whose last quarter is padding.

The four libraries are built up front in two processes (one per core)."""

from __future__ import annotations

import functools
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import onnx
import pytest

from schemas import Target
from stages.build.library import build_library
from stages.extract import ModelError, load_model
from stages.extract.weights import fill_weights, is_weightless
from stages.graph.passes import optimize
from stages.graph.tasks import extract_tasks
from stages.runtime import LoadError, load
from stages.runtime.feeds import padding_mask
from stages.tune.loop import tunable

ZOO = Path(__file__).resolve().parents[1] / "data" / "zoo"
# name -> (sequence length, vocabulary); the classic exports have dynamic axes `batch` and `sequence`.
MODELS = {"bert_2l": (128, 30522), "bert_2l_classic": (128, 30522), "gpt2_2l": (64, 50257),
          "gpt2_2l_classic": (64, 50257)}
SEED = 0


@functools.cache
def _filled(name: str) -> onnx.ModelProto:
    return fill_weights(onnx.load(ZOO / f"{name}.onnx"), seed=SEED)


def _bindings(name: str) -> dict[str, tuple[int, ...]]:
    return {"batch": (1,), "sequence": (MODELS[name][0],)} if name.endswith("_classic") else {}


def _build_and_compare(name: str, out: Path) -> dict:
    """In a worker process (the weights are drawn once, there): build one model, run it and onnxruntime on
    `_feeds`, and return each output's (max abs error, max abs reference); for a classic export also what
    importing it says with its dynamic axes unbound, and its I/O shapes at another sequence length."""
    filled = _filled(name)
    build_library(optimize(load_model(filled, _bindings(name))), Target.host(), out, threads=1)
    feeds = _feeds(name)
    want = _onnxruntime(filled, feeds)
    got = load(out).run(**feeds)
    assert set(got) == set(want), (sorted(got), sorted(want))
    result: dict = {"errors": {k: (float(np.abs(got[k].astype(np.float64) - ref).max()), float(np.abs(ref).max()))
                               for k, ref in want.items()}}
    if _bindings(name):
        try:
            load_model(filled)
        except ModelError as exc:
            result["unbound"] = str(exc)
        graph = load_model(filled, {"batch": (1,), "sequence": (32,)})
        result["seq32"] = [(v.name, v.shape, v.dtype) for v in (*graph.inputs, *graph.outputs)]
    return result


@pytest.fixture(scope="module")
def libraries(tmp_path_factory) -> dict[str, tuple[Path, dict | BaseException]]:
    """Each model's library and its comparison with onnxruntime (or the exception its build ended with)."""
    root = tmp_path_factory.mktemp("transformers")
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {n: pool.submit(_build_and_compare, n, root / n) for n in MODELS}
        return {n: (root / n, f.exception() or f.result()) for n, f in futures.items()}


def _feeds(name: str, seed: int = 1) -> dict[str, np.ndarray]:
    seq, vocab = MODELS[name]
    ids = np.random.default_rng(seed).integers(0, vocab, (1, seq)).astype(np.int64)
    ids[0, :2] = [0, vocab - 1]  # both ends of the table
    return {"input_ids": ids, "attention_mask": padding_mask((1, seq), np.dtype(np.int64))}


def _onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))


def _library(libraries, name: str):
    out, result = libraries[name]
    if isinstance(result, BaseException):
        raise result
    return load(out)


@pytest.mark.parametrize("name", MODELS)
def test_transformer_built_with_default_schedules_matches_onnxruntime(libraries, name):
    _, result = libraries[name]
    if isinstance(result, BaseException):
        raise result
    assert result["errors"]
    for key, (err, scale) in result["errors"].items():
        assert np.isfinite(scale) and scale > 1e-2, f"{name}: reference output {key!r} is degenerate ({scale})"
        assert err <= 1e-3 * scale, f"{name}, output {key!r}: max abs error {err:.3g} against a max abs " \
                                    f"reference of {scale:.3g} ({err / scale:.2g})"


@pytest.mark.parametrize("name", MODELS)
def test_the_manifest_records_the_bound_shapes_types_and_the_vocabulary(libraries, name):
    model = _library(libraries, name)
    seq, vocab = MODELS[name]
    assert [(i.name, tuple(i.shape), i.dtype, i.bound) for i in model.manifest.inputs] == [
        ("input_ids", (1, seq), "int64", vocab), ("attention_mask", (1, seq), "int64", None)]
    assert model.manifest.inputs == model.facts.inputs


def test_token_ids_out_of_the_vocabulary_are_refused_and_negative_ones_count_from_its_end(libraries):
    name = "gpt2_2l"
    model = _library(libraries, name)
    feeds = _feeds(name)
    vocab = MODELS[name][1]
    for bad in (vocab, -vocab - 1, 2**40):
        ids = feeds["input_ids"].copy()
        ids[0, 5] = bad
        with pytest.raises(LoadError, match=rf"input 'input_ids' holds {bad} at \[0, 5\], out of range for the "
                                            rf"table of {vocab} entries it indexes \(valid: -{vocab}..{vocab - 1}\)"):
            model.run(input_ids=ids, attention_mask=feeds["attention_mask"])
    wrapped = feeds["input_ids"].copy()
    wrapped[0, 5] = wrapped[0, 5] - vocab
    np.testing.assert_array_equal(model(input_ids=wrapped, attention_mask=feeds["attention_mask"]),
                                  model(**feeds))
    with pytest.raises(LoadError, match="input 'input_ids' must be int64, got int32"):
        model.run(input_ids=feeds["input_ids"].astype(np.int32), attention_mask=feeds["attention_mask"])


@pytest.mark.parametrize("name", [n for n in MODELS if n.endswith("_classic")])
def test_a_classic_export_binds_its_dynamic_axes_by_name(libraries, name):
    _, result = libraries[name]
    if isinstance(result, BaseException):
        raise result
    assert result["unbound"].startswith("input 'input_ids' has a dynamic dimension ('batch', axis 0); bind it with "
                                        "--input-shape input_ids=NxN")
    width = 768
    assert result["seq32"][:2] == [("input_ids", (1, 32), "int64"), ("attention_mask", (1, 32), "int64")]
    assert [shape for _, shape, _ in result["seq32"][2:]] == ([(1, 32, width), (1, width)] if "bert" in name
                                                              else [(1, 32, width)])


@pytest.mark.parametrize("name", MODELS)
def test_the_transformer_zoo_files_are_weightless(name):
    zoo = onnx.load(ZOO / f"{name}.onnx")
    assert is_weightless(zoo)
    with pytest.raises(ModelError, match=r"initializer '.+' has no data: .*fill_weights"):
        load_model(zoo, _bindings(name))
    assert (ZOO / f"{name}.onnx").stat().st_size < 300_000


# per model: the fused kernels its built library must call (2 layers: 2 attention blocks, 1 embedding sum),
# and the dense epilogues its MLP and residual adds fuse into
FUSED = {"bert_2l": ("gelu", "residual_add"), "bert_2l_classic": ("gelu", "residual_add"),
         "gpt2_2l": ("gelu_tanh", "residual_add"), "gpt2_2l_classic": ("gelu_tanh", "residual_add")}


@pytest.mark.parametrize("name", MODELS)
def test_the_built_transformer_runs_the_fused_kernels(libraries, name):
    model = _library(libraries, name)
    ops = [i.op for i in model.manifest.ops]
    assert ops.count("AttentionSoftmax") == 2 and ops.count("AddLayerNormalization") == 1, ops
    assert not {"Softmax", "IsNaN", "Gelu", "Add"} & set(ops), ops
    # attention's batch matmuls (both operands computed at run time) run their template, never the generic kernel
    assert [i.kind for i in model.manifest.ops if i.op == "batch_matmul"] == ["default"] * 4
    graph = optimize(load_model(_filled(name), _bindings(name)))
    kinds = {e.kind for n in graph.nodes if n.task is not None for e in n.task.epilogue}
    assert set(FUSED[name]) <= kinds, kinds
    tasks = [t.task for t in extract_tasks(graph)]
    assert all(tunable(tasks)) and "batch_matmul" in {t.op for t in tasks}
