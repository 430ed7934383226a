"""`tunaflow log check LOG [--repair]`: find damaged parts; move them aside, never delete."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from tunaflow.console import fail, out


def log_check(
    log: Annotated[Path, typer.Argument(help="tuning log directory")],
    repair: Annotated[bool, typer.Option("--repair", help="move bad parts to LOG/quarantine/ (valid rows are kept)")]
    = False,
) -> None:
    """List unreadable parts and invalid records by file and reason; exit 1 when any remain."""
    from stages.log import LogError, TuningLog

    if not log.is_dir():
        raise fail(f"{log}: no such tuning log")
    try:
        tlog = TuningLog(log)
        records, problems = tlog.read(strict=False)
    except LogError as exc:
        raise fail(str(exc)) from exc
    out.print(f"{escape(str(log))}: {len(tlog.parts())} parts, {len(records)} readable records, "
              f"{len(problems)} problem(s)")
    for p in problems:
        out.print(escape(f"  {p.path.name}: {p.reason}"), highlight=False, soft_wrap=True)
    if problems and repair:
        moved = tlog.repair()
        out.print(f"moved {len(moved)} part(s) to {escape(str(log / 'quarantine'))}; {len(tlog.records())} records "
                  "remain readable")
        return
    if problems:
        raise typer.Exit(1)
