"""The tracker over TLS (uvicorn's own): agents and clients reach it at https:// and verify it with a CA file."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from test_measure_kernels import FAST
from test_rpc import TOKEN
from test_rpc_restart import builds

from schemas import MeasureErrorNo
from schemas.options import RunnerSpec
from stages.rpc.client import RPCRunner, TrackerClient, TrackerError
from testing.cli import ROOT, tunaflow
from testing.cluster import free_port


@pytest.fixture
def cert(tmp_path):
    key, pem = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(pem),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    return pem, key


def test_a_tls_tracker_serves_agents_and_clients_that_verify_it(tmp_path, cert, host):
    pem, key = cert
    port = free_port()
    url = f"https://127.0.0.1:{port}"
    env = {**os.environ, "TUNAFLOW_RPC_TOKEN": TOKEN}
    procs = []
    logs = [open(tmp_path / f"{n}.log", "w") for n in ("tracker", "agent")]  # noqa: SIM115 - closed below
    try:
        procs.append(subprocess.Popen([sys.executable, "-m", "tunaflow", "tracker", "serve", "--port", str(port),
                                       "--tls-cert", str(pem), "--tls-key", str(key)], cwd=ROOT, env=env,
                                      stdout=logs[0], stderr=subprocess.STDOUT))
        procs.append(subprocess.Popen([sys.executable, "-m", "tunaflow", "runner", "serve", "--tracker", url,
                                       "--key", "dev", "--tls-ca", str(pem)], cwd=ROOT, env=env,
                                      stdout=logs[1], stderr=subprocess.STDOUT))
        client = TrackerClient(url, TOKEN, ca_file=str(pem))
        deadline = time.monotonic() + 60
        while True:
            try:
                if client.status().keys:
                    break
            except TrackerError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "agent.log").read_text()
            time.sleep(0.2)
        (tmp_path / "token").write_text(TOKEN)
        spec = RunnerSpec(kind="rpc", key="dev", port=port, scheme="https", tls_ca=str(pem),
                          token_file=str(tmp_path / "token"))
        with RPCRunner.from_spec(spec, FAST) as runner:
            assert [r.error_no for r in runner.run(builds(host, 2))] == [MeasureErrorNo.no_error] * 2

        with pytest.raises(TrackerError, match="CERTIFICATE_VERIFY_FAILED"):  # no CA: the system store refuses it
            TrackerClient(url, TOKEN).status()
        plain = tunaflow("tracker", "status", "--tracker", f"127.0.0.1:{port}", timeout=60, env=env)
        assert plain.returncode == 2 and "Traceback" not in plain.stderr
        ok = tunaflow("tracker", "status", "--tracker", url, timeout=60, env={**env, "TUNAFLOW_RPC_CA": str(pem)})
        assert ok.returncode == 0 and "devices 1" in ok.stdout, ok.stderr
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)
        for log in logs:
            log.close()
