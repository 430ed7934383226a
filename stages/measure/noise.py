"""Was the machine busy while we measured? CPU time from /proc/stat minus this process tree's own.

A re-measurement keeps one worker busy, so the CPU time the whole machine spent beyond what this process
and its descendants (the runner's worker, the idle builder pool) spent is other load: another tenant's
job, a burst of the user's own, or (steal) another guest on the hypervisor. Linux only: elsewhere the
probe reports nothing rather than a guess.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from schemas.measure import Noise

PROC = Path("/proc")
# A compute-bound process time-sharing the worker's core gets about half of it, so 'half a core' sat right on
# the boundary (0.49 measured); a quarter of a core of other load over the whole window already disturbs timing.
BUSY_OTHER_CORES = 0.25
BUSY_STEAL = 0.02


@dataclass(frozen=True)
class Sample:
    at: float          # time.monotonic()
    busy: int          # machine-wide non-idle ticks (user, nice, system, irq, softirq)
    steal: int
    total: int
    own: int           # ticks of this process and its descendants


def sample() -> Sample | None:
    """The CPU counters now (None where /proc/stat is not there)."""
    try:
        fields = [int(v) for v in (PROC / "stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    busy = user + nice + system + irq + softirq
    return Sample(time.monotonic(), busy, steal, busy + idle + iowait + steal, _tree_ticks(os.getpid()))


def between(start: Sample | None, end: Sample | None) -> Noise | None:
    """What the machine did from `start` to `end`, or None without both samples."""
    if start is None or end is None or end.total <= start.total:
        return None
    seconds = end.at - start.at
    hz = os.sysconf("SC_CLK_TCK")
    other = (end.busy - start.busy - (end.own - start.own)) / hz / seconds if seconds > 0 else 0.0
    steal = (end.steal - start.steal) / (end.total - start.total)
    return Noise(seconds=round(seconds, 3), cores=os.cpu_count() or 1, load_avg=round(os.getloadavg()[0], 2),
                 other_cores=round(other, 2), steal=round(steal, 4),
                 busy=other > BUSY_OTHER_CORES or steal > BUSY_STEAL)


def _tree_ticks(root: int) -> int:
    """User + system ticks of `root` and every live descendant."""
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        rest = stat[stat.rindex(")") + 2:].split()  # the name may hold spaces and parentheses
        pid = int(entry.name)
        parents[pid] = int(rest[1])
        ticks[pid] = int(rest[11]) + int(rest[12])
    mine, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        children = [p for p, pp in parents.items() if pp == parent and p not in mine]
        mine.update(children)
        frontier += children
    return sum(ticks.get(p, 0) for p in mine)
