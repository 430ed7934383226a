"""`tunaflow log plot LOG -o DIR`: one convergence chart per task, where a person would rather look."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from tunaflow.console import fail, out


def log_plot(
    log: Annotated[Path, typer.Argument(help="tuning log directory")],
    output: Annotated[Path, typer.Option("-o", "--output", help="directory for the PNG charts")] = Path("charts"),
    target_key: Annotated[str | None, typer.Option("--target-key", help="only this target key")] = None,
    threads: Annotated[int | None, typer.Option(help="only trials run with this thread count")] = None,
) -> None:
    """Blue dots: every trial's GFLOPS; orange line: best so far; red crosses: failed trials."""
    from stages.log import LogError, TuningLog
    from stages.report.charts import log_charts

    if not log.is_dir():
        raise fail(f"{log}: no such tuning log")
    try:
        paths = log_charts(TuningLog(log), output, target_key, threads)
    except LogError as exc:
        raise fail(str(exc)) from exc
    if not paths:
        raise fail(f"{log}: no records to plot")
    for p in paths:
        out.print(f"wrote {escape(str(p))}", highlight=False, soft_wrap=True)
