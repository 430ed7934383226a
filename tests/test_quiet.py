"""Waiting for other threads' spinning to stop before a timed turn (stages/runtime/quiet.py)."""

from __future__ import annotations

import threading
import time

from stages.runtime.quiet import settle


def _spin(stop: threading.Event, until: float) -> None:
    while not stop.is_set() and time.perf_counter() < until:
        pass


def test_settle_waits_for_a_spinning_thread_to_stop():
    stop = threading.Event()
    spinner = threading.Thread(target=_spin, args=(stop, time.perf_counter() + 0.4))
    spinner.start()
    try:
        waited = settle(max_s=5.0)
    finally:
        stop.set()
        spinner.join()
    assert waited >= 0.35


def test_settle_gives_up_after_max_s():
    stop = threading.Event()
    spinner = threading.Thread(target=_spin, args=(stop, time.perf_counter() + 60))
    spinner.start()
    try:
        waited = settle(max_s=0.3)
    finally:
        stop.set()
        spinner.join()
    assert 0.3 <= waited < 1.0
