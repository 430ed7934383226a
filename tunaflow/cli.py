"""The `tunaflow` command line: registers one module per command."""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable
from typing import Any

import typer

from tunaflow.commands import demo, log, log_check, log_plot, model, rpc, target, tasks, tune_op
from tunaflow.console import interrupted

app = typer.Typer(
    help="tunaflow: auto-tune tensor operators with LLVM, keep every trial in a Parquet log, "
         "orchestrated by Prefect.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
)
log_app = typer.Typer(help="Inspect, export and merge tuning logs.", no_args_is_help=True)
app.add_typer(log_app, name="log")
app.add_typer(rpc.tracker_app, name="tracker")
app.add_typer(rpc.runner_app, name="runner")


def _command(group: typer.Typer, name: str, fn: Callable[..., Any]) -> None:
    """Register `fn`; a Ctrl-C that reaches it ends the command with one line and exit code 130
    (click would print "Aborted!" and exit 1). Commands that tune report their log themselves."""

    @functools.wraps(fn)
    def command(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except KeyboardInterrupt:
            raise interrupted() from None

    group.command(name)(command)


for _name, _fn in (("tune-op", tune_op.tune_op), ("target", target.target), ("tasks", tasks.tasks),
                   ("tune", model.tune), ("build", model.build), ("run", model.run), ("demo", demo.demo)):
    _command(app, _name, _fn)
for _name, _fn in (("show", log.log_show), ("export", log.log_export), ("merge", log.log_merge),
                   ("check", log_check.log_check), ("plot", log_plot.log_plot)):
    _command(log_app, _name, _fn)


def main() -> None:
    try:
        app()
    finally:
        gc.freeze()  # the interpreter's last collection of Prefect's and pydantic's objects takes 1-2 s at exit


if __name__ == "__main__":
    main()
