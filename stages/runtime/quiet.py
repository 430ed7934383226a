"""Wait for other runtimes' threads in this process to stop spinning before timing our kernels.

OpenBLAS and onnxruntime keep their pool threads busy-waiting for a while after each call (here
OpenBLAS's stayed busy for over half a second): a kernel timed right after them runs with its
cores taken and looks up to 2x slower than it is.
"""

from __future__ import annotations

import os
import threading
import time

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def _other_threads_cpu_ticks() -> int:
    me = threading.get_native_id()
    total = 0
    for tid in os.listdir("/proc/self/task"):
        if int(tid) == me:
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended
        total += int(fields[11]) + int(fields[12])  # utime + stime
    return total


def settle(max_s: float = 3.0, quiet_polls: int = 3) -> float:
    """Block until no other thread of this process used CPU for `quiet_polls` polls in a row
    (or `max_s` passed); returns the seconds waited."""
    start = time.perf_counter()
    last, quiet = _other_threads_cpu_ticks(), 0
    while quiet < quiet_polls and time.perf_counter() - start < max_s:
        time.sleep(2 * TICK_S)
        now = _other_threads_cpu_ticks()
        quiet = quiet + 1 if now == last else 0
        last = now
    return time.perf_counter() - start
