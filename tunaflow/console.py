"""Consoles and the ways commands end early: a red message on stderr (exit code 2), or Ctrl-C (130).

Messages carry user strings (paths, node and op names from models, agent names), so they are
printed as text, never as rich markup, and the consoles never turn `:name:` into an emoji. `err` is the
stderr console live progress draws on (`stages/report/terminal.py`), so a message printed while a bar
is live lands above it; piped, both consoles keep whole names instead of cutting lines at 80 columns.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import typer
from rich.markup import escape

from stages.report.terminal import STDERR, make_console

out = make_console()
err = STDERR

INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a command stopped by Ctrl-C
interrupted_said = threading.Event()  # the one line is out: a forced exit adds nothing


def fail(msg: str) -> typer.Exit:
    err.print(f"[bold red]error:[/] {escape(msg)}", highlight=False, soft_wrap=True)
    return typer.Exit(2)


def interrupted(log: Path | None = None) -> typer.Exit:
    """The one line a Ctrl-C ends a command with: how many records the tuning log kept."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not turn this exit into a traceback
    kept = ""
    if log is not None:
        from stages.log import LogError, TuningLog

        try:
            kept = f": {len(TuningLog(log).records())} records kept in {log}"
        except (LogError, OSError) as exc:
            kept = f"; the tuning log {log} could not be read back: {exc}"
    err.print(f"[yellow]interrupted[/]{escape(kept)}", highlight=False, soft_wrap=True)
    interrupted_said.set()
    return typer.Exit(INTERRUPTED)


def prefect_env() -> None:
    """Quiet, local Prefect, called before a flow starts: no telemetry (this network blocks it) unless the
    user set otherwise, and its console logging on `err`, out of the live display's way."""
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from tunaflow.prefect_logging import route_prefect_logs

    route_prefect_logs(err)
