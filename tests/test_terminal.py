"""Commands in a real terminal (a pseudo-terminal, 160x50) and piped: one clean live display with real
totals, Prefect's INFO lines off the terminal (they still reach its API), its warnings above the
bars, stdout keeping only `--json`'s object, and whole names however wide a table gets."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

from support.odd_names import odd_model
from support.vt import Screen

from tunaflow.prefect_logging import LEVEL_ENV

ROOT = Path(__file__).resolve().parent.parent
CNN = ROOT / "data" / "models" / "cnn.onnx"
WIDTH, HEIGHT = 160, 50


def env(tmp_path: Path, **extra: str) -> dict[str, str]:
    e = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_HOME": str(tmp_path / "prefect"), "DO_NOT_TRACK": "1",
         "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "TERM": "xterm-256color", **extra}
    for name in ("COLUMNS", "LINES", "PREFECT_API_URL", "PREFECT_LOGGING_LEVEL", LEVEL_ENV):
        if name not in extra:
            e.pop(name, None)  # as for a user: Prefect's own levels, the terminal's own size
    return e


def in_terminal(args: list[str], environ: dict[str, str], timeout: float = 600,
                stdout_pipe: bool = False) -> tuple[int, str, str]:
    """Run `args` with stderr (and stdout unless `stdout_pipe`) on a pseudo-terminal; (exit code, what
    the terminal received, stdout if piped)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", HEIGHT, WIDTH, 0, 0))
    proc = subprocess.Popen(args, cwd=ROOT, env=environ, stdin=slave, stderr=slave,
                            stdout=subprocess.PIPE if stdout_pipe else slave, start_new_session=True)
    os.close(slave)
    received, deadline = bytearray(), time.monotonic() + timeout
    streams = [master] + ([proc.stdout.fileno()] if stdout_pipe else [])
    piped = bytearray()
    try:
        while streams:
            assert time.monotonic() < deadline, f"no end within {timeout} s:\n{received.decode(errors='replace')}"
            for fd in select.select(streams, [], [], 1.0)[0]:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:  # EIO: the terminal's last writer closed it
                    chunk = b""
                if not chunk:
                    streams.remove(fd)
                (received if fd == master else piped).extend(chunk)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
        os.close(master)
    return code, received.decode(errors="replace"), piped.decode()


PREFECT_LOGS = """
import logging, time
from tunaflow.console import prefect_env
prefect_env()
from prefect.logging.handlers import APILogHandler
from schemas import matmul_task
from stages.graph.tasks import ExtractedTask
from stages.report.progress import ModelProgress

runs = logging.getLogger("prefect.flow_runs")
assert any(isinstance(h, APILogHandler) for h in runs.handlers)  # every line still goes to the server
task = matmul_task(8, 8, 8)
with ModelProgress([ExtractedTask(task, 1, ("n",))], 4):
    time.sleep(0.3)
    runs.info("an INFO line of a flow run", extra={"flow_run_name": "f"})
    runs.warning("a WARNING of a flow run", extra={"flow_run_name": "f"})
    logging.getLogger("prefect.task_runs").error("an ERROR of a task run", extra={"task_run_name": "t"})
    time.sleep(0.3)
"""

NO_RUN = {"PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW": "ignore"}  # these lines come from no flow run


def test_prefect_keeps_info_off_a_terminal_and_prints_warnings_above_the_bars(tmp_path):
    code, received, _ = in_terminal([sys.executable, "-c", PREFECT_LOGS], env(tmp_path, **NO_RUN), timeout=120)
    lines = Screen(WIDTH).feed(received).lines
    assert code == 0, received
    assert "an INFO line" not in received
    assert [line.rsplit(" - ", 1)[-1] for line in lines[:2]] == ["a WARNING of a flow run", "an ERROR of a task run"]
    assert len(lines) == 4 and lines[2].startswith("all tasks"), "\n".join(lines)  # one display, not torn


def test_prefect_keeps_every_line_in_a_piped_log(tmp_path):
    r = subprocess.run([sys.executable, "-c", PREFECT_LOGS], cwd=ROOT, env=env(tmp_path, **NO_RUN), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "an INFO line of a flow run" in r.stderr and "a WARNING of a flow run" in r.stderr
    assert r.stdout == ""


def test_tune_through_prefect_in_a_terminal_draws_one_clean_display(tmp_path):
    model = odd_model(tmp_path / "odd.onnx")  # one conv and its Winograd twin, node names that are markup
    code, received, _ = in_terminal([sys.executable, "-m", "tunaflow", "tune", str(model), "--trials", "12",
                                     "--batch-size", "4", "--log", str(tmp_path / "log"), "-o", str(tmp_path / "lib")],
                                    env(tmp_path))
    lines = Screen(WIDTH).feed(received).lines
    text = "\n".join(lines)
    assert code == 0, text
    overall = [line for line in lines if line.startswith("all tasks")]
    assert len(overall) == 1, text  # every copy beyond the first is a torn display
    assert " 12/12 " in overall[0] and "kernels " in overall[0] and " ms" in overall[0], overall[0]
    assert "kernels -" not in overall[0] and " ops)" not in overall[0]
    assert "| INFO" not in text  # Prefect's run lines are in its UI, not in the scrollback
    rows = [line for line in lines if line.startswith(("conv2d(", "conv2d_winograd("))]
    assert len(rows) == 2 and all("best     0.0" not in row for row in rows), text


def test_tune_json_keeps_stdout_for_the_json_and_progress_on_the_terminal(tmp_path):
    model = odd_model(tmp_path / "odd.onnx")
    code, received, stdout = in_terminal(
        [sys.executable, "-m", "tunaflow", "tune", str(model), "--trials", "8", "--batch-size", "4", "--json",
         "--no-prefect", "--log", str(tmp_path / "log"), "-o", str(tmp_path / "lib")], env(tmp_path),
        stdout_pipe=True)
    assert code == 0, received
    report = json.loads(stdout)  # nothing but the object
    assert sum(t["trials"] for t in report["tasks"]) == 8
    overall = [line for line in Screen(WIDTH).feed(received).lines if line.startswith("all tasks")]
    assert len(overall) == 1 and " 8/8 " in overall[0], received


def test_piped_tables_keep_long_names_whole(tmp_path):
    """`tasks` on the CNN is a table about 100 columns wide: piped, it used to be cut to 80
    (`1x16x32x…`, `bias,re…`)."""
    e = env(tmp_path)
    listed = subprocess.run([sys.executable, "-m", "tunaflow", "tasks", str(CNN), "--json"], cwd=ROOT, env=e,
                            capture_output=True, text=True, timeout=120)
    tasks = [json.loads(line) for line in listed.stdout.splitlines()]
    table = subprocess.run([sys.executable, "-m", "tunaflow", "tasks", str(CNN)], cwd=ROOT, env=e,
                           capture_output=True, text=True, timeout=120)
    assert table.returncode == 0 and tasks, table.stderr
    assert "…" not in table.stdout, table.stdout
    rows = [line for line in table.stdout.splitlines() if line.startswith("│")]
    assert len(rows) == len(tasks), table.stdout  # one line per task: nothing wrapped
    for row, t in zip(rows, tasks, strict=True):
        cells = [c.strip() for c in row.strip("│").split("│")]
        shapes = ["x".join(map(str, x["shape"])) for x in t["task"]["inputs"][:2] + t["task"]["outputs"]]
        assert cells[2:5] == shapes and cells[5] == ",".join(e["kind"] for e in t["task"]["epilogue"]), row
