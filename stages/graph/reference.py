"""A numpy interpreter of the Graph: the oracle for tests and the constant folder of the importer.

It runs the graph in node order with plain numpy, so it is slow but obviously right. Attributes
are the importer's normalised ones (the same the library build reads):

- Conv / conv2d: `strides` (2), `pads` (top, left, bottom, right), `dilations` (2), `group`.
- MaxPool / AveragePool: `kernel_shape`, `strides`, `pads` (top, left, bottom, right),
  `dilations`, `ceil_mode`, `count_include_pad`.
- Reshape / Flatten: `shape` (the output shape). Transpose: `perm`. Concat / Split: `axis`
  (non-negative), Split also `split` (sizes). Tile: `repeats`. Slice: `starts`, `steps` and
  `sizes` for every axis (element i of an axis is `starts + i * steps`). Pad: `pads` (all begins, then all
  ends), `mode`, `value`. Softmax / LogSoftmax: `axis` (one axis). LayerNormalization: `axis`,
  `epsilon`. InstanceNormalization: `epsilon`. ReduceMean/Sum/Max/Min/Prod/L1/L2/SumSquare/LogSum/
  LogSumExp: `axes`, `keepdims`.
  Clip: `min`, `max`. LeakyRelu, Elu: `alpha`. Selu: `alpha`, `gamma`. HardSigmoid, HardSwish: `alpha`,
  `beta` (HardSwish is x * HardSigmoid(x)). Swish: `alpha`. Shrink: `bias`, `lambd`. LRN: `size`,
  `alpha`, `beta`, `bias`. Gelu: `approximate`. Gemm: `alpha`, `beta`, `transA`, `transB`.
  BatchNormalization: `epsilon`. ConvTranspose: `strides`, `dilations`, `pads` (top, left, bottom,
  right), `output_padding`, `group`. Resize: `mode`, `coordinate_transformation_mode`, `nearest_mode`,
  `scales`, `sizes` (stages/graph/reference_resize.py).
- Anchors (`conv2d`, `dense`, `matmul`, `batch_matmul`) carry a `TuningTask`; their node inputs
  are the task inputs in order (X, W, then the epilogue tensors) and their tensors may be
  contiguous reshapes of the task's specs (a dense over [1, S, K] activations has X spec (S, K)).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np

from schemas.task import CONV_OPS, TuningTask
from stages.graph.epilogue import apply_reference
from stages.graph.ir import Graph, Node
from stages.graph.reference_index import INDEX_OPS
from stages.graph.reference_quant import QUANT_OPS
from stages.graph.reference_resize import RESIZE_OPS
from stages.graph.reference_transformer import TRANSFORMER_OPS, add_layer_norm

OpFn = Callable[[list[np.ndarray], dict], list[np.ndarray]]


def run(graph: Graph, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Evaluate the graph on `feeds` (one array per graph input) and return its outputs by name."""
    env: dict[str, np.ndarray] = dict(graph.constants)
    for value in graph.inputs:
        if value.name not in feeds:
            raise ValueError(f"missing input {value.name!r}")
        arr = np.asarray(feeds[value.name], dtype=value.dtype)
        if arr.shape != value.shape:
            raise ValueError(f"input {value.name!r} has shape {arr.shape}, the graph wants {value.shape}")
        env[value.name] = arr
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):  # NaN/inf propagate as ONNX says
        for node in graph.nodes:
            results = run_node(node, [env[name] for name in node.inputs])
            for name, res in zip(node.outputs, results, strict=True):
                env[name] = res.reshape(graph.values[name].shape) if name in graph.values else res
    return {v.name: env[v.name] for v in graph.outputs}


def run_node(node: Node, args: list[np.ndarray]) -> list[np.ndarray]:
    if node.task is not None and node.op not in QUANT_OPS:  # an int8 anchor's arithmetic is its op's, task or not
        return [run_anchor(node.task, args)]
    try:
        fn = OPS[node.op]
    except KeyError:
        raise ValueError(f"the reference interpreter has no op {node.op!r} (node {node.name!r})") from None
    return fn(args, node.attrs)


# --- anchors -----------------------------------------------------------------------------------

def run_anchor(task: TuningTask, args: list[np.ndarray]) -> np.ndarray:
    """The anchor op followed by its epilogue, on arrays shaped like the task's specs."""
    args = [a.reshape(spec.shape) for a, spec in zip(args, task.inputs, strict=True)]
    x, w = args[0], args[1]
    if task.op in CONV_OPS:
        a = task.attrs
        y = conv2d(x, w, a["strides"], a["pads"], a["dilations"], int(a["group"]))
    elif task.op == "dense":
        a = task.attrs
        y = a.get("alpha", 1.0) * ((x.T if a.get("trans_a") else x) @ (w.T if a.get("trans_b", True) else w))
    else:
        y = np.matmul(x, w)
    return apply_reference(task.epilogue, y, args[2:], channel_axis=1 if task.op in CONV_OPS else -1)


def conv2d(x: np.ndarray, w: np.ndarray, strides, pads, dilations, group: int) -> np.ndarray:
    """NCHW x OIHW convolution as a sum over kernel positions of grouped channel contractions."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    (sh, sw), (dh, dw), (pt, pl, pb, pr) = strides, dilations, pads
    oh = (h + pt + pb - (dh * (kh - 1) + 1)) // sh + 1
    ow = (wd + pl + pr - (dw * (kw - 1) + 1)) // sw + 1
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr))).reshape(n, group, cg, h + pt + pb, wd + pl + pr)
    wg = w.reshape(group, o // group, cg, kh, kw)
    out = np.zeros((n, group, o // group, oh, ow), dtype=np.float64)
    for i in range(kh):
        for j in range(kw):
            patch = xp[..., i * dh: i * dh + sh * (oh - 1) + 1: sh, j * dw: j * dw + sw * (ow - 1) + 1: sw]
            out += np.einsum("ngchw,goc->ngohw", patch, wg[..., i, j], optimize=True)
    return out.reshape(n, o, oh, ow).astype(np.float32)


# --- memory-bound ops ---------------------------------------------------------------------------

def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x.astype(np.float64)).astype(x.dtype)


def _gelu(x: np.ndarray, approximate: str = "none") -> np.ndarray:
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1 + _erf(x / np.sqrt(2)))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


UNARY: dict[str, Callable[[np.ndarray, dict], np.ndarray]] = {  # ONNX element-wise ops, by epilogue name
    "relu": lambda x, a: np.maximum(x, 0),
    "clip": lambda x, a: np.clip(x, a.get("min", -np.inf), a.get("max", np.inf)),
    "leaky_relu": lambda x, a: np.where(x >= 0, x, x * a.get("alpha", 0.01)),
    "sigmoid": lambda x, a: _sigmoid(x),
    "tanh": lambda x, a: np.tanh(x),
    "gelu": lambda x, a: _gelu(x),
}


def _pool(x: np.ndarray, a: dict, kind: str) -> np.ndarray:
    """Max or average pooling over the last two axes, with ONNX padding and ceil_mode rules."""
    kh, kw = a["kernel_shape"]
    (sh, sw), (dh, dw) = a["strides"], a.get("dilations", (1, 1))
    pt, pl, pb, pr = a["pads"]
    h, w = x.shape[-2:]
    oh = pool_out(h, kh, sh, pt, pb, dh, a.get("ceil_mode", 0))
    ow = pool_out(w, kw, sw, pl, pr, dw, a.get("ceil_mode", 0))
    eb = max(0, (oh - 1) * sh + dh * (kh - 1) + 1 - (h + pt + pb))
    er = max(0, (ow - 1) * sw + dw * (kw - 1) + 1 - (w + pl + pr))
    width = ((0, 0),) * (x.ndim - 2)
    fill = -np.inf if kind == "max" else 0.0
    xp = np.pad(x.astype(np.float64), width + ((pt, pb + eb), (pl, pr + er)), constant_values=fill)  # int8 too
    acc = np.full(x.shape[:-2] + (oh, ow), fill, dtype=np.float64)
    ones = np.ones((h, w))
    inner = 1.0 if a.get("count_include_pad", 0) else 0.0
    count = np.pad(np.pad(ones, ((pt, pb), (pl, pr)), constant_values=inner), ((0, eb), (0, er)))
    cnt = np.zeros((oh, ow))
    for i in range(kh):
        for j in range(kw):
            win = (slice(i * dh, i * dh + sh * (oh - 1) + 1, sh), slice(j * dw, j * dw + sw * (ow - 1) + 1, sw))
            patch = xp[(..., *win)]
            acc = np.maximum(acc, patch) if kind == "max" else acc + patch
            cnt += count[win]
    return (acc if kind == "max" else acc / cnt).astype(x.dtype)


def pool_out(size: int, k: int, s: int, pad_begin: int, pad_end: int, d: int, ceil_mode: int) -> int:
    """Output length of a pooling window sweep (a last window starting in the end padding is dropped)."""
    span = size + pad_begin + pad_end - (d * (k - 1) + 1)
    out = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (out - 1) * s >= size + pad_begin:
        out -= 1
    return out


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _layer_norm(args: list[np.ndarray], a: dict) -> list[np.ndarray]:
    """The one-term case of the fused AddLayerNormalization (one implementation of the normalisation)."""
    return add_layer_norm(args, {**a, "terms": 1, "with_sum": False})


def _conv_transpose(args: list[np.ndarray], a: dict) -> list[np.ndarray]:
    """Scatter form: each input pixel adds its weighted window to the full output, then the pads are cropped."""
    x, w = args[0].astype(np.float64), args[1].astype(np.float64)
    n, c, h, wd = x.shape
    g, (mg, kh, kw) = a["group"], w.shape[1:]
    cg = c // g
    (sh, sw), (dh, dw), (pt, pl, pb, pr), (eh, ew) = a["strides"], a["dilations"], a["pads"], a["output_padding"]
    fh, fw = sh * (h - 1) + eh + (kh - 1) * dh + 1, sw * (wd - 1) + ew + (kw - 1) * dw + 1
    y = np.zeros((n, g * mg, fh, fw))
    for gi in range(g):
        xg, wg = x[:, gi * cg:(gi + 1) * cg], w[gi * cg:(gi + 1) * cg]
        for ky in range(kh):
            for kx in range(kw):
                y[:, gi * mg:(gi + 1) * mg, ky * dh:ky * dh + sh * (h - 1) + 1:sh,
                  kx * dw:kx * dw + sw * (wd - 1) + 1:sw] += np.einsum("nchw,cm->nmhw", xg, wg[:, :, ky, kx])
    y = y[:, :, pt:fh - pb, pl:fw - pr]
    if len(args) > 2:
        y = y + args[2].reshape(1, -1, 1, 1)
    return [y.astype(args[0].dtype)]


def _instance_norm(args: list[np.ndarray], a: dict) -> list[np.ndarray]:
    x, scale, bias = args
    axes = tuple(range(2, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    per_channel = (1, -1) + (1,) * (x.ndim - 2)
    y = (x - mean) / np.sqrt(var + a.get("epsilon", 1e-5)) * scale.reshape(per_channel) + bias.reshape(per_channel)
    return [y.astype(x.dtype)]


def _lrn(x: np.ndarray, a: dict) -> np.ndarray:
    size = int(a["size"])
    sq = np.pad(x.astype(np.float64) ** 2, ((0, 0), ((size - 1) // 2, size // 2)) + ((0, 0),) * (x.ndim - 2))
    total = sum(sq[:, i: i + x.shape[1]] for i in range(size))
    return (x / (a.get("bias", 1.0) + a.get("alpha", 1e-4) / size * total) ** a.get("beta", 0.75)).astype(x.dtype)


def _pad(x: np.ndarray, a: dict) -> np.ndarray:
    r = x.ndim
    begins, ends = a["pads"][:r], a["pads"][r:]
    crop = tuple(slice(max(0, -b), x.shape[i] - max(0, -e)) for i, (b, e) in enumerate(zip(begins, ends, strict=True)))
    widths = [(max(0, b), max(0, e)) for b, e in zip(begins, ends, strict=True)]
    mode = a.get("mode", "constant")
    if mode == "constant":
        return np.pad(x[crop], widths, constant_values=a.get("value", 0.0))
    return np.pad(x[crop], widths, mode="reflect" if mode == "reflect" else "edge")


def _slice(x: np.ndarray, a: dict) -> np.ndarray:
    index = [s + st * np.arange(n) for s, st, n in zip(a["starts"], a["steps"], a["sizes"], strict=True)]
    return x[np.ix_(*index)] if x.ndim else x


def _strided_copy(x: np.ndarray, a: dict) -> np.ndarray:
    """Element i is element `base + sum(i_d * strides[d])` of the flat input, gathered (never a raw view)."""
    grids = np.ix_(*(np.arange(n) * s for n, s in zip(a["shape"], a["strides"], strict=True)))
    return x.reshape(-1)[a["base"] + sum(grids, np.zeros((), np.int64))]


def _gemm(args: list[np.ndarray], a: dict) -> list[np.ndarray]:
    x = args[0].T if a.get("transA", 0) else args[0]
    w = args[1].T if a.get("transB", 0) else args[1]
    y = a.get("alpha", 1.0) * (x @ w)
    if len(args) > 2:
        y = y + a.get("beta", 1.0) * args[2]
    return [y.astype(args[0].dtype)]


def _batch_norm(args: list[np.ndarray], a: dict) -> list[np.ndarray]:
    x, scale, bias, mean, var = args
    shape = (1, -1) + (1,) * (x.ndim - 2)
    inv = scale / np.sqrt(var + a.get("epsilon", 1e-5))
    return [((x - mean.reshape(shape)) * inv.reshape(shape) + bias.reshape(shape)).astype(x.dtype)]


def _same(dtype_of: np.ndarray, y: np.ndarray) -> np.ndarray:
    return y.astype(dtype_of.dtype) if isinstance(y, np.ndarray) else np.asarray(y, dtype=dtype_of.dtype)


def _binary(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> OpFn:
    return lambda args, a: [_same(args[0], fn(args[0], args[1]))]


def _unary(fn: Callable[[np.ndarray, dict], np.ndarray]) -> OpFn:
    return lambda args, a: [_same(args[0], fn(args[0], a))]


def _variadic(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> OpFn:
    return lambda args, a: [_same(args[0], functools.reduce(fn, args[1:], args[0]))]


def _reduction(fn: Callable[..., np.ndarray]) -> OpFn:
    return _unary(lambda x, a: fn(x, axis=tuple(a["axes"]), keepdims=bool(a.get("keepdims", 1))))


def _log_sum_exp(x: np.ndarray, axis: tuple[int, ...], keepdims: bool) -> np.ndarray:
    """log(sum(exp(x))) shifted by the max, so large inputs do not overflow."""
    top = np.max(x, axis=axis, keepdims=True)
    top = np.where(np.isfinite(top), top, 0)
    out = np.log(np.sum(np.exp(x - top), axis=axis, keepdims=True)) + top
    return out if keepdims else np.squeeze(out, axis=axis)


def _elu(x: np.ndarray, alpha: float) -> np.ndarray:
    return np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0)))


def _shrink(x: np.ndarray, a: dict) -> np.ndarray:
    lambd, bias = a.get("lambd", 0.5), a.get("bias", 0.0)
    return np.where(x < -lambd, x + bias, np.where(x > lambd, x - bias, 0))


def _div(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if np.issubdtype(x.dtype, np.integer):
        return np.trunc(x / y).astype(x.dtype)
    return x / y


def _chain(args: list[np.ndarray], a: dict) -> list[np.ndarray]:
    """passes_chain.py's fused links, op by op as the unfused graph ran them."""
    parts = a.get("concat", 1)
    x = np.concatenate(args[:parts], axis=a.get("axis", 1)) if parts > 1 else args[0]
    for s in a["steps"]:
        if s.get("operand") is None:
            x = OPS[s["op"]]([x], s["attrs"])[0]
        else:
            c = args[s["operand"]]
            x = OPS[s["op"]]([c, x] if s.get("left") else [x, c], s["attrs"])[0]
    return [x]


OPS: dict[str, OpFn] = {
    "ElementwiseChain": _chain,
    "Add": _binary(np.add), "Sub": _binary(np.subtract), "Mul": _binary(np.multiply), "Div": _binary(_div),
    "Pow": _binary(np.power),
    "Sum": _variadic(np.add),
    "Relu": _unary(UNARY["relu"]), "Clip": _unary(UNARY["clip"]), "LeakyRelu": _unary(UNARY["leaky_relu"]),
    "Sigmoid": _unary(UNARY["sigmoid"]), "Tanh": _unary(UNARY["tanh"]), "Erf": _unary(lambda x, a: _erf(x)),
    "Gelu": _unary(lambda x, a: _gelu(x, a.get("approximate", "none"))), "Sqrt": _unary(lambda x, a: np.sqrt(x)),
    "Softmax": _unary(lambda x, a: _softmax(x, a["axis"])),
    "LogSoftmax": _unary(lambda x, a: np.log(_softmax(x, a["axis"]))),
    "LRN": _unary(_lrn),
    "ReduceMean": _reduction(np.mean), "ReduceSum": _reduction(np.sum), "ReduceMax": _reduction(np.max),
    "ReduceMin": _reduction(np.min), "ReduceProd": _reduction(np.prod),
    "ReduceL1": _reduction(lambda x, **k: np.sum(np.abs(x), **k)),
    "ReduceL2": _reduction(lambda x, **k: np.sqrt(np.sum(np.square(x), **k))),
    "ReduceSumSquare": _reduction(lambda x, **k: np.sum(np.square(x), **k)),
    "ReduceLogSum": _reduction(lambda x, **k: np.log(np.sum(x, **k))),
    "ReduceLogSumExp": _reduction(_log_sum_exp),
    "Abs": _unary(lambda x, a: np.abs(x)), "Neg": _unary(lambda x, a: np.negative(x)),
    "Exp": _unary(lambda x, a: np.exp(x)), "Log": _unary(lambda x, a: np.log(x)),
    **{op: _unary(lambda x, a, f=getattr(np, f): f(x)) for op, f in (
        ("Sin", "sin"), ("Cos", "cos"), ("Tan", "tan"), ("Asin", "arcsin"), ("Acos", "arccos"), ("Atan", "arctan"),
        ("Sinh", "sinh"), ("Cosh", "cosh"), ("Asinh", "arcsinh"), ("Acosh", "arccosh"), ("Atanh", "arctanh"))},
    "Mod": lambda args, a: [_same(args[0], (np.fmod if a.get("fmod", 0) else np.mod)(args[0], args[1]))],
    "Reciprocal": _unary(lambda x, a: 1 / x), "Floor": _unary(lambda x, a: np.floor(x)),
    "Ceil": _unary(lambda x, a: np.ceil(x)), "Sign": _unary(lambda x, a: np.sign(x)),
    "Softplus": _unary(lambda x, a: np.logaddexp(0, x)), "Softsign": _unary(lambda x, a: x / (1 + np.abs(x))),
    "Elu": _unary(lambda x, a: _elu(x, a.get("alpha", 1.0))),
    "Selu": _unary(lambda x, a: a["gamma"] * _elu(x, a["alpha"])),
    "HardSigmoid": _unary(lambda x, a: np.clip(a.get("alpha", 0.2) * x + a.get("beta", 0.5), 0, 1)),
    "HardSwish": _unary(lambda x, a: x * np.clip(a.get("alpha", 1 / 6) * x + a.get("beta", 0.5), 0, 1)),
    "Swish": _unary(lambda x, a: x * _sigmoid(a.get("alpha", 1.0) * x)),
    "Shrink": _unary(_shrink),
    "PRelu": _binary(lambda x, slope: np.where(x < 0, x * slope, x)),
    "Max": _variadic(np.maximum), "Min": _variadic(np.minimum),
    "Mean": lambda args, a: [_same(args[0], functools.reduce(np.add, args[1:], args[0]) / len(args))],
    "GlobalMaxPool": _unary(lambda x, a: x.max(axis=tuple(range(2, x.ndim)), keepdims=True)),
    "MaxPool": _unary(lambda x, a: _pool(x, a, "max")),
    "AveragePool": _unary(lambda x, a: _pool(x, a, "avg")),
    "GlobalAveragePool": _unary(lambda x, a: x.mean(axis=tuple(range(2, x.ndim)), keepdims=True)),
    "Reshape": lambda args, a: [args[0].reshape(a["shape"])],
    "Flatten": lambda args, a: [args[0].reshape(a["shape"])],
    "Transpose": lambda args, a: [np.ascontiguousarray(args[0].transpose(a["perm"]))],
    "Tile": lambda args, a: [np.tile(args[0], a["repeats"])],
    "Concat": lambda args, a: [np.concatenate(args, axis=a["axis"])],
    "Split": lambda args, a: np.split(args[0], np.cumsum(a["split"])[:-1], axis=a["axis"]),
    "Slice": _unary(_slice),
    "StridedCopy": _unary(_strided_copy),
    "Pad": _unary(_pad),
    "LayerNormalization": _layer_norm,
    "InstanceNormalization": _instance_norm,
    "ConvTranspose": _conv_transpose,
    "Gemm": _gemm,
    "MatMul": lambda args, a: [_same(args[0], np.matmul(args[0], args[1]))],
    "Conv": lambda args, a: [conv2d(args[0], args[1], a["strides"], a["pads"], a["dilations"], a["group"])
                             + (args[2].reshape(1, -1, 1, 1) if len(args) > 2 else 0)],
    "BatchNormalization": _batch_norm,
    **INDEX_OPS,
    **QUANT_OPS,
    **RESIZE_OPS,
    **TRANSFORMER_OPS,
}
