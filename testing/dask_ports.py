"""The addresses `--task-runner dask`'s local cluster (scheduler, dashboard, workers and nannies) listens on.

Run as a module it starts the cluster and prints one `IP PORT` line per listening socket of this process
and its children; `listening()` runs it in a child process, so the cluster never lives in the caller.
"""

from __future__ import annotations

import os
import subprocess
import sys

from testing.cli import QUIET, ROOT


def listening(timeout: float = 180) -> tuple[subprocess.CompletedProcess, list[tuple[str, int]]]:
    """The child's process result and the (ip, port) pairs it found."""
    env = {**os.environ, **QUIET}
    r = subprocess.run([sys.executable, "-m", "testing.dask_ports"], cwd=ROOT, capture_output=True, text=True,
                       timeout=timeout, env=env)
    return r, [(ip, int(port)) for ip, port in (line.split() for line in r.stdout.splitlines())]


def main() -> None:
    import psutil

    from flows.runners import make_task_runner

    with make_task_runner("dask") as runner:
        runner.client  # noqa: B018 - starts the cluster
        me = psutil.Process()
        for p in [me, *me.children(recursive=True)]:
            for c in p.net_connections(kind="inet"):
                if c.status == psutil.CONN_LISTEN:
                    print(c.laddr.ip, c.laddr.port)


if __name__ == "__main__":
    main()
