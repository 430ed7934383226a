"""The JSON manifest next to a built library: what it computes, for which CPU, and from what."""

from __future__ import annotations

import hashlib
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from schemas.target import Target

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
LIBRARY = "model.so"
WEIGHTS = "weights.bin"
PROFILE = "tf_profile"  # the library entry point that times each kernel call


class TensorInfo(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"


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
    workspace_bytes: int
    naive_workspace_bytes: int
    weights_bytes: int
    ops: tuple[OpInfo, ...]
    files: dict[str, str]  # file name → sha256
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
