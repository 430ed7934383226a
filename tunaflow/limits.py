"""Bounds the command line holds its numbers to, so nonsense is refused at the option."""

from __future__ import annotations

import math

import typer

MAX_THREADS = 256  # more than any machine this runs on; 999 threads would be a typo, not a request


def finite_epilogue(value: str | None) -> str | None:
    """An --epilogue whose every parameter is a finite number (`leaky_relu:nan` builds a kernel that
    answers NaN, which only shows up as a wrong answer per trial)."""
    if not value:
        return value
    from schemas.task import parse_epilogue

    try:
        ops = parse_epilogue(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    for op in ops:
        bad = {name: v for name, v in op.attrs.items() if not math.isfinite(v)}
        if bad:
            raise typer.BadParameter(f"{op.kind}: parameters must be finite numbers, got "
                                     + ", ".join(f"{k}={v}" for k, v in bad.items()))
    return value
