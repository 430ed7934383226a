"""One pipeline: the direct path and the Prefect flow run the same stage code, so a seeded session logs the
same configs either way; objects cross the flow boundary whole; every command leaves a log directory that
any Parquet reader opens."""

from pathlib import Path

import pyarrow.dataset as ds

from schemas import MeasureOptions, Target, TuningOptions, matmul_task
from schemas.record import REMEASURE
from stages.log import TuningLog
from testing.cli import tunaflow

ROOT = Path(__file__).resolve().parent.parent
MLP = ROOT / "data" / "models" / "mlp.onnx"
TASK = matmul_task(16, 40, 24)
FAST = MeasureOptions(number=1, repeat=2, min_repeat_ms=1, n_parallel=1)


def _trials(log: Path) -> list[tuple[str, int, int]]:
    return sorted((r.task_signature, r.trial, r.config.index) for r in TuningLog(log).records() if r.tuner != REMEASURE)


def test_direct_and_prefect_runs_of_a_seeded_session_log_the_same_configs(prefect_server, tmp_path):
    from flows.tune_model import tune_model as model_flow
    from flows.tune_op import tune_op as op_flow
    from stages.pipeline.model import tune_model
    from stages.pipeline.op import tune_op

    options = TuningOptions(n_trials=9, batch_size=4, tuner="random", seed=7, measure=FAST)
    direct = tune_op(TASK, Target.host(), options, tmp_path / "direct")
    flowed = op_flow(TASK, Target.host(), options, str(tmp_path / "flow"), progress=False)
    assert len(_trials(tmp_path / "direct")) == 9 and _trials(tmp_path / "direct") == _trials(tmp_path / "flow")
    assert direct.trials == flowed.trials == 9 and direct.default_gflops and flowed.default_gflops

    options = TuningOptions(batch_size=2, tuner="random", seed=3, top_k_remeasure=1, measure=FAST)
    tune_model(MLP, Target.host(), options, tmp_path / "mdirect", tmp_path / "lib1", budget=6, scheduler="round-robin")
    model_flow(str(MLP), Target.host(), options, str(tmp_path / "mflow"), str(tmp_path / "lib2"), budget=6,
               scheduler="round-robin", compare_default=False)
    assert len(_trials(tmp_path / "mdirect")) == 6 and _trials(tmp_path / "mdirect") == _trials(tmp_path / "mflow")


def test_a_preset_target_reaches_the_flow_with_its_caches(prefect_server, tmp_path):
    from flows.tune_op import tune_op

    preset = Target.parse("x86-64-avx2")  # 256 KiB L2 and 8 MiB L3, whatever this machine has
    options = TuningOptions(n_trials=2, batch_size=2, tuner="random", top_k_remeasure=0, measure=FAST)
    report = tune_op(TASK, preset, options, str(tmp_path / "log"), progress=False)
    assert report.target == preset and (report.target.l2_bytes, report.target.l3_bytes) == (256 << 10, 8 << 20)
    assert {r.target_key for r in TuningLog(tmp_path / "log").records()} == {preset.key}


def test_every_command_leaves_a_log_any_parquet_reader_opens(tmp_path):
    r = tunaflow("tune-op", "matmul", "--m", "8", "--n", "16", "--k", "8", "--trials", "3", "--batch-size", "3",
                 "--tuner", "random", "--log", str(tmp_path / "op"), "--no-prefect")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "op-charts").is_dir() and not list((tmp_path / "op").glob("*.png"))
    r = tunaflow("tune", str(MLP), "--trials", "3", "--batch-size", "3", "--tuner", "random", "--log",
                 str(tmp_path / "model"), "-o", str(tmp_path / "lib"), "--no-prefect", "--json")
    assert r.returncode == 0, r.stderr
    r = tunaflow("log", "merge", str(tmp_path / "merged"), str(tmp_path / "op"), str(tmp_path / "model"))
    assert r.returncode == 0, r.stderr
    for name in ("op", "model", "merged"):
        log = tmp_path / name
        table = ds.dataset(log, format="parquet").to_table()
        assert table.num_rows == len(TuningLog(log).records()) > 0, name
        assert sorted(p.name for p in log.iterdir() if not p.name.startswith(".")) == \
            sorted(p.name for p in log.glob("part-*.parquet")), f"{name} holds more than its Parquet parts"
