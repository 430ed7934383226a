"""The tuning log: a directory of Parquet parts, one per appended batch.

A part is written under a temporary name, fsynced, then renamed into place, so a crash leaves
either the whole batch or nothing. Every part carries the schema version in its metadata.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import ValidationError

from schemas.record import SCHEMA_VERSION, TuningRecord
from stages.log.arrow_schema import JSON_META, arrow_schema, from_row, to_row
from stages.measure.remeasure import TUNER_NAME as REMEASURE

VERSION_KEY = "tunaflow.schema_version"
SCHEMA = arrow_schema(TuningRecord, metadata={VERSION_KEY: str(SCHEMA_VERSION)})
PART_GLOB = "part-*.parquet"
QUARANTINE = "quarantine"


class LogError(Exception):
    """A log part that cannot be read as this version's records; names the file and the reason."""


@dataclass(frozen=True)
class Problem:
    path: Path
    reason: str


class TuningLog:
    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        if self.path.exists() and not self.path.is_dir():
            raise LogError(f"{self.path}: a tuning log is a directory of Parquet parts, this is a file")

    def parts(self) -> list[Path]:
        return sorted(self.path.glob(PART_GLOB)) if self.path.is_dir() else []

    def append(self, records: Iterable[TuningRecord]) -> Path | None:
        """Write one batch atomically; returns the part's path (None for an empty batch)."""
        records = [TuningRecord.model_validate(r) for r in records]
        if not records:
            return None
        self.path.mkdir(parents=True, exist_ok=True)
        table = to_table(records)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%f")
        final = self.path / f"part-{stamp}-{uuid.uuid4().hex[:8]}.parquet"
        tmp = self.path / f".{final.name}.tmp"
        with open(tmp, "wb") as fh:
            pq.write_table(table, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
        _fsync_dir(self.path)
        return final

    def read_table(self, strict: bool = True) -> tuple[pa.Table, list[Problem]]:
        tables, problems = [], []
        for part in self.parts():
            try:
                tables.append(_read_part(part))
            except LogError as exc:
                if strict:
                    raise
                problems.append(Problem(part, str(exc)))
        table = pa.concat_tables(tables) if tables else SCHEMA.empty_table()
        return table, problems

    def read(self, strict: bool = True) -> tuple[list[TuningRecord], list[Problem]]:
        """Validated records; with strict=False, unreadable parts and records become Problems."""
        records: list[TuningRecord] = []
        problems: list[Problem] = []
        for part in self.parts():
            try:
                rows = _read_part(part).to_pylist()
            except LogError as exc:
                if strict:
                    raise
                problems.append(Problem(part, str(exc)))
                continue
            for i, row in enumerate(rows):
                try:
                    records.append(TuningRecord.model_validate(_decode(row)))
                except (ValidationError, ValueError) as exc:
                    msg = f"{part.name}: row {i} fails validation: {_first_error(exc)}"
                    if strict:
                        raise LogError(msg) from exc
                    problems.append(Problem(part, msg))
        return records, problems

    def records(self) -> list[TuningRecord]:
        return self.read(strict=True)[0]

    def for_task(self, task_signature: str, target_key: str, threads: int | None = None) -> list[TuningRecord]:
        """Records of this task on this target (and thread count, when given)."""
        return [
            r for r in self.records()
            if r.task_signature == task_signature and r.target_key == target_key
            and (threads is None or r.threads == threads)
        ]

    def best(self, task_signature: str, target_key: str, threads: int | None = None) -> TuningRecord | None:
        """The best error-free record for this task and target, by `rank_key`."""
        ok = [r for r in self.for_task(task_signature, target_key, threads) if r.result.ok]
        return min(ok, key=rank_key) if ok else None

    def repair(self) -> list[Path]:
        """Move every unreadable part into `quarantine/` (never deletes); a part with some invalid
        rows is moved too, after its valid rows are re-appended as a new part. Returns moved paths."""
        moved: list[Path] = []
        bad_parts: dict[Path, list[TuningRecord]] = {}
        for part in self.parts():
            try:
                rows = _read_part(part).to_pylist()
            except LogError:
                bad_parts[part] = []
                continue
            good, invalid = [], False
            for row in rows:
                try:
                    good.append(TuningRecord.model_validate(_decode(row)))
                except (ValidationError, ValueError):
                    invalid = True
            if invalid:
                bad_parts[part] = good
        if not bad_parts:
            return moved
        aside = self.path / QUARANTINE
        aside.mkdir(exist_ok=True)
        for part, salvaged in bad_parts.items():
            self.append(salvaged)
            target = aside / part.name
            os.replace(part, target)
            moved.append(target)
        _fsync_dir(self.path)
        return moved

    def export_jsonl(self, out: str | os.PathLike[str]) -> int:
        records = self.records()
        with open(out, "w") as fh:
            for r in records:
                fh.write(r.model_dump_json() + "\n")
        return len(records)


def rank_key(record: TuningRecord) -> tuple[int, float]:
    """Re-measured records (the end-of-session top-k, measured again) outrank single trials, so one
    lucky noisy sample cannot become the best; then the lowest median cost wins."""
    return (0 if record.tuner == REMEASURE else 1, record.result.median)


def merge(sources: Iterable[str | os.PathLike[str]], dest: str | os.PathLike[str]) -> int:
    """Append every record of `sources` into `dest` (one part), skipping exact duplicates."""
    out = TuningLog(dest)
    seen = {_identity(r) for r in out.records()}
    fresh: list[TuningRecord] = []
    for src in sources:
        for r in TuningLog(src).records():
            if _identity(r) not in seen:
                seen.add(_identity(r))
                fresh.append(r)
    out.append(fresh)
    return len(fresh)


def to_table(records: list[TuningRecord]) -> pa.Table:
    rows = []
    for r in records:
        dumped = r.model_dump(mode="python")
        rows.append({f.name: to_row(dumped[f.name], f.type, f.metadata == JSON_META) for f in SCHEMA})
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def _decode(row: dict) -> dict:
    return {f.name: from_row(row.get(f.name), f.type, f.metadata == JSON_META) for f in SCHEMA}


def _read_part(part: Path) -> pa.Table:
    try:
        pf = pq.ParquetFile(part)
        meta = pf.schema_arrow.metadata or {}
        table = pf.read()
    except (pa.ArrowException, OSError) as exc:
        raise LogError(f"{part}: not a readable Parquet file ({exc})") from exc
    version = meta.get(VERSION_KEY.encode())
    if version is None:
        raise LogError(f"{part}: no {VERSION_KEY} in its metadata; not a tunaflow log part")
    if version.decode() != str(SCHEMA_VERSION):
        raise LogError(
            f"{part}: schema version {version.decode()}, this tunaflow reads version {SCHEMA_VERSION}"
        )
    try:
        return table.select(SCHEMA.names).cast(SCHEMA)
    except (pa.ArrowException, KeyError) as exc:
        raise LogError(f"{part}: columns do not match schema version {SCHEMA_VERSION} ({exc})") from exc


def _identity(r: TuningRecord) -> tuple:
    return (r.session_id, r.trial, r.task_signature, r.target_key, r.config.key())


def _first_error(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        return f"{'.'.join(map(str, err['loc']))}: {err['msg']}"
    return str(exc)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
