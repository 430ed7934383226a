"""Waiting for other threads' spinning to stop before a timed turn (stages/runtime/quiet.py)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

from stages.runtime.quiet import settle


@contextlib.contextmanager
def spinning(seconds: float) -> Iterator[None]:
    """A thread busy-waiting for `seconds` (or until the block ends)."""
    stop, until = threading.Event(), time.perf_counter() + seconds

    def spin() -> None:
        while not stop.is_set() and time.perf_counter() < until:
            pass

    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        yield
    finally:
        stop.set()
        spinner.join()


def test_settle_waits_for_a_spinning_thread_to_stop():
    with spinning(0.4):
        waited = settle(max_s=5.0)
    assert waited >= 0.35


def test_settle_gives_up_after_max_s():
    with spinning(60):
        waited = settle(max_s=0.3)
    assert 0.3 <= waited < 2.0  # it gives up (a loaded 2-core CI machine once took 1.1 s to wake the poll)
