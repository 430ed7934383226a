"""Issue 21's attacks, one module per group of defences; `benchmarks/faults.py` runs them all.

Each module exposes `run(tmp: Path) -> list[Outcome]`: it mounts its attacks with real parts (processes,
sockets on 127.0.0.1, files on disk), one `Outcome` per attack, and finishes in about two minutes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Outcome:
    """What one attack did. `held` is the verdict: the defence the issue asks for worked."""

    group: int                 # the numbered finding (1-10) the attack belongs to
    attack: str                # what was tried, one line
    outcome: str               # what happened, one line (the error shown, the exit code, the record kept)
    held: bool
    crashes: int = 0           # tracebacks, dead processes, hangs
    records_lost: int = 0      # tuning records that were durable before the attack and are gone after
    code_runs: int = 0         # objects or libraries that ran without coming from a holder of the token / key
