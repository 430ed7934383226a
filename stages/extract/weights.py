"""Weightless ONNX models: an architecture kept without its weights, and seeded random weights for it.

`strip_weights` replaces every float initializer by its name, shape and dtype plus four numbers
(mean, std, min, max) in the tensor's metadata, so a 100 MB export becomes a few hundred KB that
can be committed (data/zoo/). Non-float initializers (Reshape shapes, axes, indices) and float
scalars (Clip bounds) are structure, not weights: they are kept verbatim.

`fill_weights` draws each stripped tensor back from its statistics: uniform on [min, max] when the
spread says the original was uniform, else normal with the sample's mean and std set to the
recorded ones, clipped to [min, max] (so a tensor that was positive stays positive). Each draw
depends on the seed and the tensor's name only.

Activations keep the scale the statistics carry, so they must come from a network whose scale is
sane: a freshly built torchvision CNN's BatchNorms are identities (1, 0, 0, 1), and without them
MobileNetV2's output fell to 1e-9 and Inception-v3's rose to 1e12; data/zoo/export.py measures
them on random images first. Redrawn independently, weights lose their per-channel match with the
BatchNorm they were measured with (folded into them or not), so activations still drift, but
within about 0.05..1e4 over the zoo's 50-120 layers. A constant tensor (std 0) stays constant,
except BatchNormalization's parameters, which a fresh network (or the scale and shift of one with
measured statistics) records as constants that would test nothing: they get a mild per-channel
spread (scale x 0.8-1.2, variance x 0.5-1.5 so it stays positive, shift and mean + N(0, 0.1)).

Only onnx and numpy: the export script (data/zoo/export.py) loads this file from the export venv.
"""

from __future__ import annotations

import json
import math
import zlib

import numpy as np
import onnx
from onnx import TensorProto, helper

STATS_KEY = "tunaflow.weightless"
_FLOATS = (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16)
_TYPED_FIELDS = ("float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data")
# A uniform tensor's std is (max - min) / sqrt(12); a clipped normal's is well below its range / sqrt(12).
_UNIFORM_TOLERANCE = 0.05


def has_data(t: TensorProto) -> bool:
    """Whether an initializer carries its values (inline or as external data); empty tensors trivially do."""
    return (bool(t.raw_data) or any(len(getattr(t, f)) for f in _TYPED_FIELDS)
            or t.data_location == TensorProto.EXTERNAL or math.prod(t.dims) == 0)


def is_weightless(proto: onnx.ModelProto) -> bool:
    """Whether some initializer has only a shape: the model must go through `fill_weights` to run."""
    return any(not has_data(t) for t in proto.graph.initializer)


def strip_weights(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `proto` whose float initializers (beyond scalars) keep only shape, dtype and statistics."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    for t in out.graph.initializer:
        if t.data_type not in _FLOATS or math.prod(t.dims) <= 1 or not has_data(t):
            continue
        arr = onnx.numpy_helper.to_array(t).astype(np.float64)
        stats = {"mean": float(arr.mean()), "std": float(arr.std()), "min": float(arr.min()),
                 "max": float(arr.max())}
        bare = TensorProto(name=t.name, dims=t.dims, data_type=t.data_type, doc_string=t.doc_string)
        bare.metadata_props.add(key=STATS_KEY, value=json.dumps(stats))
        t.CopyFrom(bare)
    return out


def fill_weights(proto: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """A copy of a weightless `proto` with every data-less initializer drawn from its recorded statistics.

    Each tensor's draw depends only on the seed and its name, so the same seed gives the same weights."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    bn_roles = _batchnorm_roles(out.graph)
    for t in out.graph.initializer:
        if has_data(t):
            continue
        stats = _stats(t)
        rng = np.random.default_rng([seed, zlib.crc32(t.name.encode())])
        arr = _draw(rng, tuple(t.dims), stats, bn_roles.get(t.name))
        dtype = helper.tensor_dtype_to_np_dtype(t.data_type)
        filled = onnx.numpy_helper.from_array(arr.astype(dtype), t.name)
        filled.doc_string = t.doc_string
        t.CopyFrom(filled)
    return out


def _stats(t: TensorProto) -> dict[str, float]:
    for p in t.metadata_props:
        if p.key == STATS_KEY:
            return json.loads(p.value)
    raise ValueError(f"initializer {t.name!r} has no data and no recorded statistics ({STATS_KEY}) to draw it from")


def _batchnorm_roles(graph: onnx.GraphProto) -> dict[str, str]:
    roles = {}
    for node in graph.node:
        if node.op_type == "BatchNormalization":
            for name, role in zip(node.input[1:5], ("scale", "bias", "mean", "var"), strict=False):
                roles[name] = role
    return roles


def _draw(rng: np.random.Generator, shape: tuple[int, ...], s: dict[str, float], role: str | None) -> np.ndarray:
    mean, std, lo, hi = s["mean"], s["std"], s["min"], s["max"]
    if std == 0:
        base = np.full(shape, mean)
        if role == "var":
            return base * rng.uniform(0.5, 1.5, shape)
        if role == "scale":
            return base * rng.uniform(0.8, 1.2, shape)
        if role in ("bias", "mean"):
            return base + rng.normal(0.0, 0.1, shape)
        return base
    if abs((hi - lo) / math.sqrt(12) - std) <= _UNIFORM_TOLERANCE * std:
        return rng.uniform(lo, hi, shape)
    z = rng.standard_normal(shape)
    if z.size > 1:  # exactly the recorded mean and std before clipping, even for a 64-channel bias
        z = (z - z.mean()) / z.std()
    return np.clip(mean + std * z, lo, hi)
