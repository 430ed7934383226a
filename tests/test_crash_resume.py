"""kill -9 a tuning process at random moments, resume each time: the log always reads back,
only the in-flight batch is lost, no config is measured twice, the budget is reached."""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from schemas.record import REMEASURE
from stages.log import TuningLog

ROOT = Path(__file__).resolve().parent.parent
TRIALS, BATCH = 24, 4


def trials(log: Path) -> list:
    """Trial records (top-k re-measurements are logged too, but are not trials)."""
    return [r for r in TuningLog(log).records() if r.tuner != REMEASURE]


def start(log: Path) -> subprocess.Popen:
    args = [sys.executable, "-m", "tunaflow", "tune-op", "matmul", "--m", "24", "--n", "40", "--k", "32",
            "--trials", str(TRIALS), "--batch-size", str(BATCH), "--log", str(log), "--no-prefect", "--json"]
    return subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def test_kill_nine_then_resume(tmp_path):
    log = tmp_path / "log"
    rng = random.Random(5)
    kills, counts = 0, [0]
    while kills < 3:
        proc = start(log)
        time.sleep(rng.uniform(2.0, 5.0))
        if proc.poll() is not None:
            break
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        kills += 1
        records = trials(log)
        # the default schedule's trial alone, then whole batches (the last one the budget's remainder): a part
        # holds a batch or nothing
        assert len(records) in (0, TRIALS) or (len(records) - 1) % BATCH == 0, len(records)
        assert len({r.config.index for r in records}) == len(records), "a config was measured twice"
        assert len(records) >= counts[-1]
        counts.append(len(records))
    final = start(log)
    final.communicate(timeout=300)
    assert final.returncode == 0
    records = trials(log)
    assert len(records) == TRIALS
    assert len({r.config.index for r in records}) == TRIALS
