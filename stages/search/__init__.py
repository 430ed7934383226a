"""Search policies, one module each, behind one interface; looked up by name."""

from __future__ import annotations

from collections.abc import Callable

from stages.search.base import Tuner, TunerContext
from stages.search.ga import GATuner
from stages.search.grid import GridTuner
from stages.search.lgbm import ModelTuner
from stages.search.random import RandomTuner

TUNERS: dict[str, Callable[[TunerContext], Tuner]] = {
    "grid": lambda c: GridTuner(c.space, c.seed, c.exclude),
    "random": lambda c: RandomTuner(c.space, c.seed, c.exclude),
    "ga": GATuner,
    "lgbm": ModelTuner,
    "lgbm-reg": lambda c: ModelTuner(c, objective="regression"),
    "lgbm-rank": lambda c: ModelTuner(c, objective="lambdarank"),
}


def make_tuner(name: str, ctx: TunerContext) -> Tuner:
    try:
        factory = TUNERS[name]
    except KeyError:
        raise ValueError(f"unknown tuner {name!r}; choose one of {sorted(TUNERS)}") from None
    return factory(ctx)
