"""A tracker, its device agents and any other peer (a rogue tracker, a forged agent) as real child
processes on 127.0.0.1, for the RPC tests and benchmarks.

Every process writes to `tmp/<name>.log`; `status()` asks the tracker through a signed client as a
user does, so a cluster is ready when the tracker answers, not when a process has merely started.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from schemas.options import MeasureOptions
from schemas.rpc import TrackerStatus
from stages.rpc.client import RPCRunner, TrackerClient, TrackerError
from testing.cli import ROOT, tunaflow


def free_port() -> int:
    """A port nothing listens on right now (the kernel's pick for an ephemeral bind)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_request(requests: Path, what: str, timeout: float = 30.0) -> bool:
    """Whether a request whose line holds `what` reached a rogue (its request log) within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while what not in requests.read_text():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


class Cluster:
    """Child processes by name; the tracker restarts on the same port with the same options."""

    def __init__(self, tmp: Path, token: str, agent_timeout: float = 1.5, max_body_mb: int | None = None,
                 tracker_args: tuple[str, ...] = ()):
        self.tmp, self.token, self.port = tmp, token, free_port()
        self.tracker_args = ("--agent-timeout", f"{agent_timeout:g}",
                             *(("--max-body-mb", str(max_body_mb)) if max_body_mb is not None else ()), *tracker_args)
        self.env = {**os.environ, "TUNAFLOW_RPC_TOKEN": token}
        self.procs: dict[str, subprocess.Popen] = {}
        self._client: TrackerClient | None = None

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def client(self) -> TrackerClient:
        """A long-lived signed client of the current address (it signs again by itself after a restart)."""
        if self._client is None or self._client.url != self.url:
            if self._client is not None:
                self._client.close()
            self._client = TrackerClient(self.url, self.token)
        return self._client

    def spawn(self, name: str, *args: str, module: str = "tunaflow", env: dict | None = None) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "a")  # noqa: SIM115 - lives as long as the process
        self.procs[name] = subprocess.Popen([sys.executable, "-m", module, *args], cwd=ROOT,
                                            env=self.env if env is None else env, stdout=log,
                                            stderr=subprocess.STDOUT)
        return self.procs[name]

    def start(self, *agents: str) -> Cluster:
        """The tracker, then `agents` under the key `dev`, once all of them are registered."""
        self.start_tracker()
        self.add_agents(*agents)
        return self

    def start_tracker(self) -> None:
        self.spawn("tracker", "tracker", "serve", "--port", str(self.port), *self.tracker_args)
        self.wait(lambda s: True)

    def start_agent(self, name: str, key: str = "dev", shown: str | None = None) -> None:
        self.spawn(name, "runner", "serve", "--tracker", f"127.0.0.1:{self.port}", "--key", key,
                   "--name", name if shown is None else shown)

    def add_agents(self, *names: str, key: str = "dev") -> None:
        for name in names:
            self.start_agent(name, key)
        if names:
            self.devices(len(names))

    def rogue(self, name: str, routes: dict, sign: bool = False) -> Path:
        """testing/rogue_tracker.py on the tracker's port answering `routes`; returns its request log. It holds
        the token only with `sign` (a faulty tracker); without, it is a stranger that took the port."""
        script, requests = self.tmp / f"{name}.json", self.tmp / f"{name}.requests"
        script.write_text(json.dumps(routes))
        requests.write_text("")
        no_token = {k: v for k, v in self.env.items() if k != "TUNAFLOW_RPC_TOKEN"}
        self.spawn(name, "--port", str(self.port), "--script", str(script), "--log", str(requests),
                   *(["--sign"] if sign else []), module="testing.rogue_tracker", env=self.env if sign else no_token)
        return requests

    def status(self) -> TrackerStatus | None:
        """The tracker's status, or None while nothing (trusted) answers. A client of its own, closed after the
        call: polling leaves no connection open that would show in the tracker's file descriptors."""
        client = TrackerClient(self.url, self.token)
        try:
            return client.status()
        except TrackerError:
            return None
        finally:
            client.close()

    def wait(self, ok: Callable[[TrackerStatus], bool], timeout: float = 90.0) -> TrackerStatus:
        deadline = time.monotonic() + timeout
        while True:
            status = self.status()
            if status is not None and ok(status):
                return status
            if time.monotonic() > deadline:
                tails = {p.name: p.read_text(errors="replace")[-800:] for p in sorted(self.tmp.glob("*.log"))}
                raise RuntimeError(f"cluster not ready after {timeout:g} s; process logs: {tails}")
            time.sleep(0.1)

    def devices(self, n: int) -> TrackerStatus:
        """Wait until `n` devices are registered in all."""
        return self.wait(lambda s: sum(len(k.devices) for k in s.keys) >= n)

    def kill(self, name: str) -> None:
        """SIGKILL one process (no chance to clean up) and forget it."""
        proc = self.procs.pop(name)
        proc.kill()
        proc.wait()

    def crashes(self, *names: str) -> int:
        """Dead processes among `names` plus the tracebacks in their logs."""
        dead = sum(self.procs[n].poll() is not None for n in names if n in self.procs)
        logs = [self.tmp / f"{n}.log" for n in names]
        return dead + sum(log.read_text().count("Traceback") for log in logs if log.exists())

    def tracker_status(self, env: dict | None = None) -> subprocess.CompletedProcess:
        """`tunaflow tracker status` against this tracker, as a user runs it (with the cluster's token by default)."""
        return tunaflow("tracker", "status", "--tracker", f"127.0.0.1:{self.port}", timeout=60,
                        env=self.env if env is None else env)

    def runner(self, options: MeasureOptions, queue_timeout_s: float = 60.0) -> RPCRunner:
        return RPCRunner(options, "dev", self.url, self.token, queue_timeout_s=queue_timeout_s)

    def close(self) -> None:
        """Ctrl-C every process (SIGKILL after 10 s) and close the client."""
        if self._client is not None:
            self._client.close()
            self._client = None
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs = {}
