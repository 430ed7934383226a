"""Disk faults for real processes, without privileges or a filesystem of their own.

`drop_dac_override` (a `preexec_fn`) makes file modes hold for a child even when it runs as root:
it removes CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from the child's capability bounding set, so a
`chmod 555` directory is read-only to it. `file_size_limit` makes this process's writes fail like a
full disk: RLIMIT_FSIZE caps every file it writes, and since Python ignores SIGXFSZ a write past the
cap fails with EFBIG instead of killing the process.
"""

from __future__ import annotations

import ctypes
import os
import resource
from collections.abc import Iterator
from contextlib import contextmanager

PR_CAPBSET_DROP = 24
CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 1, 2


def drop_dac_override() -> None:
    """For `subprocess.Popen(preexec_fn=...)`: the child (and what it starts) obeys file modes."""
    if os.geteuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"prctl(PR_CAPBSET_DROP, {cap}): {os.strerror(err)}")


@contextmanager
def file_size_limit(nbytes: int) -> Iterator[None]:
    """While inside, no file this process writes can grow past `nbytes` (EFBIG, like ENOSPC)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
