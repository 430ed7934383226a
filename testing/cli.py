"""`tunaflow` run as a user runs it: a real child process started from the repository root, its output
captured as text, for tests and benchmarks that check exit codes, messages and files written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUIET = {"DO_NOT_TRACK": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}


def tunaflow(*args: object, timeout: float = 300, env: dict[str, str] | None = None,
             **kw) -> subprocess.CompletedProcess:
    """`python -m tunaflow ARGS` (each arg as str); `env` is the whole environment (default: this process's)."""
    return subprocess.run([sys.executable, "-m", "tunaflow", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=os.environ if env is None else env, **kw)
