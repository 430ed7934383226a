"""A point in a task's schedule space."""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict, Field


class Config(BaseModel):
    """A knob assignment; `index` is its position in the space's mixed-radix enumeration."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    index: int = Field(ge=0)
    knobs: dict[str, int | str]

    def short(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.knobs.items())

    def key(self) -> str:
        return json.dumps(self.knobs, sort_keys=True)
