"""`tunaflow demo`: the README's first command."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer

from tunaflow.commands.tune_op import print_result, tune
from tunaflow.console import out

DATA = Path(__file__).resolve().parent.parent.parent / "data"


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
    result = tune(task, Target.host(), options, log, prefect=True, show_progress=True)
    print_result(result)


