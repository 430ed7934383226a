"""Seeded inputs that a model accepts: floats from N(0, 1), integer inputs that index a table (token ids)
uniform over it, other integer and bool inputs as an attention mask with padding (ones, the last
quarter of the last axis zero), what a tokenizer gives a batch of shorter sentences."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from schemas.manifest import TensorInfo


def sample_inputs(infos: Iterable[TensorInfo], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for info in infos:
        shape, dtype = tuple(info.shape), np.dtype(info.dtype)
        if dtype.kind == "f":
            feeds[info.name] = rng.standard_normal(shape).astype(dtype)
        elif info.bound is not None:
            feeds[info.name] = rng.integers(0, info.bound, shape).astype(dtype)
        else:
            feeds[info.name] = padding_mask(shape, dtype)
    return feeds


def padding_mask(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    mask = np.ones(shape, dtype=dtype)
    if shape:
        mask[..., shape[-1] - shape[-1] // 4:] = 0
    return mask
