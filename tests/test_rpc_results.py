"""The host judges device results, agents survive malformed jobs, idle floods leave the agents their slots,
and odd RPC input gets a clear answer: real trackers, agents and sockets on 127.0.0.1."""

from __future__ import annotations

import json
import math
import signal
import time

import httpx
import pytest
from test_measure_kernels import FAST, TASK
from test_rpc import TOKEN
from test_rpc_restart import builds
from typer.testing import CliRunner

from schemas import MeasureErrorNo, MeasureResult
from schemas.rpc import MeasureJob, SubmitRequest
from stages.measure.plausible import fastest_plausible_s, judge
from stages.rpc.auth import AUTH_HEADER, RequestSigner, signature
from stages.templates import matmul
from testing.cli import tunaflow
from testing.cluster import Cluster
from testing.forged_agent import FORGERIES
from testing.hostile_rpc import IdleFlood, current_epoch

IMPLAUSIBLE = MeasureErrorNo.implausible_result


def test_judge_refuses_what_no_measurement_gives(host):
    floor = fastest_plausible_s(TASK, host, 1)
    assert 0 < floor < 1e-6  # a 32x48x40 matmul: far below any real timing, far above 1e-12
    for kind, forged in FORGERIES.items():
        result = judge({"costs": [1e-3], **forged}, TASK, host, 1)
        assert result.error_no == IMPLAUSIBLE and result.costs == () and not result.ok, kind
    assert "GFLOPS" in judge({"costs": [1e-12]}, TASK, host, 1).error_msg
    honest = judge({"costs": [2e-5, 2.1e-5]}, TASK, host, 1)
    assert honest.ok and honest.median == pytest.approx(2.05e-5)
    assert judge({"costs": [floor / 2]}, TASK, host, 4).ok  # four threads may be four times faster
    failed = judge(MeasureResult(error_no=MeasureErrorNo.wrong_answer, error_msg="x" * 10**5), TASK, host, 1)
    assert failed.error_no == MeasureErrorNo.wrong_answer and len(failed.error_msg) < 2100


@pytest.fixture(scope="module")
def forger(tmp_path_factory):
    with Cluster(tmp_path_factory.mktemp("forger"), TOKEN) as c:
        c.start_tracker()
        c.spawn("forger", "--tracker", c.url, "--key", "dev", module="testing.forged_agent")
        c.devices(1)
        yield c


def test_forged_results_are_implausible_errors_and_the_batch_is_kept(forger, host):
    n = 1 + len(FORGERIES)
    with forger.runner(FAST) as runner:
        results = runner.run(builds(host, n))
    assert len(results) == n
    assert results[0].ok, results[0].error_msg  # the forger's honest turn
    assert [r.error_no for r in results[1:]] == [IMPLAUSIBLE] * (n - 1), [r.error_msg for r in results]
    assert all(math.isfinite(r.build_s) and r.costs == () for r in results[1:])
    assert forger.procs["forger"].poll() is None and forger.procs["tracker"].poll() is None


def test_tune_op_over_a_lying_device_records_errors_and_finishes(forger, tmp_path, host):
    from stages.log import TuningLog

    run = tunaflow("tune-op", "matmul", "--m", "32", "--n", "48", "--k", "40", "--trials", "18", "--batch-size", "9",
                   "--tuner", "random", "--no-prefect", "--json", "--log", tmp_path / "log", "--runner", "rpc",
                   "--tracker", f"127.0.0.1:{forger.port}", "--key", "dev", "--remeasure-top-k", "0", env=forger.env)
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr[-3000:]
    report = json.loads(run.stdout)
    records = TuningLog(tmp_path / "log").records()
    assert report["trials"] == 18 and len(records) == 18
    codes = [r.result.error_no for r in records]
    assert codes.count(IMPLAUSIBLE) >= 14 and set(codes) <= {MeasureErrorNo.no_error, IMPLAUSIBLE}
    ok = [r for r in records if r.result.ok]
    assert ok and report["best_gflops"] == pytest.approx(max(r.gflops for r in ok), rel=0.01)
    assert report["best_gflops"] < TASK.flops / fastest_plausible_s(TASK, host, 1) / 1e9


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with Cluster(tmp_path_factory.mktemp("robust"), TOKEN) as c:
        yield c.start("agent0")


def test_malformed_jobs_are_refused_or_answered_and_the_agent_keeps_serving(cluster, host):
    auth = RequestSigner(TOKEN)
    job = MeasureJob.of(TASK, host, dict(matmul.default_config(TASK, host).knobs), b"o", FAST)
    raw = SubmitRequest(key="dev", jobs=[job]).model_dump(mode="json")
    raw["jobs"][0]["obj_b64"] = "this is not base64!"
    resp = httpx.post(cluster.url + "/v1/jobs", json=raw, auth=auth)
    assert resp.status_code == 422 and "obj_b64" in resp.text and "not base64" in resp.text

    good = builds(host, 1)[0]
    broken = [job.model_copy(update={"obj_b64": "AAAA"}),  # base64, but not an object file
              job.model_copy(update={"knobs": {"bogus": "x"}}),  # knobs the template does not know
              job.model_copy(update={"target": host.model_copy(update={"triple": "aarch64-linux-gnu"})}),
              MeasureJob.of(good.task, good.target, dict(good.config.knobs), good.obj, FAST)]
    ids = cluster.client.request("POST", "/v1/jobs", SubmitRequest(key="dev", jobs=broken).model_dump(mode="json"))
    pending, results = ids.json()["job_ids"], {}
    deadline = time.monotonic() + 120
    while len(results) < len(pending) and time.monotonic() < deadline:
        reply = cluster.client.request("POST", "/v1/jobs/results", {"job_ids": pending, "wait_s": 5}).json()
        results.update(reply["results"])
    codes = [MeasureResult.model_validate(results[j]).error_no for j in pending]
    assert codes[:3] == [MeasureErrorNo.runtime_error] * 3 and codes[3] == MeasureErrorNo.no_error, results
    assert cluster.procs["agent0"].poll() is None
    assert cluster.client.status().keys[0].devices[0].measured >= 4


def test_an_agent_answers_a_job_it_cannot_read_and_keeps_serving(tmp_path, host):
    """A token holder that is not a correct tracker (here a signing fake) hands out a job whose object is not
    base64: the agent posts an error result for it and asks for the next job."""
    from testing.rogue_tracker import lease, plain

    job = MeasureJob.of(TASK, host, dict(matmul.default_config(TASK, host).knobs), b"o", FAST)
    unreadable = lease("j1", job)
    unreadable["job"]["obj_b64"] = "this is not base64!"
    with Cluster(tmp_path, TOKEN) as c:
        requests = c.rogue("fake", {"agents": plain(200, {"agent_id": "a1", "heartbeat_s": 0.5}),
                                    "next": plain(200, unreadable)}, sign=True)
        c.start_agent("agent")
        deadline = time.monotonic() + 60
        while sum("/result " in r for r in requests.read_text().splitlines()) < 2:
            assert time.monotonic() < deadline and c.procs["agent"].poll() is None, (tmp_path / "agent.log").read_text()
            time.sleep(0.1)
        posted = [r for r in requests.read_text().splitlines() if "/result " in r]
        assert c.procs["agent"].poll() is None
    result = MeasureResult.model_validate(json.loads(posted[0].split(" ", 2)[2])["result"])
    assert result.error_no == MeasureErrorNo.runtime_error and "malformed job" in result.error_msg
    assert "obj_b64" in result.error_msg and "not base64" in result.error_msg


def flood_while_measuring(cluster, host, n: int = 300) -> None:
    flood = IdleFlood("127.0.0.1", cluster.port, n)
    try:
        deadline = time.monotonic() + 20
        while flood.opened < 300:
            assert time.monotonic() < deadline, f"only {flood.opened} idle sockets opened"
            time.sleep(0.05)
        time.sleep(3)  # longer than the agent timeout: a starved agent would be dropped by now
        with cluster.runner(FAST) as runner:
            results = runner.run(builds(host, 4, skip=20))
        status = cluster.client.status()
        opened = flood.opened
    finally:
        flood.stop()
    assert [r.error_no for r in results] == [MeasureErrorNo.no_error] * 4, [r.error_msg for r in results]
    assert [d.name for d in status.keys[0].devices] == ["agent0"] and status.requeued == 0
    assert opened > n  # the server closed idle strangers and the flood kept reopening them


def test_an_idle_flood_leaves_the_agents_their_slots(cluster, host):
    flood_while_measuring(cluster, host)


def test_a_flood_past_the_connection_limit_evicts_strangers_not_agents(tmp_path, host):
    with Cluster(tmp_path, TOKEN, tracker_args=("--max-connections", "128")) as c:
        flood_while_measuring(c.start("agent0"), host)


def test_ctrl_c_stops_the_tracker_and_the_agent_cleanly(tmp_path):
    c = Cluster(tmp_path, TOKEN)
    try:
        c.start("agent0")
        time.sleep(1)  # the agent is in a long poll
        tracker, agent = c.procs["tracker"], c.procs["agent0"]
        start = time.monotonic()
        tracker.send_signal(signal.SIGINT)
        tracker.wait(10)
        tracker_s = time.monotonic() - start
        time.sleep(1.5)
        start = time.monotonic()
        agent.send_signal(signal.SIGINT)
        code = agent.wait(10)
        agent_s = time.monotonic() - start
    finally:
        c.close()
    tracker_log, agent_log = (tmp_path / "tracker.log").read_text(), (tmp_path / "agent0.log").read_text()
    assert tracker_s < 2.5 and "Traceback" not in tracker_log, (tracker_s, tracker_log)
    assert agent_s < 2.5 and code == 130 and "Traceback" not in agent_log, (agent_s, agent_log)
    assert "tracker unreachable" in agent_log and "stopped (interrupted)" in agent_log


def test_odd_rpc_input_gets_a_clear_answer(cluster, tmp_path):
    epoch = current_epoch(cluster.url, TOKEN)
    non_ascii = signature(TOKEN, "GET", "/v1/status", b"", epoch=epoch).encode()[:-2] + "é".encode()
    resp = httpx.get(cluster.url + "/v1/status", headers={AUTH_HEADER: non_ascii})
    assert resp.status_code == 401 and "malformed" in resp.json()["detail"]
    for path, body in (("/v1/jobs/results", b'{"job_ids": ["j1"], "wait_s": NaN}'),
                       ("/v1/agents/a1/next", b'{"wait_s": Infinity}')):
        resp = httpx.post(cluster.url + path, content=body, auth=RequestSigner(TOKEN),
                          headers={"content-type": "application/json"})
        assert resp.status_code == 422 and "wait_s" in resp.json()["detail"], resp.text

    from tunaflow.cli import app

    cli = CliRunner()
    env = {"TUNAFLOW_RPC_TOKEN": TOKEN, "COLUMNS": "300"}
    for args, why in ((["--port", "70000"], "Invalid value for '--port'"),
                      (["--max-body-mb", "-1"], "Invalid value for '--max-body-mb'"),
                      (["--agent-timeout", "-5"], "Invalid value for '--agent-timeout'"),
                      (["--agent-timeout", "nan"], "Invalid value for '--agent-timeout'"),
                      (["--max-retries", "-1"], "Invalid value for '--max-retries'"),
                      (["--tls-cert", str(tmp_path / "c.pem")], "--tls-cert and --tls-key go together")):
        out = cli.invoke(app, ["tracker", "serve", *args], env=env)
        assert out.exit_code == 2 and why in out.output and "Traceback" not in out.output, (args, out.output)
    out = cli.invoke(app, ["runner", "serve", "--key", "dev", "--tracker", "127.0.0.1:70000"], env=env)
    assert out.exit_code == 2 and "port 1-65535" in out.output

    name = "[/]:a:[bold]x"
    cluster.start_agent("marked", key="odd", shown=name)
    cluster.wait(lambda s: any(d.name == name for k in s.keys for d in k.devices))
    shown = cluster.tracker_status()
    assert shown.returncode == 0 and name in shown.stdout, shown.stdout + shown.stderr
    cluster.procs.pop("marked").terminate()
