"""tune-op's numpy reference is measured where numpy runs, this host: for candidates measured on RPC devices
the report carries no numpy figure, and says why, instead of this host's speed next to the device's."""

import json

import pytest

from testing.cli import tunaflow
from testing.cluster import Cluster

TOKEN = "op-reference-test-token-0123456789"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with Cluster(tmp_path_factory.mktemp("rpc"), TOKEN) as c:
        yield c.start("agent0")


def test_tune_op_over_rpc_reports_no_host_numpy_figure(cluster, tmp_path):
    args = ["tune-op", "matmul", "--m", "32", "--n", "32", "--k", "32", "--trials", "2", "--batch-size", "2",
            "--tuner", "random", "--no-prefect", "--log", tmp_path / "log", "--runner", "rpc", "--key", "dev",
            "--tracker", f"127.0.0.1:{cluster.port}", "--remeasure-top-k", "0"]
    run = tunaflow(*args, "--json", env=cluster.env)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["trials"] == 2 and report["best_gflops"] > 0
    assert report["numpy_gflops"] is None
    assert report["numpy_note"] == "not measured: the candidates ran on the devices under key 'dev', numpy here"
    shown = tunaflow(*args, env=cluster.env)  # the log already holds both trials: the report alone
    assert shown.returncode == 0, shown.stderr
    assert "numpy         : not measured: the candidates ran on the devices under key 'dev'" in shown.stdout


def test_tune_op_here_reports_numpys_figure(tmp_path):
    run = tunaflow("tune-op", "matmul", "--m", "32", "--n", "32", "--k", "32", "--trials", "2", "--batch-size", "2",
                   "--tuner", "random", "--no-prefect", "--log", tmp_path / "log", "--remeasure-top-k", "0", "--json")
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["numpy_gflops"] > 0 and report["numpy_note"] is None
