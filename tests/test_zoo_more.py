"""More of the zoo (data/zoo/export_more.py: models users brought, weights stripped): torchvision's Swin-T, MaxViT-T
and LR-ASPP, Hugging Face wav2vec2, Llama, T5's and Whisper's encoders, MobileViT-S and DistilBERT. Each with seeded
weights filled in, built with default schedules, run on seeded inputs (token ids within the vocabulary, masks with
padding: `random_feeds`) and judged by onnxruntime on every output.

The libraries are built, run and compared up front in two processes (one per core; the weights are drawn there);
the file must stay well under a minute."""

from __future__ import annotations

import functools
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import onnx
import pytest
from test_transformer_zoo import _onnxruntime

from schemas import Target
from stages.build.library import build_library
from stages.extract import ModelError, load_model
from stages.extract.weights import fill_weights, is_weightless
from stages.graph.passes import optimize
from stages.runtime import load
from stages.runtime.compare import random_feeds

ZOO = Path(__file__).resolve().parents[1] / "data" / "zoo"
# Longest build first, so the two processes finish close together.
MODELS = ("maxvit_t", "mobilevit_s", "swin_t", "lraspp_mobilenet_v3_large", "wav2vec2_2l", "llama_2l", "distilbert_2l",
          "whisper_encoder_2l", "t5_encoder_2l")
SEED = 0


@functools.cache
def _filled(name: str) -> onnx.ModelProto:
    return fill_weights(onnx.load(ZOO / f"{name}.onnx"), seed=SEED)


def _build_and_compare(name: str, out: Path) -> dict[str, tuple[float, float]]:
    """In a worker process: build one model, run it and onnxruntime on the same seeded inputs, and return each
    output's (max abs error, max abs reference)."""
    filled = _filled(name)
    build_library(optimize(load_model(filled)), Target.host(), out, threads=1)
    model = load(out)
    feeds = random_feeds(model, seed=1)  # the CLI's self-check runs seed 0
    want = _onnxruntime(filled, feeds)
    got = model.run(**feeds)
    assert set(got) == set(want), (sorted(got), sorted(want))
    return {k: (float(np.abs(got[k].astype(np.float64) - ref).max()), float(np.abs(ref).max()))
            for k, ref in want.items()}


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, dict[str, tuple[float, float]] | BaseException]:
    """Each model's comparison with onnxruntime, or the exception its build or run ended with."""
    root = tmp_path_factory.mktemp("zoo_more")
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {n: pool.submit(_build_and_compare, n, root / n) for n in MODELS}
        return {n: f.exception() or f.result() for n, f in futures.items()}


@pytest.mark.parametrize("name", MODELS)
def test_more_zoo_model_built_with_default_schedules_matches_onnxruntime(results, name):
    errors = results[name]
    if isinstance(errors, BaseException):
        raise errors
    assert errors
    for key, (err, scale) in errors.items():
        assert np.isfinite(scale) and scale > 1e-2, f"{name}: reference output {key!r} is degenerate ({scale})"
        assert err <= 1e-3 * scale, f"{name}, output {key!r}: max abs error {err:.3g} against a max abs " \
                                    f"reference of {scale:.3g} ({err / scale:.2g})"


@pytest.mark.parametrize("name", MODELS)
def test_the_more_zoo_files_are_small_and_weightless(name):
    zoo = onnx.load(ZOO / f"{name}.onnx")
    assert is_weightless(zoo)
    with pytest.raises(ModelError, match=r"initializer '.+' has no data: .*fill_weights"):
        load_model(zoo)
    assert (ZOO / f"{name}.onnx").stat().st_size < 2_000_000
