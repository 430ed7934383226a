"""Issue 21, group 9: the tuning log under faults, through the real CLI and real processes.

Six attacks: the log directory turns read-only mid-session (as root too: the tuner runs without
CAP_DAC_OVERRIDE), the disk fills mid-session (RLIMIT_FSIZE set on the running tuner), a writer is
killed mid-write and leaves a temporary part, one part is damaged (truncated), two `tune-op`
sessions share one log with --trials 32, and a tracker outage turns a batch into `unknown` errors.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from attacks import Outcome
from testing.cli import QUIET, tunaflow
from testing.cluster import free_port

ROOT = Path(__file__).resolve().parents[2]
GROUP = 9
TUNE = ["tune-op", "matmul", "--m", "24", "--n", "40", "--k", "32", "--tuner", "random", "--no-prefect", "--json"]


def run(tmp: Path) -> list[Outcome]:
    shared = tmp / "shared"
    outcomes = [read_only_mid_session(tmp / "ro"), full_disk_mid_session(tmp / "full"),
                killed_writer_leaves_tmp(tmp / "killed"), two_sessions(shared)]
    outcomes += [damaged_part(tmp / "damaged", shared), tracker_outage(tmp / "outage")]
    return outcomes


def read_only_mid_session(work: Path) -> Outcome:
    from stages.log import merge
    from testing.disk import drop_dac_override

    log, spare = work / "log", work / "spare"
    spare.mkdir(parents=True)
    proc = _tune(log, ["--trials", "64", "--batch-size", "8", "--remeasure-top-k", "0"], env={"TMPDIR": str(spare)},
                 preexec_fn=drop_dac_override)
    try:
        _wait_for_part(log, proc)
        os.chmod(log, 0o555)
        durable = len(_records(log))
        _, err = proc.communicate(timeout=180)
    finally:
        os.chmod(log, 0o755)
        _stop(proc)
    rescued = sum(merge([d], log) for d in spare.iterdir())
    return _write_fault_outcome("the log directory turns read-only mid-session (chmod 555, tuner without "
                                "CAP_DAC_OVERRIDE)", proc.returncode, err, log, durable, rescued, expect_rescue=8)


def full_disk_mid_session(work: Path) -> Outcome:
    log = work / "log"
    (work / "spare").mkdir(parents=True)
    proc = _tune(log, ["--trials", "64", "--batch-size", "8", "--remeasure-top-k", "0"],
                 env={"TMPDIR": str(work / "spare")})
    try:
        _wait_for_part(log, proc)
        resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (2048, resource.RLIM_INFINITY))
        durable = len(_records(log))
        _, err = proc.communicate(timeout=180)
    finally:
        _stop(proc)
    return _write_fault_outcome("the disk fills mid-session (RLIMIT_FSIZE 2 KiB set on the running tuner: "
                                "every write fails, the rescue copy too)", proc.returncode, err, log, durable, 0,
                                expect_rescue=0)


WRITER = """
import sys
from schemas import Config, MeasureResult, TuningRecord, matmul_task
from stages.log import TuningLog
task = matmul_task(8, 8, 8)
log = TuningLog(sys.argv[1])
for i in range(10 ** 6):
    log.append([TuningRecord(tunaflow_version="0", session_id="w", trial=i * 2000 + j, tuner="random",
                             target_key="tk", task_signature=task.signature, task=task, template_version=1,
                             config=Config(index=i * 2000 + j, knobs={"mr": 4}), result=MeasureResult(costs=(1e-3,)),
                             gflops=1.0) for j in range(2000)])
    print(i, flush=True)
"""


def killed_writer_leaves_tmp(work: Path) -> Outcome:
    """kill -9 a writer of big batches while its temporary part exists (after its first committed
    batch), then: `log check`, a session, `log check`."""
    log = work / "log"
    kills = 0
    while kills < 5 and not list(log.glob(".*.tmp")):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(log)], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True, env=_env())
        assert proc.stdout is not None
        proc.stdout.readline()
        deadline = time.monotonic() + 10
        while not list(log.glob(".*.tmp")) and time.monotonic() < deadline:
            time.sleep(0.0005)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills += 1
    left = list(log.glob(".*.tmp"))
    if not left:
        return Outcome(GROUP, "kill -9 a writer mid-write: the temporary part it leaves", f"no kill of {kills} hit "
                       "a write", held=False)
    durable = len(_records(log))
    check = _cli("log", "check", str(log))
    reported = check.returncode == 1 and all(t.name in check.stdout for t in left)
    session = _cli(*TUNE, "--trials", "2", "--batch-size", "2", "--remeasure-top-k", "0", "--log", str(log))
    after = [r for r in _records(log) if r.session_id == "w"]
    remaining = list(log.glob(".*.tmp"))
    aside = sorted(p.name for p in (log / "quarantine").glob("*")) if (log / "quarantine").exists() else []
    recovered = len(after) - durable
    clean = _cli("log", "check", str(log)).returncode == 0
    held = reported and session.returncode == 0 and not remaining and len(after) >= durable and clean
    return Outcome(GROUP, "kill -9 a writer of 2000-record batches mid-write: it leaves a `.part-*.tmp`",
                   f"after {kills} kill(s) {len(left)} .tmp left; `log check` {'reports' if reported else 'misses'} "
                   f"it (exit {check.returncode}); the next session (exit {session.returncode}) "
                   f"{'recovered ' + str(recovered) + ' whole records from it' if recovered else 'recovered nothing'}"
                   f"{', moved ' + str(len(aside)) + ' incomplete part(s) to quarantine/' if aside else ''}; "
                   f"{len(remaining)} .tmp remain, `log check` then {'clean' if clean else 'not clean'}",
                   held=held, crashes=int(session.returncode not in (0, 2)),
                   records_lost=max(0, durable - len(after)))


def two_sessions(log: Path) -> Outcome:
    procs = [_tune(log, ["--trials", "32", "--batch-size", "8"]) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    trials = [r for r in _records(log) if r.tuner != "remeasure"]
    configs = len({r.config.index for r in trials})
    codes = [p.returncode for p in procs]
    refusal = next((err.strip() for p, (_, err) in zip(procs, outs, strict=True) if p.returncode == 2), "")
    held = len(trials) <= 32 and configs == len(trials) and all(c in (0, 2) for c in codes) and \
        all("Traceback" not in err for _, err in outs)
    return Outcome(GROUP, "two `tune-op --trials 32` processes on one log at once",
                   f"{len(trials)} trials, {configs} distinct configs; exits {codes}"
                   f"{': ' + refusal[:160] if refusal else ''}", held=held,
                   crashes=sum("Traceback" in err for _, err in outs))


def damaged_part(work: Path, source: Path) -> Outcome:
    """Truncate one part of a real log; show, export, tune-op and build must read the rest."""
    log = work / "log"
    work.mkdir(parents=True)
    shutil.copytree(source, log)
    part = sorted(log.glob("part-*.parquet"))[0]
    part.write_bytes(part.read_bytes()[:2000])
    good = len(_records(log))
    model = _matmul_model(work / "mm.onnx")
    runs = {
        "show": _cli("log", "show", str(log)),
        "export": _cli("log", "export", str(log), str(work / "out.jsonl")),
        "tune-op": _cli(*TUNE, "--trials", "40", "--batch-size", "8", "--remeasure-top-k", "0", "--log", str(log)),
        "build": _cli("build", str(model), "-o", str(work / "lib"), "--log", str(log), "--no-verify"),
    }
    ok = [name for name, r in runs.items() if r.returncode == 0 and part.name in r.stderr and "skipped" in r.stderr]
    exported = len((work / "out.jsonl").read_text().splitlines()) if (work / "out.jsonl").exists() else 0
    check = _cli("log", "check", str(log))
    crashes = sum("Traceback" in r.stderr for r in runs.values())
    held = len(ok) == len(runs) and exported == good and check.returncode == 1 and part.name in check.stdout
    return Outcome(GROUP, "one truncated part in a log, then show / export / tune-op / build",
                   f"{', '.join(ok) or 'none'} read the log with one warning naming {part.name} "
                   f"({exported} of {good} good records exported); failed: "
                   f"{', '.join(f'{n} (exit {r.returncode})' for n, r in runs.items() if n not in ok) or 'none'}; "
                   f"`log check` still reports it (exit {check.returncode})", held=held, crashes=crashes)


def tracker_outage(work: Path) -> Outcome:
    """A batch measured through a tracker nobody answers for (real RPC runner, closed port) becomes
    `unknown` errors; a rerun with the local runner must measure those very configs and count only
    its own trials."""

    import stages.rpc.client as rpc_client
    from schemas import MeasureErrorNo, MeasureOptions, Target, TuningOptions, matmul_task
    from schemas.options import RunnerSpec
    from stages.log import TuningLog
    from stages.measure.builder import Builder
    from stages.tune.loop import tune_task
    from stages.tune.runners import make_runner
    from stages.tune.session import TuningSession, measure

    port = free_port()
    token = work / "token"
    work.mkdir(parents=True)
    token.write_text("t" * 64)
    task, host = matmul_task(24, 40, 32), Target.host()
    fast = MeasureOptions(number=1, repeat=2, min_repeat_ms=1, n_parallel=1)
    rpc = RunnerSpec(kind="rpc", key="k", host="127.0.0.1", port=port, token_file=str(token))
    options = TuningOptions(n_trials=8, batch_size=8, tuner="random", measure=fast, top_k_remeasure=0)
    log = TuningLog(work / "log")
    patience = getattr(rpc_client, "UNREACHABLE_S", None)
    if patience is not None:  # the client's patience (30 s) shortened: the outage outlasts it either way
        rpc_client.UNREACHABLE_S = 2.0
    try:
        with TuningSession(task, host, options.model_copy(update={"runner": rpc}), log) as session, \
                Builder(fast) as builder, make_runner(rpc, fast) as runner:
            lost = session.propose()
            session.record(lost, measure(builder, runner, task, lost, host))
    finally:
        if patience is not None:
            rpc_client.UNREACHABLE_S = patience
    unknown = sum(r.result.error_no == MeasureErrorNo.unknown for r in log.records())
    summary = tune_task(task, host, options.model_copy(update={"tuner": "lgbm", "seed": 1}), log)
    remeasured = {r.config.index for r in log.records() if r.result.error_no != MeasureErrorNo.unknown}
    again = {c.index for c in lost} == remeasured
    held = unknown == len(lost) and summary.new_trials == len(lost) and summary.trials == len(lost) and again
    return Outcome(GROUP, f"tracker outage (nothing on 127.0.0.1:{port}): a batch of {len(lost)} becomes `unknown` "
                   "errors, then --trials 8 again with the local runner (lgbm, another seed)",
                   f"{unknown} unknown records; the rerun measured {summary.new_trials} new trials "
                   f"({'the same configs the outage lost' if again else 'other configs'}) and counts "
                   f"{summary.trials} of 8", held=held)


def _write_fault_outcome(attack: str, code: int | None, err: str, log: Path, durable: int, rescued: int,
                         expect_rescue: int) -> Outcome:
    lines = err.strip().splitlines()
    after = len(_records(log)) - rescued
    tmp_left = list(log.glob(".*.tmp"))
    crashed = "Traceback" in err or code not in (0, 2)
    held = (code == 2 and len(lines) == 1 and lines[0].startswith("error:") and not crashed and after >= durable
            and not tmp_left and rescued == expect_rescue)
    return Outcome(GROUP, attack, f"exit {code}: {(lines or [''])[-1][:230]}; {after} records intact "
                   f"({durable} durable before), {rescued} rescued records merged back, {len(tmp_left)} .tmp left",
                   held=held, crashes=int(crashed), records_lost=max(0, durable - after))


def _matmul_model(path: Path) -> Path:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [24, 32])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [24, 40])
    w = helper.make_tensor("w", TensorProto.FLOAT, [32, 40], np.ones(32 * 40, np.float32))
    onnx.save(helper.make_model(helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm", [x], [y],
                                                  [w])), path)
    return path


def _records(log: Path) -> list:
    from stages.log import TuningLog

    return TuningLog(log).read(strict=False)[0] if log.exists() else []


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), **QUIET, **(extra or {})}


def _cli(*args: str) -> subprocess.CompletedProcess:
    return tunaflow(*args, env=_env())


def _tune(log: Path, extra: list[str], env: dict[str, str] | None = None, preexec_fn=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tunaflow", *TUNE, "--log", str(log), *extra], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(env),
                            preexec_fn=preexec_fn)


def _wait_for_part(log: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not list(log.glob("part-*.parquet")):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the tuner wrote no part (exit {proc.poll()})")
        time.sleep(0.05)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()

