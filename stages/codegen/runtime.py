"""The native runtime generated kernels call into (`runtime.c`: the worker pool behind
`tf_parallel_for`), built with the system C compiler.

Two uses: a process that JIT-loads kernels (the runner's worker, an RPC agent) loads it once as a
shared library so MCJIT resolves the symbol; a model library compiles `runtime.c` in (`SOURCE`).
The shared library is cached per source hash, so only the first process on a machine compiles it.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import llvmlite.binding as llvm

SOURCE = Path(__file__).with_name("runtime.c")
AMX_REQUEST = "tf_amx_request"  # asks Linux for AMX tile data before a kernel's first tile instruction
CFLAGS = ["-O2", "-fPIC", "-std=c11", "-pthread"]


def cache_dir() -> Path:
    base = os.environ.get("TUNAFLOW_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tunaflow")
    return Path(base)


def compiler() -> str:
    wanted = os.environ.get("CC")
    cc = shutil.which(wanted) if wanted else (shutil.which("cc") or shutil.which("gcc") or shutil.which("clang"))
    if not cc:
        raise RuntimeError(f"no C compiler found ({'CC=' + wanted if wanted else 'cc, gcc or clang'}): threaded "
                           "kernels need tunaflow's runtime (runtime.c) compiled once; install one or set CC")
    return cc


def link_command(compiler: str, objects: list[str], dest: str) -> list[str]:
    """`cc -shared` argv linking kernel objects into `dest` with the runtime compiled in, hidden
    (each library owns its pool, and its symbols cannot clash with another library's)."""
    return [compiler, "-shared", *CFLAGS, "-fvisibility=hidden", "-o", dest, *objects, str(SOURCE), "-lm"]


def shared_library() -> Path:
    """The runtime as a shared library, compiled on first use (atomically: parallel processes may race)."""
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(CFLAGS).encode()).hexdigest()[:16]
    dest = cache_dir() / f"tf_runtime-{digest}.so"
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        out = Path(tmp) / dest.name
        proc = subprocess.run([compiler(), "-shared", *CFLAGS, "-o", str(out), str(SOURCE)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"compiling {SOURCE.name} failed:\n{proc.stderr.strip()}")
        os.replace(out, dest)
    return dest


@functools.cache
def load() -> Path:
    """Make the runtime's symbols visible to JIT-loaded kernels in this process (once).

    Opened with RTLD_NODELETE first: LLVM closes the libraries it loaded when the process exits,
    and a worker still spinning then (for TUNAFLOW_SPIN_US after its last loop) would run code
    that is no longer mapped; the process died of SIGSEGV on its way out.
    """
    path = shared_library()
    ctypes.CDLL(str(path), mode=os.RTLD_NOW | os.RTLD_GLOBAL | os.RTLD_NODELETE)
    llvm.load_library_permanently(str(path))
    return path
