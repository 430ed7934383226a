"""One writer per tuning log: an advisory `flock` on `LOG/.writer.lock`, held while a session runs.

Two sessions appending to one log each count the budget from what they read at their start, so
both spend it (64 trials for a budget of 32, the same configs measured twice); the lock makes the
second one wait a little, then refuse, naming the pid that holds it. Readers take no lock: parts
are renamed into place whole. The lock is reentrant within a process (a model's tuning runs one
session per task on one log, Prefect may run them on threads) and dies with its process, so a
killed tuner never leaves a log locked. The file holds the holder's pid and is removed on release;
after locking, the inode is re-checked, so a file removed between open and lock is never trusted.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from stages.log.errors import LogBusyError, LogWriteError

LOCK_NAME = ".writer.lock"
POLL_S = 0.1

_mutex = threading.Lock()
_held: dict[Path, _Held] = {}


@dataclass
class _Held:
    fd: int
    count: int = 0


@dataclass
class WriterLease:
    """This process's share of a log's writer lock; `fresh` when it was taken (not re-entered)."""

    log_dir: Path
    fresh: bool
    released: bool = field(default=False, init=False)

    def release(self) -> None:
        with _mutex:
            if self.released:
                return
            self.released = True
            held = _held[self.log_dir]
            held.count -= 1
            if held.count == 0:
                del _held[self.log_dir]
                _drop(self.log_dir / LOCK_NAME, held.fd)

    def __enter__(self) -> WriterLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def acquire(log_dir: Path, wait_s: float) -> WriterLease:
    """Take (or re-enter) the writer lock of `log_dir`, creating the directory; waits up to `wait_s`."""
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LogWriteError(f"{log_dir}: cannot create this log ({exc.strerror or exc})") from exc
    key = log_dir.resolve()
    with _mutex:
        held = _held.get(key)
        if held is not None:
            held.count += 1
            return WriterLease(key, fresh=False)
        fd = _lock(log_dir, wait_s)
        _held[key] = _Held(fd, 1)
        return WriterLease(key, fresh=True)


def holder(log_dir: Path) -> int | None:
    """The pid of the process writing `log_dir` (0 when it has not written its pid yet), None when
    nobody does; probes with a shared lock, so it works on a read-only log."""
    try:
        fd = os.open(log_dir / LOCK_NAME, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _pid_in(fd)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _lock(log_dir: Path, wait_s: float) -> int:
    path = log_dir / LOCK_NAME
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise LogWriteError(f"{log_dir}: cannot write this log ({exc.strerror or exc}: {path})") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _pid_in(fd)
            os.close(fd)
            if time.monotonic() >= deadline:
                who = f"pid {pid}" if pid else "a process that has not written its pid yet"
                raise LogBusyError(
                    f"{log_dir}: another tunaflow session ({who}) is writing this log; waited {wait_s:g} s. "
                    "Let it finish (a rerun then resumes), or tune into another log") from None
            time.sleep(POLL_S)
            continue
        if not _same_file(fd, path):
            os.close(fd)
            continue
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                _drop(path, fd)
                raise LogWriteError(f"{log_dir}: cannot write this log ({exc.strerror or exc}: {path})") from exc
        return fd


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def _pid_in(fd: int) -> int:
    try:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    except OSError:
        return 0
    return int(text) if text.isdigit() else 0


def _drop(path: Path, fd: int) -> None:
    """Unlink while still holding the lock, then close: a waiter that opened the old inode re-checks it."""
    with contextlib.suppress(OSError):  # a read-only log keeps its lock file; the next writer locks it again
        os.unlink(path)
    os.close(fd)
