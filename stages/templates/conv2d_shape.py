"""conv2d geometry: the task factory, the shapes every conv kernel derives, and the numpy reference.

Task attributes follow the graph importer's normalised ONNX Conv attributes: `strides` (2),
`pads` (top, left, bottom, right), `dilations` (2), `group`. Activations are NCHW and weights
OIHW at the task boundary; epilogue tensors follow `[X, W]` as `stages.graph.epilogue` says.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from schemas.task import EpilogueOp, TensorSpec, TuningTask, parse_epilogue
from stages.graph import epilogue


@dataclass(frozen=True)
class ConvGeom:
    n: int
    c: int
    h: int
    w: int
    oc: int
    icg: int
    kh: int
    kw: int
    sh: int
    sw: int
    dh: int
    dw: int
    pt: int
    pl: int
    pb: int
    pr: int
    groups: int

    @property
    def ocg(self) -> int:
        """Output channels per group."""
        return self.oc // self.groups

    @property
    def oh(self) -> int:
        return (self.h + self.pt + self.pb - self.dh * (self.kh - 1) - 1) // self.sh + 1

    @property
    def ow(self) -> int:
        return (self.w + self.pl + self.pr - self.dw * (self.kw - 1) - 1) // self.sw + 1

    @property
    def is_1x1_gemm(self) -> bool:
        """A 1x1, stride-1, unpadded conv is a GEMM over the flattened image: no packing of X needed."""
        return (self.kh, self.kw, self.sh, self.sw, self.pt, self.pl, self.pb, self.pr) == (1, 1, 1, 1, 0, 0, 0, 0)


def geom(task: TuningTask) -> ConvGeom:
    (n, c, h, w), (oc, icg, kh, kw) = task.inputs[0].shape, task.inputs[1].shape
    a = task.attrs
    (sh, sw), (dh, dw), (pt, pl, pb, pr) = a["strides"], a["dilations"], a["pads"]
    return ConvGeom(n, c, h, w, oc, icg, kh, kw, sh, sw, dh, dw, pt, pl, pb, pr, int(a["group"]))


def conv2d_task(x_shape: tuple[int, ...], w_shape: tuple[int, ...], strides: tuple[int, int] = (1, 1),
                pads: tuple[int, int, int, int] = (0, 0, 0, 0), dilations: tuple[int, int] = (1, 1),
                group: int = 1, epilogue_ops: tuple[EpilogueOp, ...] = ()) -> TuningTask:
    """Y = conv(X[N,C,H,W], W[O,C/group,KH,KW]) followed by the epilogue; ValueError says what is inconsistent."""
    if len(x_shape) != 4 or len(w_shape) != 4:
        raise ValueError(f"conv2d wants a 4-D NCHW input and a 4-D OIHW weight, got {list(x_shape)} and "
                         f"{list(w_shape)}")
    n, c, h, w = x_shape
    oc, icg, kh, kw = w_shape
    if group < 1 or c % group or oc % group:
        raise ValueError(f"group={group} must divide input channels {c} and output channels {oc}")
    if icg * group != c:
        raise ValueError(f"weight has {icg} input channels per group, input has {c} channels in {group} group(s)")
    if min(*strides, *dilations) < 1 or min(pads) < 0:
        raise ValueError(f"strides and dilations must be >= 1 and pads >= 0, got {strides}, {dilations}, {pads}")
    epilogue.validate(epilogue_ops)
    attrs = {"strides": tuple(strides), "pads": tuple(pads), "dilations": tuple(dilations), "group": group}
    g = ConvGeom(n, c, h, w, oc, icg, kh, kw, *strides, *dilations, *pads, group)
    if g.oh < 1 or g.ow < 1:
        raise ValueError(f"the {kh}x{kw} window (dilation {dilations}) does not fit the padded {h}x{w} input")
    out = (n, oc, g.oh, g.ow)
    return TuningTask(
        op="conv2d",
        inputs=(TensorSpec(shape=tuple(x_shape)), TensorSpec(shape=tuple(w_shape)),
                *epilogue.operand_specs(epilogue_ops, out, 1)),
        outputs=(TensorSpec(shape=out),),
        attrs=attrs,
        epilogue=tuple(epilogue_ops),
    )


def parse_pair(text: str | int | None, default: int) -> tuple[int, int]:
    """`2` or `2x3` (CLI) → (2, 3)."""
    if text is None:
        return default, default
    parts = [int(p) for p in str(text).lower().split("x")]
    if len(parts) == 1:
        return parts[0], parts[0]
    if len(parts) == 2:
        return parts[0], parts[1]
    raise ValueError(f"expected N or NxM, got {text!r}")


def parse_pads(text: str | int | None) -> tuple[int, int, int, int]:
    """`1`, `1x2` (vertical x horizontal) or `top,left,bottom,right` → (top, left, bottom, right)."""
    if text is None:
        return 0, 0, 0, 0
    s = str(text)
    if "," in s:
        parts = tuple(int(p) for p in s.split(","))
        if len(parts) != 4:
            raise ValueError(f"--pad with commas takes top,left,bottom,right, got {text!r}")
        return parts  # type: ignore[return-value]
    ph, pw = parse_pair(s, 0)
    return ph, pw, ph, pw


def conv_cli_args(opts: dict, op: str) -> tuple:
    """`tune-op OP --input 1x64x56x56 --weight 64x64x3x3 [--stride] [--pad] [--dilation] [--groups] [--epilogue]`
    → (x shape, w shape, strides, pads, dilations, groups, epilogue), the arguments of a conv task maker."""
    missing = [f"--{o}" for o in ("input", "weight") if opts.get(o) is None]
    if missing:
        raise ValueError(f"{op} needs {', '.join(missing)}")
    try:
        x = tuple(int(d) for d in str(opts["input"]).lower().split("x"))
        w = tuple(int(d) for d in str(opts["weight"]).lower().split("x"))
    except ValueError as exc:
        raise ValueError(f"--input and --weight are shapes like 1x64x56x56: {exc}") from exc
    return (x, w, parse_pair(opts.get("stride"), 1), parse_pads(opts.get("pad")), parse_pair(opts.get("dilation"), 1),
            int(opts.get("groups") or 1), parse_epilogue(opts.get("epilogue") or ""))


def reference(task: TuningTask, inputs: list[np.ndarray]) -> np.ndarray:
    """float64 direct convolution (a sum over window taps of channel contractions), then the epilogue."""
    g = geom(task)
    x, w = (np.asarray(a, dtype=np.float64) for a in inputs[:2])
    xp = np.pad(x, ((0, 0), (0, 0), (g.pt, g.pb), (g.pl, g.pr))).reshape(
        g.n, g.groups, g.icg, g.h + g.pt + g.pb, g.w + g.pl + g.pr)
    wg = w.reshape(g.groups, g.ocg, g.icg, g.kh, g.kw)
    out = np.zeros((g.n, g.groups, g.ocg, g.oh, g.ow))
    for i in range(g.kh):
        for j in range(g.kw):
            y0, x0 = i * g.dh, j * g.dw
            patch = xp[..., y0: y0 + g.sh * (g.oh - 1) + 1: g.sh, x0: x0 + g.sw * (g.ow - 1) + 1: g.sw]
            out += np.einsum("ngchw,goc->ngohw", patch, wg[..., i, j])
    y = out.reshape(g.n, g.oc, g.oh, g.ow)
    return epilogue.apply_reference(task.epilogue, y, inputs[2:], channel_axis=1)


def numpy_conv(task: TuningTask, inputs: list[np.ndarray]) -> np.ndarray:
    """What numpy alone does for this conv (float32 im2col + one BLAS matmul per group, no epilogue):
    the "numpy" speed the tuning report prints next to the tuned kernel."""
    g = geom(task)
    x, w = inputs[:2]
    xp = np.pad(x, ((0, 0), (0, 0), (g.pt, g.pb), (g.pl, g.pr))).reshape(
        g.n, g.groups, g.icg, g.h + g.pt + g.pb, g.w + g.pl + g.pr)
    cols = np.empty((g.n, g.groups, g.icg, g.kh, g.kw, g.oh, g.ow), dtype=np.float32)
    for i in range(g.kh):
        for j in range(g.kw):
            y0, x0 = i * g.dh, j * g.dw
            cols[:, :, :, i, j] = xp[..., y0: y0 + g.sh * (g.oh - 1) + 1: g.sh, x0: x0 + g.sw * (g.ow - 1) + 1: g.sw]
    cols = cols.reshape(g.n, g.groups, g.icg * g.kh * g.kw, g.oh * g.ow)
    out = np.matmul(w.reshape(g.groups, g.ocg, -1), cols)
    return out.reshape(g.n, g.oc, g.oh, g.ow)
