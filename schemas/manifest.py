"""The JSON manifest next to a built library: what it computes, for which CPU, and from what.

The manifest is a description, not an authority: the loader checks it against the facts the library
embeds about itself (`stages/build/facts.py`) and, when a key is in use, against `manifest.sig`, an
HMAC-SHA256 of its bytes under TUNAFLOW_ARTIFACT_KEY.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, field_validator

from schemas.target import Target

# 2: the library embeds its facts (`.tunaflow_facts`) and both file digests are required.
# 3: tf_run and tf_profile take a status array and return the number of a call that met bad data.
FORMAT_VERSION = 3
MANIFEST = "manifest.json"
SIGNATURE = "manifest.sig"
LIBRARY = "model.so"
WEIGHTS = "weights.bin"
PROFILE = "tf_profile"  # the library entry point that times each kernel call
KEY_ENV = "TUNAFLOW_ARTIFACT_KEY"


class TensorInfo(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    shape: tuple[NonNegativeInt, ...]
    dtype: str = "float32"
    # An integer input that indexes a table (token ids): its values must lie in [-bound, bound).
    bound: int | None = Field(default=None, ge=1)

    @field_validator("dtype")
    @classmethod
    def _numeric(cls, v: str) -> str:
        try:
            kind = np.dtype(v).kind
        except TypeError:
            kind = None
        if kind not in tuple("fiub"):
            raise ValueError(f"dtype must be a numeric numpy dtype, got {v!r}")
        return v


class OpInfo(BaseModel):
    """One kernel call of `tf_run`: a tuned/default anchor kernel or a generated memory-bound op."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    node: str
    op: str
    kind: str  # "tuned", "default", "generated", "alias"
    task: str | None = None
    task_signature: str | None = None
    knobs: dict[str, int | str] | None = None
    record: dict | None = None  # session_id, trial, median_s, gflops of the record used
    layout: str | None = None  # a conv's padded hand-off: "x padded", "y padded t,l,b,r", or both


class Manifest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    format_version: int = FORMAT_VERSION
    model: str
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    target: Target
    target_key: str
    threads: int
    log: str | None
    log_digest: str | None
    workspace_bytes: int = Field(ge=0)
    naive_workspace_bytes: int
    weights_bytes: int = Field(ge=0)
    ops: tuple[OpInfo, ...]
    files: dict[str, str]  # file name → sha256; the loader requires exactly model.so and weights.bin
    build_s: float


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def log_digest(path: Path) -> str:
    """sha256 over the log's part names and bytes, in name order: changes whenever the log does."""
    h = hashlib.sha256()
    for part in sorted(path.glob("part-*.parquet")):
        h.update(part.name.encode())
        h.update(part.read_bytes())
    return h.hexdigest()


def artifact_key(key: str | bytes | None = None) -> bytes | None:
    """The key given, else TUNAFLOW_ARTIFACT_KEY's; None when neither is set (or both are empty)."""
    if key is None:
        key = os.environ.get(KEY_ENV, "")
    if isinstance(key, str):
        key = key.encode()
    return key or None


def signature(manifest_bytes: bytes, key: bytes) -> str:
    """What `manifest.sig` holds: hex HMAC-SHA256 of the manifest's exact bytes."""
    return hmac.new(key, manifest_bytes, hashlib.sha256).hexdigest()
