"""Hostile network input to a real tracker on 127.0.0.1: every request gets the right status, the
tracker neither crashes nor keeps the resources, and it still serves real work afterwards."""

from __future__ import annotations

import asyncio
import os
import time

import httpx
import psutil
import pytest
from fastapi import FastAPI
from test_measure_kernels import FAST
from test_rpc import TOKEN
from test_rpc_restart import builds

from schemas import MeasureErrorNo
from stages.rpc.auth import AUTH_HEADER, Guard, RequestSigner, signature
from stages.rpc.tracker import IDLE_S
from testing.cli import tunaflow
from testing.cluster import Cluster
from testing.hostile_rpc import SlowConnections, Tally, bad_credentials, burst, malformed, oversized, replayed


def footprint(pid: int) -> tuple[float, int]:
    proc = psutil.Process(pid)
    return proc.memory_info().rss / 2**20, proc.num_fds()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with Cluster(tmp_path_factory.mktemp("hostile"), TOKEN, max_body_mb=1) as c:
        yield c.start("agent0")


def test_hostile_requests_get_the_right_status_and_leave_nothing_behind(cluster, host):
    tracker = cluster.procs["tracker"]
    tally = Tally()
    burst(cluster.url, TOKEN, Tally(), 100)  # warm up, so the baseline includes the server's steady state
    time.sleep(1.5)  # and the warm-up's connections are closed
    rss0, fds0 = footprint(tracker.pid)
    slow = SlowConnections("127.0.0.1", cluster.port, 50)
    try:
        bad_credentials(cluster.url, TOKEN, tally, n=3)
        replayed(cluster.url, TOKEN, tally, n=3)
        malformed(cluster.url, TOKEN, tally, n=1)
        oversized(cluster.url, TOKEN, 1024 * 1024, tally, n=1)
        burst(cluster.url, TOKEN, tally, 200)  # served while the slow connections hang
        assert slow.closed_by_server(timeout=IDLE_S + 5) == 50  # the server drops them, not the client
    finally:
        slow.close()
    assert tally.wrong == []
    assert tally.sent["replayed request"] == 3 and tally.sent["burst"] == 200
    time.sleep(0.5)
    rss1, fds1 = footprint(tracker.pid)
    assert tracker.poll() is None
    assert fds1 <= fds0 + 4, f"file descriptors {fds0} -> {fds1}"
    assert rss1 - rss0 < 40, f"RSS {rss0:.0f} -> {rss1:.0f} MiB"
    with cluster.runner(FAST) as runner:
        results = runner.run(builds(host, 2))
    assert [r.error_no for r in results] == [MeasureErrorNo.no_error] * 2


def test_the_tracker_binds_loopback_by_default_and_refuses_to_start_without_a_token(cluster):
    addrs = {c.laddr.ip for c in psutil.Process(cluster.procs["tracker"].pid).net_connections("tcp")
             if c.status == psutil.CONN_LISTEN}
    assert addrs == {"127.0.0.1"}
    env = {k: v for k, v in os.environ.items() if k != "TUNAFLOW_RPC_TOKEN"}
    for host in ("0.0.0.0", "127.0.0.1"):
        proc = tunaflow("tracker", "serve", "--host", host, "--port", "1", timeout=60, env=env)
        assert proc.returncode == 2 and "no RPC token" in proc.stderr, proc.stderr


def test_nonces_are_forgotten_after_the_window_and_old_requests_stay_refused():
    app = FastAPI()
    app.get("/v1/status")(lambda: {"ok": True})
    guard = Guard(app, TOKEN, window_s=0.2)

    async def scenario() -> list[int]:
        transport = httpx.ASGITransport(app=guard)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", auth=RequestSigner(TOKEN)) as http:
            statuses = [(await http.get("/v1/status")).status_code for _ in range(50)]
            captured = {AUTH_HEADER: signature(TOKEN, "GET", "/v1/status", b"", epoch=guard.epoch)}
            statuses.append((await http.get("/v1/status", auth=None, headers=captured)).status_code)
            assert len(guard._seen) == 52  # 50 requests (the first also signed for no epoch), 1 captured
            await asyncio.sleep(0.5)
            statuses.append((await http.get("/v1/status", auth=None, headers=captured)).status_code)
            statuses.append((await http.get("/v1/status")).status_code)
            assert len(guard._seen) == 1
        return statuses

    assert asyncio.run(scenario()) == [200] * 51 + [401, 200]
