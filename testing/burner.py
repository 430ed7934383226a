"""A competing process that burns one core, for tests and benchmarks of measurement under load.

It is started detached (its parent exits at once, so it is no descendant of the caller): the noise probe
(`stages/measure/noise.py`) counts the caller's own process tree as tunaflow's, and a burner inside it
would be invisible as other load. It ends by itself after `seconds` and is killed at the block's end.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

LOOP = """
import os, random, sys, time
seed, seconds, cpu, bursts = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
if cpu >= 0:
    os.sched_setaffinity(0, {cpu})
rng, end = random.Random(seed), time.monotonic() + seconds
while time.monotonic() < end:
    stop = min(end, time.monotonic() + (rng.uniform(0.2, 1.5) if bursts else seconds))
    while time.monotonic() < stop:
        pass
    if bursts:
        time.sleep(rng.uniform(0.2, 1.5))
"""


@contextlib.contextmanager
def burning(seconds: float, cpu: int | None = None, bursts: bool = False, seed: int = 0) -> Iterator[int]:
    """Burn one core (pinned to `cpu` when given) for at most `seconds`, in random 0.2-1.5 s bursts with as
    long pauses when `bursts`; yields the burner's pid."""
    launch = subprocess.run(
        ["/bin/sh", "-c", 'setsid "$0" -c "$1" "$2" "$3" "$4" "$5" </dev/null >/dev/null 2>&1 & echo $!',
         sys.executable, LOOP, str(seed), str(seconds), str(-1 if cpu is None else cpu), "1" if bursts else "0"],
        capture_output=True, text=True, check=True)
    pid = int(launch.stdout.strip())
    try:
        yield pid
    finally:
        with contextlib.suppress(OSError):  # gone already; a reused pid runs something else: leave it
            if LOOP.encode() in open(f"/proc/{pid}/cmdline", "rb").read():
                os.kill(pid, signal.SIGKILL)
