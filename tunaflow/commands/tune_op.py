"""`tunaflow tune-op`: tune one operator."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from tunaflow import runs
from tunaflow.commands.rpc import DeviceKeyOpt, RunnerKind, TokenFile, TrackerOpt, runner_choice
from tunaflow.console import fail, interrupted, out
from tunaflow.limits import MAX_THREADS, finite_epilogue

SHAPE_HELP = "operator shape options; each operator takes its own (see the README)"


def tune_op(
    op: Annotated[str, typer.Argument(help="operator to tune: " + ", ".join(_ops()))],
    m: Annotated[int | None, typer.Option(help="rows of the output (matmul, dense, batch_matmul)")] = None,
    n: Annotated[int | None, typer.Option(help="columns of the output (matmul, dense, batch_matmul)")] = None,
    k: Annotated[int | None, typer.Option(help="reduction length (matmul, dense, batch_matmul)")] = None,
    b: Annotated[int | None, typer.Option(help="batch count (batch_matmul)")] = None,
    input: Annotated[str | None, typer.Option(help="input shape, e.g. 1x64x56x56 (conv2d, conv2d_winograd)")] = None,
    weight: Annotated[str | None, typer.Option(help="weight shape, e.g. 64x64x3x3 (conv2d, conv2d_winograd)")] = None,
    stride: Annotated[str | None, typer.Option(help="stride, e.g. 1 or 2x2 (conv2d)")] = None,
    pad: Annotated[str | None, typer.Option(
        help="padding: 1, 1x1 or top,left,bottom,right (conv2d, conv2d_winograd)")] = None,
    dilation: Annotated[str | None, typer.Option(help="dilation, e.g. 1 or 2x2 (conv2d)")] = None,
    groups: Annotated[int | None, typer.Option(min=1, help="groups (conv2d)")] = None,
    epilogue: Annotated[str | None, typer.Option(callback=finite_epilogue,
                                                 help="fused ops, e.g. bias,relu or clip:0:6")] = None,
    trials: Annotated[int, typer.Option(help="trial budget of this task in the log; a rerun resumes up to it")] = 64,
    log: Annotated[Path, typer.Option(help="tuning log directory (created if missing; holds only Parquet parts)")]
    = Path("tuning-log"),
    charts: Annotated[Path | None, typer.Option(help="where the convergence chart goes (default: LOG-charts beside "
                                                     "the log)", show_default=False)] = None,
    early_stopping: Annotated[int | None, typer.Option(help="stop after this many trials without a new best")] = None,
    tuner: Annotated[str, typer.Option(help="search policy: lgbm (cost model), lgbm-reg, lgbm-rank, ga, random, grid")]
    = "lgbm",
    transfer_from: Annotated[list[Path] | None, typer.Option(
        "--transfer-from", help="a log whose records of the same op seed the cost model (repeatable); "
        "its records of this very task resume the session")] = None,
    threads: Annotated[int, typer.Option(min=1, max=MAX_THREADS, help="threads each kernel runs with")] = 1,
    seed: Annotated[int, typer.Option(help="seed of the search")] = 0,
    batch_size: Annotated[int, typer.Option(help="candidates built and measured per round")] = 16,
    target: Annotated[str, typer.Option(help="'host', a preset, or 'llvm -mtriple=... -mcpu=...'")] = "host",
    runner: RunnerKind = "local",
    key: DeviceKeyOpt = None,
    tracker: TrackerOpt = "127.0.0.1:9190",
    token_file: TokenFile = None,
    remeasure_top_k: Annotated[int, typer.Option(help="re-measure this many best configs at the end and choose "
                                                      "the best from that")] = 3,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object at the end, for scripts")] = False,
    prefect: Annotated[bool, typer.Option("--prefect/--no-prefect",
                                          help="run as a Prefect flow (visible in the UI) or call the stages directly")]
    = True,
    task_runner: Annotated[str, typer.Option(help="Prefect task runner: local, dask (a local Dask cluster) or "
                                                  "dask://HOST:PORT; with Dask each build is its own task run")]
    = "local",
) -> None:
    """Tune one operator on this machine and log every trial.

    Example: tunaflow tune-op matmul --m 512 --n 512 --k 512 --trials 64 --log runs/mm
    """
    from pydantic import ValidationError

    from schemas import MeasureOptions, Target, TargetError, TuningOptions
    from stages.templates import TEMPLATES

    if op not in TEMPLATES:
        raise fail(f"unknown operator {op!r}; tune-op supports: {', '.join(_ops())}")
    template = TEMPLATES[op]
    given = {name: v for name, v in dict(m=m, n=n, k=k, b=b, input=input, weight=weight, stride=stride, pad=pad,
                                         dilation=dilation, groups=groups, epilogue=epilogue).items() if v is not None}
    foreign = sorted(set(given) - set(template.CLI_OPTIONS))
    if foreign:
        raise fail(f"{op} does not take {', '.join('--' + f for f in foreign)}; it takes "
                   f"{', '.join('--' + o for o in template.CLI_OPTIONS)}")
    try:
        task = template.task_from_cli(given)
        tgt = Target.parse(target)
        spec, tgt = runner_choice(runner, key, tracker, token_file, tgt, target)
        template.default_config(task, tgt)  # a task the template has no schedule for (NoValidConfig) stops here
        missing = [str(p) for p in transfer_from or [] if not p.is_dir()]
        if missing:
            raise ValueError(f"--transfer-from: no tuning log at {', '.join(missing)}")
        options = TuningOptions(n_trials=trials, early_stopping=early_stopping, tuner=tuner, seed=seed,
                                transfer_from=tuple(str(p) for p in transfer_from or []),
                                batch_size=batch_size, measure=MeasureOptions(threads=threads), runner=spec,
                                top_k_remeasure=remeasure_top_k)
    except (ValidationError, TargetError, ValueError) as exc:
        raise fail(str(exc)) from exc
    if task_runner != "local" and not prefect:
        raise fail("--task-runner needs the Prefect flow; drop --no-prefect")
    try:
        # progress goes to stderr, so --json keeps stdout for the result and a script still sees progress
        result = runs.tune_op(task, tgt, options, log, prefect=prefect, progress=True,
                              task_runner=task_runner, charts=charts)
    except KeyboardInterrupt:
        raise interrupted(log) from None
    if json_out:
        print(result.model_dump_json())
    else:
        print_result(result)


def _ops() -> list[str]:
    from stages.templates import TEMPLATES

    return sorted(TEMPLATES)


def print_result(r) -> None:
    out.print(f"[bold]{escape(r.task)}[/]  ({r.trials} trials in the log, {r.new_trials} new, {r.wall_s:.1f} s)")
    if r.best_config is None:
        out.print("[red]no successful trial yet[/]")
    else:
        knobs = " ".join(f"{k}={v}" for k, v in r.best_config.items())
        out.print(f"best schedule : {escape(knobs)}")
        out.print(f"best          : [bold green]{r.best_gflops:.1f} GFLOPS[/] (spread {r.best_spread:.1%})")
    speedup = f"  -> tuned is {r.speedup_over_default:.2f}x the default" if r.speedup_over_default else ""
    default = f"{r.default_gflops:.1f} GFLOPS" if r.default_gflops is not None else "no trial of it in the log"
    out.print(f"default       : {default}{speedup}")
    out.print(f"numpy         : {r.numpy_gflops:.1f} GFLOPS" if r.numpy_gflops is not None
              else f"numpy         : {escape(r.numpy_note or 'not measured')}")
    out.print(f"noise         : {escape(noise_text(r))}")
    if r.errors:
        out.print(f"failed trials : {escape(str(r.errors))}")
    out.print(f"tuning log    : {escape(r.log)}")
    if r.chart:
        out.print(f"chart         : {escape(r.chart)}")




def noise_text(r) -> str:
    """How repeatable this task's measurements were and how busy the machine was while re-measuring."""
    parts = [f"repeats CV {r.repeat_cv:.1%}" if r.repeat_cv is not None else "no new trials"]
    if r.rounds:
        cv = f" CV {r.rounds_cv:.1%}" if r.rounds_cv is not None else ""
        parts.append(f"{r.rounds} re-measure rounds, the best's{cv}" + (" UNSTABLE" if r.unstable else " (stable)"))
    n = r.noise
    if n is not None:
        parts.append(f"machine {'BUSY' if n.busy else 'quiet'}: {n.other_cores:.1f} other core(s) of {n.cores}, "
                     f"steal {n.steal:.1%}, load {n.load_avg:.1f}")
    return "; ".join(parts)
