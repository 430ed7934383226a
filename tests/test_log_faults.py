"""The tuning log under faults, with real processes and real files: a log that turns read-only or
full mid-session, damaged parts, temporary parts left by a killed writer, two sessions on one log,
and `unknown` (infrastructure) errors a rerun must retry."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pyarrow.parquet as pq
import pytest
from onnx import TensorProto, helper
from support.log_records import log_with_a_torn_part, rec

from schemas import MeasureErrorNo, MeasureOptions, MeasureResult, TuningOptions, matmul_task
from schemas.record import REMEASURE
from stages.log import LogBusyError, TuningLog, merge
from stages.log.lock import LOCK_NAME
from stages.log.store import to_table
from stages.tune.loop import tune_task
from stages.tune.session import TuningSession
from testing.cli import tunaflow
from testing.disk import drop_dac_override

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
TASK = matmul_task(24, 40, 16)
FAST = MeasureOptions(number=1, repeat=2, min_repeat_ms=1, n_parallel=1)

# Measures a batch, records it, then breaks the disk (read-only directory or full disk) and records a
# second measured batch: prints what `record` raised.
MID_SESSION = """
import json, os, sys
from pathlib import Path
from schemas import MeasureOptions, Target, TuningOptions, matmul_task
from testing.disk import file_size_limit
from stages.log import LogError, TuningLog
from stages.measure.builder import Builder
from stages.tune.runners import make_runner
from stages.tune.session import TuningSession, measure

mode, path = sys.argv[1], Path(sys.argv[2])
task, target = matmul_task(24, 40, 16), Target.host()
options = TuningOptions(n_trials=6, batch_size=3, tuner="random", top_k_remeasure=0,
                        measure=MeasureOptions(number=1, repeat=2, min_repeat_ms=1, n_parallel=1))
with TuningSession(task, target, options, TuningLog(path)) as s, Builder(options.measure) as b, \\
        make_runner(options.runner, options.measure) as r:
    configs = s.propose()
    s.record(configs, measure(b, r, task, configs, target))
    configs = s.propose()
    results = measure(b, r, task, configs, target)
    if mode == "read-only":
        os.chmod(path, 0o555)
    try:
        if mode == "full":
            with file_size_limit(1024):
                s.record(configs, results)
        else:
            s.record(configs, results)
        print(json.dumps({"error": None}))
    except LogError as exc:
        print(json.dumps({"error": str(exc), "type": type(exc).__name__}))
"""


def mid_session(mode: str, log: Path, spare: Path) -> dict:
    spare.mkdir()
    r = subprocess.run([sys.executable, "-c", MID_SESSION, mode, str(log)], cwd=ROOT, capture_output=True, text=True,
                       env={**ENV, "TMPDIR": str(spare)}, preexec_fn=drop_dac_override, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_read_only_log_mid_session_is_one_error_and_the_batch_is_saved(tmp_path):
    log, spare = tmp_path / "log", tmp_path / "spare"
    try:
        out = mid_session("read-only", log, spare)
    finally:
        os.chmod(log, 0o755)
    assert out["type"] == "LogWriteError"
    assert out["error"].startswith(f"{log}: cannot write a log part (Permission denied)")
    assert "the 3 records of this batch are not in the log, the parts already there are intact" in out["error"]
    assert "\n" not in out["error"]
    assert len(TuningLog(log).records()) == 3
    assert not list(log.glob(".*.tmp"))
    (saved,) = spare.iterdir()
    assert f"they are saved in {saved}" in out["error"] and f"tunaflow log merge {log} {saved}" in out["error"]
    assert merge([saved], log) == 3
    records = TuningLog(log).records()
    assert len(records) == len({r.config.index for r in records}) == 6


def test_full_disk_mid_session_removes_its_temporary_part(tmp_path):
    log = tmp_path / "log"
    out = mid_session("full", log, tmp_path / "spare")
    assert out["type"] == "LogWriteError"
    assert out["error"].startswith(f"{log}: cannot write a log part (File too large)")
    assert "the 3 records of this batch are not in the log" in out["error"]
    assert out["error"].endswith("saving them under the temp directory failed too")
    assert len(TuningLog(log).records()) == 3 and len(TuningLog(log).parts()) == 1
    assert not list(log.glob(".*.tmp")) and not list((tmp_path / "spare").iterdir())


def test_merge_into_a_read_only_log_is_one_error_line(tmp_path):
    src, dest = TuningLog(tmp_path / "src"), TuningLog(tmp_path / "dest")
    src.append([rec(0, 1e-3)])
    dest.append([rec(1, 1e-3)])
    os.chmod(dest.path, 0o555)
    try:
        r = tunaflow("log", "merge", dest.path, src.path, timeout=120, preexec_fn=drop_dac_override)
    finally:
        os.chmod(dest.path, 0o755)
    assert r.returncode == 2
    assert r.stderr.strip() == (f"error: {dest.path}: cannot write this log (Permission denied: "
                                f"{dest.path / LOCK_NAME})"), r.stderr
    assert [x.trial for x in dest.records()] == [1]


def test_damaged_part_is_skipped_with_a_warning_by_show_export_and_tune(tmp_path):
    log, part = log_with_a_torn_part(tmp_path / "log")
    for args in (["log", "show", str(log.path)], ["log", "export", str(log.path), str(tmp_path / "out.jsonl")]):
        r = tunaflow(*args)
        assert r.returncode == 0, r.stderr
        assert f"{part}: not a readable Parquet file" in r.stderr and "skipped" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "1 records" in tunaflow("log", "show", str(log.path)).stdout
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 1
    r = tunaflow("tune-op", "matmul", "--m", "24", "--n", "40", "--k", "16", "--trials", "2", "--batch-size", "2",
                 "--tuner", "random", "--remeasure-top-k", "0", "--log", str(log.path), "--no-prefect", "--json")
    assert r.returncode == 0, r.stderr
    assert f"{part}: not a readable Parquet file" in r.stderr
    assert json.loads(r.stdout)["trials"] == 2
    assert part.exists(), "reading never moves a part; `log check --repair` does"


def test_build_reads_a_log_with_a_damaged_part(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 6])
    w = helper.make_tensor("w", TensorProto.FLOAT, [8, 6], np.ones(48, np.float32))
    model = tmp_path / "mm.onnx"
    onnx.save(helper.make_model(helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm", [x], [y],
                                                  [w])), model)
    log = TuningLog(tmp_path / "log")
    log.append([rec(0, 1e-3)])
    (log.path / "part-zzz.parquet").write_bytes(b"PAR1 garbage")
    r = tunaflow("build", model, "-o", tmp_path / "out", "--log", log.path, "--no-verify")
    assert r.returncode == 0, r.stderr
    assert "part-zzz.parquet: not a readable Parquet file" in r.stderr
    assert (tmp_path / "out" / "manifest.json").exists()


def test_temporary_parts_of_a_killed_writer_are_reported_then_recovered_or_moved_aside(tmp_path, caplog):
    log = TuningLog(tmp_path / "log")
    log.append([rec(0, 1e-3)])
    whole = log.path / ".part-20260101T000000000000-aaaaaaaa.parquet.tmp"  # killed between fsync and rename
    half = log.path / ".part-20260101T000000000001-bbbbbbbb.parquet.tmp"   # killed mid-write
    pq.write_table(to_table([rec(1, 1e-3), rec(2, 1e-3)]), whole)
    half.write_bytes(whole.read_bytes()[:300])
    _, problems = log.read(strict=False)
    assert {(p.path, p.kind) for p in problems} == {(whole, "stale"), (half, "stale")}
    r = tunaflow("log", "check", log.path, timeout=120)
    assert r.returncode == 1 and whole.name in r.stdout and "interrupted writer" in r.stdout
    with log.writer():
        pass
    assert not list(log.path.glob(".*.tmp"))
    assert sorted(x.trial for x in log.records()) == [0, 1, 2]
    assert (log.path / "quarantine" / half.name).exists(), "an incomplete part is moved aside, never deleted"
    assert "recovered 2 records" in caplog.text and "moved to" in caplog.text
    assert log.read(strict=False)[1] == []


HOLDER = """
import sys, time
from stages.log import TuningLog
lease = TuningLog(sys.argv[1]).writer()
print("locked", flush=True)
time.sleep(60)
"""


def test_a_second_writer_waits_then_refuses_naming_the_pid_and_a_dead_holder_frees_the_log(tmp_path):
    path = tmp_path / "log"
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
        started = time.monotonic()
        with pytest.raises(LogBusyError, match=rf"{path}: another tunaflow session \(pid {proc.pid}\) is writing "
                                               r"this log; waited 0.5 s"):
            TuningLog(path, wait_s=0.5).append([rec(0, 1e-3)])
        assert 0.5 <= time.monotonic() - started < 3
        assert TuningLog(path).records() == [], "readers take no lock, and nothing was written"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    TuningLog(path, wait_s=0).append([rec(0, 1e-3)])
    assert len(TuningLog(path).records()) == 1
    assert not (path / LOCK_NAME).exists(), "the lock file goes with its last holder"


def test_two_sessions_on_one_log_spend_one_budget(tmp_path):
    log = tmp_path / "log"
    args = [sys.executable, "-m", "tunaflow", "tune-op", "matmul", "--m", "24", "--n", "40", "--k", "32",
            "--trials", "32", "--batch-size", "8", "--tuner", "random", "--log", str(log), "--no-prefect", "--json"]
    procs = [subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    trials = [r for r in TuningLog(log).records() if r.tuner != REMEASURE]
    assert len(trials) == 32
    assert len({r.config.index for r in trials}) == 32, "a config was measured twice"
    codes = sorted(p.returncode for p in procs)
    assert codes in ([0, 0], [0, 2]), outs
    for p, (stdout, stderr) in zip(procs, outs, strict=True):
        if p.returncode == 2:
            assert stderr.strip().startswith(f"error: {log}: another tunaflow session (pid ")
            assert len(stderr.strip().splitlines()) == 1
        else:
            assert json.loads(stdout)["trials"] == 32


def options(**kw) -> TuningOptions:
    return TuningOptions(**{"n_trials": 4, "batch_size": 4, "tuner": "random", "measure": FAST,
                            "top_k_remeasure": 0, **kw})


def test_unknown_errors_are_retried_by_a_rerun_and_not_counted(tmp_path, host):
    log = TuningLog(tmp_path / "log")
    outage = MeasureResult(error_no=MeasureErrorNo.unknown, error_msg="cannot reach the tracker at http://127.0.0.1:9")
    with TuningSession(TASK, host, options(), log) as session:
        lost = session.propose()
        session.record(lost, [outage] * len(lost))
        assert session.done, "inside one session an outage still spends trials: it cannot spin forever"
    summary = tune_task(TASK, host, options(tuner="lgbm", seed=1), log)  # another tuner and seed: still those
    assert summary.new_trials == 4 and summary.trials == 4
    records = log.records()
    measured = {r.config.index for r in records if r.result.error_no != MeasureErrorNo.unknown}
    assert {c.index for c in lost} == measured, "the configs the outage lost were measured again"
    per_config = {i: sorted(r.result.error_no == MeasureErrorNo.unknown for r in records if r.config.index == i)
                  for i in measured}
    assert all(kinds == [False, True] for kinds in per_config.values()), "one lost, one real record each"
    again = tune_task(TASK, host, options(), log)
    assert again.new_trials == 0 and again.trials == 4


def test_a_budget_counts_only_records_that_are_not_unknown(tmp_path, host):
    log = TuningLog(tmp_path / "log")
    outage = MeasureResult(error_no=MeasureErrorNo.unknown, error_msg="the tracker lost the job (restarted?)")
    wrong = MeasureResult(error_no=MeasureErrorNo.wrong_answer, error_msg="max abs error 1")
    with TuningSession(TASK, host, options(n_trials=6, tuner="grid"), log) as session:
        first = session.propose()
        session.record(first, [outage, outage, wrong, MeasureResult(costs=(1e-3,))])
    with TuningSession(TASK, host, options(n_trials=6, tuner="lgbm", seed=3), log) as session:
        assert session.trials == 2 and session.remaining == 4
        proposed = [c.index for c in session.propose()]
    assert proposed[:2] == [first[0].index, first[1].index], "configs lost to the outage are proposed again"
    assert not {first[2].index, first[3].index} & set(proposed), "measured configs are not"
