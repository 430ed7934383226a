"""The host side of RPC: submit built candidates to the tracker, collect one result per candidate.

Objects are compiled here for the device's target and shipped; the tracker guarantees every
accepted job ends with a result (measured, requeued, or failed after bounded retries), so
this side only has to survive the tracker itself being unreachable for a while. Only answers
signed for each request by a holder of the token are used (`stages.rpc.auth`), and each result
is parsed and judged on its own against its job, so one lying or malformed result is recorded
as an `implausible_result` error and never costs the rest of the batch.
"""

from __future__ import annotations

import ssl
import time

import httpx

from schemas.measure import MeasureErrorNo, MeasureResult
from schemas.options import MeasureOptions, RunnerSpec
from schemas.rpc import MAX_JOBS_PER_SUBMIT, MeasureJob, ResultsReply, SubmitReply, SubmitRequest, TrackerStatus
from schemas.target import Target
from stages.measure.artifact import BuildResult
from stages.measure.plausible import judge
from stages.rpc.auth import RequestSigner, UntrustedResponse, load_token

CHUNK_BYTES = 16 * 1024 * 1024
UNREACHABLE_S = 30.0
POLL_S = 5.0


class TrackerError(RuntimeError):
    """The tracker refused a request or could not be reached; the message says which."""


def tls_verify(url: str, ca_file: str | None) -> ssl.SSLContext | bool:
    """What httpx verifies an https tracker with: the CA file when given, else the system's store."""
    if ca_file is None or not url.startswith("https://"):
        return True
    try:
        return ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise TrackerError(f"cannot use the CA file {ca_file}: {exc}") from exc


class TrackerClient:
    def __init__(self, url: str, token: str, timeout: float = 10.0, ca_file: str | None = None):
        self.url = url
        self._http = httpx.Client(base_url=url, auth=RequestSigner(token), verify=tls_verify(url, ca_file),
                                  timeout=httpx.Timeout(timeout, read=timeout + POLL_S + 5.0))

    def request(self, method: str, path: str, body: dict | None = None) -> httpx.Response:
        try:
            resp = self._http.request(method, path, json=body)
        except httpx.TransportError as exc:
            raise TrackerError(f"cannot reach the tracker at {self.url}: {exc}") from exc
        except UntrustedResponse as exc:
            if exc.status_code == 401:
                raise TrackerError(f"the tracker at {self.url} rejected the RPC token (wrong TUNAFLOW_RPC_TOKEN or "
                                   "--token-file), or what answers there does not hold the token") from None
            raise TrackerError(f"refused an answer from {self.url}: {exc} (is something other than the tracker "
                               "listening there?)") from exc
        if resp.status_code == 401:
            raise TrackerError(f"the tracker at {self.url} refused the request: {resp.json().get('detail')}")
        if resp.status_code >= 400:
            raise TrackerError(f"the tracker at {self.url} answered {resp.status_code}: {resp.text[:300]}")
        return resp

    def status(self) -> TrackerStatus:
        return TrackerStatus.model_validate(self.request("GET", "/v1/status").json())

    def close(self) -> None:
        self._http.close()


class RPCRunner:
    """Measures on the devices under `key`; several devices measure one batch in parallel."""

    def __init__(self, options: MeasureOptions, key: str, url: str, token: str, queue_timeout_s: float = 120.0,
                 ca_file: str | None = None):
        self.options, self.key, self.queue_timeout_s = options, key, queue_timeout_s
        self.client = TrackerClient(url, token, ca_file=ca_file)

    @classmethod
    def from_spec(cls, spec: RunnerSpec, options: MeasureOptions) -> RPCRunner:
        return cls(options, spec.key, f"{spec.scheme}://{spec.host}:{spec.port}", load_token(spec.token_file),
                   ca_file=spec.tls_ca)

    def device_target(self) -> Target | None:
        """The target the devices under the key registered with (None while none is registered)."""
        for ks in self.client.status().keys:
            if ks.key == self.key:
                return ks.target
        return None

    def run(self, builds: list[BuildResult]) -> list[MeasureResult]:
        results: list[MeasureResult | None] = [
            None if b.ok else MeasureResult(error_no=b.error_no, error_msg=b.error_msg, build_s=b.build_s)
            for b in builds]
        jobs = {i: MeasureJob.of(b.task, b.target, dict(b.config.knobs), b.obj, self.options, b.build_s)
                for i, b in enumerate(builds) if b.ok}
        failure = "the tracker returned no result"
        try:
            self._collect(self._submit(jobs), jobs, results)
        except TrackerError as exc:
            failure = str(exc)[:2000]
        return [r if r is not None else MeasureResult(error_no=MeasureErrorNo.unknown, error_msg=failure,
                                                      build_s=b.build_s)
                for r, b in zip(results, builds, strict=True)]

    def _submit(self, jobs: dict[int, MeasureJob]) -> dict[str, int]:
        pending: dict[str, int] = {}
        for chunk in _chunks(list(jobs.items())):
            req = SubmitRequest(key=self.key, jobs=[j for _, j in chunk], queue_timeout_s=self.queue_timeout_s)
            reply = SubmitReply.model_validate(self._retrying("POST", "/v1/jobs", req.model_dump(mode="json")).json())
            pending.update(zip(reply.job_ids, (i for i, _ in chunk), strict=True))
        return pending

    def _collect(self, pending: dict[str, int], jobs: dict[int, MeasureJob],
                 results: list[MeasureResult | None]) -> None:
        while pending:
            body = {"job_ids": list(pending), "wait_s": POLL_S}
            reply = ResultsReply.model_validate(self._retrying("POST", "/v1/jobs/results", body).json())
            for jid, raw in reply.results.items():
                if jid in pending:
                    i = pending.pop(jid)
                    job = jobs[i]
                    results[i] = judge(raw, job.task, job.target, job.options.threads)
            for jid in reply.unknown:
                if jid in pending:
                    results[pending.pop(jid)] = MeasureResult(error_no=MeasureErrorNo.unknown,
                                                              error_msg="the tracker lost the job (restarted?)")

    def _retrying(self, method: str, path: str, body: dict) -> httpx.Response:
        """Retry while the tracker is unreachable or something else answers in its place (a restart), for up to
        UNREACHABLE_S; the tracker's own refusals are not retried."""
        give_up = time.monotonic() + UNREACHABLE_S
        while True:
            try:
                return self.client.request(method, path, body)
            except TrackerError as exc:
                passing = isinstance(exc.__cause__, httpx.TransportError | UntrustedResponse)
                if not passing or time.monotonic() > give_up:
                    raise
                time.sleep(0.5)

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> RPCRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _chunks(items: list[tuple[int, MeasureJob]]) -> list[list[tuple[int, MeasureJob]]]:
    """Split a batch so each submit stays under the server's body limit and job count."""
    chunks: list[list[tuple[int, MeasureJob]]] = [[]]
    size = 0
    for item in items:
        n = len(item[1].obj_b64) + 4096
        if chunks[-1] and (size + n > CHUNK_BYTES or len(chunks[-1]) >= MAX_JOBS_PER_SUBMIT):
            chunks.append([])
            size = 0
        chunks[-1].append(item)
        size += n
    return [c for c in chunks if c]
