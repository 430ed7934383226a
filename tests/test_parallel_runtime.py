"""The native worker pool behind threaded kernels: every chunk runs exactly once, from many calls,
from concurrent callers, and in a forked child."""

from __future__ import annotations

import ctypes
import json
import multiprocessing as mp
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from llvmlite import ir

from schemas import Target
from stages.codegen import runtime
from stages.codegen.compile import compile_ir
from stages.codegen.harness import add_harness
from stages.codegen.irb import F32, F32P, I64, VOIDP, for_range, gep
from stages.codegen.jit import LoadedKernel
from stages.codegen.parallel import PARALLEL_FOR, emit_main

EXTENT = 37


def _count_kernel(threads: int) -> bytes:
    """`out[i] += 1` over [0, EXTENT): a chunk run twice or skipped shows in the counts."""
    mod = ir.Module()
    body = ir.Function(mod, ir.FunctionType(ir.VoidType(), [VOIDP, I64, I64]), name="body")
    b = ir.IRBuilder(body.append_basic_block("entry"))
    out = b.load(b.bitcast(body.args[0], F32P.as_pointer()))
    with for_range(b, body.args[1], body.args[2]) as i:
        p = gep(b, out, i)
        b.store(b.fadd(b.load(p), ir.Constant(F32, 1.0)), p)
    b.ret_void()
    add_harness(mod, emit_main(mod, body, EXTENT, threads))
    return compile_ir(mod, Target.host()).data


@pytest.fixture(scope="module")
def kernel4() -> LoadedKernel:
    return LoadedKernel(_count_kernel(4), Target.host())


def test_threaded_main_calls_the_pool_and_one_thread_does_not():
    assert PARALLEL_FOR in str(emit_main(ir.Module(), _dummy_body(), EXTENT, 4).module)
    assert PARALLEL_FOR not in str(emit_main(ir.Module(), _dummy_body(), EXTENT, 1).module)


def _dummy_body() -> ir.Function:
    mod = ir.Module()
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [VOIDP, I64, I64]), name="body")
    ir.IRBuilder(fn.append_basic_block("entry")).ret_void()
    return fn


def test_every_chunk_runs_once_per_call(kernel4):
    out = np.zeros(EXTENT, np.float32)
    kernel4.time([out], 500)
    np.testing.assert_array_equal(out, 500)


def test_concurrent_callers_each_get_every_chunk_once(kernel4):
    """A second caller finds the pool busy and runs its loop itself: still exactly once."""
    outs = [np.zeros(EXTENT, np.float32) for _ in range(4)]
    workers = [threading.Thread(target=kernel4.time, args=([o], 300)) for o in outs]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    for o in outs:
        np.testing.assert_array_equal(o, 300)


def _child(obj: bytes, conn) -> None:
    out = np.zeros(EXTENT, np.float32)
    LoadedKernel(obj, Target.host()).time([out], 100)
    conn.send(out.tolist())


def test_a_forked_child_starts_its_own_workers(kernel4):
    kernel4.time([np.zeros(EXTENT, np.float32)], 10)  # the parent's pool is running
    parent, child = mp.get_context("fork").Pipe()
    proc = mp.get_context("fork").Process(target=_child, args=(_count_kernel(4), child))
    proc.start()
    assert parent.poll(60), "forked child hung in the pool"
    assert parent.recv() == [100.0] * EXTENT
    proc.join(10)
    assert proc.exitcode == 0


def test_a_library_keeps_the_runtime_to_itself(tmp_path):
    obj = tmp_path / "k.o"
    obj.write_bytes(_count_kernel(2))
    lib = tmp_path / "k.so"
    subprocess.run(runtime.link_command(runtime.compiler(), [str(obj)], str(lib)), check=True)
    so = ctypes.CDLL(str(lib))
    assert not hasattr(so, PARALLEL_FOR)
    out = np.zeros(EXTENT, np.float32)
    main = so.tf_main
    main.argtypes, main.restype = [ctypes.c_void_p], None
    ptrs = (ctypes.c_void_p * 1)(out.ctypes.data)
    for _ in range(50):
        main(ptrs)
    np.testing.assert_array_equal(out, 50)


def test_the_shared_runtime_is_cached_per_source(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNAFLOW_CACHE", str(tmp_path))
    first = runtime.shared_library()
    assert first.parent == tmp_path and first.exists()
    mtime = first.stat().st_mtime_ns
    assert runtime.shared_library() == first and first.stat().st_mtime_ns == mtime


_NO_CC = """
import sys
from schemas import Target
from stages.codegen.jit import LoadedKernel
sys.path.insert(0, "tests")
from test_parallel_runtime import _count_kernel
LoadedKernel(_count_kernel(1), Target.host())
try:
    LoadedKernel(_count_kernel(2), Target.host())
except RuntimeError as exc:
    print("refused:", exc)
"""


def test_one_thread_kernels_need_no_c_compiler(tmp_path):
    """Without a compiler only threaded kernels are refused, with a message that says why."""
    env = {**os.environ, "CC": "no-such-cc", "TUNAFLOW_CACHE": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", _NO_CC], env=env, capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1], timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "refused: no C compiler found (CC=no-such-cc)" in proc.stdout


_WORKER_STATE = """
import os, sys, threading, time
import numpy as np
from schemas import Target
from stages.codegen.jit import LoadedKernel
sys.path.insert(0, "tests")
from test_parallel_runtime import EXTENT, _count_kernel
kernel = LoadedKernel(_count_kernel(2), Target.host())
kernel.time([np.zeros(EXTENT, np.float32)], 10)
time.sleep(0.2)
me = threading.get_native_id()
states = []
for tid in os.listdir("/proc/self/task"):
    if int(tid) != me:
        with open(f"/proc/self/task/{tid}/stat") as f:
            states.append(f.read().rsplit(")", 1)[1].split()[0])
print("".join(sorted(states)))
"""


@pytest.mark.parametrize("spin_us, spinning", [("1000000", True), ("0", False), ("junk", False), (None, False)])
def test_workers_spin_for_tunaflow_spin_us_then_sleep(spin_us, spinning):
    """0.2 s after a loop a worker told to spin 1 s is still running; one told 0, or left at the
    2 ms default (also for a value that is not a number), sleeps."""
    env = {k: v for k, v in os.environ.items() if k != "TUNAFLOW_SPIN_US"}
    if spin_us is not None:
        env["TUNAFLOW_SPIN_US"] = spin_us
    proc = subprocess.run([sys.executable, "-c", _WORKER_STATE], capture_output=True, text=True, env=env,
                          cwd=Path(__file__).resolve().parents[1], timeout=120)
    assert proc.returncode == 0, proc.stderr
    states = proc.stdout.split()[-1]
    assert ("R" in states) == spinning, states


_WORKER_CPUS = """
import json, os, sys
import numpy as np
from schemas import Target
from stages.codegen.jit import LoadedKernel
sys.path.insert(0, "tests")
from test_parallel_runtime import EXTENT, _count_kernel
if len(sys.argv) > 1:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
kernel = LoadedKernel(_count_kernel(2), Target.host())
kernel.time([np.zeros(EXTENT, np.float32)], 10)
for tid in os.listdir("/proc/self/task"):
    with open(f"/proc/self/task/{tid}/comm") as f:
        if f.read().strip() == "tunaflow-w1":
            print(json.dumps([sorted(os.sched_getaffinity(int(tid))), sorted(os.sched_getaffinity(0))]))
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning needs two allowed CPUs")
@pytest.mark.parametrize("pin, one_cpu", [(None, False), ("0", False), (None, True)])
def test_workers_are_named_and_pinned_to_a_cpu_of_their_own(pin, one_cpu):
    """The worker runs on one allowed CPU by default; with TUNAFLOW_PIN=0, or when the process may
    use only one CPU, it keeps the process's CPUs."""
    env = {k: v for k, v in os.environ.items() if k != "TUNAFLOW_PIN"}
    if pin is not None:
        env["TUNAFLOW_PIN"] = pin
    proc = subprocess.run([sys.executable, "-c", _WORKER_CPUS, *(["one"] if one_cpu else [])], capture_output=True,
                          text=True, env=env, cwd=Path(__file__).resolve().parents[1], timeout=120)
    assert proc.returncode == 0, proc.stderr
    worker, process = json.loads(proc.stdout.splitlines()[-1])
    if pin is None and not one_cpu:
        assert len(worker) == 1 and worker[0] in process and len(process) >= 2
    else:
        assert worker == process


_CALLER_MOVES = """
import os, sys
import numpy as np
from schemas import Target
from stages.codegen.jit import LoadedKernel
sys.path.insert(0, "tests")
from test_parallel_runtime import EXTENT, _count_kernel
kernel = LoadedKernel(_count_kernel(2), Target.host())
args = [np.zeros(EXTENT, np.float32)]
kernel(args)
worker = next(int(t) for t in os.listdir("/proc/self/task")
              if open(f"/proc/self/task/{t}/comm").read().strip() == "tunaflow-w1")
allowed = os.sched_getaffinity(0)
for _ in range(5):
    (taken,) = os.sched_getaffinity(worker)
    os.sched_setaffinity(0, {taken})  # the caller moves onto the worker's CPU, as the scheduler may move it
    os.sched_setaffinity(0, allowed)
    kernel(args)
    if os.sched_getaffinity(worker) != {taken}:
        print("moved", taken, sorted(os.sched_getaffinity(worker)))
        break
else:
    print("stayed", taken)
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning needs two allowed CPUs")
def test_a_worker_moves_off_the_cpu_its_caller_came_to():
    """The caller is not pinned: run on the CPU its worker is pinned to, the next loop moves the worker to
    another CPU, so the two do not share one core for the loop."""
    env = {k: v for k, v in os.environ.items() if k != "TUNAFLOW_PIN"}
    proc = subprocess.run([sys.executable, "-c", _CALLER_MOVES], capture_output=True, text=True, env=env,
                          cwd=Path(__file__).resolve().parents[1], timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[0] == "moved", proc.stdout
