"""Agents and clients trust only the tracker: a process without the token on the tracker's port, a replayed
signed answer, and a request captured before a real tracker restart, all as real processes on 127.0.0.1."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from test_measure_kernels import FAST, TASK
from test_rpc import TOKEN
from test_rpc_restart import builds

from schemas import MeasureErrorNo
from schemas.rpc import MeasureJob, SubmitRequest
from stages.rpc.auth import AUTH_HEADER, REPLY_HEADER, RequestSigner
from stages.rpc.client import TrackerError
from stages.templates import matmul
from testing.cluster import Cluster, wait_for_request
from testing.rogue_tracker import canary_object, captured, lease, plain

REFUSED = "not signed by the tracker"


@pytest.fixture
def canary(tmp_path, host):
    marker = tmp_path / "canary-ran"
    config = matmul.default_config(TASK, host)
    return marker, MeasureJob.of(TASK, host, dict(config.knobs), canary_object(host, marker), FAST)


def test_an_agent_refuses_a_rogue_and_a_replayed_answer_and_keeps_serving(tmp_path, host, canary):
    marker, job = canary
    with Cluster(tmp_path, TOKEN, agent_timeout=1.0) as c:
        c.start_tracker()
        # A holder of the token queues the canary and leases it as an agent would: the signed answers are
        # what an eavesdropper on plain HTTP captures.
        c.client.request("POST", "/v1/jobs", SubmitRequest(key="dev", jobs=[job]).model_dump(mode="json"))
        with httpx.Client(base_url=c.url, auth=RequestSigner(TOKEN)) as spy:
            reg = spy.post("/v1/agents", json={"key": "dev", "target": host.model_dump(mode="json"), "name": "spy"})
            spy_id = reg.json()["agent_id"]
            nxt = spy.post(f"/v1/agents/{spy_id}/next", json={"wait_s": 1})
            done = {"job_id": nxt.json()["job_id"], "result": {"error_no": 4, "error_msg": "not run"}}
            spy.post(f"/v1/agents/{spy_id}/result", json=done).raise_for_status()  # no one else gets the canary
            spy.delete(f"/v1/agents/{spy_id}").raise_for_status()
        assert nxt.status_code == 200 and REPLY_HEADER in nxt.headers
        c.add_agents("agent0")
        c.kill("tracker")

        forged = {"agents": plain(200, {"agent_id": "a1", "heartbeat_s": 0.5}), "next": plain(200, lease("j1", job))}
        seen = [c.rogue("rogue", forged)]
        assert wait_for_request(seen[-1], "/v1/agents"), seen[-1].read_text()
        time.sleep(3)
        c.kill("rogue")
        time.sleep(1.5)  # the agent sees the port closed (a different problem, logged once)
        seen.append(c.rogue("replay", {"agents": captured(reg), "next": captured(nxt)}))
        assert wait_for_request(seen[-1], "/v1/agents"), seen[-1].read_text()
        time.sleep(3)
        c.kill("replay")

        for requests in seen:  # never got past registering: no lease was believed, no result was posted
            lines = requests.read_text().splitlines()
            assert not any(r.split(" ")[1].endswith(("/next", "/result")) for r in lines), lines
        assert not marker.exists()
        assert c.procs["agent0"].poll() is None
        log = (tmp_path / "agent0.log").read_text()
        assert log.count(REFUSED) == 2 and "Traceback" not in log, log
        assert "carries no tracker signature" in log and "not for this request" in log

        c.start_tracker()
        c.devices(1)
        with c.runner(FAST) as runner:
            assert [r.error_no for r in runner.run(builds(host, 2))] == [MeasureErrorNo.no_error] * 2


def test_a_client_refuses_a_rogue_tracker(tmp_path):
    with Cluster(tmp_path, TOKEN) as c:
        c.start_tracker()
        c.kill("tracker")
        c.rogue("rogue", {"status": plain(200, {"keys": [], "requeued": 0, "failed_after_retries": 0})})
        with pytest.raises(TrackerError, match="refused an answer") as refused:
            for _ in range(300):  # until the rogue listens
                try:
                    c.client.status()
                except TrackerError as exc:
                    if "cannot reach" not in str(exc):
                        raise
                time.sleep(0.1)
        assert "carries no tracker signature" in str(refused.value)
        status = c.tracker_status()
        assert status.returncode == 2 and "refused an answer" in status.stderr and "Traceback" not in status.stderr


def test_a_request_captured_before_a_restart_is_refused_after_it(tmp_path, host):
    c = Cluster(tmp_path, TOKEN)
    try:
        c.start_tracker()
        job = MeasureJob.of(TASK, host, {}, b"obj", FAST)
        body = SubmitRequest(key="dev", jobs=[job], queue_timeout_s=600).model_dump_json().encode()
        signer = RequestSigner(TOKEN)
        with httpx.Client(base_url=c.url, auth=signer) as http:
            first = http.post("/v1/jobs", content=body, headers={"content-type": "application/json"})
        assert first.status_code == 200
        sent = first.request.headers[AUTH_HEADER]  # the signed request as it went over the wire
        replay = {AUTH_HEADER: sent, "content-type": "application/json"}
        assert httpx.post(c.url + "/v1/jobs", content=body, headers=replay).status_code == 401  # same start
        assert c.client.status().keys[0].queued == 1

        c.kill("tracker")
        c.start_tracker()
        again = httpx.post(c.url + "/v1/jobs", content=body, headers=replay)
        assert again.status_code == 401 and "another start of the tracker" in again.json()["detail"]
        assert c.client.status().keys == []  # nothing was queued by the replay (and the client signed again)
    finally:
        c.close()


class Tamper(httpx.AsyncBaseTransport):
    """A man in the middle between a client and a real Guard: rewrites each answer with `edit`."""

    def __init__(self, app, edit):
        self.inner, self.edit = httpx.ASGITransport(app=app), edit

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        resp = await self.inner.handle_async_request(request)
        status, headers, body = self.edit(resp.status_code, dict(resp.headers), await resp.aread())
        headers["content-length"] = str(len(body))
        return httpx.Response(status, headers=headers, content=body, request=request)


def test_a_signature_binds_the_answer_to_its_status_body_and_request():
    from fastapi import FastAPI

    from stages.rpc.auth import Guard, UntrustedResponse

    app = FastAPI()
    app.get("/v1/status")(lambda: {"ok": True})
    guard = Guard(app, TOKEN)
    first: dict = {}

    def keep_first(status, headers, body):  # replays the first signed answer for every later request
        first.setdefault("answer", (status, headers, body))
        return first["answer"] if headers.get(REPLY_HEADER) else (status, headers, body)

    edits = {"untouched": lambda s, h, b: (s, h, b), "body swapped": lambda s, h, b: (s, h, b.replace(b"true", b"0")),
             "status changed": lambda s, h, b: (200 if s == 401 else 500, h, b),
             "signature dropped": lambda s, h, b: (s, {k: v for k, v in h.items() if k != REPLY_HEADER}, b),
             "replayed": keep_first}

    async def outcome(kind: str) -> str:
        transport = Tamper(guard, edits[kind])
        async with httpx.AsyncClient(transport=transport, base_url="http://t", auth=RequestSigner(TOKEN)) as http:
            try:
                for _ in range(2):
                    resp = await http.get("/v1/status")
                return str(resp.status_code)
            except UntrustedResponse as exc:
                return f"refused {exc.status_code}"

    got = {kind: asyncio.run(outcome(kind)) for kind in edits}
    assert got == {"untouched": "200", "body swapped": "refused 200", "status changed": "refused 200",
                   "signature dropped": "refused 401", "replayed": "refused 401"}, got
