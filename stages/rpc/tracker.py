"""The tracker: devices register under a key and pull jobs; clients submit batches and collect results.

State lives in one asyncio event loop (no locks). A reaper drops agents whose heartbeats
stop and puts their job back in its queue; after `max_retries` requeues, or when no device
takes a job within its queue timeout, the job finishes as an error, so every submitted job
gets exactly one result. A device's result is judged against its job before it is kept (see
`stages.measure.plausible`), so a lying or malformed one finishes its job as an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import secrets
import time
from collections import deque
from dataclasses import dataclass, field

from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from schemas.measure import MeasureErrorNo, MeasureResult
from schemas.rpc import (
    DeviceStatus,
    KeyStatus,
    Lease,
    MeasureJob,
    NextRequest,
    RegisterReply,
    RegisterRequest,
    ResultPost,
    ResultsReply,
    ResultsRequest,
    SubmitReply,
    SubmitRequest,
    TrackerStatus,
)
from schemas.target import Target
from stages.measure.plausible import judge
from stages.rpc.auth import DEFAULT_MAX_BODY, Guard
from stages.rpc.slots import IDLE_S, LIMIT, fit_fd_limit, protocol

__all__ = ["IDLE_S", "TrackerState", "create_app", "serve"]

REAP_EVERY_S = 0.25


@dataclass
class _Job:
    id: str
    key: str
    job: MeasureJob
    queue_deadline: float
    attempts: int = 0
    agent_id: str | None = None
    lease_deadline: float = 0.0
    result: MeasureResult | None = None


@dataclass
class _Agent:
    id: str
    key: str
    name: str
    target: Target
    last_seen: float
    job_id: str | None = None
    measured: int = 0


@dataclass
class TrackerState:
    agent_timeout_s: float = 5.0
    max_retries: int = 2
    jobs: dict[str, _Job] = field(default_factory=dict)
    queues: dict[str, deque[str]] = field(default_factory=dict)
    agents: dict[str, _Agent] = field(default_factory=dict)
    closing: bool = False
    requeued: int = 0
    failed_after_retries: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    _ids: itertools.count = field(default_factory=itertools.count)

    def new_id(self, prefix: str) -> str:
        return f"{prefix}{next(self._ids)}-{secrets.token_hex(4)}"

    def notify(self) -> None:
        """Wake every long-poll; each re-checks what it waits for."""
        self.changed.set()
        self.changed = asyncio.Event()

    def close(self) -> None:
        """The server is shutting down: every long poll answers now."""
        self.closing = True
        self.notify()

    async def wait(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.changed.wait(), timeout)

    def submit(self, req: SubmitRequest) -> list[str]:
        now = time.monotonic()
        ids = []
        for job in req.jobs:
            jid = self.new_id("j")
            self.jobs[jid] = _Job(jid, req.key, job, now + req.queue_timeout_s)
            self.queues.setdefault(req.key, deque()).append(jid)
            ids.append(jid)
        self.notify()
        return ids

    def lease(self, agent: _Agent) -> Lease | None:
        queue = self.queues.get(agent.key)
        while queue:
            job = self.jobs.get(queue.popleft())
            if job is None or job.result is not None:
                continue
            job.agent_id = agent.id
            opts = job.job.options
            job.lease_deadline = time.monotonic() + 2 * opts.timeout + 30.0 + self.agent_timeout_s
            agent.job_id = job.id
            return Lease(job_id=job.id, job=job.job)
        return None

    def finish(self, job: _Job, result: MeasureResult) -> None:
        job.result = result
        job.agent_id = None
        self.notify()

    def give_back(self, job: _Job, why: str) -> None:
        """The job's device is gone: queue it again at the front, or fail it after `max_retries`."""
        job.agent_id = None
        job.attempts += 1
        if job.attempts > self.max_retries:
            self.failed_after_retries += 1
            self.finish(job, MeasureResult(error_no=MeasureErrorNo.runtime_error, build_s=job.job.build_s,
                                           error_msg=f"{why}; gave up after {self.max_retries} requeues"))
            return
        self.requeued += 1
        self.queues.setdefault(job.key, deque()).appendleft(job.id)
        self.notify()

    def drop_agent(self, agent_id: str, why: str) -> None:
        agent = self.agents.pop(agent_id, None)
        if agent is None or agent.job_id is None:
            return
        job = self.jobs.get(agent.job_id)
        if job is not None and job.result is None and job.agent_id == agent_id:
            self.give_back(job, why)

    def reap(self) -> None:
        now = time.monotonic()
        for agent in list(self.agents.values()):
            if now - agent.last_seen > self.agent_timeout_s:
                self.drop_agent(agent.id, f"device {agent.name or agent.id} under key {agent.key!r} vanished")
        for job in list(self.jobs.values()):
            if job.result is not None:
                continue
            if job.agent_id is not None and now > job.lease_deadline:
                agent = self.agents.get(job.agent_id)
                if agent is not None:
                    agent.job_id = None
                self.give_back(job, f"device under key {job.key!r} held the job past its lease")
            elif job.agent_id is None and now > job.queue_deadline:
                self.finish(job, MeasureResult(error_no=MeasureErrorNo.run_timeout, build_s=job.job.build_s,
                                               error_msg=f"no device under key {job.key!r} took the job in time"))

    def status(self) -> TrackerStatus:
        now = time.monotonic()
        keys = sorted(set(self.queues) | {a.key for a in self.agents.values()})
        out = []
        for key in keys:
            agents = [a for a in self.agents.values() if a.key == key]
            devices = [DeviceStatus(agent_id=a.id, name=a.name, target_key=a.target.key, busy=a.job_id is not None,
                                    job_id=a.job_id, measured=a.measured, last_seen_s=round(now - a.last_seen, 3))
                       for a in agents]
            busy = sum(d.busy for d in devices)
            queued = sum(1 for j in self.queues.get(key, ()) if j in self.jobs and self.jobs[j].result is None)
            out.append(KeyStatus(key=key, target=agents[0].target if agents else None, devices=devices,
                                 free=len(devices) - busy, busy=busy, queued=queued))
        return TrackerStatus(keys=out, requeued=self.requeued, failed_after_retries=self.failed_after_retries)


def create_app(token: str, agent_timeout_s: float = 5.0, max_retries: int = 2,
               max_body: int = DEFAULT_MAX_BODY, trusted: set | None = None) -> FastAPI:
    """The tracker's routes behind the Guard; `trusted` is shared with the connection slots."""
    state = TrackerState(agent_timeout_s=agent_timeout_s, max_retries=max_retries)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        state.changed = asyncio.Event()  # bind to the server's loop

        async def reaper() -> None:
            while True:
                await asyncio.sleep(REAP_EVERY_S)
                state.reap()

        task = asyncio.create_task(reaper())
        yield
        task.cancel()

    app = FastAPI(title="tunaflow tracker", lifespan=lifespan, openapi_url=None)
    app.add_middleware(Guard, token=token, max_body=max_body, trusted=trusted)
    app.state.tracker = state

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        """One line per problem, without echoing the input (a NaN in it would make the answer unencodable)."""
        lines = [f"{'.'.join(str(p) for p in e['loc'] if p != 'body') or 'body'}: {e['msg']}" for e in exc.errors()]
        return JSONResponse({"detail": "; ".join(lines)[:2000]}, status_code=422)

    def agent_of(agent_id: str) -> _Agent:
        agent = state.agents.get(agent_id)
        if agent is None:
            raise HTTPException(404, f"unknown agent {agent_id!r}: register again")
        agent.last_seen = time.monotonic()
        return agent

    @app.post("/v1/agents")
    async def register(req: RegisterRequest) -> RegisterReply:
        agent_id = state.new_id("a")
        state.agents[agent_id] = _Agent(agent_id, req.key, req.name, req.target, time.monotonic())
        state.notify()
        return RegisterReply(agent_id=agent_id, heartbeat_s=max(0.2, agent_timeout_s / 4))

    @app.post("/v1/agents/{agent_id}/heartbeat", status_code=204)
    async def heartbeat(agent_id: str) -> Response:
        agent_of(agent_id)
        return Response(status_code=204)

    @app.delete("/v1/agents/{agent_id}", status_code=204)
    async def leave(agent_id: str) -> Response:
        state.drop_agent(agent_id, "device left")
        return Response(status_code=204)

    @app.post("/v1/agents/{agent_id}/next", response_model=None)
    async def next_job(agent_id: str, req: NextRequest) -> Lease | Response:
        deadline = time.monotonic() + req.wait_s
        while True:
            agent = agent_of(agent_id)
            if agent.job_id is not None:
                raise HTTPException(409, f"agent {agent_id!r} still holds job {agent.job_id!r}")
            lease = state.lease(agent)
            if lease is not None or time.monotonic() >= deadline or state.closing:
                return lease if lease is not None else Response(status_code=204)
            await state.wait(deadline - time.monotonic())

    @app.post("/v1/agents/{agent_id}/result", status_code=204)
    async def post_result(agent_id: str, req: ResultPost) -> Response:
        agent = agent_of(agent_id)
        if agent.job_id == req.job_id:
            agent.job_id = None
            agent.measured += 1
        job = state.jobs.get(req.job_id)
        if job is not None and job.result is None and job.agent_id == agent_id:
            state.finish(job, judge(req.result, job.job.task, job.job.target, job.job.options.threads))
        state.notify()
        return Response(status_code=204)

    @app.post("/v1/jobs")
    async def submit(req: SubmitRequest) -> SubmitReply:
        return SubmitReply(job_ids=state.submit(req))

    @app.post("/v1/jobs/results")
    async def results(req: ResultsRequest) -> ResultsReply:
        deadline = time.monotonic() + req.wait_s
        while True:
            done = {j: state.jobs[j].result for j in req.job_ids
                    if j in state.jobs and state.jobs[j].result is not None}
            if done or time.monotonic() >= deadline or state.closing:
                for j in done:
                    del state.jobs[j]
                unknown = [j for j in req.job_ids if j not in state.jobs and j not in done]
                return ResultsReply(results={j: r.model_dump(mode="json") for j, r in done.items()},
                                    unknown=unknown)
            await state.wait(deadline - time.monotonic())

    @app.get("/v1/status")
    async def status() -> TrackerStatus:
        return state.status()

    return app


def serve(token: str, host: str = "127.0.0.1", port: int = 9190, agent_timeout_s: float = 5.0,
          max_retries: int = 2, max_body: int = DEFAULT_MAX_BODY, tls_cert: str | None = None,
          tls_key: str | None = None, max_connections: int = LIMIT) -> None:
    """Run the tracker until interrupted (over TLS when given a certificate and its key)."""
    import uvicorn

    limit = fit_fd_limit(max_connections)
    trusted: set = set()
    app = create_app(token, agent_timeout_s, max_retries, max_body, trusted)
    uvicorn.run(app, host=host, port=port, log_level="warning", timeout_keep_alive=30, limit_concurrency=None,
                timeout_graceful_shutdown=3, http=protocol(trusted, limit, app.state.tracker.close),
                ssl_certfile=tls_cert, ssl_keyfile=tls_key)
