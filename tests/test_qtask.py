"""The int8 task kinds in the task schema: dtypes, FLOPs, descriptions, and float tasks unchanged."""

import pytest
from pydantic import ValidationError

from schemas.task import TensorSpec, TuningTask, matmul_task, parse_epilogue
from stages.templates import conv2d, dense, qdense


def test_float_task_signatures_are_what_they_were_before_int8_dtypes():
    """Logs are keyed on signatures: growing the op and dtype literals must not re-key a float task."""
    assert matmul_task(64, 48, 32).signature == "fe25ce7b7c0c9546"
    assert dense.task(128, 768, 3072, parse_epilogue("bias,relu")).signature == "7eb4c06e4b761107"
    assert conv2d.conv2d_task((1, 64, 56, 56), (64, 64, 3, 3), pads=(1, 1, 1, 1)).signature == "8985a4acc034881f"


def test_qdense_task_dtypes_flops_description():
    t = qdense.task(128, 768, 3072, parse_epilogue("relu"), x_dtype="int8", y_zero_point=3)
    assert [s.dtype for s in t.inputs] == ["int8", "int8", "int32", "float32"] and t.outputs[0].dtype == "uint8"
    assert t.flops == 2 * 128 * 768 * 3072
    assert t.description == "qdense(128x3072,768x3072:int8->uint8)+relu"
    assert t.signature != qdense.task(128, 768, 3072, parse_epilogue("relu"), y_zero_point=3).signature


def test_bad_int8_tasks_are_refused_with_a_reason():
    with pytest.raises(ValidationError, match="dtype"):
        TensorSpec(shape=(2,), dtype="uint16")
    with pytest.raises(ValueError, match="only"):
        qdense.task(4, 4, 4, parse_epilogue("sigmoid"))
    with pytest.raises(ValueError, match="x_zero_point=300"):
        qdense.task(4, 4, 4, x_zero_point=300)
    with pytest.raises(ValueError, match="y_dtype"):
        qdense.task(4, 4, 4, y_dtype="int32")
    assert TuningTask.model_validate(qdense.task(2, 3, 4).model_dump(mode="json")) == qdense.task(2, 3, 4)
