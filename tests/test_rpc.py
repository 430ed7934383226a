"""RPC measurement with real processes and real sockets on 127.0.0.1: a tracker, device agents, a client."""

from __future__ import annotations

import itertools
import json
import os
import threading
import time

import httpx
import pytest
from test_measure_kernels import FAST, TASK, build_of

from schemas import MeasureErrorNo, MeasureResult
from schemas.rpc import MeasureJob, SubmitRequest
from stages.measure.builder import build_one
from stages.rpc.auth import REPLY_HEADER, RequestSigner, UntrustedResponse
from stages.rpc.tracker import TrackerState, _Agent
from stages.templates import matmul
from testing.cli import tunaflow
from testing.cluster import Cluster, free_port

TOKEN = "test-token-0123456789abcdef"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with Cluster(tmp_path_factory.mktemp("rpc"), TOKEN, max_body_mb=2) as c:
        yield c.start("agent0", "agent1")


def distinct_builds(target, n: int):
    space = matmul.space(TASK, target)
    configs = [space.config(i) for i in itertools.islice(space.valid_indices(), 0, 97 * n, 97)]
    return [build_one(TASK, c, target) for c in configs]


def test_two_agents_measure_a_batch(cluster, host):
    builds = distinct_builds(host, 6)
    with cluster.runner(FAST) as runner:
        assert runner.device_target() == host
        results = runner.run(builds)
    assert [r.error_no for r in results] == [MeasureErrorNo.no_error] * 6
    assert all(len(r.costs) == 3 and r.median > 0 for r in results)
    (dev,) = cluster.client.status().keys
    assert dev.key == "dev" and dev.free == 2 and dev.queued == 0
    assert sorted(d.name for d in dev.devices) == ["agent0", "agent1"]
    assert all(d.measured > 0 for d in dev.devices)


def test_faulty_kernels_are_recorded_and_the_agents_survive(cluster, host):
    builds = [build_of(k, host) for k in ("segfault", "hang", "wrong", "sigill", "ok")]
    with cluster.runner(FAST) as runner:
        results = runner.run(builds)
    assert [r.error_no for r in results] == [MeasureErrorNo.runtime_error, MeasureErrorNo.run_timeout,
                                             MeasureErrorNo.wrong_answer, MeasureErrorNo.runtime_error,
                                             MeasureErrorNo.no_error]
    assert "SIGSEGV" in results[0].error_msg and "SIGILL" in results[3].error_msg
    assert all(p.poll() is None for p in cluster.procs.values())
    assert len(cluster.client.status().keys[0].devices) == 2


def test_wrong_token_is_rejected(cluster):
    with pytest.raises(UntrustedResponse) as refused:  # the tracker cannot sign for a wrong token's request
        httpx.get(cluster.url + "/v1/status", auth=RequestSigner("not-the-token-0123456789"))
    assert refused.value.status_code == 401
    resp = httpx.get(cluster.url + "/v1/status")
    assert resp.status_code == 401 and "token" in resp.json()["detail"] and REPLY_HEADER not in resp.headers
    cli = cluster.tracker_status(env={**os.environ, "TUNAFLOW_RPC_TOKEN": "not-the-token-0123456789"})
    assert cli.returncode == 2 and "rejected the RPC token" in cli.stderr
    ok = cluster.tracker_status()
    assert ok.returncode == 0 and "dev" in ok.stdout and "free 2" in ok.stdout


def test_oversized_and_malformed_requests_get_4xx_and_the_tracker_stays_up(cluster, host):
    auth = RequestSigner(TOKEN)
    job = MeasureJob.of(TASK, host, {"mr": 1}, b"\0" * (3 * 1024 * 1024), FAST)
    big = SubmitRequest(key="dev", jobs=[job]).model_dump_json()
    resp = httpx.post(cluster.url + "/v1/jobs", content=big, headers={"content-type": "application/json"}, auth=auth)
    assert resp.status_code == 413
    resp = httpx.post(cluster.url + "/v1/jobs", content=b"{not json", auth=auth)
    assert resp.status_code == 422
    resp = httpx.post(cluster.url + "/v1/jobs", json={"key": "dev", "jobs": [{"task": "x"}]}, auth=auth)
    assert resp.status_code == 422 and "jobs" in resp.text
    resp = httpx.post(cluster.url + "/v1/agents/nobody/next", json={"wait_s": 0}, auth=auth)
    assert resp.status_code == 404
    assert cluster.client.status().keys[0].free == 2


def test_an_agent_killed_mid_batch_loses_nothing(tmp_path, host):
    with Cluster(tmp_path, TOKEN, agent_timeout=1.0) as c:
        c.start("a", "b")
        slow = FAST.model_copy(update={"min_repeat_ms": 250.0, "repeat": 2})
        builds = distinct_builds(host, 4)
        results: list[MeasureResult] = []
        with c.runner(slow) as runner:
            worker = threading.Thread(target=lambda: results.extend(runner.run(builds)))
            worker.start()
            busy = c.wait(lambda s: any(d.busy for k in s.keys for d in k.devices), timeout=30)
            victim = next(d.name for d in busy.keys[0].devices if d.busy)
            c.procs[victim].kill()
            worker.join(120)
        assert [r.error_no for r in results] == [MeasureErrorNo.no_error] * 4
        status = c.wait(lambda s: len(s.keys[0].devices) == 1)
        assert status.requeued >= 1 and status.failed_after_retries == 0
        assert [d.name for d in status.keys[0].devices] != [victim]


def test_a_job_whose_devices_keep_vanishing_fails_after_bounded_retries(host):
    state = TrackerState(agent_timeout_s=0.0, max_retries=1)
    job = MeasureJob.of(TASK, host, {}, b"obj", FAST)
    (jid,) = state.submit(SubmitRequest(key="dev", jobs=[job]))
    for attempt in range(2):
        agent = _Agent(f"a{attempt}", "dev", "", host, time.monotonic() - 1)
        state.agents[agent.id] = agent
        assert state.lease(agent).job_id == jid
        state.reap()
    result = state.jobs[jid].result
    assert result is not None and result.error_no == MeasureErrorNo.runtime_error
    assert "gave up after 1 requeues" in result.error_msg and state.requeued == 1


def test_a_job_no_device_takes_is_an_error(host):
    state = TrackerState()
    (jid,) = state.submit(SubmitRequest(key="nobody", jobs=[MeasureJob.of(TASK, host, {}, b"o", FAST)],
                                        queue_timeout_s=0.001))
    time.sleep(0.01)
    state.reap()
    assert state.jobs[jid].result.error_no == MeasureErrorNo.run_timeout
    assert "no device under key 'nobody'" in state.jobs[jid].result.error_msg


def test_tune_op_over_rpc_from_the_command_line(cluster, tmp_path):
    from stages.log import TuningLog

    args = ["tune-op", "matmul", "--m", "32", "--n", "32", "--k", "32", "--trials", "4", "--batch-size", "4",
            "--tuner", "random", "--no-prefect", "--json", "--log", tmp_path / "log", "--runner", "rpc",
            "--tracker", f"127.0.0.1:{cluster.port}"]
    run = tunaflow(*args, "--key", "dev", "--remeasure-top-k", "2", env=cluster.env)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["trials"] == 4 and report["best_gflops"] > 0
    records = TuningLog(tmp_path / "log").records()
    assert sorted(r.tuner for r in records) == ["random"] * 4 + ["remeasure"] * 2
    nobody = tunaflow(*args, "--key", "nobody", timeout=120, env=cluster.env)
    assert nobody.returncode == 2 and "no device under key 'nobody'" in nobody.stderr


def test_servers_refuse_to_start_without_a_token(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TUNAFLOW_RPC_TOKEN"}
    for args in (["tracker", "serve", "--port", str(free_port())], ["runner", "serve", "--key", "dev"]):
        r = tunaflow(*args, timeout=60, env=env)
        assert r.returncode == 2 and "no RPC token" in r.stderr, (args, r.stderr)
    (tmp_path / "short").write_text("abc\n")
    r = tunaflow("tracker", "status", "--token-file", tmp_path / "short", timeout=60, env=env)
    assert r.returncode == 2 and "shorter than 16 characters" in r.stderr
