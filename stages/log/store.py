"""The tuning log: a directory of Parquet parts, one per appended batch.

A part is written whole or not at all (`parts.py`) and carries the schema version in its
metadata; one process writes a log at a time (`lock.py`), readers take no lock. Reading skips a
damaged part or an invalid row with one warning naming it (logger `stages.log`, also kept in
`TuningLog.skipped` for the CLI) and keeps every good record; a part of another schema version is
refused. A write that fails is retried once, then the batch is saved under the temp directory if
that works, and a `LogWriteError` says where, why and how many records are not in the log.
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import ValidationError

from schemas.record import IN_MODEL, REMEASURE, SCHEMA_VERSION, TuningRecord
from stages.log.arrow_schema import JSON_META, arrow_schema, from_row, to_row
from stages.log.errors import LogError, LogVersionError, LogWriteError
from stages.log.lock import WriterLease, acquire, holder
from stages.log.parts import final_name, rescue, stale_parts, write_part

VERSION_KEY = "tunaflow.schema_version"
SCHEMA = arrow_schema(TuningRecord, metadata={VERSION_KEY: str(SCHEMA_VERSION)})
PART_GLOB = "part-*.parquet"
QUARANTINE = "quarantine"
WAIT_S = 5.0   # how long a second writer waits for the lock before refusing
RETRY_S = 0.5  # pause before the one retry of a failed write

PARSED_ROWS = 200_000  # records kept parsed across reads (a few hundred MB at most)

logger = logging.getLogger("stages.log")
# Parts are immutable once in place (written whole under a fresh name; repair moves them away), so a part's
# parsed records are kept by its path, inode, size and mtime: a tuning run reads its log once per task and
# round, and parsing a 3,000-record log took 1.6 s (Zen 5) where its 1,700 stats take milliseconds.
_PARSED: OrderedDict[tuple, tuple[TuningRecord, ...]] = OrderedDict()
_parsed_rows = 0
_warned: set[tuple[Path, str]] = set()


@dataclass(frozen=True)
class Problem:
    path: Path
    reason: str
    kind: str = "damaged"  # damaged (unreadable part, invalid row) | version (another schema) | stale (.tmp part)


class TuningLog:
    def __init__(self, path: str | os.PathLike[str], wait_s: float = WAIT_S):
        self.path = Path(path)
        self.wait_s = wait_s
        self.skipped: list[Problem] = []  # what the last `records()` skipped, for the CLI to show
        if self.path.exists() and not self.path.is_dir():
            raise LogError(f"{self.path}: a tuning log is a directory of Parquet parts, this is a file")

    def parts(self) -> list[Path]:
        return sorted(self.path.glob(PART_GLOB)) if self.path.is_dir() else []

    def writer(self) -> WriterLease:
        """Hold this log's writer lock (re-entered within the process; LogBusyError when another
        process keeps it past `wait_s`). Whoever takes it first recovers parts an interrupted writer
        left under their temporary name."""
        lease = acquire(self.path, self.wait_s)
        if lease.fresh:
            try:
                self._recover()
            except BaseException:
                lease.release()
                raise
        return lease

    def append(self, records: Iterable[TuningRecord]) -> Path | None:
        """Write one batch atomically; returns the part's path (None for an empty batch)."""
        records = [TuningRecord.model_validate(r) for r in records]
        if not records:
            return None
        table = to_table(records)
        with self.writer():
            try:
                return write_part(self.path, table)
            except (OSError, pa.ArrowException):
                time.sleep(RETRY_S)  # one more try: a transient failure, or space freed meanwhile
            try:
                return write_part(self.path, table)
            except (OSError, pa.ArrowException) as exc:
                raise self._write_error(table, exc) from exc

    def read(self, strict: bool = True) -> tuple[list[TuningRecord], list[Problem]]:
        """Validated records; with strict=False, unreadable parts, invalid records and stale
        temporary parts become Problems."""
        records: list[TuningRecord] = []
        problems: list[Problem] = []
        for part in self.parts():
            stamp = _stamp(part)
            if stamp in _PARSED:
                records += _PARSED[stamp]
                continue
            try:
                rows = _read_part(part).to_pylist()
            except LogError as exc:
                if strict:
                    raise
                problems.append(_problem(part, exc))
                continue
            mine: list[TuningRecord] = []
            for i, row in enumerate(rows):
                try:
                    mine.append(TuningRecord.model_validate(_decode(row)))
                except (ValidationError, ValueError) as exc:
                    msg = f"{part}: row {i} fails validation: {_first_error(exc)}"
                    if strict:
                        raise LogError(msg) from exc
                    problems.append(Problem(part, msg))
            records += mine
            if stamp is not None and len(mine) == len(rows):
                _remember(stamp, tuple(mine))
        if not strict:
            problems += self._stale()
        return records, problems

    def records(self) -> list[TuningRecord]:
        """Every good tuning record (trials and re-measurements; in-model verdicts are `verdicts()`): damaged
        parts and invalid rows are skipped with a warning naming them, a part of another schema version is
        refused (LogVersionError)."""
        return [r for r in self.rows() if r.tuner != IN_MODEL]

    def verdicts(self) -> list[TuningRecord]:
        """The in-model verdicts (stages/refine), oldest first: not trials, never ranked with them."""
        return [r for r in self.rows() if r.tuner == IN_MODEL]

    def rows(self) -> list[TuningRecord]:
        """Every good row of the log, verdicts included, in the order they were written."""
        records, problems = self.read(strict=False)
        for p in problems:
            if p.kind == "version":
                raise LogVersionError(p.reason)
        self.skipped = problems
        for p in problems:
            _warn_once(self.path, p)
        return records

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
        rows is moved too, after its valid rows are re-appended as a new part; stale temporary parts
        are recovered when whole, moved aside when not. Returns moved paths."""
        with self.writer():
            moved = self._recover()
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
            for part, salvaged in bad_parts.items():
                self.append(salvaged)
                moved.append(self._move_aside(part))
        return moved

    def export_jsonl(self, out: str | os.PathLike[str]) -> int:
        records = self.rows()
        try:
            with open(out, "w") as fh:
                for r in records:
                    fh.write(r.model_dump_json() + "\n")
        except OSError as exc:
            raise LogWriteError(f"{out}: cannot write the export ({exc.strerror or exc})") from exc
        return len(records)

    def _stale(self) -> list[Problem]:
        """Temporary parts no live writer is writing."""
        tmps = stale_parts(self.path)
        if not tmps or holder(self.path) is not None:
            return []
        return [Problem(t, f"{t}: a part an interrupted writer left under its temporary name; the next session "
                           "on this log (or `log check --repair`) recovers it if whole, else moves it aside", "stale")
                for t in tmps]

    def _recover(self) -> list[Path]:
        """Under the writer lock, every temporary part is stale: rename a whole one into place, move
        an incomplete one to `quarantine/`. Returns the moved paths."""
        moved = []
        for tmp in stale_parts(self.path):
            try:
                count = len([TuningRecord.model_validate(_decode(row)) for row in _read_part(tmp).to_pylist()])
            except (LogError, ValidationError, ValueError):
                moved.append(self._move_aside(tmp))
                logger.warning("%s: an incomplete part left by an interrupted writer; moved to %s", tmp, moved[-1])
                continue
            try:
                os.replace(tmp, final_name(tmp))
            except OSError as exc:
                raise LogWriteError(f"{tmp}: cannot recover this part ({exc.strerror or exc})") from exc
            logger.warning("%s: recovered %d records an interrupted writer had written but not renamed into place",
                           tmp, count)
        return moved

    def _move_aside(self, part: Path) -> Path:
        aside = self.path / QUARANTINE
        try:
            aside.mkdir(exist_ok=True)
            os.replace(part, aside / part.name)
        except OSError as exc:
            raise LogWriteError(f"{part}: cannot move it to {aside} ({exc.strerror or exc})") from exc
        return aside / part.name

    def _write_error(self, table: pa.Table, exc: BaseException) -> LogWriteError:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        saved = rescue(table)
        kept = (f"; they are saved in {saved} (`tunaflow log merge {self.path} {saved}` adds them back)" if saved
                else "; saving them under the temp directory failed too")
        return LogWriteError(f"{self.path}: cannot write a log part ({reason}); the {table.num_rows} records of this "
                             f"batch are not in the log, the parts already there are intact{kept}")


def rank_key(record: TuningRecord) -> tuple[int, float]:
    """The one order of "best" (build, `log show`, reports): re-measured records (the end-of-session top-k,
    measured again) outrank single trials, so a config measured once cannot jump ahead of them; then the
    lowest `cost_s` wins (a re-measurement's combined figure, a trial's median)."""
    return (0 if record.tuner == REMEASURE else 1, record.cost_s)


def merge(sources: Iterable[str | os.PathLike[str]], dest: str | os.PathLike[str]) -> int:
    """Append every record of `sources` into `dest` (one part), skipping exact duplicates."""
    out = TuningLog(dest)
    with out.writer():
        seen = {_identity(r) for r in out.rows()}
        fresh: list[TuningRecord] = []
        for src in sources:
            for r in TuningLog(src).rows():
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
        raise LogVersionError(
            f"{part}: schema version {version.decode()}, this tunaflow reads version {SCHEMA_VERSION}"
        )
    try:
        return _with_defaults(table).select(SCHEMA.names).cast(SCHEMA)
    except (pa.ArrowException, KeyError) as exc:
        raise LogError(f"{part}: columns do not match schema version {SCHEMA_VERSION} ({exc})") from exc


def _with_defaults(table: pa.Table) -> pa.Table:
    """A part written before a field with a default existed gets that default in every row."""
    for field in SCHEMA:
        info = TuningRecord.model_fields[field.name]
        if field.name not in table.column_names and not info.is_required():
            value = to_row(info.get_default(call_default_factory=True), field.type, field.metadata == JSON_META)
            table = table.append_column(field, pa.array([value] * table.num_rows, field.type))
    return table


def _stamp(part: Path) -> tuple | None:
    try:
        st = part.stat()
    except OSError:
        return None
    return str(part.resolve()), st.st_ino, st.st_size, st.st_mtime_ns


def _remember(stamp: tuple, records: tuple[TuningRecord, ...]) -> None:
    global _parsed_rows
    _PARSED[stamp] = records
    _parsed_rows += len(records)
    while _parsed_rows > PARSED_ROWS and len(_PARSED) > 1:
        _parsed_rows -= len(_PARSED.popitem(last=False)[1])


def _identity(r: TuningRecord) -> tuple:
    return (r.session_id, r.trial, r.task_signature, r.target_key, r.config.key())


def _first_error(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        return f"{'.'.join(map(str, err['loc']))}: {err['msg']}"
    return str(exc)



def _problem(part: Path, exc: LogError) -> Problem:
    return Problem(part, str(exc), "version" if isinstance(exc, LogVersionError) else "damaged")


def _warn_once(log: Path, p: Problem) -> None:
    """One warning per problem per process: a session reads its log many times."""
    if (p.path, p.reason) in _warned:
        return
    _warned.add((p.path, p.reason))
    if p.kind == "stale":
        logger.warning("%s", p.reason)
    else:
        logger.warning("%s; skipped, every other record is read (`tunaflow log check %s --repair` moves it aside)",
                       p.reason, log)
