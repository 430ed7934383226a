"""Every message between an RPC client, the tracker and a device agent.

The object code travels base64-encoded inside JSON; its size is bounded here and the whole
request body is bounded again by the server, so no field can grow without limit. Results from
devices travel as raw JSON objects: each is parsed and judged on its own by whoever receives it
(`stages.measure.plausible.judge`), so one malformed or lying result never costs the others.
"""

from __future__ import annotations

import base64
import binascii
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator

from schemas.measure import MeasureResult
from schemas.options import MeasureOptions
from schemas.target import Target
from schemas.task import TuningTask

MAX_OBJECT_BYTES = 8 * 1024 * 1024
MAX_JOBS_PER_SUBMIT = 256

DeviceKey = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]
Id = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]


class _Msg(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


RawResult = Annotated[dict[str, JsonValue], Field(max_length=16)]  # a MeasureResult as sent, not yet trusted


class MeasureJob(_Msg):
    """One candidate compiled on the host for the device's target, with how to measure it."""

    task: TuningTask
    target: Target
    knobs: dict[str, int | str] = Field(max_length=64)
    obj_b64: str = Field(max_length=(MAX_OBJECT_BYTES * 4) // 3 + 4)
    options: MeasureOptions
    build_s: float = Field(default=0.0, ge=0)

    @field_validator("obj_b64")
    @classmethod
    def _base64(cls, v: str) -> str:
        try:
            base64.b64decode(v, validate=True)
        except binascii.Error as exc:
            raise ValueError(f"the object is not base64: {exc}") from None
        return v

    @classmethod
    def of(cls, task: TuningTask, target: Target, knobs: dict, obj: bytes, options: MeasureOptions,
           build_s: float = 0.0) -> MeasureJob:
        return cls(task=task, target=target, knobs=knobs, obj_b64=base64.b64encode(obj).decode(), options=options,
                   build_s=build_s)

    @property
    def obj(self) -> bytes:
        return base64.b64decode(self.obj_b64, validate=True)


class SubmitRequest(_Msg):
    key: DeviceKey
    jobs: list[MeasureJob] = Field(min_length=1, max_length=MAX_JOBS_PER_SUBMIT)
    queue_timeout_s: float = Field(default=60.0, gt=0, le=3600,
                                   description="a job no device under the key takes within this is an error")


class SubmitReply(_Msg):
    job_ids: list[Id]


class ResultsRequest(_Msg):
    job_ids: list[Id] = Field(min_length=1, max_length=4096)
    wait_s: float = Field(default=5.0, ge=0, le=30, description="long-poll: wait this long for one to finish")


class ResultsReply(_Msg):
    """Finished jobs among those asked for; each is handed out once, then forgotten."""

    model_config = ConfigDict(allow_inf_nan=True)  # results are judged by the receiver, NaN included

    results: dict[str, RawResult]
    unknown: list[str] = Field(default_factory=list, description="ids the tracker does not hold")


class RegisterRequest(_Msg):
    key: DeviceKey
    target: Target
    name: str = Field(default="", max_length=128)


class RegisterReply(_Msg):
    agent_id: Id
    heartbeat_s: float


class Lease(_Msg):
    """A job handed to one agent; it is requeued if the agent stops sending heartbeats."""

    job_id: Id
    job: MeasureJob


class NextRequest(_Msg):
    wait_s: float = Field(default=10.0, ge=0, le=30)


class ResultPost(_Msg):
    model_config = ConfigDict(allow_inf_nan=True)  # the tracker judges the result, NaN included

    job_id: Id
    result: RawResult

    @classmethod
    def of(cls, job_id: str, result: MeasureResult) -> ResultPost:
        return cls(job_id=job_id, result=result.model_dump(mode="json"))


class DeviceStatus(_Msg):
    agent_id: Id
    name: str
    target_key: str
    busy: bool
    job_id: str | None
    measured: int
    last_seen_s: float


class KeyStatus(_Msg):
    key: str
    target: Target | None
    devices: list[DeviceStatus]
    free: int
    busy: int
    queued: int


class TrackerStatus(_Msg):
    keys: list[KeyStatus]
    requeued: int
    failed_after_retries: int
