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
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from attacks import Outcome
from testing import bombs

ROOT = Path(__file__).resolve().parents[2]
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

    env = {**os.environ, "DO_NOT_TRACK": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "tunaflow", "tasks", str(model)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env=env, preexec_fn=cap)
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
    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "ext",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = d / "model.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="weights.bin", size_threshold=0)
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
