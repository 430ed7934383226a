import pytest
from pydantic import ValidationError

from schemas import (
    Config,
    MeasureErrorNo,
    MeasureOptions,
    MeasureResult,
    Target,
    TargetError,
    TensorSpec,
    TuningOptions,
    TuningTask,
    matmul_task,
)
from schemas.task import EpilogueOp, parse_epilogue


def test_host_target_detects_this_machine(host):
    assert host.name == "host"
    assert host.triple.startswith(("x86_64", "aarch64"))
    assert host.cores >= 1
    assert host.vector_bits in (128, 256, 512)
    assert host.l1_bytes < host.l2_bytes <= host.l3_bytes
    assert host.key == Target.host().key


def test_target_parses_tvm_like_string():
    t = Target.parse("llvm -mtriple=x86_64-linux-gnu -mcpu=skylake-avx512 -num-cores=2")
    assert (t.triple, t.cpu, t.cores, t.vector_bits) == ("x86_64-linux-gnu", "skylake-avx512", 2, 512)
    again = Target.parse(t.to_string())
    assert again.key == t.key


def test_target_presets_and_key_ignores_name_and_feature_order():
    avx2 = Target.parse("x86-64-avx2")
    assert avx2.vector_bits == 256 and avx2.vector_registers == 16
    assert Target.parse("aarch64").vector_bits == 128
    a = Target(name="a", triple="x86_64", cpu="c", features="+b,+a", cores=1, vector_bits=256,
               l1_bytes=1, l2_bytes=2, l3_bytes=3)
    b = a.model_copy(update={"name": "b", "features": "+a,+b"})
    assert a.key == Target.model_validate(b.model_dump()).key


@pytest.mark.parametrize("text, fragment", [
    ("cuda -arch=sm_80", "unknown target"),
    ("llvm -mcpu", "not of the form"),
    ("llvm -mtriple=x86_64-linux-gnu -mcpu=haswell -bogus=1", "unknown target option"),
    ("llvm -mtriple=x86_64-linux-gnu -mcpu=haswell -num-cores=two", "bad number"),
    ("no-such-preset", "unknown target"),
    ("llvm -mtriple=x86_64-linux-gnu -mcpu=[/]:a:", "-mcpu='\\[/\\]:a:' is not a valid LLVM name"),
    ("llvm -mtriple=x86_64 linux -mcpu=haswell", "not of the form"),
    ("llvm -mtriple=x86_64-linux-gnu -mcpu=haswell -mattr=avx2", "not a comma list"),
])
def test_bad_target_strings_name_the_problem(text, fragment):
    with pytest.raises(TargetError, match=fragment):
        Target.parse(text)


def test_target_rejects_bad_vector_width():
    with pytest.raises(ValidationError, match="vector_bits must be"):
        Target(name="x", triple="x86_64", cpu="c", cores=1, vector_bits=100, l1_bytes=1, l2_bytes=1, l3_bytes=1)


def test_task_signature_is_stable_and_order_independent():
    a = TuningTask(op="conv2d", inputs=(TensorSpec(shape=(1, 3, 8, 8)), TensorSpec(shape=(4, 3, 3, 3))),
                   outputs=(TensorSpec(shape=(1, 4, 6, 6)),), attrs={"stride": (1, 1), "groups": 1})
    b = TuningTask(op="conv2d", inputs=a.inputs, outputs=a.outputs, attrs={"groups": 1, "stride": (1, 1)})
    assert a.signature == b.signature
    assert len(a.signature) == 16
    assert matmul_task(4, 5, 6).signature != matmul_task(4, 6, 5).signature
    assert TuningTask.model_validate_json(a.model_dump_json()).signature == a.signature


def test_task_flops_and_description():
    t = matmul_task(2, 3, 4)
    assert t.flops == 2 * 2 * 3 * 4
    assert t.description == "matmul(2x4,4x3)"


@pytest.mark.parametrize("payload, fragment", [
    ({"op": "softmax", "inputs": [{"shape": [1]}], "outputs": [{"shape": [1]}]}, "op"),
    ({"op": "matmul", "inputs": [{"shape": [0, 3]}], "outputs": [{"shape": [1]}]}, "positive integer"),
    ({"op": "matmul", "inputs": [{"shape": [2], "dtype": "float16"}], "outputs": [{"shape": [1]}]}, "dtype"),
    ({"op": "matmul", "inputs": [], "outputs": [{"shape": [1]}]}, "inputs"),
    ({"op": "matmul", "inputs": [{"shape": [1]}], "outputs": [{"shape": [1]}], "extra": 1}, "extra"),
])
def test_task_validation_errors_name_the_field(payload, fragment):
    with pytest.raises(ValidationError, match=fragment):
        TuningTask.model_validate(payload)


def test_epilogue_parsing():
    ops = parse_epilogue("bias, relu,clip:0:6,leaky_relu:0.1")
    assert ops == (EpilogueOp(kind="bias"), EpilogueOp(kind="relu"),
                   EpilogueOp(kind="clip", attrs={"min": 0.0, "max": 6.0}),
                   EpilogueOp(kind="leaky_relu", attrs={"alpha": 0.1}))
    with pytest.raises(ValueError, match="takes 1 parameter"):
        parse_epilogue("leaky_relu:1:2")
    with pytest.raises(ValueError, match="must be numbers"):
        parse_epilogue("clip:a:b")
    with pytest.raises(ValidationError, match="kind"):
        parse_epilogue("softplus")


def test_measure_result_statistics():
    r = MeasureResult(costs=(3.0, 1.0, 2.0))
    assert r.ok and r.median == 2.0
    assert r.spread == pytest.approx(0.5)
    bad = MeasureResult(error_no=MeasureErrorNo.wrong_answer, error_msg="max abs error 3")
    assert not bad.ok and bad.median == float("inf")
    assert MeasureErrorNo.run_timeout.name == "run_timeout"


def test_config_key_is_order_independent():
    assert Config(index=1, knobs={"a": 1, "b": "x"}).key() == Config(index=1, knobs={"b": "x", "a": 1}).key()
    with pytest.raises(ValidationError):
        Config(index=-1, knobs={})


def test_options_defaults_and_errors():
    o = TuningOptions()
    assert o.n_trials >= 1 and o.measure.repeat >= 1
    with pytest.raises(ValidationError, match="n_trials"):
        TuningOptions(n_trials=0)
    with pytest.raises(ValidationError, match="timeout"):
        MeasureOptions(timeout=0)
    with pytest.raises(ValidationError, match="tuner"):
        TuningOptions(tuner="annealing-typo")
