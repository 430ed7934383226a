"""`tunaflow refine`: each op's top records from a tuning log timed inside the model, the verdict logged."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from tunaflow.console import fail, out
from tunaflow.limits import DEFAULT_TENSOR_MB, MAX_THREADS, MaxConstantOpt, MaxTensorOpt, import_limits

TopKOpt = Annotated[int, typer.Option(
    "--refine-top-k", min=0, help="time each op's top N records inside the built model, and build the fastest "
                                  "there (0 or 1: off)")]


def refine(
    model: Annotated[Path, typer.Argument(help="the ONNX model")],
    log: Annotated[Path, typer.Option(help="tuning log to take the records from and append the verdict to")],
    threads: Annotated[int, typer.Option(min=1, max=MAX_THREADS, help="threads (match the log's)")] = 1,
    top_k: Annotated[int, typer.Option(min=2, help="records per op to time, the ranking's pick included")] = 3,
    rounds: Annotated[int, typer.Option(min=1, help="timing rounds over every variant and workspace address")] = 3,
    again: Annotated[bool, typer.Option(help="re-time ops whose latest verdict timed the same candidates")] = False,
    target: Annotated[str, typer.Option(help="'host' or a preset this machine runs")] = "host",
    input_shape: Annotated[list[str] | None, typer.Option(
        "--input-shape", help="bind an input's (or a symbolic dim's) shape, e.g. input=1x3x224x224")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object at the end")] = False,
    max_constant_mb: MaxConstantOpt = None,
    max_tensor_mb: MaxTensorOpt = DEFAULT_TENSOR_MB,
) -> None:
    """Time each op's top records from LOG inside MODEL and append the verdict to LOG: `build` then runs, per
    op, the record that was fastest inside the model (a kernel timed alone can rank differently). `tune` does
    this after tuning; run it alone on a log tuned before, or after `tune-op`.

    Example: tunaflow refine model.onnx --log runs/cnn/log && tunaflow build model.onnx --log runs/cnn/log -o lib
    """
    from stages.log import LogError
    from stages.refine.in_model import refine as refine_log
    from tunaflow.commands.model import _graph, _target

    if not log.is_dir():
        raise fail(f"{log}: no tuning log there (a directory of Parquet parts); run `tunaflow tune` first")
    graph = _graph(model, input_shape, import_limits(max_constant_mb, max_tensor_mb))
    try:
        report = refine_log(graph, _target(target), threads, log, top_k, rounds, again,
                            progress=None if json_out else lambda m: out.print(f"[dim]{escape(m)}[/]"))
    except LogError as exc:
        raise fail(str(exc)) from exc
    if json_out:
        print(json.dumps(report.model_dump(mode="json") | {"saved_ms": report.saved_ms}))
    else:
        print_refine(report, detail=True)


def print_refine(r, detail: bool = False) -> None:
    """One summary line (and with `detail` every op timed) of a RefineReport."""
    from rich.table import Table

    if r.skipped:
        out.print(f"refined  : nothing timed in the model ({escape(r.skipped)})")
        return
    out.print(f"refined  : {len(r.ops)} op(s) timed in the model ({r.variants} variants x {r.rounds} rounds, "
              f"{r.seconds:.1f} s): {len(r.changed)} pick(s) changed, {r.saved_ms:.3f} ms per inference saved "
              "by the medians")
    for d in r.dropped:
        out.print(f"[yellow]           not judged: {escape(d)}[/]")
    if not detail:
        for op in sorted(r.changed, key=lambda o: o.nodes * (o.in_model_ms[o.chosen] - o.in_model_ms[0]))[:5]:
            out.print(f"           {escape(op.task)} x{op.nodes}: {op.in_model_ms[0]:.3f} -> "
                      f"{op.in_model_ms[op.chosen]:.3f} ms ({escape(op.candidates[op.chosen])})")
        return
    table = Table(title="in-model time per call, ms (record alone -> in the model); * built")
    table.add_column("op")
    table.add_column("x", justify="right")
    for i in range(max(len(op.candidates) for op in r.ops)):
        table.add_column("pick" if i == 0 else f"rival {i}", justify="right")
    for op in r.ops:
        cells = [f"{'*' if i == op.chosen else ''}{a:.3f} -> {b:.3f}"
                 for i, (a, b) in enumerate(zip(op.record_ms, op.in_model_ms, strict=True))]
        table.add_row(escape(op.task), str(op.nodes), *cells)
    out.print(table)
