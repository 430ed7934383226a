"""Issue 21, group 8 (and group 10's external-data errors): models of a few hundred bytes that made the
import allocate tens of GiB, a declared 1x3x100000x100000 input, and .onnx files whose external data is
missing or short.

Each bomb is imported in its own child process under a 2 GiB address-space cap (testing/bombs.py),
so a bomb that gets through ends in MemoryError (a crash) rather than swapping the machine; the child's
peak RSS is reported. The declared input and the external-data files go through `tunaflow tasks` as a
user runs it, under the same cap.
"""

from __future__ import annotations

import os
import resource
import subprocess
import time
from pathlib import Path

import onnx

from attacks import Outcome
from testing import bombs
from testing.cli import QUIET, tunaflow
from testing.external_data import save_with_external_weight

GROUP = 8
CAP = 2 * 2**30
MiB = 2**20
PEAK_OK = 512 * MiB  # the constant budget is 256 MiB; a bomb that allocated would be at the cap


def run(tmp: Path) -> list[Outcome]:
    tmp.mkdir(parents=True, exist_ok=True)
    out = [_bomb(tmp, name, make, "--max-constant-mb") for name, make in bombs.CONSTANT_BOMBS.items()]
    out.append(_bomb(tmp, "run-time Tile", bombs.runtime_tile, "--max-tensor-mb"))
    out.append(_declared_input(tmp))
    out.extend(_external(tmp, case) for case in ("missing", "short"))
    return out


def _bomb(tmp: Path, name: str, make, option: str) -> Outcome:
    path = tmp / f"bomb_{len(list(tmp.glob('bomb_*')))}.onnx"
    onnx.save(make(), str(path))
    start = time.perf_counter()
    result, = bombs.import_in_child([path], limit_bytes=CAP)
    seconds = time.perf_counter() - start
    peak = result["peak_rss"]
    held = result["outcome"] == "ModelError" and option in result["message"] and peak < PEAK_OK
    first = result["message"].splitlines()[0] if result["message"] else ""
    rss = f"peak RSS {peak / MiB:.0f} MiB" if peak else "no peak (child died)"
    return Outcome(GROUP, f"{name} bomb ({path.stat().st_size} B model) imported under a 2 GiB address-space cap",
                   f"{result['outcome']} in {seconds:.1f} s, {rss}: {first[:160]}", held,
                   crashes=int(result["outcome"] not in ("ok", "ModelError")))


def _tasks(model: Path) -> tuple[subprocess.CompletedProcess, float]:
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))

    start = time.perf_counter()
    proc = tunaflow("tasks", model, timeout=120, env={**os.environ, **QUIET}, preexec_fn=cap)
    return proc, time.perf_counter() - start


def _verdict(proc: subprocess.CompletedProcess, expect: str) -> tuple[str, bool, int]:
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    crashed = "Traceback" in proc.stderr or proc.returncode < 0
    held = proc.returncode not in (0, None) and not crashed and any(expect in line for line in lines)
    return (lines[-1][:200] if lines else proc.stdout.strip()[-200:]), held, int(crashed)


def _declared_input(tmp: Path) -> Outcome:
    path = tmp / "declared.onnx"
    onnx.save(bombs.declared_input(), str(path))
    proc, seconds = _tasks(path)
    line, held, crashes = _verdict(proc, "--max-tensor-mb")
    return Outcome(GROUP, "`tunaflow tasks` on a model declaring a 1x3x100000x100000 input (112 GiB)",
                   f"exit {proc.returncode} in {seconds:.1f} s: {line}", held, crashes=crashes)


def _external(tmp: Path, case: str) -> Outcome:
    d = tmp / f"external_{case}"
    d.mkdir(exist_ok=True)
    path = save_with_external_weight(d / "model.onnx", "weights.bin")
    data = d / "weights.bin"
    if case == "missing":
        data.unlink()
    else:
        with data.open("r+b") as f:
            f.truncate(10)
    proc, seconds = _tasks(path)
    line, held, crashes = _verdict(proc, "weights.bin")
    what = "deleted" if case == "missing" else "truncated to 10 of its 64 bytes"
    return Outcome(10, f"`tunaflow tasks` on an .onnx whose external data file is {what}",
                   f"exit {proc.returncode} in {seconds:.1f} s: {line}", held, crashes=crashes)
