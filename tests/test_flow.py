"""A real flow run on Prefect's temporary local server, writing a real Parquet log."""

import asyncio
from pathlib import Path

from schemas import MeasureOptions, Target, TuningOptions, matmul_task
from stages.log import TuningLog

TASK = matmul_task(16, 48, 32)


def test_tune_op_flow_runs_on_prefect_and_writes_the_log(prefect_server, tmp_path):
    from prefect.client.orchestration import get_client

    from flows.tune_op import tune_op

    options = TuningOptions(n_trials=6, batch_size=3, top_k_remeasure=0,
                            measure=MeasureOptions(number=1, repeat=2, min_repeat_ms=1, n_parallel=1))
    result = tune_op(TASK, Target.host(), options, str(tmp_path / "log"), progress=False)
    records = TuningLog(tmp_path / "log").records()
    assert result.trials == len(records) == 6
    assert result.best_gflops == round(max(r.gflops for r in records), 2) > 0
    assert result.default_gflops > 0 and result.numpy_gflops > 0
    assert list((tmp_path / "log").glob("part-*.parquet"))
    assert result.best_latency_ms > 0 and Path(result.chart).stat().st_size > 10_000
    assert Path(result.chart).parent == tmp_path / "log-charts"  # beside the log, which holds only Parquet

    async def task_run_names() -> list[str]:
        async with get_client() as client:
            runs = await client.read_task_runs()
            return [r.name for r in runs]

    names = asyncio.run(task_run_names())
    for step in ("propose", "build", "measure", "record"):
        assert f"{step} {TASK.description}" in names, (step, names)

    async def artifacts() -> dict[str, str]:
        async with get_client() as client:
            return {a.key: a.type for a in await client.read_artifacts() if a.key}

    kinds = asyncio.run(artifacts())
    assert kinds[f"progress-matmul-{TASK.signature}"] == "progress"
    assert kinds[f"results-matmul-{TASK.signature}"] == "markdown"
    assert kinds[f"convergence-matmul-{TASK.signature}"] == "markdown"

    again = tune_op(TASK, Target.host(), options.model_copy(update={"n_trials": 8}), str(tmp_path / "log"),
                    progress=False)
    assert again.trials == 8 and again.new_trials == 2


def test_dask_task_runner_builds_each_candidate_as_a_task_run(prefect_server, tmp_path):
    from prefect.client.orchestration import get_client

    from flows.runners import make_task_runner
    from flows.tune_op import tune_op

    task = matmul_task(8, 16, 8)
    options = TuningOptions(n_trials=4, batch_size=4, top_k_remeasure=0,
                            measure=MeasureOptions(number=1, repeat=2, min_repeat_ms=1, n_parallel=1))
    flow = tune_op.with_options(task_runner=make_task_runner("dask"))
    result = flow(task, Target.host(), options, str(tmp_path / "log"), progress=False, distributed_builds=True)
    assert result.trials == 4 and len(TuningLog(tmp_path / "log").records()) == 4

    async def candidate_runs() -> list[str]:
        async with get_client() as client:
            return [r.name for r in await client.read_task_runs() if r.name.startswith(f"build {task.description} #")]

    assert len(asyncio.run(candidate_runs())) == 4


def test_unknown_task_runner_is_a_clear_error():
    import pytest

    from flows.runners import make_task_runner

    with pytest.raises(ValueError, match="unknown task runner 'spark'"):
        make_task_runner("spark")
    assert make_task_runner("local") is None


def test_tune_model_flow_names_rounds_after_tasks_and_publishes_reports(prefect_server, tmp_path):
    from prefect.client.orchestration import get_client

    from flows.tune_model import tune_model

    model = Path(__file__).resolve().parent.parent / "data" / "models" / "mlp.onnx"
    options = TuningOptions(n_trials=4, batch_size=2, tuner="random", top_k_remeasure=1,
                            measure=MeasureOptions(number=1, repeat=2, min_repeat_ms=1, n_parallel=1))
    result = tune_model(str(model), Target.host(), options, str(tmp_path / "log"), str(tmp_path / "lib"), budget=4)
    assert sum(t.trials for t in result.tasks) == 4
    assert result.latency["tuned"]["median_ms"] > 0 and result.latency["default"]["median_ms"] > 0

    async def names_and_artifacts() -> tuple[list[str], dict[str, str]]:
        async with get_client() as client:
            runs = [r.name for r in await client.read_task_runs()]
            arts = {a.key: a.data for a in await client.read_artifacts() if a.key}
            return runs, arts

    runs, arts = asyncio.run(names_and_artifacts())
    first = result.tasks[0].task
    for step in ("propose", "build", "measure", "record"):
        assert f"{step} {first}" in runs, (step, runs)
    assert "build-mlp" in arts and "End-to-end latency" in arts["build-mlp"] and "| dense |" in arts["build-mlp"]
    assert "results-mlp-host" in arts and first in arts["results-mlp-host"]


def test_the_temporary_server_batches_task_run_writes_unless_the_user_says_otherwise(monkeypatch):
    from flows.server import SERVER_DEFAULTS, server_env

    key = "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE"
    monkeypatch.delenv(key, raising=False)
    assert server_env()[key] == SERVER_DEFAULTS[key] == "100"
    monkeypatch.setenv(key, "7")
    assert server_env()[key] == "7"
    assert server_env()["PREFECT__SERVER_EPHEMERAL"] == "1"
