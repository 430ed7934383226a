"""Bounds the command line holds its numbers to, so nonsense is refused at the option."""

from __future__ import annotations

import math
from typing import Annotated

import typer

from schemas.options import ImportLimits

MAX_THREADS = 256  # more than any machine this runs on; 999 threads would be a typo, not a request

DEFAULT_TENSOR_MB = ImportLimits.model_fields["max_tensor_mb"].default
MaxConstantOpt = Annotated[float | None, typer.Option(
    "--max-constant-mb", min=0.001, show_default=False,
    help="memory the import may spend on constants it computes (default: the larger of 256 MB and 4x the "
         "model's own weights)")]
MaxTensorOpt = Annotated[float, typer.Option(
    "--max-tensor-mb", min=0.001, help="largest run-time tensor a model may declare or infer, in MB of float32")]


def import_limits(max_constant_mb: float | None, max_tensor_mb: float) -> ImportLimits:
    return ImportLimits(max_constant_mb=max_constant_mb, max_tensor_mb=max_tensor_mb)


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
