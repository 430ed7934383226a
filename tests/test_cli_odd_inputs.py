"""Odd input at the command line (issue 21, groups 6 and 10): real `tunaflow` processes, real files.

Every case ends with a clear message and a non-zero exit code, never a traceback; user strings
(node names, paths) print as they are, not as rich markup or emoji.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from support.odd_names import ODD, odd_model

from testing import cli, dask_ports


def tunaflow(*args: object) -> subprocess.CompletedProcess:
    return cli.tunaflow(*args, env={**os.environ, "COLUMNS": "250"})  # paths unwrapped


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    """The odd model under a path holding `[/]:a:`, and its library, built by `tunaflow build`."""
    root = tmp_path_factory.mktemp("odd")
    model = odd_model(root / "[" / "]:a:.onnx")  # the path reads .../[/]:a:.onnx
    lib = root / "[" / "]:a:lib"
    r = tunaflow("build", model, "-o", lib)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and f"{root}/[/]:a:lib" in r.stdout and "🅰" not in r.stdout
    return model, lib


def test_markup_and_emoji_in_names_and_paths_print_as_text(built, tmp_path):
    model, lib = built
    tasks = tunaflow("tasks", model)
    assert tasks.returncode == 0, tasks.stderr
    assert ":a:" in tasks.stdout and "🅰" not in tasks.stdout
    run = tunaflow("run", lib, "--profile", "2", "--output", tmp_path / "out")
    assert run.returncode == 0, run.stderr
    assert "│ [/]  │ conv2d" in run.stdout and "│ :a:  │ MaxPool" in run.stdout and "🅰" not in run.stdout
    assert "output y:a:" in run.stdout
    missing = tunaflow("tasks", tmp_path / f"{ODD}.onnx")
    assert missing.returncode == 2 and f"{ODD}.onnx" in missing.stderr and "Traceback" not in missing.stderr


def test_run_output_is_the_file_written_and_never_a_directory(built, tmp_path):
    _, lib = built
    r = tunaflow("run", lib, "--output", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out.npz").is_file() and f"written  : {tmp_path / 'out.npz'}" in r.stdout
    (tmp_path / "dir").mkdir()
    r = tunaflow("run", lib, "--output", tmp_path / "dir")
    assert r.returncode == 2 and "is a directory" in r.stderr and not (tmp_path / "dir.npz").exists()


def test_run_refuses_inputs_that_are_not_an_npz_archive(built, tmp_path):
    _, lib = built
    (tmp_path / "garbage.npz").write_bytes(b"PK\x03\x04 not a zip archive")
    np.save(tmp_path / "one.npy", np.zeros((1, 3, 8, 8), np.float32))
    np.savez(tmp_path / "pickled.npz", x=np.array([{"a": 1}], dtype=object))
    for name in ("garbage.npz", "one.npy", "pickled.npz"):
        r = tunaflow("run", lib, "--inputs", tmp_path / name)
        assert r.returncode == 2, (name, r.stderr)
        assert "not a readable .npz archive" in r.stderr and name in r.stderr and "Traceback" not in r.stderr


def test_build_into_an_existing_file_is_refused(built, tmp_path):
    model, _ = built
    (tmp_path / "file").write_text("mine")
    for command in ("build", "tune"):
        r = tunaflow(command, model, "-o", tmp_path / "file", "--log", tmp_path / "log", "--no-prefect") \
            if command == "tune" else tunaflow(command, model, "-o", tmp_path / "file")
        assert r.returncode == 2 and "is a file" in r.stderr and "Traceback" not in r.stderr, (command, r.stderr)
        assert (tmp_path / "file").read_text() == "mine"
    assert not (tmp_path / "log").exists()  # tune refused before tuning


@pytest.mark.parametrize(("args", "option", "fragment"), [
    (["build", "M", "-o", "OUT", "--threads", "0"], "--threads", "greater than or equal to 1"),
    (["build", "M", "-o", "OUT", "--threads", "999"], "--threads", "less than or equal to 256"),
    (["run", "LIB", "--bench", "-5"], "--bench", "greater than or equal to 0"),
    (["run", "LIB", "--profile", "-1"], "--profile", "greater than or equal to 0"),
    (["tune-op", "conv2d", "--input", "1x4x8x8", "--weight", "4x4x3x3", "--groups", "0", "--no-prefect"],
     "--groups", "greater than or equal to 1"),
    (["tune-op", "matmul", "--m", "4", "--n", "4", "--k", "4", "--epilogue", "leaky_relu:nan", "--no-prefect"],
     "--epilogue", "alpha=nan"),
    (["tune-op", "matmul", "--m", "4", "--n", "4", "--k", "4", "--epilogue", "clip:-inf:6", "--no-prefect"],
     "--epilogue", "min=-inf"),
    (["tune-op", "matmul", "--m", "4", "--n", "4", "--k", "4", "--threads", "0", "--no-prefect"], "--threads",
     "greater than or equal to 1"),
])
def test_nonsense_numbers_are_refused_at_the_option(built, tmp_path, args, option, fragment):
    model, lib = built
    subs = {"M": str(model), "OUT": str(tmp_path / "out"), "LIB": str(lib)}
    r = tunaflow(*[subs.get(a, a) for a in args], "--log", tmp_path / "log") if args[0] == "tune-op" else \
        tunaflow(*[subs.get(a, a) for a in args])
    assert r.returncode == 2, r.stdout + r.stderr
    assert option in r.stderr and fragment in " ".join(r.stderr.replace("│", " ").split()), r.stderr
    assert not (tmp_path / "log").exists() and not (tmp_path / "out").exists()


def test_the_local_dask_cluster_listens_on_loopback_only():
    """`--task-runner dask`'s cluster: scheduler, dashboard (Dask's default is 0.0.0.0:8787) and workers."""
    r, listening = dask_ports.listening()
    assert r.returncode == 0, r.stderr
    assert len(listening) >= 4, r.stdout  # the scheduler, its dashboard, and one worker (+ nanny) per core
    assert {ip for ip, _ in listening} == {"127.0.0.1"}, listening
