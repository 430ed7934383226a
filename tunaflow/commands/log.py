"""`tunaflow log ...`: inspect, export and merge tuning logs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from tunaflow.console import fail, out


def log_show(
    log: Annotated[Path, typer.Argument(help="tuning log directory")],
    top: Annotated[int, typer.Option(help="best configs shown per task")] = 5,
) -> None:
    """The best configs per task, target and thread count, ranked as the build ranks them (a re-measured config
    first), with their spread, the failure counts, and the latest in-model verdict (`tunaflow refine`)."""
    from stages.log import LogError, TuningLog

    if not log.exists():
        raise fail(f"{log}: no such tuning log")
    try:
        rows = TuningLog(log).rows()
    except LogError as exc:
        raise fail(str(exc)) from exc
    from schemas.record import IN_MODEL, REMEASURE
    from stages.build.apply_best import latest_verdict
    from stages.log.store import rank_key

    records = [r for r in rows if r.tuner != IN_MODEL]
    verdicts = [r for r in rows if r.tuner == IN_MODEL and r.result.ok]

    groups: dict[tuple[str, str, int], list] = {}
    for r in records:
        groups.setdefault((r.task_signature, r.target_key, r.threads), []).append(r)
    out.print(f"{escape(str(log))}: {len(records)} records, {len(groups)} task/target/thread-count groups")
    for (sig, key, threads), recs in groups.items():
        ok = sorted((r for r in recs if r.result.ok), key=rank_key)  # the build's order: re-measured first
        failed: dict[str, int] = {}
        for r in recs:
            if not r.result.ok:
                failed[r.result.error_no.name] = failed.get(r.result.error_no.name, 0) + 1
        again = sum(r.tuner == REMEASURE for r in recs)
        title = (f"{recs[0].task.description}  [{sig}]  on {key}, {threads} thread(s)  ({len(recs) - again} trials"
                 + (f", {again} re-measurements" if again else "") + ")")
        table = Table(title=escape(title))
        for col in ("rank", "GFLOPS", "median ms", "spread", "trial", "config"):
            table.add_column(col, justify="right" if col != "config" else "left")
        for rank, r in enumerate(ok[:top], 1):
            trial = ("re-measured" + (" (unstable)" if r.unstable else "")) if r.tuner == REMEASURE else str(r.trial)
            table.add_row(str(rank), f"{r.gflops:.1f}", f"{r.cost_s * 1e3:.3f}", f"{r.result.spread:.1%}",
                          trial, escape(r.config.short()))
        out.print(table)
        timed = latest_verdict([v for v in verdicts if v.target_key == key and v.threads == threads], {sig})
        if timed:
            out.print(f"  in the model ({escape(timed[0].session_id)}; the build runs the fastest of an op and its "
                      "twins while this verdict stands):")
            for v in sorted(timed, key=lambda v: v.cost_s):
                out.print(f"    {v.cost_s * 1e3:.3f} ms per call  {escape(v.config.short())}")
        if failed:
            out.print(f"  failed: {escape(str(failed))}")


def log_export(
    log: Annotated[Path, typer.Argument(help="tuning log directory")],
    output: Annotated[Path, typer.Argument(help="JSON-lines file to write")],
) -> None:
    """Write every record as one JSON object per line, for inspection."""
    from stages.log import LogError, TuningLog

    try:
        count = TuningLog(log).export_jsonl(output)
    except LogError as exc:
        raise fail(str(exc)) from exc
    out.print(f"wrote {count} records to {escape(str(output))}")


def log_merge(
    dest: Annotated[Path, typer.Argument(help="log to merge into (created if missing)")],
    sources: Annotated[list[Path], typer.Argument(help="logs to read")],
) -> None:
    """Append the records of other logs into DEST, skipping exact duplicates."""
    from stages.log import LogError, merge

    try:
        added = merge(sources, dest)
    except LogError as exc:
        raise fail(str(exc)) from exc
    out.print(f"merged {added} new records into {escape(str(dest))}")


