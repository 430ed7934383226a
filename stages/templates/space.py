"""Schedule spaces declared as knobs (AutoTVM style) with a validity rule that gives reasons."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from schemas.config import Config

Knobs = dict[str, int | str]


class InvalidConfig(ValueError):
    """A knob assignment the template cannot generate; the message says why."""


class NoValidConfig(ValueError):
    """A task no default candidate of a template serves; the message names the task and each reason."""


@dataclass(frozen=True)
class Knob:
    name: str
    choices: tuple[int | str, ...]


@dataclass(frozen=True)
class ConfigSpace:
    knobs: tuple[Knob, ...]
    rule: Callable[[Knobs], str | None]

    @property
    def size(self) -> int:
        """Number of knob combinations, valid or not."""
        return math.prod(len(k.choices) for k in self.knobs)

    def knobs_at(self, index: int) -> Knobs:
        if not 0 <= index < self.size:
            raise InvalidConfig(f"index {index} is outside the space (size {self.size})")
        out: Knobs = {}
        for knob in reversed(self.knobs):
            index, pos = divmod(index, len(knob.choices))
            out[knob.name] = knob.choices[pos]
        return {k.name: out[k.name] for k in self.knobs}

    def index_of(self, knobs: Knobs) -> int:
        index = 0
        for knob in self.knobs:
            if knob.name not in knobs:
                raise InvalidConfig(f"knob {knob.name!r} is missing")
            if knobs[knob.name] not in knob.choices:
                raise InvalidConfig(f"knob {knob.name}={knobs[knob.name]!r} is not one of {list(knob.choices)}")
            index = index * len(knob.choices) + knob.choices.index(knobs[knob.name])
        return index

    def reason(self, knobs: Knobs) -> str | None:
        """Why this assignment is invalid, or None when it is valid."""
        extra = sorted(set(knobs) - {k.name for k in self.knobs})
        if extra:
            return f"unknown knob(s) {extra}"
        try:
            self.index_of(knobs)
        except InvalidConfig as exc:
            return str(exc)
        return self.rule(knobs)

    def config(self, index: int) -> Config:
        knobs = self.knobs_at(index)
        why = self.rule(knobs)
        if why:
            raise InvalidConfig(why)
        return Config(index=index, knobs=knobs)

    def from_knobs(self, knobs: Knobs) -> Config:
        why = self.reason(knobs)
        if why:
            raise InvalidConfig(why)
        return Config(index=self.index_of(knobs), knobs=knobs)

    def is_valid(self, index: int) -> bool:
        return self.rule(self.knobs_at(index)) is None

    def valid_indices(self) -> Iterator[int]:
        return (i for i in range(self.size) if self.is_valid(i))


def first_valid(space: ConfigSpace, candidates: Iterable[Knobs], what: str) -> Config:
    """The first candidate the space's own rule accepts: a default is a list of preferences, so a
    heuristic that overreaches for one shape falls back instead of handing out a rejected config."""
    reasons: list[str] = []
    for knobs in candidates:
        why = space.reason(knobs)
        if why is None:
            return Config(index=space.index_of(knobs), knobs=knobs)
        reasons.append(why)
    why = "; ".join(dict.fromkeys(reasons)) or "no candidate"
    raise NoValidConfig(f"no schedule of the space fits {what}: {why}")
