"""Where to look before a cost model exists: the template's default config and the configs most like it.

The default is a hand-written heuristic (register tile, cache blocks, parallel axis) that is
usually within a few percent of the best, so its neighbourhood is a better first batch than
uniform draws. "Like it" is measured on the cost model's features, standardised over the
candidates: two configs are near when their loop nests are (tile shape, footprints, waste),
not merely when few knob values differ. Candidates are the space's valid pool when there is one
(a recorded sample holds only some configs, so the default itself may be absent), else the
default, its valid one-knob neighbours and a random draw.
"""

from __future__ import annotations

import numpy as np

from stages.cost_model.features import featurize
from stages.search.base import TunerContext
from stages.search.codec import SpaceCodec
from stages.templates import template_for
from stages.templates.space import Knobs

RANDOM_CANDIDATES = 512


def default_knobs(ctx: TunerContext) -> Knobs | None:
    """The template's default config for the task, or None when no template knows the op."""
    try:
        return dict(template_for(ctx.task).default_config(ctx.task, ctx.target).knobs)
    except ValueError:
        return None


def near_default(ctx: TunerContext, codec: SpaceCodec, rng: np.random.Generator, n: int, exclude: set[int],
                 min_distance: int = 2) -> np.ndarray:
    """Up to n valid rows not in `exclude`, nearest the default first, each at least `min_distance`
    knobs from those already picked (a tight cluster would teach the model one point)."""
    knobs = default_knobs(ctx)
    names = [k.name for k in ctx.space.knobs]
    if n <= 0 or knobs is None or not set(names) <= set(knobs):
        return np.zeros((0, codec.width), np.int64)
    knobs = {name: knobs[name] for name in names}  # a recorded sample may predate a knob the template added
    cand = _candidates(codec, rng, knobs, exclude)
    if not len(cand):
        return cand
    x = _features(ctx, codec.values(cand))
    ref = _features(ctx, {k: np.array([v], dtype=object if isinstance(v, str) else np.float64)
                          for k, v in knobs.items()})
    scale = x.std(axis=0)
    scale[scale == 0] = 1.0
    dist = np.sqrt((((x - ref) / scale) ** 2).sum(axis=1))
    picked: list[np.ndarray] = []
    for row in cand[np.argsort(dist, kind="stable")]:
        if all(int((row != p).sum()) >= min_distance for p in picked):
            picked.append(row)
            if len(picked) == n:
                break
    return np.array(picked, dtype=np.int64).reshape(-1, codec.width)


def _features(ctx: TunerContext, values: dict[str, np.ndarray]) -> np.ndarray:
    return featurize(ctx.task, ctx.target, ctx.threads, values).astype(np.float64)


def _candidates(codec: SpaceCodec, rng: np.random.Generator, knobs: Knobs, exclude: set[int]) -> np.ndarray:
    if codec.pool is not None:
        free = codec.pool[~np.isin(codec.pool, np.fromiter(exclude, dtype=np.int64, count=len(exclude)))]
        return codec.decode(free)
    rows = [codec.random_valid(rng, RANDOM_CANDIDATES, exclude)]
    if all(knobs[k.name] in k.choices for k in codec.space.knobs):
        home = np.array([k.choices.index(knobs[k.name]) for k in codec.space.knobs], dtype=np.int64)
        near = np.repeat(home[None, :], int(codec.radix.sum()), axis=0)
        col = np.repeat(np.arange(codec.width), codec.radix)
        near[np.arange(len(near)), col] = np.concatenate([np.arange(r) for r in codec.radix])
        rows.append(near)
    out = np.unique(np.vstack(rows), axis=0)
    keep = codec.valid(out) & ~np.isin(codec.encode(out), np.fromiter(exclude, dtype=np.int64, count=len(exclude)))
    return out[keep]
