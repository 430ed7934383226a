"""The process's consoles: one for stdout, and one for stderr that live progress, log lines and messages
share, so whatever is printed while a bar is live lands above it instead of tearing it.

On a terminal a console is as wide as the terminal. Piped or redirected, rich would assume 80 columns
and cut names (`node_Conv_3…`) to fit; a reader of a file or a pipe wants every name whole, so such
a console is `PIPED_WIDTH` wide unless COLUMNS says otherwise.
"""

from __future__ import annotations

import os
from typing import TextIO

from rich.console import Console

PIPED_WIDTH = 4096  # wider than any table or line a command prints: no cut, no wrap


def make_console(*, stderr: bool = False, file: TextIO | None = None) -> Console:
    """A console on stdout, stderr or `file` that never turns `:name:` into an emoji."""
    console = Console(stderr=stderr, file=file, emoji=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = PIPED_WIDTH
    return console


STDERR = make_console(stderr=True)
