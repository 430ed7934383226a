"""Issue 21, groups 5, 6 and 10: exits, binds and odd input at the command line, as real processes.

Ctrl-C to a Prefect-mode `tune-op`'s process group (as from a terminal: the temporary server gets
it too), the ports `--task-runner dask`'s local cluster listens on, and each odd input of group 10
that the CLI owns: rich markup and emoji in node names and paths, a model whose external data is
missing, a garbage .npz, `build -o FILE`, nonsense numbers and `run --output DIR`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from attacks import Outcome

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from support.odd_names import odd_model  # noqa: E402  (the model the CLI tests use)

from testing.cli import QUIET, tunaflow  # noqa: E402
from testing.dask_ports import listening  # noqa: E402

ENV = {**QUIET, "COLUMNS": "250"}
EXIT_GOAL_S = 2.0


def run(tmp: Path) -> list[Outcome]:
    model = odd_model(tmp / "[" / "]:a:.onnx")  # nodes [/], [bold], :a:; the path reads .../[/]:a:.onnx
    lib = tmp / "[" / "]:a:lib"
    outcomes = [ctrl_c_prefect_mode(tmp / "ctrl-c"), dask_binds()]
    outcomes += markup_and_emoji(model, lib, tmp)
    outcomes += [external_data_missing(tmp / "ext"), garbage_npz(lib, tmp / "npz"), build_into_file(model, tmp)]
    outcomes += nonsense_numbers(model, lib, tmp)
    outcomes.append(output_is_a_directory(lib, tmp / "out"))
    return outcomes


def _tunaflow(*args: object) -> subprocess.CompletedProcess:
    return tunaflow(*args, env={**os.environ, **ENV})


def _crashed(r: subprocess.CompletedProcess) -> int:
    return int("Traceback" in r.stderr or r.returncode not in (0, 1, 2, 130))


def _last_line(text: str) -> str:
    """The message at the end of stderr, without the box typer draws around option errors."""
    lines = [line.translate(_BOX).strip() for line in text.splitlines()]
    lines = [line for line in lines if line and line not in ("Error", "Try")]
    return " ".join(" ".join(lines[-2:]).split())[:200] if lines else "(nothing)"


_BOX = str.maketrans(dict.fromkeys("╭╮╰╯─│", " "))


def ctrl_c_prefect_mode(work: Path) -> Outcome:
    from stages.log import TuningLog

    log = work / "log"
    work.mkdir(parents=True)
    env = {**os.environ, **ENV, "PREFECT_HOME": str(work / "prefect")}
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.Popen([sys.executable, "-m", "tunaflow", "tune-op", "matmul", "--m", "16", "--n", "16", "--k",
                             "16", "--trials", "5000", "--batch-size", "4", "--remeasure-top-k", "0", "--log",
                             str(log)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=(work / "stderr").open("w"), start_new_session=True)  # a pipe would fill up
    try:
        deadline = time.monotonic() + 240
        while not list(log.glob("*.parquet")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        waited = time.monotonic() - (deadline - 240)
        time.sleep(0.5)
        before = len(TuningLog(log).records())
        sent = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=200)
            took = time.monotonic() - sent
        except subprocess.TimeoutExpired:
            took = float("inf")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    after = len(TuningLog(log).records())
    err = (work / "stderr").read_text()
    said = [line for line in err.splitlines() if line.startswith("interrupted")]
    held = proc.returncode == 130 and took <= EXIT_GOAL_S and len(said) == 1 and after >= before > 0
    return Outcome(5, "Ctrl-C (SIGINT to the process group) of a Prefect-mode tune-op mid-session",
                   f"exit {proc.returncode} {took:.2f} s after the signal (goal {EXIT_GOAL_S:g} s); "
                   f"{said[0] if said else 'no interrupted line'}; {after} records read back ({before} before; first "
                   f"record after {waited:.0f} s)",
                   held, crashes=int("Traceback" in err or took == float("inf")), records_lost=max(0, before - after))


def dask_binds() -> Outcome:
    r, addrs = listening()
    exposed = [f"{ip}:{port}" for ip, port in addrs if ip != "127.0.0.1"]
    return Outcome(6, "--task-runner dask: the ports its local cluster (scheduler, dashboard, workers) listens on",
                   f"{len(addrs)} listening sockets, " + (f"exposed: {', '.join(exposed)}" if exposed else
                                                          "all on 127.0.0.1") + (f"; exit {r.returncode}"
                                                                                 if r.returncode else ""),
                   r.returncode == 0 and bool(addrs) and not exposed, crashes=int(r.returncode != 0))


def markup_and_emoji(model: Path, lib: Path, tmp: Path) -> list[Outcome]:
    build = _tunaflow("build", model, "-o", lib)
    prof = _tunaflow("run", lib, "--profile", "2") if build.returncode == 0 else build
    names_ok = "│ [/]  │" in prof.stdout and "│ :a:  │" in prof.stdout
    tasks = _tunaflow("tasks", model)
    missing = _tunaflow("tasks", tmp / "[/]:a:missing.onnx")
    return [
        Outcome(10, "a model whose nodes are named [/] and :a: through build and run --profile",
                f"build exit {build.returncode}, run exit {prof.returncode}; node names printed as written: "
                f"{names_ok}" + (f"; {_last_line(prof.stderr)}" if prof.returncode else ""),
                build.returncode == 0 and prof.returncode == 0 and names_ok and "🅰" not in prof.stdout,
                crashes=_crashed(build) + _crashed(prof)),
        Outcome(10, "a model path holding [/]:a: through tasks, build and a missing-file error",
                f"tasks exit {tasks.returncode}, build printed the path as written: "
                f"{'[/]:a:lib' in build.stdout}; missing file: {_last_line(missing.stderr)}",
                tasks.returncode == 0 and "[/]:a:lib" in build.stdout and missing.returncode == 2
                and "[/]:a:missing.onnx" in missing.stderr, crashes=_crashed(tasks) + _crashed(missing)),
        Outcome(10, "emoji codes (:a:) in a graph's, a node's and an output's names",
                "printed as text" if "🅰" not in tasks.stdout + build.stdout + prof.stdout and ":a:" in tasks.stdout
                else "printed as 🅰", "🅰" not in tasks.stdout + build.stdout + prof.stdout and ":a:" in tasks.stdout),
    ]


def external_data_missing(work: Path) -> Outcome:
    import onnx

    model = odd_model(work / "m.onnx")
    onnx.save(onnx.load(model), work / "ext.onnx", save_as_external_data=True, location="ext.bin", size_threshold=0)
    (work / "ext.bin").unlink()
    r = [_tunaflow(cmd, work / "ext.onnx", *extra) for cmd, extra in (("tasks", ()), ("build", ("-o", work / "l")))]
    clear = all(x.returncode == 2 and "ext.bin" in x.stderr for x in r)
    return Outcome(10, "a model whose external data file is missing, through tasks and build",
                   _last_line(r[1].stderr), clear, crashes=sum(map(_crashed, r)))


def garbage_npz(lib: Path, work: Path) -> Outcome:
    import numpy as np

    work.mkdir(parents=True, exist_ok=True)
    (work / "garbage.npz").write_bytes(b"PK\x03\x04 not a zip archive")
    np.save(work / "one.npy", np.zeros(3))
    np.savez(work / "pickled.npz", x=np.array([{"a": 1}], dtype=object))
    r = [_tunaflow("run", lib, "--inputs", work / name) for name in ("garbage.npz", "one.npy", "pickled.npz")]
    clear = all(x.returncode == 2 and "not a readable .npz archive" in x.stderr for x in r)
    return Outcome(10, "run --inputs: a garbage .npz, a .npy, an .npz of pickled objects",
                   _last_line(r[0].stderr), clear, crashes=sum(map(_crashed, r)))


def build_into_file(model: Path, tmp: Path) -> Outcome:
    target = tmp / "a-file"
    target.write_text("mine")
    r = _tunaflow("build", model, "-o", target)
    kept = target.read_text() == "mine"
    return Outcome(10, "build -o <an existing file>", f"exit {r.returncode}: {_last_line(r.stderr)}; file kept: {kept}",
                   r.returncode == 2 and kept, crashes=_crashed(r))


def nonsense_numbers(model: Path, lib: Path, tmp: Path) -> list[Outcome]:
    mm = ["tune-op", "matmul", "--m", "4", "--n", "4", "--k", "4", "--no-prefect", "--log", tmp / "nonsense-log"]
    cases = [("build --threads 0", ["build", model, "-o", tmp / "t0", "--threads", "0"], "--threads"),
             ("build --threads 999", ["build", model, "-o", tmp / "t999", "--threads", "999"], "--threads"),
             ("tune-op conv2d --groups 0", ["tune-op", "conv2d", "--input", "1x4x8x8", "--weight", "4x4x3x3",
                                            "--groups", "0", "--no-prefect", "--log", tmp / "nonsense-log"],
              "--groups"),
             ("tune-op --epilogue leaky_relu:nan", [*mm, "--epilogue", "leaky_relu:nan"], "--epilogue"),
             ("run --bench -5", ["run", lib, "--bench", "-5"], "--bench")]
    outcomes = []
    for what, args, option in cases:
        r = _tunaflow(*args)
        refused = r.returncode == 2 and option in r.stderr and not (tmp / "nonsense-log").exists()
        outcomes.append(Outcome(10, what, f"exit {r.returncode}: {_last_line(r.stderr)}", refused,
                                crashes=_crashed(r)))
    return outcomes


def output_is_a_directory(lib: Path, work: Path) -> Outcome:
    (work / "dir").mkdir(parents=True)
    r = _tunaflow("run", lib, "--output", work / "dir")
    wrote = (work / "dir.npz").exists()
    return Outcome(10, "run --output DIR (an existing directory)",
                   f"exit {r.returncode}: {_last_line(r.stderr)}; DIR.npz written: {wrote}",
                   r.returncode == 2 and not wrote, crashes=_crashed(r))
