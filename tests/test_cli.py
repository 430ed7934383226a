"""The CLI as a user runs it: a real subprocess, real tuning, real log."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def tunaflow(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tunaflow", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def test_tune_op_json_then_resume_then_log_show(tmp_path):
    log = str(tmp_path / "log")
    args = ["tune-op", "matmul", "--m", "32", "--n", "32", "--k", "32", "--log", log, "--no-prefect", "--json",
            "--batch-size", "4", "--seed", "3", "--remeasure-top-k", "0"]
    first = tunaflow(*args, "--trials", "6")
    assert first.returncode == 0, first.stderr
    out = json.loads(first.stdout)
    for key in ("task_signature", "trials", "wall_s", "best_gflops", "best_config", "default_gflops", "numpy_gflops"):
        assert key in out
    assert out["trials"] == 6 and out["best_gflops"] > 0 and set(out["best_config"]) >= {"mr", "kc", "vw", "uk"}
    again = json.loads(tunaflow(*args, "--trials", "8").stdout)
    assert again["trials"] == 8 and again["new_trials"] == 2
    shown = tunaflow("log", "show", log, "--top", "2")
    assert shown.returncode == 0
    assert "8 records" in shown.stdout and "matmul(32x32,32x32)" in shown.stdout
    export = tunaflow("log", "export", log, str(tmp_path / "x.jsonl"))
    assert export.returncode == 0 and len((tmp_path / "x.jsonl").read_text().splitlines()) == 8


def test_plain_progress_lines_when_not_a_terminal(tmp_path):
    r = tunaflow("tune-op", "matmul", "--m", "8", "--n", "8", "--k", "8", "--trials", "4", "--batch-size", "2",
                 "--log", str(tmp_path / "log"), "--no-prefect")
    assert r.returncode == 0, r.stderr
    assert "trial 4/4" in r.stderr and "best" in r.stderr
    assert "best schedule" in r.stdout and "numpy" in r.stdout and str(tmp_path / "log") in r.stdout


def test_target_json():
    r = tunaflow("target", "--json")
    assert r.returncode == 0
    t = json.loads(r.stdout)
    assert t["name"] == "host" and t["key"].startswith(t["triple"])
    assert tunaflow("target", "--target", "x86-64-avx2", "--json").returncode == 0


def test_errors_are_clear_and_exit_non_zero(tmp_path):
    cases = [
        (["tune-op", "matmul", "--m", "4"], "matmul needs --n, --k"),
        (["tune-op", "softmax", "--m", "4"], "unknown operator 'softmax'"),
        (["tune-op", "matmul", "--m", "4", "--n", "4", "--k", "4", "--target", "cuda"], "unknown target"),
        (["tune-op", "matmul", "--m", "4", "--n", "4", "--k", "4", "--tuner", "nope", "--no-prefect"], "tuner"),
        (["tune-op", "matmul", "--m", "-4", "--n", "4", "--k", "4", "--no-prefect"], "positive"),
        (["log", "show", str(tmp_path / "missing")], "no such tuning log"),
        (["target", "--target", "llvm -bogus=1"], "unknown target option"),
    ]
    for args, fragment in cases:
        r = tunaflow(*args)
        assert r.returncode != 0, args
        assert fragment in r.stderr, (args, r.stderr)


def test_help_explains_commands():
    r = tunaflow("--help")
    assert r.returncode == 0
    for cmd in ("tune-op", "target", "log", "demo"):
        assert cmd in r.stdout
    h = tunaflow("tune-op", "--help").stdout
    assert "--trials" in h and "resumes" in h and "--early-stopping" in h


def test_log_plot_writes_one_chart_per_task_with_one_point_per_trial(tmp_path):
    import struct

    log = str(tmp_path / "log")
    for m in ("8", "12"):
        r = tunaflow("tune-op", "matmul", "--m", m, "--n", "16", "--k", "8", "--trials", "5", "--batch-size", "5",
                     "--log", log, "--no-prefect", "--json", "--tuner", "random")
        assert r.returncode == 0, r.stderr
    r = tunaflow("log", "plot", log, "-o", str(tmp_path / "charts"))
    assert r.returncode == 0, r.stderr
    pngs = sorted((tmp_path / "charts").glob("*.png"))
    assert len(pngs) == 2
    for png in pngs:
        head = png.read_bytes()[:24]
        assert head[:8] == b"\x89PNG\r\n\x1a\n"
        width, height = struct.unpack(">II", head[16:24])
        assert width >= 600 and height >= 300
        data = json.loads(png.with_suffix(".json").read_text())
        assert data["trial"] == [1, 2, 3, 4, 5] and len(data["gflops"]) == 5
        assert data["best"] == sorted(data["best"]) and max(data["gflops"]) == data["best"][-1]
    assert tunaflow("log", "plot", str(tmp_path / "nolog")).returncode != 0
