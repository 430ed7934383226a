"""A real flow run on Prefect's temporary local server, writing a real Parquet log."""

import asyncio

from schemas import MeasureOptions, TuningOptions, matmul_task
from stages.log import TuningLog

TASK = matmul_task(16, 48, 32)


def test_tune_op_flow_runs_on_prefect_and_writes_the_log(prefect_server, tmp_path):
    from prefect.client.orchestration import get_client

    from flows.tune_op import tune_op

    options = TuningOptions(n_trials=6, batch_size=3, measure=MeasureOptions(number=1, repeat=2, min_repeat_ms=1,
                                                                             n_parallel=1))
    result = tune_op(TASK, "host", options, str(tmp_path / "log"), progress=False)
    records = TuningLog(tmp_path / "log").records()
    assert result["trials"] == len(records) == 6
    assert result["best_gflops"] == round(max(r.gflops for r in records), 2) > 0
    assert result["default_gflops"] > 0 and result["numpy_gflops"] > 0
    assert list((tmp_path / "log").glob("part-*.parquet"))

    async def task_run_names() -> list[str]:
        async with get_client() as client:
            runs = await client.read_task_runs()
            return [r.name for r in runs]

    names = asyncio.run(task_run_names())
    for step in ("propose", "build", "measure", "record", "measure-default"):
        assert any(n.startswith(step + "-") for n in names), (step, names)

    again = tune_op(TASK, "host", options.model_copy(update={"n_trials": 8}), str(tmp_path / "log"), progress=False)
    assert again["trials"] == 8 and again["new_trials"] == 2
