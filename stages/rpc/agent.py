"""The device agent: registers under a key, pulls one job at a time, measures it in an isolated worker.

Measuring goes through the same `LocalRunner` as local tuning (a spawned worker process that
loads the shipped object, checks it against numpy and times it natively), so a crashing or
hanging kernel costs a worker, never the agent. A heartbeat thread keeps the lease alive
while a measurement runs; if the agent dies, the tracker gives its job to another device.
The agent believes only answers signed for its request by a holder of the token, so whatever
else answers on the tracker's address is refused (one log line) and never hands it code; a job
it cannot understand is answered with an error result, never with the agent's death.
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
import subprocess
import sys
import threading

import httpx
from pydantic import TypeAdapter, ValidationError

from schemas.config import Config
from schemas.measure import MeasureErrorNo, MeasureResult
from schemas.options import MeasureOptions
from schemas.rpc import Id, Lease, RegisterReply, RegisterRequest, ResultPost
from schemas.target import Target, TargetError
from stages.measure.artifact import BuildResult
from stages.measure.plausible import judge
from stages.measure.runner import LocalRunner
from stages.rpc.auth import RequestSigner, UntrustedResponse

log = logging.getLogger("tunaflow.agent")
POLL_S = 10.0
RETRY_S = 1.0


class Agent:
    def __init__(self, tracker_url: str, key: str, token: str, target: Target, name: str = "",
                 verify: ssl.SSLContext | bool = True):
        self.key, self.target, self.url = key, target, tracker_url
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self._http = httpx.Client(base_url=tracker_url, auth=RequestSigner(token), verify=verify,
                                  timeout=httpx.Timeout(10.0, read=POLL_S + 10.0))
        self._runner = LocalRunner(MeasureOptions())
        self._stop = threading.Event()
        self._closed = False
        self._beat_thread: threading.Thread | None = None
        self._last_warning = ""
        self.agent_id: str | None = None
        self._heartbeat_s = 1.0

    def register(self) -> None:
        req = RegisterRequest(key=self.key, target=self.target, name=self.name)
        reply = RegisterReply.model_validate(self._post("/v1/agents", req.model_dump(mode="json")).json())
        self.agent_id, self._heartbeat_s = reply.agent_id, reply.heartbeat_s
        self._last_warning = ""
        log.info("registered as %s under key %s", self.agent_id, self.key)

    def serve(self) -> None:
        """Pull and measure jobs until `stop()`; a lost or impersonated tracker is retried, never fatal."""
        self._runner.start()
        self._beat_thread = threading.Thread(target=self._beat, daemon=True, name="tunaflow-heartbeat")
        self._beat_thread.start()
        try:
            while not self._stop.is_set():
                try:
                    if self.agent_id is None:
                        self.register()
                    job_id, lease = self._next()
                    if job_id is not None:
                        self._post_result(job_id, self.measure(lease) if isinstance(lease, Lease) else lease)
                except UntrustedResponse as exc:
                    self._warn("untrusted", f"refused an answer from {self.url} not signed by the tracker ({exc}); "
                               "nothing from it is used")
                    self.agent_id = None
                    self._stop.wait(RETRY_S)
                except httpx.HTTPStatusError as exc:
                    if exc.response.status_code == 404:
                        self.agent_id = None  # the tracker forgot us (restart or timeout): register again
                    else:
                        self._warn("refused", f"tracker refused: {exc.response.status_code} {exc.response.text[:200]}")
                        self._stop.wait(RETRY_S)
                except httpx.TransportError as exc:
                    self._warn("unreachable", f"tracker unreachable: {exc}")
                    self.agent_id = None
                    self._stop.wait(RETRY_S)
                except (ValidationError, ValueError) as exc:
                    self._warn("unusable", f"unusable answer from the tracker: {str(exc).splitlines()[0]}")
                    self._stop.wait(RETRY_S)
        finally:
            self.close()

    def _warn(self, kind: str, msg: str) -> None:
        """Log a problem once when it starts, not once a second while it lasts."""
        if kind != self._last_warning:
            log.warning("%s", msg)
        self._last_warning = kind

    def measure(self, lease: Lease) -> MeasureResult:
        """The job's result; anything wrong with the job itself is an error result, never an exception."""
        job = lease.job
        if job.target.triple != self.target.triple:
            return MeasureResult(error_no=MeasureErrorNo.runtime_error, build_s=job.build_s,
                                 error_msg=f"object built for {job.target.triple}, this device is {self.target.triple}")
        try:
            build = BuildResult(job.task, job.target, Config(index=0, knobs=job.knobs), job.obj, job.build_s)
            result = self._runner.run_one(build, job.options)
        except Exception as exc:  # the boundary: whatever the job holds, the agent answers and goes on
            return _bad_job(f"{type(exc).__name__}: {exc}")
        return judge(result, job.task, job.target, job.options.threads)  # a NaN timing is not even sendable

    def _next(self) -> tuple[str | None, Lease | MeasureResult | None]:
        """(job id, its lease) or, for a job that cannot be read, (job id, the error result); (None, None) if idle."""
        resp = self._post(f"/v1/agents/{self.agent_id}/next", {"wait_s": POLL_S})
        if resp.status_code == 204:
            return None, None
        raw = resp.json()
        try:
            return (lease := Lease.model_validate(raw)).job_id, lease
        except ValidationError as exc:
            job_id = raw.get("job_id") if isinstance(raw, dict) else None
            try:
                job_id = _ID.validate_python(job_id)
            except ValidationError:
                raise exc from None
            first = exc.errors()[0]
            return job_id, _bad_job(f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}")

    def _post_result(self, job_id: str, result: MeasureResult) -> None:
        body = ResultPost.of(job_id, result).model_dump(mode="json")
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
            except (httpx.HTTPError, RuntimeError) as exc:  # RuntimeError: the client closed under us
                log.debug("heartbeat failed: %s", exc)

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        """Leave the tracker and stop the worker; safe to call twice and from an interrupt."""
        self._stop.set()
        if self._closed:
            return
        self._closed = True
        if self._beat_thread is not None:
            self._beat_thread.join(1.0)
        if self.agent_id is not None:
            try:
                self._http.delete(f"/v1/agents/{self.agent_id}", timeout=2.0)
            except httpx.HTTPError:
                pass
        self._runner.close()
        self._http.close()


_ID = TypeAdapter(Id)


_CPU_PROBE = """
import sys
import llvmlite.binding as llvm
llvm.initialize_all_targets()
llvm.initialize_all_asmprinters()
module = llvm.parse_assembly("define void @probe() {\\n  ret void\\n}\\n")
module.triple = sys.argv[1]
llvm.Target.from_triple(sys.argv[1]).create_target_machine(cpu=sys.argv[2]).emit_object(module)
"""


def device_target(cpu: str | None = None, caches: str | None = None) -> Target:
    """The target this machine registers: triple, CPU, features, cores and caches as LLVM and sysfs read them.

    Under emulation (an arm64 userland under qemu) LLVM reads the CPU as `generic` and the features as
    the emulator's, which are not the board's: `cpu` names the real CPU (e.g. cortex-a76), and then the
    target carries no explicit features, so code is generated for what LLVM's model of that CPU has.
    Without sysfs caches (emulation) the target has default caches: `caches` ("64K,512K,2M": L1 data, L2,
    L3) gives the board's, which the default schedules and the spaces size their blocks by.
    TargetError names a CPU LLVM does not know for this triple, or caches it cannot read.
    """
    detected = Target.host()
    update: dict[str, object] = {}
    if caches:
        update.update(zip(("l1_bytes", "l2_bytes", "l3_bytes"), parse_caches(caches), strict=True))
    if not cpu:
        return detected.model_copy(update=update)
    named = Target.parse(f"llvm -mtriple={detected.triple} -mcpu={cpu} -num-cores={detected.cores}")
    _check_cpu_known(named)
    return named.model_copy(update={"name": cpu, "l1_bytes": detected.l1_bytes, "l2_bytes": detected.l2_bytes,
                                    "l3_bytes": detected.l3_bytes, **update})


def parse_caches(text: str) -> tuple[int, int, int]:
    """Bytes of `L1,L2,L3` sizes written like 64K,512K,2M (K and M are 1024-based)."""
    parts = [p.strip() for p in text.split(",")]
    sizes = []
    for part in parts:
        number, unit = part[:-1] if part[-1:] in "KkMm" else part, part[-1:].upper()
        if len(parts) != 3 or not number.isdigit() or int(number) == 0:
            raise TargetError(f"caches {text!r} are not three sizes L1,L2,L3 like 64K,512K,2M")
        sizes.append(int(number) * {"K": 1024, "M": 1024 * 1024}.get(unit, 1))
    return sizes[0], sizes[1], sizes[2]


def _check_cpu_known(target: Target) -> None:
    """LLVM only warns on stderr about an unknown CPU and compiles for a generic one (or aborts the process, for
    some triples): probe it in a child process and make either an error."""
    probe = subprocess.run([sys.executable, "-c", _CPU_PROBE, target.triple, target.cpu], capture_output=True,
                           text=True, timeout=120)
    if probe.returncode != 0 or "not a recognized processor" in probe.stderr:
        raise TargetError(f"CPU {target.cpu!r} is not one LLVM knows for {target.triple} (the names "
                          f"`llc -mtriple={target.triple} -mcpu=help` lists, e.g. cortex-a76 for aarch64)")


def _bad_job(why: str) -> MeasureResult:
    return MeasureResult(error_no=MeasureErrorNo.runtime_error, error_msg=f"malformed job: {why}"[:2000])
