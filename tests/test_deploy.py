"""prefect.yaml as a user deploys it: to a local server, then one deployment run by a process worker."""

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
PREFECT = [sys.executable, "-m", "prefect"]


def test_every_target_has_a_scheduled_deployment():
    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    by_name = {d["name"]: d for d in spec["deployments"]}
    for d in by_name.values():
        assert d["schedules"] and d["schedules"][0]["cron"]
        module, func = d["entrypoint"].split(":")
        assert (ROOT / module).exists() and func in (ROOT / module).read_text()


def test_deploy_all_then_run_one_deployment_with_an_override(prefect_server, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    subprocess.run([*PREFECT, "work-pool", "create", "tunaflow", "--type", "process"], env=env, cwd=ROOT,
                   capture_output=True, text=True, timeout=120)
    deployed = subprocess.run([*PREFECT, "--no-prompt", "deploy", "--all"], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr

    log = tmp_path / "log"
    op = {"op": "matmul", "inputs": [{"shape": [16, 8]}, {"shape": [8, 24]}], "outputs": [{"shape": [16, 24]}]}
    options = {"n_trials": 3, "batch_size": 3, "tuner": "random", "top_k_remeasure": 0,
               "measure": {"number": 1, "repeat": 2, "min_repeat_ms": 1, "n_parallel": 1}}
    flow_run = run_deployment("tune-op/matmul-512-host", timeout=0,
                              parameters={"op": op, "options": options, "log_path": str(log)})
    worker = subprocess.run([*PREFECT, "worker", "start", "--pool", "tunaflow", "--run-once"], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=400)

    async def state() -> str:
        async with get_client() as client:
            return (await client.read_flow_run(flow_run.id)).state.type.value

    assert asyncio.run(state()) == "COMPLETED", worker.stdout[-3000:] + worker.stderr[-3000:]
    from stages.log import TuningLog

    records = TuningLog(log).records()
    assert len(records) == 3 and json.loads(records[0].task.model_dump_json())["inputs"][0]["shape"] == [16, 8]
