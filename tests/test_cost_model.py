"""Cost model: features across shapes, LightGBM objectives, ranking metric, transfer learning."""

from pathlib import Path

import numpy as np
import pytest

from schemas import MeasureOptions, MeasureResult, TuningOptions, matmul_task
from schemas.measure import MeasureErrorNo
from schemas.task import TensorSpec, TuningTask
from stages.cost_model.dataset import Rows, knob_columns, speed, task_rows, transfer_rows
from stages.cost_model.features import FEATURES, featurize, generic_features
from stages.cost_model.lgbm import LGBMModel, relevance
from stages.cost_model.metrics import topk_recall
from stages.log import TuningLog
from stages.search import make_tuner
from stages.search.base import TunerContext
from stages.search.codec import SpaceCodec
from stages.search.lgbm import ModelTuner
from stages.templates import template_for
from stages.tune.session import TuningSession
from stages.tune.simulate import load_samples
from stages.tune.transfer import load_transfer

SAMPLES = Path(__file__).resolve().parents[1] / "data" / "samples"


@pytest.fixture(scope="module")
def small():
    return load_samples(str(SAMPLES / "matmul_24x40x16"))[0]


@pytest.fixture(scope="module")
def other():
    return load_samples(str(SAMPLES / "matmul_20x36x12"))[0]


def feature_names(task, host, threads, values):
    """`featurize`'s column names, in its order: the keys its op kind's feature function returns."""
    return list(FEATURES[task.op](task, host, threads, values))


def random_rows(task, host, n=64, seed=0):
    codec = SpaceCodec(template_for(task).space(task, host))
    return codec.values(codec.random_valid(np.random.default_rng(seed), n, set()))


@pytest.mark.parametrize("shape", [(127, 1000, 777), (1, 3, 5), (512, 512, 512)])
def test_features_are_finite_and_line_up_across_odd_shapes(host, shape):
    task = matmul_task(*shape)
    values = random_rows(task, host)
    x = featurize(task, host, 1, values)
    names = feature_names(task, host, 1, values)
    assert x.shape == (len(values["mr"]), len(names)) and np.isfinite(x).all()
    assert names == feature_names(matmul_task(8, 8, 8), host, 2, random_rows(matmul_task(8, 8, 8), host, 4))


def test_derived_features_have_the_loop_nest_values(host):
    task = matmul_task(127, 1000, 777)
    knobs = {"mr": 6, "nv": 2, "vw": 16, "kc": 256, "mc": 8, "nc": 4, "uk": 4, "order": "jr_ir", "pack_a": 1,
             "par": "n"}
    names = feature_names(task, host, 2, knob_columns([knobs]))
    f = dict(zip(names, featurize(task, host, 2, knob_columns([knobs]))[0], strict=True))
    assert f["nr"] == 32 and f["tile_elems"] == 192 and f["lane_use"] == 1.0
    assert f["n_waste"] == pytest.approx((32 * 32 - 1000) / 1000)
    assert f["m_tail"] == pytest.approx((127 - 21 * 6) / 127)
    assert f["k_blocks"] == 4 and f["k_waste"] == pytest.approx((4 * 256 - 777) / 777)
    assert f["b_panel_l1"] == pytest.approx(256 * 32 * 4 / host.l1_bytes)
    assert f["unrolled_fmas"] == 6 * 2 * 4 and f["k_trips"] == 64
    assert f["n_blocks"] == 8 and f["chunks_per_core"] == 4 and f["pack_a"] == 1


@pytest.mark.parametrize("op, opts", [("dense", {"m": 127, "n": 1000, "k": 777, "epilogue": "bias,relu"}),
                                      ("batch_matmul", {"b": 3, "m": 33, "n": 65, "k": 17}),
                                      ("conv2d", {"input": "1x32x17x13", "weight": "32x1x3x3", "stride": "2",
                                                  "pad": "1", "groups": 32})])
def test_every_template_gets_finite_features(host, op, opts):
    from stages.templates import TEMPLATES

    task = TEMPLATES[op].task_from_cli(opts)
    values = random_rows(task, host, 16)
    x = featurize(task, host, 2, values)
    assert task.op in FEATURES and x.shape[0] == len(values["mr"]) and np.isfinite(x).all()


def test_conv_features_see_the_flat_grid_and_the_lane_axis(host):
    from stages.cost_model.features import conv2d_features
    from stages.templates import TEMPLATES

    task = TEMPLATES["conv2d"].task_from_cli({"input": "1x16x28x28", "weight": "16x16x3x3", "pad": "1"})
    base = {"vw": 16, "mr": 4, "nw": 1, "rh": 1, "icb": 16, "uk": 1, "ocn": 1, "unroll": 1, "order": "chw",
            "par": "oc"}
    f = conv2d_features(task, host, 1, knob_columns([{**base, "flat": 1, "axis": "oc"}, {**base, "flat": 0,
                                                                                          "axis": "w"}]))
    assert list(f["flat"]) == [1, 0] and list(f["axis_oc"]) == [1, 0]
    # 28 x 30-wide grid (28 + 2 pad) in 16-lane tiles: 53 tiles = 848 lanes for 784 outputs
    assert f["grid_waste"][0] == pytest.approx((848 - 784) / 784) and f["grid_waste"][1] == 0


def test_conv_features_count_channel_vector_tiles_as_the_kernel_splits_them(host):
    """28 columns: column tiles waste 4 of 32 lanes; channel-vector tiles are 2 x 14 (Plan.tile_w)."""
    from stages.cost_model.features import conv2d_features
    from stages.templates import TEMPLATES, conv2d

    task = TEMPLATES["conv2d"].task_from_cli({"input": "1x32x28x28", "weight": "32x32x3x3", "pad": "1"})
    base = {"vw": 16, "mr": 16, "nw": 1, "rh": 2, "icb": 32, "uk": 1, "ocn": 1, "unroll": 0, "order": "chw",
            "par": "oh", "flat": 0}
    knobs = [{**base, "axis": "oc"}, {**base, "axis": "w", "mr": 8}]
    f = conv2d_features(task, host, 1, knob_columns(knobs))
    assert conv2d.plan(task, knobs[0]).tile_w == 14
    assert list(f["tile_outputs"]) == [16 * 2 * 14, 8 * 2 * 16]
    assert f["ow_waste"][0] == 0 and f["ow_waste"][1] == pytest.approx(4 / 28)
    assert f["regs_use"][0] == pytest.approx((2 * 14 + 1 + 1) / host.vector_registers)


def test_gemm_features_read_shapes_from_the_output_and_flops(host):
    from stages.templates import TEMPLATES

    knobs = knob_columns([{"mr": 4, "nv": 1, "vw": 16, "kc": 64, "mc": 4, "nc": 4, "uk": 2}])
    dense = TEMPLATES["dense"].task_from_cli({"m": 127, "n": 1000, "k": 777})
    assert np.array_equal(featurize(dense, host, 1, knobs), featurize(matmul_task(127, 1000, 777), host, 1, knobs))


def test_ops_without_a_feature_function_get_generic_features(host):
    task = TuningTask(op="conv2d_winograd", inputs=(TensorSpec(shape=(1, 3, 7, 7)), TensorSpec(shape=(5, 3, 3, 3))),
                      outputs=(TensorSpec(shape=(1, 5, 5, 5)),))
    assert task.op not in FEATURES
    cols = knob_columns([{"oc_block": 16, "layout": "nchw16c"}, {"oc_block": 8, "layout": "nchw8c"}])
    out = generic_features(task, host, 1, cols)
    assert set(out) == {"knob_oc_block", "knob_layout", "out_log", "in_log", "lane_frac"}
    assert out["knob_oc_block"][0] > out["knob_oc_block"][1] and out["knob_layout"][0] != out["knob_layout"][1]
    x = featurize(task, host, 1, cols)
    assert x.shape == (2, len(out)) and np.isfinite(x).all()
    assert np.array_equal(x[:, 0], np.asarray(out["knob_oc_block"], dtype=np.float32))


def test_labels_take_the_fastest_repeat_and_zero_for_failures():
    assert speed(MeasureResult(costs=(2.0, 0.5, 4.0))) == 2.0
    assert speed(MeasureResult(costs=(), error_no=MeasureErrorNo.runtime_error, error_msg="boom")) == 0.0


def test_topk_recall_and_relevance_buckets():
    actual = np.array([5.0, 4.0, 3.0, 2.0, 1.0])
    assert topk_recall(actual, actual, 2) == 1.0
    assert topk_recall(-actual, actual, 2) == 0.0
    assert topk_recall(np.array([5.0, 1, 4, 2, 3]), actual, 2) == 0.5
    assert relevance(np.array([0.0, 0.5, 1.0])).tolist() == [0, 15, 30]


@pytest.fixture(scope="module")
def big():
    return load_samples(str(SAMPLES / "matmul_512"))[0]


def _ranks(v):
    return np.argsort(np.argsort(v))


@pytest.mark.parametrize("objective", ["regression", "lambdarank"])
def test_model_ranks_held_out_configs_of_a_recorded_sample(big, host, objective):
    recs = list(big.records.values())
    rows = task_rows(big.task, host, 1, [r.config.knobs for r in recs], np.array([r.gflops for r in recs]))
    order = np.random.default_rng(0).permutation(len(recs))
    train, test = order[:300], order[300:]
    model = LGBMModel(objective)
    model.fit(rows.x[train], rows.y[train], np.zeros(len(train), np.int64), np.ones(len(train)))
    pred = model.predict(rows.x[test])
    spearman = np.corrcoef(_ranks(pred), _ranks(rows.y[test]))[0, 1]
    assert spearman > 0.3, spearman
    chance = 100 / len(test)
    assert topk_recall(pred, rows.y[test], 100) > 2 * chance


def test_transfer_rows_group_per_task_and_normalise_each(small, other, host):
    recs = list(small.records.values()) + list(other.records.values())
    rows = transfer_rows(recs, host, weight=0.5)
    assert sorted(np.unique(rows.groups)) == [0, 1]
    for g in (0, 1):
        assert rows.y[rows.groups == g].max() == pytest.approx(1.0)
    assert np.all(rows.weights == 0.5)
    both = Rows.concat([rows, rows])
    assert sorted(np.unique(both.groups)) == [0, 1, 2, 3]


def test_transfer_trains_the_model_before_any_measurement(small, other, host):
    ctx = TunerContext(space=small.space, task=small.task, target=host, seed=0,
                       transfer=tuple(other.records.values()))
    tuner = make_tuner("lgbm", ctx)
    assert tuner._trained
    # against the same tuner without transfer and without the default-config prior: what a model knows
    # before its first measurement comes from the transfer records alone
    cold = ModelTuner(TunerContext(space=small.space, task=small.task, target=host, seed=0), prior=False)
    assert not cold._trained
    warm_first, cold_first = tuner.next_batch(8), cold.next_batch(8)
    assert len({c.index for c in warm_first}) == 8
    mean = lambda configs: small.gflops([c.index for c in configs]).mean()  # noqa: E731
    assert mean(warm_first) > mean(cold_first)


def test_session_resumes_from_an_exact_match_in_a_transfer_log(tmp_path, host, small):
    src = TuningLog(tmp_path / "other")
    version = template_for(small.task).VERSION  # a session resumes only from records of the current template
    src.append([r.model_copy(update={"target_key": host.key, "template_version": version})
                for r in list(small.records.values())[:10]])
    options = TuningOptions(n_trials=10, batch_size=5, tuner="lgbm", transfer_from=(str(tmp_path / "other"),),
                            measure=MeasureOptions(threads=small.threads))
    log = TuningLog(tmp_path / "log")
    session = TuningSession(small.task, host, options, log)
    assert session.trials == 10 and session.done and len(log.records()) == 10
    again = TuningSession(small.task, host, options, log)
    assert again.trials == 10 and len(log.records()) == 10
    transfer = load_transfer([str(tmp_path / "other")], small.task, host.key, small.threads)
    assert len(transfer.exact) == 10 and transfer.related == ()


def test_transfer_takes_the_op_family_and_nothing_else(tmp_path, host, small):
    from stages.templates import TEMPLATES

    src = TuningLog(tmp_path / "mm")
    src.append(list(small.records.values())[:5])
    dense = TEMPLATES["dense"].task_from_cli({"m": 24, "n": 40, "k": 16})
    assert len(load_transfer([str(tmp_path / "mm")], dense, host.key, 1).related) == 5
    conv = TEMPLATES["conv2d"].task_from_cli({"input": "1x4x6x6", "weight": "4x4x3x3"})
    assert load_transfer([str(tmp_path / "mm")], conv, host.key, 1) == load_transfer([], conv, host.key, 1)
