"""One anchor of a built library: its time in the model against the time its chosen record says (issue 24)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class AnchorTime(BaseModel):
    """`run --profile`'s verdict on one tuned anchor: does the tuner's figure hold in the library?"""

    model_config = ConfigDict(frozen=True, extra="forbid")

    node: str
    task: str
    deployed_us: float = Field(gt=0, description="the fastest round median of its calls in the library (the "
                                                 "tuner's rule: load only ever slows a kernel)")
    tuned_us: float = Field(gt=0, description="what the chosen record says (its cost_s)")
    alone_us: float | None = Field(default=None, description="the same config timed alone now as the tuner times "
                                                             "it, the mean of a >= 10 ms loop (run --alone)")
    alone_call_us: float | None = Field(default=None, description="the same config timed alone now per single "
                                                                  "call, as the profile counts (run --alone)")
    alone_cold_us: float | None = Field(default=None, description="the same, its caches flushed before each call "
                                                                  "(run --alone)")
    ratio: float = Field(gt=0, description="deployed / tuned")
    off: bool = Field(description="the ratio is more than the tolerance away from 1")
    reasons: tuple[str, ...] = Field(default=(), description="what can be told about why, for an anchor off")
