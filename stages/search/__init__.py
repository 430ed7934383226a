"""Search policies, one module each, behind one interface; looked up by name."""

from __future__ import annotations

from collections.abc import Callable

from stages.search.base import Tuner
from stages.search.grid import GridTuner
from stages.search.random import RandomTuner
from stages.templates.space import ConfigSpace

TUNERS: dict[str, Callable[[ConfigSpace, int, set[int]], Tuner]] = {
    "grid": GridTuner,
    "random": RandomTuner,
}


def make_tuner(name: str, space: ConfigSpace, seed: int, exclude: set[int]) -> Tuner:
    try:
        factory = TUNERS[name]
    except KeyError:
        raise ValueError(f"unknown tuner {name!r}; choose one of {sorted(TUNERS)}") from None
    return factory(space, seed, exclude)
