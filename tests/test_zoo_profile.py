"""benchmarks/zoo_profile.py: both profiles sort kernels into the same layer classes from shapes alone."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.zoo_profile import conv_class, op_class, task_class  # noqa: E402
from stages.templates.conv2d_shape import conv2d_task  # noqa: E402


@pytest.mark.parametrize("x,w,strides,pads,group,cls", [
    ((1, 64, 56, 56), (64, 64, 1, 1), 1, 0, 1, "conv 1x1"),
    ((1, 64, 56, 56), (64, 64, 3, 3), 1, 1, 1, "conv 3x3"),
    ((1, 64, 35, 35), (96, 64, 3, 3), 1, 0, 1, "conv 3x3"),  # an unpadded 3x3 loses 2 rows, not half
    ((1, 128, 56, 56), (128, 128, 3, 3), 2, 1, 1, "conv strided"),
    ((1, 256, 56, 56), (512, 256, 1, 1), 2, 0, 1, "conv strided"),
    ((1, 288, 35, 35), (384, 288, 3, 3), 2, 0, 1, "conv strided"),
    ((1, 144, 56, 56), (144, 1, 3, 3), 1, 1, 144, "depthwise 3x3"),
    ((1, 96, 112, 112), (96, 1, 3, 3), 2, 1, 96, "depthwise 3x3"),
    ((1, 672, 14, 14), (672, 1, 5, 5), 1, 2, 672, "depthwise 5x5"),
    ((1, 3, 224, 224), (64, 3, 7, 7), 2, 3, 1, "stem 7x7"),
    ((1, 768, 17, 17), (128, 768, 1, 7), 1, 0, 1, "conv other window"),
])
def test_a_conv_is_classified_alike_from_its_task_and_from_onnxruntime_shapes(x, w, strides, pads, group, cls):
    task = conv2d_task(x, w, (strides, strides), (pads if w[2] > 1 else 0, pads if w[3] > 1 else 0) * 2, (1, 1),
                       group)
    assert task_class(task) == cls
    assert op_class("Conv", (x, w, (w[0],)), task.outputs[0].shape) == cls
    assert op_class("FusedConv", (x, w), task.outputs[0].shape) == cls


def test_other_kernels_fall_into_their_classes():
    assert [op_class(op) for op in ("MaxPool", "GlobalAveragePool", "Gemm", "dense", "Concat", "ReorderOutput",
                                    "Sigmoid", "Add")] == \
        ["pool", "pool", "dense", "dense", "concat/copies", "concat/copies", "element-wise", "element-wise"]
    assert conv_class((1, 1, 8, 8), (4, 1, 3, 3), (1, 4, 8, 8)) == "conv 3x3"  # one input channel: not depthwise
