"""Writing one part: under a temporary name, fsynced, renamed into place, so a reader sees the whole
batch or nothing. A write that fails removes its temporary file; a part an interrupted writer left
under its temporary name is found by `stale_parts` (the store recovers or moves it aside).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from contextlib import suppress
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

TMP_GLOB = ".part-*.parquet.tmp"
RESCUE_PREFIX = "tunaflow-unwritten-"


def write_part(log_dir: Path, table: pa.Table) -> Path:
    """Write `table` as a new part of `log_dir`; on any failure (or Ctrl-C) no temporary file is left."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%f")
    final = log_dir / f"part-{stamp}-{uuid.uuid4().hex[:8]}.parquet"
    tmp = temporary_name(final)
    try:
        with open(tmp, "wb") as fh:
            pq.write_table(table, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    except BaseException:
        with suppress(OSError):
            tmp.unlink()
        raise
    with suppress(OSError):  # the part is in place; a directory that cannot be fsynced does not undo that
        fsync_dir(log_dir)
    return final


def temporary_name(final: Path) -> Path:
    return final.with_name(f".{final.name}.tmp")


def final_name(tmp: Path) -> Path:
    """The name a temporary part would have been renamed to."""
    return tmp.with_name(tmp.name[1:-len(".tmp")])


def stale_parts(log_dir: Path) -> list[Path]:
    """Temporary parts present now (stale unless a writer holds the lock)."""
    return sorted(log_dir.glob(TMP_GLOB)) if log_dir.is_dir() else []


def rescue(table: pa.Table) -> Path | None:
    """Write a batch the log refused into a new log under the temp directory; None if that fails too."""
    try:
        where = Path(tempfile.mkdtemp(prefix=RESCUE_PREFIX))
    except OSError:
        return None
    try:
        write_part(where, table)
    except (OSError, pa.ArrowException):
        shutil.rmtree(where, ignore_errors=True)
        return None
    return where


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
