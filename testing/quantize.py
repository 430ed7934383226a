"""Quantized test models: the weight-free zoo graphs (data/zoo/) with seeded weights, quantized by onnxruntime.

CNNs go through `quantize_static` (QDQ format, per-channel int8 weights, uint8 activations, calibrated on a
few seeded random inputs), BERT through `quantize_dynamic` (MatMulInteger + DynamicQuantizeLinear), which is
what users who quantize for CPU latency run. A CNN may be re-bound to a smaller input resolution first (its
exports end in a global pool, so any size works) to keep tests fast. No torch is needed.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import numpy as np
import onnx

from stages.extract.weights import fill_weights
from stages.runtime.feeds import padding_mask

ZOO = Path(__file__).resolve().parents[1] / "data" / "zoo"
CNNS = ("resnet50", "mobilenet_v2", "efficientnet_b0", "densenet121", "inception_v3")
SEED = 0


@functools.cache
def filled(name: str, size: int | None = None) -> onnx.ModelProto:
    """The zoo model with seeded weights, its image input bound to `size` x `size` when given."""
    proto = fill_weights(onnx.load(ZOO / f"{name}.onnx"), seed=SEED)
    if size is not None:
        dims = proto.graph.input[0].type.tensor_type.shape.dim
        dims[2].dim_value = dims[3].dim_value = size
        del proto.graph.value_info[:]
        for out in proto.graph.output:
            out.type.tensor_type.ClearField("shape")
    return proto


def random_inputs(proto: onnx.ModelProto, seed: int, vocabulary: int = 30522) -> dict[str, np.ndarray]:
    """Seeded inputs for every graph input: standard-normal floats (images); for a transformer, token ids
    over the whole vocabulary and an attention mask whose last quarter is padding."""
    rng = np.random.default_rng(seed)
    init = {t.name for t in proto.graph.initializer}
    feeds = {}
    for i in (i for i in proto.graph.input if i.name not in init):
        shape = [d.dim_value for d in i.type.tensor_type.shape.dim]
        if i.type.tensor_type.elem_type == onnx.TensorProto.FLOAT:
            feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
        elif "mask" in i.name:
            feeds[i.name] = padding_mask(tuple(shape), np.int64)
        else:
            feeds[i.name] = rng.integers(0, vocabulary, shape, dtype=np.int64)
    return feeds


class _Calibration:
    """onnxruntime's CalibrationDataReader protocol over seeded random inputs."""

    def __init__(self, proto: onnx.ModelProto, count: int, seed: int) -> None:
        self._feeds = iter([random_inputs(proto, seed + k) for k in range(count)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._feeds, None)


def quantize_static(proto: onnx.ModelProto, calibration: int = 2, seed: int = 100, per_channel: bool = True,
                    activation: str = "uint8") -> onnx.ModelProto:
    """`proto` quantized in QDQ format: int8 weights (per channel by default), `activation` (uint8/int8)
    activations, the ranges calibrated (min/max) on `calibration` seeded random inputs."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType
    from onnxruntime.quantization import quantize_static as ort_quantize_static

    with tempfile.TemporaryDirectory(prefix="tunaflow-quant-") as tmp:
        src, dst = Path(tmp) / "fp32.onnx", Path(tmp) / "int8.onnx"
        onnx.save(proto, src)
        ort_quantize_static(
            str(src), str(dst), _Calibration(proto, calibration, seed), quant_format=QuantFormat.QDQ,
            per_channel=per_channel, weight_type=QuantType.QInt8,
            activation_type=QuantType.QUInt8 if activation == "uint8" else QuantType.QInt8,
            calibrate_method=CalibrationMethod.MinMax)
        return onnx.load(dst)


def quantize_dynamic(proto: onnx.ModelProto) -> onnx.ModelProto:
    """`proto` quantized dynamically (int8 weights, activations quantized at run time), as for transformers."""
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization import quantize_dynamic as ort_quantize_dynamic

    with tempfile.TemporaryDirectory(prefix="tunaflow-quant-") as tmp:
        src, dst = Path(tmp) / "fp32.onnx", Path(tmp) / "int8.onnx"
        onnx.save(proto, src)
        ort_quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8)
        return onnx.load(dst)


@functools.cache
def quantized_zoo(name: str, size: int | None = None) -> onnx.ModelProto:
    """A zoo model quantized: `quantize_static` for the CNNs (at `size` when given), `quantize_dynamic` else."""
    if name in CNNS:
        return quantize_static(filled(name, size))
    return quantize_dynamic(filled(name))


def onnxruntime_run(proto: onnx.ModelProto, feeds: dict[str, np.ndarray], threads: int = 1) -> dict[str, np.ndarray]:
    """Every output of `proto` as onnxruntime's CPU provider (its int8 kernels) computes it."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds), strict=True))
