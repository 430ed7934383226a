"""The `tunaflow` command line: registers one module per command."""

from __future__ import annotations

import functools
import gc
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

import typer

from tunaflow.commands import demo, log, log_check, log_plot, model, refine, rpc, target, tasks, tune_op
from tunaflow.console import INTERRUPTED, interrupted, interrupted_said

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
                   ("tune", model.tune), ("refine", refine.refine), ("build", model.build), ("run", model.run),
                   ("demo", demo.demo)):
    _command(app, _name, _fn)
for _name, _fn in (("show", log.log_show), ("export", log.log_export), ("merge", log.log_merge),
                   ("check", log_check.log_check), ("plot", log_plot.log_plot)):
    _command(log_app, _name, _fn)


BACKSTOP_S = 2.0  # a Ctrl-C'd command still running this long later is ended regardless


def _force_exit() -> None:
    if not interrupted_said.is_set():
        sys.stderr.write("interrupted: the command did not stop by itself; every batch already in its log is kept\n")
        sys.stderr.flush()
    os._exit(INTERRUPTED)


_backstop = threading.Timer(BACKSTOP_S, _force_exit)
_backstop.daemon = True


def _on_sigint(signum: int, frame: object) -> None:
    """Ctrl-C raises KeyboardInterrupt, as Python's own handler does, and arms a backstop: a library on the
    way may swallow it (once, under load, a Prefect-mode tune-op tuned on for minutes after a Ctrl-C), and
    the log is consistent at any instant (a batch is one atomic part, a stray .tmp is recovered later)."""
    if not _backstop.is_alive() and not _backstop.finished.is_set():
        _backstop.start()
    raise KeyboardInterrupt


def main() -> None:
    signal.signal(signal.SIGINT, _on_sigint)
    try:
        app()
    finally:
        gc.freeze()  # the interpreter's last collection of Prefect's and pydantic's objects takes 1-2 s at exit


if __name__ == "__main__":
    main()
