"""The temporary Prefect server a command runs its flow against, owned by the command.

Prefect starts its own temporary server as a child in the command's process group, so a Ctrl-C
at the terminal kills it with the command; the flow engine then reports the crash to a dead
server and the client retries for about 150 s. Here the server runs in a session of its own
(a terminal's Ctrl-C reaches only the command), dies with the command if that is killed
(PR_SET_PDEATHSIG), and is stopped by the command itself once the flow has ended, so an
interrupted flow run is recorded as crashed and the command exits at once. With
PREFECT_API_URL set, the user's own server is used and nothing is started.

The server writes its output to `server.log` in PREFECT_HOME, not to the command's terminal: stopped while
its task-run recorder flushes a batch, it prints a database traceback that is no error of the user's run
(seen after a Ctrl-C). A server that fails to start has the end of that file in the error.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import prefect
from prefect.events.worker import EventsWorker
from prefect.logging.handlers import APILogWorker
from prefect.server.api.server import SubprocessASGIServer
from prefect.settings import (
    PREFECT_API_URL,
    PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
    get_current_settings,
)

STARTUP_TIMEOUT_S = 120  # a fresh database's migrations take 40 s on a loaded 2-core machine (Prefect waits 20)
DRAIN_S = 1.0  # queued logs and events of the flow run, sent before the server goes
STOP_WAIT_S = 1.0  # a temporary server's SQLite database survives a kill; the user is waiting
LOG_TAIL_CHARS = 3000  # of the server's own log, in the error when it does not start

_PR_SET_PDEATHSIG = 1

# Prefect's task-run recorder writes each task-run event in a transaction of its own by default. On 2 cores
# that server work (2.6 s of CPU per 200-trial tune-op session, measured) competes with the builders, and
# made a flow 19% slower than the direct stages; batched writes halve it. The UI's task-run states then lag
# by at most a second. The user's environment wins over these.
SERVER_DEFAULTS = {
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE": "100",
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL": "1",
}


def _die_with_parent() -> Any:
    """A preexec function asking the kernel to SIGTERM the child when its parent dies (Linux)."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def server_env() -> dict[str, str]:
    """The temporary server's environment: Prefect's own for its temporary server, over SERVER_DEFAULTS."""
    return {**SERVER_DEFAULTS, **os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
            "PREFECT__SERVER_FINAL": "1", **get_current_settings().to_environment_variables(exclude_unset=True)}


def server_log() -> Path:
    """Where the temporary server's output goes (one run's: rewritten at each start)."""
    return Path(get_current_settings().home) / "server.log"


class _OwnSessionServer(SubprocessASGIServer):
    """Prefect's temporary server (the same uvicorn command and environment as Prefect's own),
    started in a new session so terminal signals skip it, its output in `server_log()`."""

    def start(self, timeout: int | None = None) -> None:
        try:
            super().start(timeout)
        except RuntimeError as exc:
            log = server_log()
            tail = log.read_text(errors="replace")[-LOG_TAIL_CHARS:] if log.exists() else ""
            raise RuntimeError(f"{exc} The server's output ({log}):\n{tail}") from None

    def _run_uvicorn_command(self) -> subprocess.Popen[Any]:
        env = server_env()
        command = [sys.executable, "-m", "uvicorn", "--app-dir", str(prefect.__module_path__.parent), "--factory",
                   "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(self.port),
                   "--log-level", "error", "--lifespan", "on"]
        log = server_log()
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("wb") as out:  # the child keeps its own copy of the descriptor
            return subprocess.Popen(command, env=env, start_new_session=True, preexec_fn=_die_with_parent(),
                                    stdout=out, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        if self.server_process is not None and self.server_process.poll() is None:
            self.server_process.terminate()
            try:
                self.server_process.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                self.server_process.kill()
        super().stop()


@contextlib.contextmanager
def local_server() -> Iterator[None]:
    """Run the body against a temporary server this process owns (unless PREFECT_API_URL names one).

    Registered as Prefect's own temporary server, so every client in the process (the engine's,
    the log and event workers' threads) talks to it; their queues are drained before it stops.
    """
    if PREFECT_API_URL.value():
        yield
        return
    server = _OwnSessionServer()
    try:
        server.start(timeout=max(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value(), STARTUP_TIMEOUT_S))
        yield
    finally:
        try:
            for worker in (APILogWorker, EventsWorker):
                worker.drain_all(timeout=DRAIN_S)
        finally:
            server.stop()
