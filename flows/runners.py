"""Task runners by name, so a flow can be scaled out without code changes.

`local` runs task runs in threads of the flow's process (builds still use the builder's own
processes); `dask` starts a local Dask cluster (one single-threaded worker process per core);
`dask://HOST:PORT` (or `tcp://HOST:PORT`) uses an existing Dask scheduler. With Dask, every
candidate is built by its own task run on the cluster; measurement stays on the runner.
"""

from __future__ import annotations

import os

from prefect.task_runners import TaskRunner

# The local cluster's scheduler, workers and dashboard listen on this machine only (Dask's default
# dashboard address is every interface, port 8787); `dask://HOST:PORT` is how to reach further.
LOOPBACK = {"host": "127.0.0.1", "dashboard_address": "127.0.0.1:0"}


def make_task_runner(spec: str) -> TaskRunner | None:
    """None means the flow's default; ValueError names a spec that is not understood."""
    if spec == "local":
        return None
    if spec == "dask" or spec.startswith(("dask://", "tcp://")):
        try:
            from prefect_dask import DaskTaskRunner
        except ImportError as exc:
            raise ValueError("--task-runner dask needs prefect-dask: pip install 'tunaflow[dask]'") from exc
        if spec == "dask":
            import dask

            # Non-daemon workers may start the process a candidate is built in (its build timeout needs one).
            dask.config.set({"distributed.worker.daemon": False})
            workers = len(os.sched_getaffinity(0))
            return DaskTaskRunner(cluster_kwargs={"n_workers": workers, "threads_per_worker": 1, "processes": True,
                                                  **LOOPBACK})
        return DaskTaskRunner(address="tcp://" + spec.split("://", 1)[1])
    raise ValueError(f"unknown task runner {spec!r}; use local, dask, or dask://HOST:PORT")


def is_distributed(spec: str) -> bool:
    return spec != "local"
