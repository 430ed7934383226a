"""Ctrl-C of `tunaflow tune-op` (issue 21, group 5): a real process group gets SIGINT, as from a terminal.

The command, its build and measure workers and (in the Prefect mode) the temporary server all
share the terminal's process group, so the signal goes to the whole group. The command must end
within seconds (it used to retry the dead server for about 150 s) with exit code 130, one line
saying how many records the log kept, and a log that reads back with every record written before.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from stages.log import TuningLog

ROOT = Path(__file__).resolve().parent.parent
EXIT_WITHIN_S = 5.0  # the goal is 2 s (measured 1.0-1.4 s on 2 idle cores); slack for a loaded machine


def interrupt_tune_op(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess, float, int, int]:
    """Start a long tune-op, SIGINT its process group once the log has records; (result, seconds to exit,
    records before the signal, records after)."""
    log = tmp_path / "log"
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "DO_NOT_TRACK": "1",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "COLUMNS": "250", "PREFECT_LOGGING_LEVEL": "INFO"}
    env.pop("PREFECT_API_URL", None)  # the command's own temporary server, as for a user
    proc = subprocess.Popen([sys.executable, "-m", "tunaflow", "tune-op", "matmul", "--m", "16", "--n", "16",
                             "--k", "16", "--trials", "5000", "--batch-size", "4", "--remeasure-top-k", "0",
                             "--log", str(log), *extra], cwd=ROOT, env=env, stdout=(tmp_path / "stdout").open("w"),
                            stderr=(tmp_path / "stderr").open("w"), start_new_session=True)  # a pipe would fill up
    try:
        deadline = time.monotonic() + 240
        while not list(log.glob("*.parquet")):
            assert proc.poll() is None, (tmp_path / "stderr").read_text()[-3000:]
            assert time.monotonic() < deadline, "no record within 240 s"
            time.sleep(0.1)
        time.sleep(0.5)  # in the middle of the next batch
        before = len(TuningLog(log).records())
        sent = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    after = len(TuningLog(log).records())
    out, err = (tmp_path / "stdout").read_text(), (tmp_path / "stderr").read_text()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), took, before, after


def assert_clean_interrupt(r: subprocess.CompletedProcess, took: float, before: int, after: int) -> None:
    assert r.returncode == 130, r.stderr[-3000:]
    assert took < EXIT_WITHIN_S, f"took {took:.1f} s to exit"
    assert after >= before > 0
    lines = [line for line in r.stderr.splitlines() if line.startswith("interrupted")]
    assert len(lines) == 1 and lines[0].startswith(f"interrupted: {after} records kept in "), r.stderr[-3000:]
    assert "Traceback" not in r.stderr and "Aborted" not in r.stderr, r.stderr[-3000:]
    print(f"exit {took:.2f} s after SIGINT, {after} records kept")


def test_ctrl_c_in_prefect_mode_exits_at_once_and_keeps_the_log(tmp_path):
    r, took, before, after = interrupt_tune_op(tmp_path)
    assert_clean_interrupt(r, took, before, after)
    assert "Crashed" in r.stderr  # the flow run was reported to a live server, not retried against a dead one
    # The server's own output (a database traceback when stopped mid-flush) went to its log, not the terminal.
    assert (tmp_path / "prefect" / "server.log").exists()


def test_ctrl_c_without_prefect(tmp_path):
    assert_clean_interrupt(*interrupt_tune_op(tmp_path, "--no-prefect"))


SWALLOWER = """
import time, typer
from tunaflow import cli

@cli.app.command("swallow")
def swallow() -> None:
    ready = False
    while True:  # a library that catches KeyboardInterrupt and goes on
        try:  # "ready" inside the try: a SIGINT right after it is swallowed too, not a race the test loses
            if not ready:
                print("ready", flush=True)
                ready = True
            time.sleep(60)
        except KeyboardInterrupt:
            pass

cli.main()
"""


def test_a_command_that_swallows_the_interrupt_is_ended_by_the_backstop(tmp_path):
    from tunaflow.cli import BACKSTOP_S

    proc = subprocess.Popen([sys.executable, "-c", SWALLOWER, "swallow"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        sent = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert BACKSTOP_S <= took < BACKSTOP_S + 8  # slack for a loaded machine
    assert err.strip() == "interrupted: the command did not stop by itself; every batch already in its log is kept"
