"""int8 convolution (issue 26's `qconv2d` anchor): NCHW uint8/int8 X, OIHW int8 W, per-channel int32 B
and float32 S, `y = requant(sum over the window (X - zx) * W + B)`, NCHW uint8/int8 Y.

Attributes as the float conv2d's (`strides`, `pads` top/left/bottom/right, `dilations`, `group`)
plus `x_zero_point`, `y_zero_point`; epilogue `relu` / `clip` in the quantized domain. Padding is
the activation zero point, so padded taps add nothing. One direct kernel serves every window,
stride, dilation and group count, depthwise and 1x1 included (`qconv2d_codegen`); the weights are
packed per channel tile into 4-byte channel groups per tap, and `-zx * sum W` is folded into B at
build time.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from llvmlite import ir

from schemas.config import Config
from schemas.target import Target
from schemas.task import EpilogueOp, TensorSpec, TuningTask
from stages.templates import qgemm_requant
from stages.templates.conv2d_shape import ConvGeom, conv2d_task, conv_cli_args, geom
from stages.templates.qconv2d_amx import pack_weights_amx
from stages.templates.qconv2d_codegen import build_module
from stages.templates.qconv2d_dw import pack_weights_dw
from stages.templates.qconv2d_plan import QConvPlan, QConvSchedule
from stages.templates.qconv2d_schedule import default_qconv, qconv_space
from stages.templates.qdense import ACTIVATION_DTYPES
from stages.templates.qgemm_pack import aligned, effective_zx, folded_bias, padded, random_operands
from stages.templates.space import ConfigSpace, Knobs

NAME = "qconv2d"
VERSION = 3  # 3: 1x1 stride-1 unpadded convs run flattened to one row (`qgeom`)

CLI_OPTIONS = ("input", "weight", "stride", "pad", "dilation", "groups", "epilogue")


def task(x_shape: tuple[int, ...], w_shape: tuple[int, ...], strides: tuple[int, int] = (1, 1),
         pads: tuple[int, int, int, int] = (0, 0, 0, 0), dilations: tuple[int, int] = (1, 1), group: int = 1,
         ops: tuple[EpilogueOp, ...] = (), x_dtype: str = "uint8", y_dtype: str = "uint8", x_zero_point: int = 0,
         y_zero_point: int = 0) -> TuningTask:
    """The int8 twin of `conv2d_task` (same shape checks); ValueError says what is inconsistent."""
    qgemm_requant.validate(ops)
    for what, dt, zp in (("x", x_dtype, x_zero_point), ("y", y_dtype, y_zero_point)):
        if dt not in ACTIVATION_DTYPES:
            raise ValueError(f"qconv2d {what}_dtype must be uint8 or int8, got {dt!r}")
        lo, hi = qgemm_requant.RANGES[dt]
        if not lo <= zp <= hi:
            raise ValueError(f"qconv2d {what}_zero_point={zp} is outside the {dt} range [{lo}, {hi}]")
    f = conv2d_task(x_shape, w_shape, strides, pads, dilations, group)
    oc = w_shape[0]
    return TuningTask(op="qconv2d",
                      inputs=(TensorSpec(shape=tuple(x_shape), dtype=x_dtype), TensorSpec(shape=tuple(w_shape),
                                                                                          dtype="int8"),
                              TensorSpec(shape=(oc,), dtype="int32"), TensorSpec(shape=(oc,), dtype="float32")),
                      outputs=(TensorSpec(shape=f.outputs[0].shape, dtype=y_dtype),), epilogue=tuple(ops),
                      attrs={**f.attrs, "x_zero_point": int(x_zero_point), "y_zero_point": int(y_zero_point)})


def task_from_cli(opts: dict) -> TuningTask:
    """`tune-op qconv2d --input 1x64x56x56 --weight 64x64x3x3 --stride 1 --pad 1 --groups 1 --epilogue relu`:
    uint8 activations, zero points 0 (they change no instruction the kernel runs)."""
    return task(*conv_cli_args(opts, "qconv2d"))


def qgeom(task: TuningTask) -> ConvGeom:
    """The geometry the kernel runs: a 1x1 stride-1 unpadded conv is a GEMM over the flattened image, so it
    runs as one row of H*W columns (the same sums); its column tiles then cover the image without a partly
    idle vector at the end of every row (56 columns in 4 vectors of 16 left an eighth of the lanes idle)."""
    g = geom(task)
    return replace(g, h=1, w=g.h * g.w) if g.is_1x1_gemm and g.h > 1 else g


def space(task: TuningTask, target: Target) -> ConfigSpace:
    return qconv_space(qgeom(task), target)


def default_config(task: TuningTask, target: Target) -> Config:
    return default_qconv(qgeom(task), target, what=task.description, image_ow=geom(task).ow)


def make_inputs(task: TuningTask, seed: int = 0) -> list[np.ndarray]:
    return random_operands(task, np.random.default_rng(seed))


def reference(task: TuningTask, inputs: list[np.ndarray]) -> np.ndarray:
    """The spec in int64 numpy (padding by the zero point, a sum over taps of channel contractions),
    then its requantize epilogue."""
    g = geom(task)
    x, w, bias, scale = inputs
    zx = int(task.attrs.get("x_zero_point", 0))
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (g.pt, g.pb), (g.pl, g.pr)), constant_values=zx) - zx
    xp = xp.reshape(g.n, g.groups, g.icg, g.h + g.pt + g.pb, g.w + g.pl + g.pr)
    wg = w.astype(np.int64).reshape(g.groups, g.ocg, g.icg, g.kh, g.kw)
    acc = np.zeros((g.n, g.groups, g.ocg, g.oh, g.ow), dtype=np.int64)
    for i in range(g.kh):
        for j in range(g.kw):
            y0, x0 = i * g.dh, j * g.dw
            patch = xp[..., y0: y0 + g.sh * (g.oh - 1) + 1: g.sh, x0: x0 + g.sw * (g.ow - 1) + 1: g.sw]
            acc += np.einsum("ngchw,goc->ngohw", patch, wg[..., i, j])
    acc = acc.reshape(g.n, g.oc, g.oh, g.ow) + bias.astype(np.int64)[None, :, None, None]
    return qgemm_requant.reference(qgemm_requant.requant_of(task), acc, scale[None, :, None, None],
                                   task.outputs[0].dtype)


def pack_weights(w: np.ndarray, p: QConvPlan) -> np.ndarray:
    """OIHW int8 → [group][channel tile][channel block][kh][kw][tile's channels][4], zero-padded on both
    channel axes."""
    g, mr = p.g, p.oc_tile
    full = np.zeros((g.groups, p.ot * mr, p.cb * 4, g.kh, g.kw), dtype=np.int8)
    full[:, :g.ocg, :g.icg] = w.reshape(g.groups, g.ocg, g.icg, g.kh, g.kw)
    out = aligned((g.groups, p.ot, p.cb, g.kh, g.kw, mr, 4), "int8")
    out[...] = full.reshape(g.groups, p.ot, mr, p.cb, 4, g.kh, g.kw).transpose(0, 1, 3, 5, 6, 2, 4)
    return out


def _per_tile(v: np.ndarray, p: QConvPlan) -> np.ndarray:
    """A per-channel vector laid out [group][ot * mr] (zeros past each group's channels), flattened."""
    g = p.g
    out = np.zeros((g.groups, p.ot * p.oc_tile), dtype=v.dtype)
    out[:, :g.ocg] = v.reshape(g.groups, g.ocg)
    return out.reshape(-1)


def kernel_args(task: TuningTask, knobs: Knobs, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """`[X, W packed, B with the zero point folded in, S, workspace (the packed X), Y]`."""
    x, w, bias, scale = inputs
    p = QConvPlan(qgeom(task), QConvSchedule.from_knobs(knobs))
    folded = folded_bias(bias, w.reshape(w.shape[0], -1), effective_zx(task), w.shape[0])
    size = p.g.groups * p.ot * p.oc_tile
    if p.s.axis == "dw":
        wp = pack_weights_dw(w)
    else:
        wp = pack_weights_amx(w, p) if p.s.isa == "amx" else pack_weights(w, p)
    return [np.ascontiguousarray(x), wp, padded(_per_tile(folded, p), size),
            padded(_per_tile(scale, p), size), aligned((p.workspace,), "uint8"),
            aligned(task.outputs[0].shape, task.outputs[0].dtype)]


def build_ir(task: TuningTask, knobs: Knobs, target: Target, threads: int = 1) -> ir.Module:
    p = QConvPlan(qgeom(task), QConvSchedule.from_knobs(knobs))
    g = p.g
    return build_module(f"qconv2d_{g.c}x{g.h}x{g.w}_{g.oc}x{g.kh}x{g.kw}", p, qgemm_requant.requant_of(task),
                        int(task.attrs.get("x_zero_point", 0)), task.inputs[0].dtype == "int8", target.triple,
                        threads)
