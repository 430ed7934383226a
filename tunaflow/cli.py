"""The `tunaflow` command line."""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(
    help="tunaflow: auto-tune tensor operators with LLVM, keep every trial in a Parquet log, "
         "orchestrated by Prefect.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
)
log_app = typer.Typer(help="Inspect, export and merge tuning logs.", no_args_is_help=True)
app.add_typer(log_app, name="log")
out = Console()
err = Console(stderr=True)

DATA = Path(__file__).resolve().parent.parent / "data"
OPS = ("matmul",)


def _prefect_env() -> None:
    """Quiet, local Prefect: no telemetry (this network blocks it) unless the user set otherwise."""
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


def _fail(msg: str) -> typer.Exit:
    err.print(f"[bold red]error:[/] {msg}")
    return typer.Exit(2)


@app.command("tune-op")
def tune_op(
    op: Annotated[str, typer.Argument(help=f"operator to tune: {', '.join(OPS)}")],
    m: Annotated[int | None, typer.Option(help="rows of A and C")] = None,
    n: Annotated[int | None, typer.Option(help="columns of B and C")] = None,
    k: Annotated[int | None, typer.Option(help="columns of A, rows of B (the reduction)")] = None,
    trials: Annotated[int, typer.Option(help="trial budget of this task in the log; a rerun resumes up to it")] = 64,
    log: Annotated[Path, typer.Option(help="tuning log directory (created if missing)")] = Path("tuning-log"),
    early_stopping: Annotated[int | None, typer.Option(help="stop after this many trials without a new best")] = None,
    tuner: Annotated[str, typer.Option(help="search policy: random or grid")] = "random",
    threads: Annotated[int, typer.Option(help="threads each kernel runs with")] = 1,
    seed: Annotated[int, typer.Option(help="seed of the search")] = 0,
    batch_size: Annotated[int, typer.Option(help="candidates built and measured per round")] = 16,
    target: Annotated[str, typer.Option(help="'host', a preset, or 'llvm -mtriple=... -mcpu=...'")] = "host",
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object at the end, for scripts")] = False,
    prefect: Annotated[bool, typer.Option("--prefect/--no-prefect",
                                          help="run as a Prefect flow (visible in the UI) or call the stages directly")]
    = True,
) -> None:
    """Tune one operator on this machine and log every trial.

    Example: tunaflow tune-op matmul --m 512 --n 512 --k 512 --trials 64 --log runs/mm
    """
    from pydantic import ValidationError

    from schemas import MeasureOptions, Target, TargetError, TuningOptions, matmul_task

    if op not in OPS:
        raise _fail(f"unknown operator {op!r}; tune-op supports: {', '.join(OPS)}")
    missing = [name for name, v in (("--m", m), ("--n", n), ("--k", k)) if v is None]
    if missing:
        raise _fail(f"{op} needs {', '.join(missing)}")
    try:
        task = matmul_task(m, n, k)
        tgt = Target.parse(target)
        options = TuningOptions(n_trials=trials, early_stopping=early_stopping, tuner=tuner, seed=seed,
                                batch_size=batch_size, measure=MeasureOptions(threads=threads))
    except (ValidationError, TargetError) as exc:
        raise _fail(str(exc)) from exc
    result = _tune(task, tgt, options, log, prefect, show_progress=not json_out)
    if json_out:
        print(json.dumps(result))
    else:
        _print_result(result)


def _tune(task, target, options, log: Path, prefect: bool, show_progress: bool) -> dict:
    from stages.log import LogError, TuningLog
    from stages.measure.numpy_ref import numpy_gflops
    from stages.report.progress import TerminalProgress
    from stages.report.summary import op_report
    from stages.tune.session import run_session_with_default

    try:
        TuningLog(log).records()
    except LogError as exc:
        raise _fail(str(exc)) from exc
    if prefect:
        _prefect_env()
        from flows.tune_op import tune_op as flow

        return flow(task, target.to_string() if target.name != "host" else "host", options, str(log),
                    progress=show_progress)
    observers = []
    with TerminalProgress(task.description, options.n_trials, every=options.batch_size) as bar:
        if show_progress:
            observers.append(bar)
        summary, default = run_session_with_default(task, target, options, TuningLog(log), observers)
    return op_report(summary, default, numpy_gflops(task, options.measure.threads), str(log))


def _print_result(r: dict) -> None:
    out.print(f"[bold]{r['task']}[/]  ({r['trials']} trials in the log, {r['new_trials']} new, {r['wall_s']:.1f} s)")
    if r["best_config"] is None:
        out.print("[red]no successful trial yet[/]")
    else:
        knobs = " ".join(f"{k}={v}" for k, v in r["best_config"].items())
        out.print(f"best schedule : {knobs}")
        out.print(f"best          : [bold green]{r['best_gflops']:.1f} GFLOPS[/] (spread {r['best_spread']:.1%})")
    speedup = f"  -> tuned is {r['speedup_over_default']:.2f}x the default" if r["speedup_over_default"] else ""
    out.print(f"default       : {r['default_gflops']:.1f} GFLOPS{speedup}")
    out.print(f"numpy         : {r['numpy_gflops']:.1f} GFLOPS")
    if r["errors"]:
        out.print(f"failed trials : {r['errors']}")
    out.print(f"tuning log    : {r['log']}")


@app.command()
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
        raise _fail(str(exc)) from exc
    if json_out:
        print(json.dumps({**t.model_dump(), "key": t.key, "string": t.to_string()}))
        return
    table = Table(title=f"target {t.name}", show_header=False)
    for name, value in [("key", t.key), ("string", t.to_string()), ("triple", t.triple), ("cpu", t.cpu),
                        ("cores", t.cores), ("vector bits", t.vector_bits), ("L1 / L2 / L3",
                        f"{t.l1_bytes // 1024} KiB / {t.l2_bytes // 1024} KiB / {t.l3_bytes // 1024} KiB"),
                        ("features", t.features)]:
        table.add_row(name, str(value))
    out.print(table)


@log_app.command("show")
def log_show(
    log: Annotated[Path, typer.Argument(help="tuning log directory")],
    top: Annotated[int, typer.Option(help="best configs shown per task")] = 5,
) -> None:
    """The best configs per task and target, with their spread, and the failure counts."""
    from stages.log import LogError, TuningLog

    if not log.exists():
        raise _fail(f"{log}: no such tuning log")
    try:
        records = TuningLog(log).records()
    except LogError as exc:
        raise _fail(str(exc)) from exc
    groups: dict[tuple[str, str], list] = {}
    for r in records:
        groups.setdefault((r.task_signature, r.target_key), []).append(r)
    out.print(f"{log}: {len(records)} records, {len(groups)} task/target pairs")
    for (sig, key), recs in groups.items():
        ok = sorted((r for r in recs if r.result.ok), key=lambda r: r.result.median)
        failed: dict[str, int] = {}
        for r in recs:
            if not r.result.ok:
                failed[r.result.error_no.name] = failed.get(r.result.error_no.name, 0) + 1
        table = Table(title=f"{recs[0].task.description}  [{sig}]  on {key}  ({len(recs)} trials)")
        for col in ("rank", "GFLOPS", "median ms", "spread", "trial", "config"):
            table.add_column(col, justify="right" if col != "config" else "left")
        for rank, r in enumerate(ok[:top], 1):
            table.add_row(str(rank), f"{r.gflops:.1f}", f"{r.result.median * 1e3:.3f}", f"{r.result.spread:.1%}",
                          str(r.trial), r.config.short())
        out.print(table)
        if failed:
            out.print(f"  failed: {failed}")


@log_app.command("export")
def log_export(
    log: Annotated[Path, typer.Argument(help="tuning log directory")],
    output: Annotated[Path, typer.Argument(help="JSON-lines file to write")],
) -> None:
    """Write every record as one JSON object per line, for inspection."""
    from stages.log import LogError, TuningLog

    try:
        count = TuningLog(log).export_jsonl(output)
    except LogError as exc:
        raise _fail(str(exc)) from exc
    out.print(f"wrote {count} records to {output}")


@log_app.command("merge")
def log_merge(
    dest: Annotated[Path, typer.Argument(help="log to merge into (created if missing)")],
    sources: Annotated[list[Path], typer.Argument(help="logs to read")],
) -> None:
    """Append the records of other logs into DEST, skipping exact duplicates."""
    from stages.log import LogError, merge

    try:
        added = merge(sources, dest)
    except LogError as exc:
        raise _fail(str(exc)) from exc
    out.print(f"merged {added} new records into {dest}")


@app.command()
def demo(
    trials: Annotated[int, typer.Option(help="trial budget")] = 48,
    runs: Annotated[Path, typer.Option(help="where the demo's tuning log goes")] = Path("runs"),
) -> None:
    """Tune the bundled 512x512x512 matmul through the Prefect flow and compare with default and numpy."""
    from schemas import MeasureOptions, Target, TuningOptions, TuningTask

    task = TuningTask.model_validate_json((DATA / "tasks" / "matmul_512.json").read_text())
    log = runs / f"demo-{datetime.now():%Y%m%d-%H%M%S}"
    out.print(f"[bold]tunaflow demo[/]: {trials} trials of {task.description} on this machine, through Prefect "
              "(a temporary local Prefect server starts first, 10-20 s)")
    options = TuningOptions(n_trials=trials, batch_size=16, tuner="random", measure=MeasureOptions(threads=1))
    result = _tune(task, Target.host(), options, log, prefect=True, show_progress=True)
    _print_result(result)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
