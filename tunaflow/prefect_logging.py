"""Prefect's console logging, kept out of the way of a live progress display.

Prefect prints every flow and task run's INFO lines to stderr through a rich console of its own. On a
terminal those lines land inside the live region of the progress display and each one leaves a torn
copy of the bars in the scrollback. So, before a flow starts, every console handler Prefect configured
is replaced by one printing on the command's stderr console, the one the live display draws on (lines
go above the bars), and on a terminal it prints warnings and errors only: the INFO lines still reach
the Prefect server (its API log handler is left alone) and show in the UI. Off a terminal, in a CI log
say, there is no live region and every line is kept.

Worker processes (Dask) configure Prefect's logging afresh; they inherit
PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL, the level of Prefect's console handler there; set by the
user, it is kept everywhere.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys

from rich.console import Console
from rich.text import Text

STYLES = {logging.WARNING: "yellow", logging.ERROR: "red", logging.CRITICAL: "bold red"}
TERMINAL_LEVEL = logging.WARNING
LEVEL_ENV = "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL"  # logging.yml's handlers.console.level


class ConsoleLogHandler(logging.Handler):
    """Log records as lines on a rich console: above its live display while one runs, as text (a
    message with brackets is not markup), never wrapped or cut by the console."""

    def __init__(self, console: Console, level: int = logging.NOTSET):
        super().__init__(level)
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.console.print(Text(self.format(record), style=STYLES.get(record.levelno, "")), soft_wrap=True)
        except RecursionError:
            raise
        except Exception:  # what logging.StreamHandler does: a broken stream must not end the run
            self.handleError(record)


def _writes_to_console(handler: logging.Handler) -> bool:
    """Prefect's rich console handler, or a stream handler on stderr or stdout (Prefect's debug one)."""
    from prefect.logging.handlers import PrefectConsoleHandler

    return isinstance(handler, PrefectConsoleHandler) or (
        type(handler) is not logging.FileHandler and isinstance(handler, logging.StreamHandler)
        and handler.stream in (sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__))


def route_prefect_logs(console: Console) -> list[logging.Logger]:
    """Move Prefect's console output onto `console` (warnings and errors only when `console` is a
    terminal); the loggers changed, for a test. Importing `prefect.main` configures Prefect's logging
    first: once the handlers are swapped, another configuration would find its own handlers gone and
    start over with fresh ones."""
    quiet = console.is_terminal and LEVEL_ENV not in os.environ  # the user's own level wins
    if quiet:
        os.environ[LEVEL_ENV] = logging.getLevelName(TERMINAL_LEVEL)
    importlib.import_module("prefect.main")
    loggers = [logging.getLogger()] + [v for v in logging.Logger.manager.loggerDict.values()
                                       if isinstance(v, logging.Logger)]
    changed = []
    for logger in loggers:
        for old in [h for h in logger.handlers if _writes_to_console(h)]:
            level = max(old.level, TERMINAL_LEVEL) if quiet else old.level
            new = ConsoleLogHandler(console, level)
            new.setFormatter(old.formatter)
            logger.removeHandler(old)
            logger.addHandler(new)
            changed.append(logger)
    return changed
