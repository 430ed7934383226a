"""Consoles and the one way commands fail: a red message on stderr, exit code 2."""

from __future__ import annotations

import os

import typer
from rich.console import Console

out = Console()
err = Console(stderr=True)


def fail(msg: str) -> typer.Exit:
    err.print(f"[bold red]error:[/] {msg}", highlight=False, soft_wrap=True)
    return typer.Exit(2)


def prefect_env() -> None:
    """Quiet, local Prefect: no telemetry (this network blocks it) unless the user set otherwise."""
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
