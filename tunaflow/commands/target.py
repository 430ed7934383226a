"""`tunaflow target`: the hardware logs are keyed on."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from tunaflow.console import fail, out


def target(
    json_out: Annotated[bool, typer.Option("--json", help="print the target as JSON")] = False,
    spec: Annotated[str, typer.Option("--target", help="a preset or target string to parse instead of the host")]
    = "host",
) -> None:
    """Show the detected host target (or parse --target): what tuning logs are keyed on."""
    from schemas import Target, TargetError

    try:
        t = Target.parse(spec)
    except (TargetError, ValueError) as exc:
        raise fail(str(exc)) from exc
    if json_out:
        print(json.dumps({**t.model_dump(), "key": t.key, "string": t.to_string()}))
        return
    table = Table(title=f"target {escape(t.name)}", show_header=False)
    for name, value in [("key", t.key), ("string", t.to_string()), ("triple", t.triple), ("cpu", t.cpu),
                        ("cores", t.cores), ("vector bits", t.vector_bits), ("L1 / L2 / L3",
                        f"{t.l1_bytes // 1024} KiB / {t.l2_bytes // 1024} KiB / {t.l3_bytes // 1024} KiB"),
                        ("features", t.features)]:
        table.add_row(name, escape(str(value)))
    out.print(table)


