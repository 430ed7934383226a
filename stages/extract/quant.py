"""Import of quantized ONNX models: QuantizeLinear / DequantizeLinear and what onnxruntime's quantizers write.

Normalised forms (stages/graph/reference_quant.py runs them):
- `QuantizeLinear` [x, scale, zero_point] -> uint8/int8, attrs `axis` (None: per tensor) and `dtype`;
  `DequantizeLinear` [x, scale, zero_point] -> float32, attr `axis`. Scale and zero point are constants
  (a missing zero point becomes a zero constant of the output type); a per-axis scale has one value per
  element of `axis`. ONNX arithmetic: y = saturate(round_half_even(x / scale) + zp), x = (q - zp) * scale.
- `QLinearConv` / `QLinearMatMul` become DequantizeLinear -> Conv / MatMul -> QuantizeLinear (the bias as a
  DequantizeLinear of its int32 values by x_scale * w_scale), which the quant pass (passes_quant.py) turns
  into the canonical int8 anchors as it does the QDQ form.
- `ConvInteger` / `MatMulInteger` [x, w, x_zero_point, w_zero_point] -> int32 (exact); `DynamicQuantizeLinear`
  [x] -> (uint8 y, float32 scale, uint8 zero point), computed at run time.

A DequantizeLinear of constants folds at import like any constant node (so BatchNormalization parameters and
shape arithmetic stay constants), but its quantized origin is remembered (`Ctx.quantized`): a Conv, Gemm or
MatMul reading such a constant as its weight or bias reads a DequantizeLinear node of the integers instead
(`keep_unfolded`), so the quant pass still sees the int8 weights and their scales; so does an Add or Mul of a
run-time tensor and such a constant (`_operand_dq`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from schemas.errors import ModelError
from stages.extract.dtypes import onnx_dtype
from stages.extract.normalize import NORMALIZERS as FLOAT_NORMALIZERS
from stages.extract.normalize import Ctx, Emit

QUANT_TYPES = ("uint8", "int8")
ANCHOR_OPERANDS = {"Conv": (1, 2), "Gemm": (1, 2), "MatMul": (1,)}  # operand positions a weight DQ may feed


def keep_unfolded(op: str, attrs: dict) -> bool:
    """Whether a normalised node with constant inputs stays a node at import (a weight's DequantizeLinear)."""
    return op == "DequantizeLinear" and bool(attrs.get("weight"))


def _fail(ctx: Ctx, why: str) -> ModelError:
    return ModelError(f"{ctx.op} {ctx.node!r}: {why}")


def _zero_point(ins: list[str], i: int, ctx: Ctx, dtype: str, like: np.ndarray) -> str:
    """Input i (a constant zero point), or a new zero constant of `dtype` shaped like the scale."""
    if len(ins) > i and ins[i]:
        return ins[i]
    name = ctx.fresh(f"{ctx.node}/zero_point")
    ctx.consts[name] = np.zeros(like.shape, dtype=dtype)
    ctx.shapes[name] = like.shape
    return name


def _params(ctx: Ctx, x: str, scale: str | None, zp: str, raw_axis: int, allowed: tuple[str, ...]) \
        -> int | None:
    """Check one (scale, zero point) pair for tensor `x`; the normalised axis (None: per tensor)."""
    if not scale:
        raise _fail(ctx, "its scale input is missing")
    s = ctx.const(scale, "scale")
    z = ctx.const(zp, "zero point")
    if s.dtype.kind != "f":
        raise _fail(ctx, f"its scale {scale!r} is {s.dtype}, not a float type")
    if not (np.isfinite(s).all() and (s > 0).all()):
        raise _fail(ctx, f"its scale {scale!r} must be finite and positive, it holds {s.reshape(-1)[:4].tolist()}")
    if z.dtype.name not in allowed:
        raise _fail(ctx, f"its zero point {zp!r} is {z.dtype}; zero points are {' or '.join(allowed)} here")
    if z.size != s.size:
        raise _fail(ctx, f"its zero point {zp!r} has {z.size} values, its scale {scale!r} {s.size}")
    if s.size == 1:
        return None
    shape = ctx.shape(x)
    if s.ndim != 1:
        raise _fail(ctx, f"its scale {scale!r} is {list(s.shape)}: per-axis scales are 1-D (blocked scales are "
                    "not supported)")
    if not -len(shape) <= raw_axis < len(shape):
        raise _fail(ctx, f"axis {raw_axis} is out of range for its rank-{len(shape)} input")
    axis = raw_axis % len(shape)
    if shape[axis] != s.size:
        raise _fail(ctx, f"its scale has {s.size} values, but axis {axis} of its input has {shape[axis]}")
    return axis


def _quantize(ins, outs, raw, ctx) -> list[Emit]:
    if raw.get("block_size"):
        raise _fail(ctx, "blocked quantization (block_size) is not supported")
    scale = ins[1] if len(ins) > 1 else None
    if not scale:
        raise _fail(ctx, "its scale input is missing")
    default = onnx_dtype(raw["output_dtype"]) if raw.get("output_dtype") else "uint8"
    zp = _zero_point(ins, 2, ctx, ctx.dtype(ins[2]) if len(ins) > 2 and ins[2] else default, ctx.const(scale, "scale"))
    if ctx.dtype(ins[0]) != "float32":
        raise _fail(ctx, f"its input is {ctx.dtype(ins[0])}; QuantizeLinear quantizes float tensors")
    axis = _params(ctx, ins[0], scale, zp, int(raw.get("axis", 1)), QUANT_TYPES)
    return [("QuantizeLinear", [ins[0], scale, zp], outs[:1], {"axis": axis, "dtype": ctx.dtype(zp)})]


def dequantize_emit(ctx: Ctx, x: str, scale: str | None, zp: str | None, out: str, raw_axis: int,
                    weight: bool = False) -> Emit:
    """The checked DequantizeLinear of `x` (its zero point made when missing)."""
    if not scale:
        raise _fail(ctx, "its scale input is missing")
    xt = ctx.dtype(x)
    if xt not in (*QUANT_TYPES, "int32"):
        raise _fail(ctx, f"its input {x!r} is {xt}; DequantizeLinear takes uint8, int8 or int32")
    z = zp or _zero_point([], 0, ctx, xt, ctx.const(scale, "scale"))
    if ctx.dtype(z) != xt:
        raise _fail(ctx, f"its zero point {z!r} is {ctx.dtype(z)} but its input {x!r} is {xt}")
    axis = _params(ctx, x, scale, z, raw_axis, (*QUANT_TYPES, "int32"))
    return ("DequantizeLinear", [x, scale, z], [out], {"axis": axis, **({"weight": 1} if weight else {})})


def _dequantize(ins, outs, raw, ctx) -> list[Emit]:
    if raw.get("block_size"):
        raise _fail(ctx, "blocked quantization (block_size) is not supported")
    emit = dequantize_emit(ctx, ins[0], ins[1] if len(ins) > 1 else None, ins[2] if len(ins) > 2 else None,
                           outs[0], int(raw.get("axis", 1)))
    if ins[0] in ctx.consts:
        ctx.quantized[outs[0]] = emit
    return [emit]


def _keep_dq(ins: list[str], pos: int, ctx: Ctx, out: list[Emit]) -> None:
    """Input `pos` (a folded quantized constant) read instead through a kept DequantizeLinear of its integers,
    appended to `out`."""
    src = ctx.quantized[ins[pos]]
    fresh = ctx.fresh(ins[pos])
    out.append((src[0], src[1], [fresh], {**src[3], "weight": 1}))
    ins[pos] = fresh


def _weight_dq(emits: list[Emit], ctx: Ctx) -> list[Emit]:
    """Anchors read a folded weight or bias as a kept DequantizeLinear node of its integers."""
    out: list[Emit] = []
    for op, ins, outs, attrs in emits:
        ins = list(ins)
        for pos in ANCHOR_OPERANDS.get(op, ()):
            if pos < len(ins) and ins[pos] and ins[pos] in ctx.quantized:
                _keep_dq(ins, pos, ctx, out)
        out.append((op, ins, outs, attrs))
    return out


def _anchor(op: str) -> Callable[..., list[Emit]]:
    def fn(ins, outs, raw, ctx) -> list[Emit]:
        return _weight_dq(FLOAT_NORMALIZERS[op](ins, outs, raw, ctx), ctx)
    return fn


def _operand_dq(op: str) -> Callable[..., list[Emit]]:
    """An Add / Mul of a run-time tensor and a folded quantized constant reads the constant as a kept
    DequantizeLinear node of its integers, as an anchor reads its weight: onnxruntime runs DQ(x) + DQ(c) -> Q
    as a QLinearAdd / QLinearMul of the integers, and the quant pass copies that arithmetic (passes_quant.py
    `_add_scalar`, passes_quant_islands.py `_mul`); where it does not apply the DQ folds back."""
    def fn(ins, outs, raw, ctx) -> list[Emit]:
        emits = FLOAT_NORMALIZERS[op](ins, outs, raw, ctx)
        out: list[Emit] = []
        for e_op, e_ins, e_outs, attrs in emits:
            e_ins = list(e_ins)
            folded = [i for i, name in enumerate(e_ins[:2]) if name in ctx.quantized]
            if e_op == op and len(e_ins) == 2 and len(folded) == 1 and e_ins[1 - folded[0]] not in ctx.consts:
                _keep_dq(e_ins, folded[0], ctx, out)
            out.append((e_op, e_ins, e_outs, attrs))
        return out
    return fn


def _as(ctx: Ctx, op: str, fn: Callable[[], list[Emit]]) -> list[Emit]:
    """Run a float normaliser as if the node were `op` (its attribute rules key on the op name)."""
    own, ctx.op = ctx.op, op
    try:
        return fn()
    finally:
        ctx.op = own


def _fresh_like(ctx: Ctx, base: str, like: str) -> str:
    name = ctx.fresh(base)
    ctx.shapes[name] = ctx.shape(like)
    return name


def _qlinear_conv(ins, outs, raw, ctx) -> list[Emit]:
    if len(ins) < 8 or not all(ins[:8]):
        raise _fail(ctx, "QLinearConv needs x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale and "
                    "y_zero_point")
    x, xs, xz, w, ws, wz, ys, yz = ins[:8]
    xf, wf, yf = _fresh_like(ctx, x, x), _fresh_like(ctx, w, w), ctx.fresh(outs[0])
    emits = [dequantize_emit(ctx, x, xs, xz, xf, 1), dequantize_emit(ctx, w, ws, wz, wf, 0, weight=True)]
    conv_ins = [xf, wf]
    if len(ins) > 8 and ins[8]:
        bias_scale = ctx.fresh(f"{ctx.node}/bias_scale")
        sw = ctx.const(ws, "w_scale").astype(np.float32).reshape(-1)
        ctx.consts[bias_scale] = np.float32(ctx.const(xs, "x_scale").reshape(-1)[0]) * sw
        ctx.shapes[bias_scale] = ctx.consts[bias_scale].shape
        bf = _fresh_like(ctx, ins[8], ins[8])
        emits.append(dequantize_emit(ctx, ins[8], bias_scale, None, bf, 0, weight=True))
        conv_ins.append(bf)
    emits += _as(ctx, "Conv", lambda: FLOAT_NORMALIZERS["Conv"](conv_ins, [yf], raw, ctx))
    zy = ctx.const(yz, "y_zero_point")
    emits.append(("QuantizeLinear", [yf, ys, yz], outs[:1],
                  {"axis": _params(ctx, x, ys, yz, 1, QUANT_TYPES), "dtype": zy.dtype.name}))
    return emits


def _qlinear_matmul(ins, outs, raw, ctx) -> list[Emit]:
    if len(ins) < 8 or not all(ins[:8]):
        raise _fail(ctx, "QLinearMatMul needs a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale and "
                    "y_zero_point")
    a, as_, az, b, bs, bz, ys, yz = ins[:8]
    af, bf, yf = _fresh_like(ctx, a, a), _fresh_like(ctx, b, b), ctx.fresh(outs[0])
    emits = [dequantize_emit(ctx, a, as_, az, af, -2),
             dequantize_emit(ctx, b, bs, bz, bf, -1, weight=b in ctx.consts),
             ("MatMul", [af, bf], [yf], {})]
    ctx.shapes[yf] = ctx.shape(a)[:-1] + ctx.shape(b)[-1:]
    zy = ctx.const(yz, "y_zero_point")
    emits.append(("QuantizeLinear", [yf, ys, yz], outs[:1],
                  {"axis": _params(ctx, yf, ys, yz, 1, QUANT_TYPES), "dtype": zy.dtype.name}))
    return emits


def _integer_zero_points(ins: list[str], ctx: Ctx) -> list[str]:
    """[x, w, x_zero_point, w_zero_point] with missing zero points made zero constants of x's / w's type."""
    for i in (0, 1):
        if ctx.dtype(ins[i]) not in QUANT_TYPES:
            raise _fail(ctx, f"its input {ins[i]!r} is {ctx.dtype(ins[i])}; it takes uint8 or int8")
    zs = []
    for k, i in ((2, 0), (3, 1)):
        name = _zero_point(ins, k, ctx, ctx.dtype(ins[i]), np.zeros(()))
        if ctx.dtype(name) != ctx.dtype(ins[i]):
            raise _fail(ctx, f"its zero point {name!r} is {ctx.dtype(name)} but {ins[i]!r} is {ctx.dtype(ins[i])}")
        zs.append(name)
    return [ins[0], ins[1], *zs]


def _conv_integer(ins, outs, raw, ctx) -> list[Emit]:
    full = _integer_zero_points(ins, ctx)
    emits = _as(ctx, "Conv", lambda: FLOAT_NORMALIZERS["Conv"](full[:2], outs, raw, ctx))
    renamed = []
    for op, e_ins, e_outs, attrs in emits:
        if op == "Conv":
            renamed.append(("ConvInteger", [*e_ins, *full[2:]], e_outs, attrs))
        else:
            renamed.append((op, e_ins, e_outs, attrs))
    xz = ctx.const(full[2], "x_zero_point")
    if xz.size != 1:
        raise _fail(ctx, f"its x zero point has {xz.size} values; one (per tensor) is supported")
    return renamed


def _matmul_integer(ins, outs, raw, ctx) -> list[Emit]:
    return [("MatMulInteger", _integer_zero_points(ins, ctx), outs[:1], {})]


def _dynamic_quantize(ins, outs, raw, ctx) -> list[Emit]:
    if ctx.dtype(ins[0]) != "float32":
        raise _fail(ctx, f"its input is {ctx.dtype(ins[0])}; it quantizes float tensors")
    return [("DynamicQuantizeLinear", ins[:1], list(outs), {})]


QUANT_NORMALIZERS: dict[str, Callable[..., list[Emit]]] = {
    "QuantizeLinear": _quantize, "DequantizeLinear": _dequantize,
    "QLinearConv": _qlinear_conv, "QLinearMatMul": _qlinear_matmul,
    "ConvInteger": _conv_integer, "MatMulInteger": _matmul_integer,
    "DynamicQuantizeLinear": _dynamic_quantize,
    **{op: _anchor(op) for op in ANCHOR_OPERANDS},
    **{op: _operand_dq(op) for op in ("Add", "Mul")},
}
