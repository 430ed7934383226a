"""Hostile network input to an RPC server, each kind with the status a correct server answers.

Used by tests/test_hostile_rpc.py (small counts) and benchmarks/faults.py (the figures). Every
probe returns how many requests it sent and which answers were wrong; a connection the server
dropped counts as a wrong answer, so a crash shows up as one.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import socket
import time
from dataclasses import dataclass, field

import httpx

from stages.rpc.auth import AUTH_HEADER, RequestSigner, signature

STATUS = "/v1/status"


@dataclass
class Tally:
    """Requests sent per kind and the answers that were not the expected status."""

    sent: dict[str, int] = field(default_factory=dict)
    wrong: list[str] = field(default_factory=list)

    def expect(self, kind: str, status: int | None, expected: int | tuple[int, ...], detail: str = "") -> None:
        self.sent[kind] = self.sent.get(kind, 0) + 1
        if status not in (expected if isinstance(expected, tuple) else (expected,)):
            self.wrong.append(f"{kind}: got {status}, expected {expected} {detail}".strip())

    @property
    def total(self) -> int:
        return sum(self.sent.values())


def _status(http: httpx.Client, method: str, path: str, **kw) -> int | None:
    """The answer's status, or None when the server dropped the connection."""
    try:
        return http.request(method, path, **kw).status_code
    except httpx.HTTPError:
        return None


def current_epoch(url: str, token: str, verify=True) -> str:
    """The running tracker's epoch, learnt as a client learns it (from its signed answer)."""
    signer = RequestSigner(token)
    with httpx.Client(base_url=url, timeout=10, auth=signer, verify=verify) as http:
        http.get(STATUS).raise_for_status()
    return signer.epoch


def bad_credentials(url: str, token: str, tally: Tally, n: int = 5) -> None:
    """No signature, a wrong token, a garbage or non-ASCII header, a bearer token, a stale timestamp, a body
    swapped after signing: 401."""
    body = b'{"job_ids": ["j1"], "wait_s": 0}'
    epoch = current_epoch(url, token)
    with httpx.Client(base_url=url, timeout=10) as http:
        for _ in range(n):
            stale = {AUTH_HEADER: signature(token, "GET", STATUS, b"", now=time.time() - 600, epoch=epoch)}
            swapped = {AUTH_HEADER: signature(token, "POST", "/v1/jobs/results", body, epoch=epoch)}
            non_ascii = signature(token, "GET", STATUS, b"", epoch=epoch).encode()[:-1] + "é".encode()
            tally.expect("no token", _status(http, "GET", STATUS), 401)
            wrong = {AUTH_HEADER: signature("not-the-token-" + "x" * 16, "GET", STATUS, b"", epoch=epoch)}
            tally.expect("wrong token", _status(http, "GET", STATUS, headers=wrong), 401)
            tally.expect("garbage auth header", _status(http, "GET", STATUS, headers={AUTH_HEADER: "a b c d"}), 401)
            tally.expect("non-ASCII auth header", _status(http, "GET", STATUS, headers={AUTH_HEADER: non_ascii}), 401)
            tally.expect("bearer token", _status(http, "GET", STATUS, headers={"Authorization": f"Bearer {token}"}),
                         401)
            tally.expect("stale timestamp", _status(http, "GET", STATUS, headers=stale), 401)
            tally.expect("body swapped after signing", _status(http, "POST", "/v1/jobs/results",
                                                               content=body.replace(b"j1", b"j2"), headers=swapped),
                         401)


def replayed(url: str, token: str, tally: Tally, n: int = 5) -> None:
    """A request captured once and sent again: the original is served, every copy refused."""
    epoch = current_epoch(url, token)
    with httpx.Client(base_url=url, timeout=10) as http:
        for _ in range(n):
            captured = {AUTH_HEADER: signature(token, "GET", STATUS, b"", epoch=epoch)}
            tally.expect("original of a replay", _status(http, "GET", STATUS, headers=captured), 200)
            tally.expect("replayed request", _status(http, "GET", STATUS, headers=captured), 401)


def malformed(url: str, token: str, tally: Tally, n: int = 2) -> None:
    """Signed requests with bodies and paths the API cannot accept: 400 or 422 (unparsable or invalid body),
    404 or 405, never 5xx."""
    cases = [
        ("/v1/jobs", b"{not json", 422),
        ("/v1/jobs", b"\xff\xfe\x00garbage", 422),
        ("/v1/jobs", b"[]", 422),
        ("/v1/jobs", b'{"key": "../../etc", "jobs": []}', 422),
        ("/v1/jobs", b'{"key": "dev", "jobs": [{"task": "x"}]}', 422),
        ("/v1/jobs", b"[" * 100_000 + b"]" * 100_000, 422),
        ("/v1/jobs/results", b'{"job_ids": [], "wait_s": 1e308}', 422),
        ("/v1/jobs/results", b'{"job_ids": ["j1"], "wait_s": NaN}', 422),
        ("/v1/agents/x/next", b'{"wait_s": Infinity}', 422),
        ("/v1/jobs/results", b'{"job_ids": ["' + b"a" * 100 + b'"]}', 422),
        ("/v1/agents", b'{"key": "dev", "target": {"triple": 7}}', 422),
        ("/v1/agents/" + "x" * 300 + "/next", b'{"wait_s": 0}', 404),
        ("/v1/nowhere", b"{}", 404),
    ]
    with httpx.Client(base_url=url, timeout=30, auth=RequestSigner(token),
                      headers={"content-type": "application/json"}) as http:
        for _ in range(n):
            for path, body, expected in cases:
                tally.expect("malformed body or path", _status(http, "POST", path, content=body),
                             (400, 422) if expected == 422 else expected, path[:40])
            tally.expect("wrong method", _status(http, "PUT", STATUS, content=b"{}"), 405)


def oversized(url: str, token: str, max_body: int, tally: Tally, n: int = 2) -> None:
    """A body over the limit, declared or streamed without a length: 413."""
    big = b"x" * (max_body + 1)

    def chunks():
        for i in range(0, len(big), 65536):
            yield big[i:i + 65536]

    with httpx.Client(base_url=url, timeout=30, auth=RequestSigner(token)) as http:
        for _ in range(n):
            tally.expect("oversized body", _status(http, "POST", "/v1/jobs", content=big), 413)
            tally.expect("oversized chunked body", _status(http, "POST", "/v1/jobs", content=chunks()), 413)


class SlowConnections:
    """`n` connections that send half a request and then nothing (slowloris); the server should close them."""

    def __init__(self, host: str, port: int, n: int):
        self.socks: list[socket.socket] = []
        for i in range(n):
            s = socket.create_connection((host, port), timeout=5)
            head = b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\n" if i % 2 else \
                b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{\"key\":"
            s.sendall(head)
            self.socks.append(s)

    def closed_by_server(self, timeout: float) -> int:
        """How many of the connections the server has closed (read to end of stream) within `timeout`."""
        deadline, closed = time.monotonic() + timeout, 0
        for s in self.socks:
            try:
                while True:
                    s.settimeout(max(0.01, deadline - time.monotonic()))
                    if not s.recv(65536):
                        closed += 1
                        break
            except TimeoutError:
                pass
            except OSError:  # reset by the server: closed too
                closed += 1
        return closed

    def close(self) -> None:
        for s in self.socks:
            s.close()
        self.socks = []


def burst(url: str, token: str, tally: Tally, n: int, concurrency: int = 64) -> float:
    """`n` signed status requests, `concurrency` at a time; every one must be answered 200. Seconds taken."""

    async def run() -> None:
        gate = asyncio.Semaphore(concurrency)
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(base_url=url, auth=RequestSigner(token), timeout=30, limits=limits) as http:
            async def one() -> int | None:
                async with gate:
                    try:
                        return (await http.get(STATUS)).status_code
                    except httpx.HTTPError:
                        return None

            for status in await asyncio.gather(*(one() for _ in range(n))):
                tally.expect("burst", status, 200)

    start = time.perf_counter()
    asyncio.run(run())
    return time.perf_counter() - start


class IdleFlood:
    """`n` connections that send nothing (no token needed), reopened as soon as the server closes one, from a
    process of their own (as an attacker's would be) until `stop()`: the flood that once filled every slot."""

    def __init__(self, host: str, port: int, n: int):
        ctx = mp.get_context("fork")
        self._opened = ctx.Value("q", 0)
        self._stop = ctx.Event()
        self._proc = ctx.Process(target=_flood, args=(host, port, n, self._opened, self._stop), daemon=True,
                                 name="idle-flood")
        self._proc.start()

    @property
    def opened(self) -> int:
        """Connections opened so far (the first `n`, then every reopening)."""
        return self._opened.value

    def stop(self) -> None:
        self._stop.set()
        self._proc.join(10)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()


def _flood(host: str, port: int, n: int, opened, stop) -> None:
    socks: list[socket.socket] = []
    try:
        while not stop.is_set():
            alive = []
            for s in socks:
                try:
                    closed = s.recv(1) == b""
                except BlockingIOError:
                    closed = False
                except OSError:
                    closed = True
                if closed:
                    s.close()
                else:
                    alive.append(s)
            socks = alive
            while len(socks) < n and not stop.is_set():
                try:
                    s = socket.create_connection((host, port), timeout=2)
                except OSError:
                    break
                s.setblocking(False)
                socks.append(s)
                opened.value += 1
            stop.wait(0.05)
    finally:
        for s in socks:
            s.close()
