"""The import's memory bounds at the command line: `--max-constant-mb` and `--max-tensor-mb` on tasks, build
and tune, each refusal one line naming the option, nonsense refused at the option."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from testing import bombs

ROOT = Path(__file__).resolve().parent.parent
CNN = ROOT / "data" / "models" / "cnn.onnx"


def tunaflow(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "tunaflow", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=120)


def _one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.startswith("error:"), proc.stderr
    for fragment in fragments:
        assert fragment in proc.stderr, proc.stderr


def test_a_constant_over_the_default_budget_is_refused_and_the_option_admits_it(tmp_path):
    path = tmp_path / "const.onnx"
    onnx.save(bombs.constant_of_shape(8500), path)  # 8500^2 float32: 276 MiB, over the 256 MiB default
    _one_line_error(tunaflow("tasks", str(path), cwd=tmp_path), "ConstantOfShape", "--max-constant-mb")
    ok = tunaflow("tasks", str(path), "--max-constant-mb", "400", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr


@pytest.mark.parametrize("command", ["tasks", "build", "tune"])
def test_max_tensor_mb_bounds_every_command_that_imports(tmp_path, command):
    extra = {"tasks": [], "build": ["-o", str(tmp_path / "lib")],
             "tune": ["-o", str(tmp_path / "lib"), "--log", str(tmp_path / "log"), "--no-prefect"]}[command]
    proc = tunaflow(command, str(CNN), *extra, "--max-tensor-mb", "0.01", cwd=tmp_path)
    _one_line_error(proc, "input 'input'", "--max-tensor-mb")
    assert not (tmp_path / "lib").exists() and not (tmp_path / "log").exists()


@pytest.mark.parametrize("option", ["--max-constant-mb", "--max-tensor-mb"])
def test_a_limit_that_is_not_positive_is_refused_at_the_option(tmp_path, option):
    proc = tunaflow("tasks", str(CNN), option, "0", cwd=tmp_path)
    assert proc.returncode == 2 and option in proc.stderr and "Traceback" not in proc.stderr
