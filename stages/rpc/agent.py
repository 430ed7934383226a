"""The device agent: registers under a key, pulls one job at a time, measures it in an isolated worker.

Measuring goes through the same `LocalRunner` as local tuning (a spawned worker process that
loads the shipped object, checks it against numpy and times it natively), so a crashing or
hanging kernel costs a worker, never the agent. A heartbeat thread keeps the lease alive
while a measurement runs; if the agent dies, the tracker gives its job to another device.
"""

from __future__ import annotations

import logging
import os
import socket
import threading

import httpx

from schemas.config import Config
from schemas.measure import MeasureErrorNo, MeasureResult
from schemas.options import MeasureOptions
from schemas.rpc import Lease, RegisterReply, RegisterRequest, ResultPost
from schemas.target import Target
from stages.measure.artifact import BuildResult
from stages.measure.runner import LocalRunner
from stages.rpc.auth import RequestSigner

log = logging.getLogger("tunaflow.agent")
POLL_S = 10.0
RETRY_S = 1.0


class Agent:
    def __init__(self, tracker_url: str, key: str, token: str, target: Target, name: str = ""):
        self.key, self.target = key, target
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self._http = httpx.Client(base_url=tracker_url, auth=RequestSigner(token),
                                  timeout=httpx.Timeout(10.0, read=POLL_S + 10.0))
        self._runner = LocalRunner(MeasureOptions())
        self._stop = threading.Event()
        self.agent_id: str | None = None
        self._heartbeat_s = 1.0

    def register(self) -> None:
        req = RegisterRequest(key=self.key, target=self.target, name=self.name)
        reply = RegisterReply.model_validate(self._post("/v1/agents", req.model_dump(mode="json")).json())
        self.agent_id, self._heartbeat_s = reply.agent_id, reply.heartbeat_s
        log.info("registered as %s under key %s", self.agent_id, self.key)

    def serve(self) -> None:
        """Pull and measure jobs until `stop()`; a lost tracker is retried, never fatal."""
        self._runner.start()
        beat = threading.Thread(target=self._beat, daemon=True, name="tunaflow-heartbeat")
        beat.start()
        try:
            while not self._stop.is_set():
                try:
                    if self.agent_id is None:
                        self.register()
                    lease = self._next()
                    if lease is not None:
                        self._post_result(lease.job_id, self.measure(lease))
                except httpx.HTTPStatusError as exc:
                    if exc.response.status_code == 404:
                        self.agent_id = None  # the tracker forgot us (restart or timeout): register again
                    else:
                        log.warning("tracker refused: %s %s", exc.response.status_code, exc.response.text[:200])
                        self._stop.wait(RETRY_S)
                except httpx.TransportError as exc:
                    log.warning("tracker unreachable: %s", exc)
                    self.agent_id = None
                    self._stop.wait(RETRY_S)
        finally:
            self.close()

    def measure(self, lease: Lease) -> MeasureResult:
        job = lease.job
        if job.target.triple != self.target.triple:
            return MeasureResult(error_no=MeasureErrorNo.runtime_error, build_s=job.build_s,
                                 error_msg=f"object built for {job.target.triple}, this device is {self.target.triple}")
        build = BuildResult(job.task, job.target, Config(index=0, knobs=job.knobs), job.obj, job.build_s)
        return self._runner.run_one(build, job.options)

    def _next(self) -> Lease | None:
        resp = self._post(f"/v1/agents/{self.agent_id}/next", {"wait_s": POLL_S})
        return None if resp.status_code == 204 else Lease.model_validate(resp.json())

    def _post_result(self, job_id: str, result: MeasureResult) -> None:
        body = ResultPost(job_id=job_id, result=result).model_dump(mode="json")
        for attempt in range(3):
            try:
                self._post(f"/v1/agents/{self.agent_id}/result", body)
                return
            except httpx.TransportError:
                if attempt == 2:
                    raise
                self._stop.wait(RETRY_S)

    def _post(self, path: str, body: dict) -> httpx.Response:
        resp = self._http.post(path, json=body)
        resp.raise_for_status()
        return resp

    def _beat(self) -> None:
        while not self._stop.wait(self._heartbeat_s):
            agent_id = self.agent_id
            if agent_id is None:
                continue
            try:
                self._http.post(f"/v1/agents/{agent_id}/heartbeat")
            except httpx.HTTPError as exc:
                log.debug("heartbeat failed: %s", exc)

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        self._stop.set()
        if self.agent_id is not None:
            try:
                self._http.delete(f"/v1/agents/{self.agent_id}", timeout=2.0)
            except httpx.HTTPError:
                pass
        self._runner.close()
        self._http.close()
