"""Resize (opset 10 on) and Upsample (opsets 7-9) as one normalised Resize node.

Resize's `roi`, `scales` and `sizes` inputs (Upsample's `scales`, an attribute before opset 9) must be constants:
the output shape is resolved here, as onnxruntime resolves it: from `sizes` (opset 18's `axes` and
`keep_aspect_ratio_policy` applied, scale = output / input), or floor(input * scale) in float32 from `scales`.
Attributes as stages/graph/reference_resize.py reads them; Resize-10 and Upsample use asymmetric coordinates and
the `simple` nearest rounding. The kernel (stages/memops/resize.py) takes 4-D NCHW inputs resized on H and W, in
nearest or linear mode; anything else (cubic, antialias, exclude_outside, tf_crop_and_resize, another layout) is
refused here, naming the node and the attribute, rather than run wrongly.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from schemas.errors import ModelError
from stages.extract.normalize import Ctx, Emit, _axis

MODES = ("nearest", "linear")
TRANSFORMS = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_half_pixel_for_nn",
              "half_pixel_symmetric")
ROUNDINGS = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
POLICIES = ("stretch", "not_larger", "not_smaller")


def _refuse(ctx: Ctx, why: str) -> ModelError:
    return ModelError(f"{ctx.op} {ctx.node!r}: {why}")


def _given(ctx: Ctx, ins: list[str], i: int, what: str) -> np.ndarray | None:
    """Input i as flat constant values; None when absent or empty (opset 11 passes an empty `scales` with `sizes`)."""
    value = ctx.opt_const(ins, i, what)
    return None if value is None or value.size == 0 else value.reshape(-1)


def _check_modes(ctx: Ctx, raw: dict, mode: str, transform: str, rounding: str) -> None:
    if mode not in MODES:
        raise _refuse(ctx, f"mode {mode!r} is not supported (nearest and linear are)")
    if transform not in TRANSFORMS:
        raise _refuse(ctx, f"coordinate_transformation_mode {transform!r} is not supported ({', '.join(TRANSFORMS)} "
                           "are)")
    if mode == "nearest" and rounding not in (*ROUNDINGS, "simple"):
        raise _refuse(ctx, f"nearest_mode {rounding!r} is not supported ({', '.join(ROUNDINGS)} are)")
    for flag in ("antialias", "exclude_outside"):
        if int(raw.get(flag, 0)):
            raise _refuse(ctx, f"{flag}={int(raw[flag])} is not supported")


def _output(ctx: Ctx, shape: tuple[int, ...], scales: np.ndarray | None, sizes: np.ndarray | None,
            axes: list[int], policy: str) -> tuple[list[float], list[int]]:
    """(scale per axis, output shape) from exactly one of `scales` and `sizes`, given for `axes`."""
    if (scales is None) == (sizes is None):
        raise _refuse(ctx, "exactly one of scales and sizes must be given, it has "
                           + ("both" if scales is not None else "neither"))
    what, given = ("scales", scales) if scales is not None else ("sizes", sizes)
    if len(given) != len(axes):
        raise _refuse(ctx, f"{what} has {len(given)} values for {len(axes)} axes of its {len(shape)}-D input")
    if (given <= 0).any():
        raise _refuse(ctx, f"{what} {given.tolist()} must be positive")
    if scales is not None:
        full = [1.0] * len(shape)
        for a, s in zip(axes, scales, strict=True):
            full[a] = float(np.float32(s))
        return full, [int(np.floor(np.float32(s) * np.float32(d))) for s, d in zip(full, shape, strict=True)]
    out = list(shape)
    for a, n in zip(axes, sizes, strict=True):
        out[a] = int(n)
    ratio = [np.float32(o) / np.float32(d) for o, d in zip(out, shape, strict=True)]
    if policy == "stretch":
        return [float(r) for r in ratio], out
    kept = (min if policy == "not_larger" else max)(ratio[a] for a in axes)
    scale = [float(kept) if a in axes else 1.0 for a in range(len(shape))]
    return scale, [int(np.floor(np.float64(kept * np.float32(d)) + 0.5)) if a in axes else d
                   for a, d in enumerate(shape)]


def _emit(ins: list[str], outs: list[str], raw: dict, ctx: Ctx, mode: str, transform: str, rounding: str,
          scales: np.ndarray | None, sizes: np.ndarray | None, axes: list[int] | None = None) -> list[Emit]:
    shape = ctx.shape(ins[0])
    _check_modes(ctx, raw, mode, transform, rounding)
    policy = raw.get("keep_aspect_ratio_policy", "stretch")
    if policy not in POLICIES:
        raise _refuse(ctx, f"keep_aspect_ratio_policy {policy!r} is not one of {', '.join(POLICIES)}")
    scale, out = _output(ctx, shape, scales, sizes, list(range(len(shape))) if axes is None else axes, policy)
    if len(shape) != 4 or any(out[a] != shape[a] or (scale[a] != 1.0 and shape[a] != 1) for a in (0, 1)):
        raise _refuse(ctx, f"only 4-D NCHW inputs resized on H and W are supported; this one resizes {list(shape)} "
                           f"to {out} (scales {[round(s, 6) for s in scale]})")
    if mode == "linear" and np.dtype(ctx.dtype(ins[0])).kind != "f":
        raise _refuse(ctx, f"mode 'linear' runs on float tensors; its input is {ctx.dtype(ins[0])}")
    attrs = {"mode": mode, "coordinate_transformation_mode": transform, "nearest_mode": rounding,
             "scales": [1.0, 1.0, *scale[2:]], "sizes": out}
    return [("Resize", ins[:1], outs[:1], attrs)]


def resize(ins, outs, raw, ctx) -> list[Emit]:
    mode = raw.get("mode", "nearest")
    if ctx.opset < 11:
        return _emit(ins, outs, raw, ctx, mode, "asymmetric", "simple", _given(ctx, ins, 1, "scales"), None)
    _given(ctx, ins, 1, "roi")
    rank = len(ctx.shape(ins[0]))
    axes = [_axis(int(a), rank) for a in raw["axes"]] if "axes" in raw else None
    if axes is not None and (len(set(axes)) != len(axes) or not all(0 <= a < rank for a in axes)):
        raise _refuse(ctx, f"axes {list(raw['axes'])} are not distinct axes of its {rank}-D input")
    return _emit(ins, outs, raw, ctx, mode, raw.get("coordinate_transformation_mode", "half_pixel"),
                 raw.get("nearest_mode", "round_prefer_floor"), _given(ctx, ins, 2, "scales"),
                 _given(ctx, ins, 3, "sizes"), axes)


def upsample(ins, outs, raw, ctx) -> list[Emit]:
    """Upsample-7/9: Resize-10 with `scales` as an attribute (opset 7-8) or an input (9)."""
    if ctx.opset < 7:
        raise _refuse(ctx, "the experimental Upsample of opset < 7 is not supported")
    scales = np.asarray(raw["scales"], np.float32) if ctx.opset < 9 else ctx.const(ins[1], "scales").reshape(-1)
    return _emit(ins, outs, raw, ctx, raw.get("mode", "nearest"), "asymmetric", "simple", scales, None)


RESIZE_NORMALIZERS: dict[str, Callable[..., list[Emit]]] = {"Resize": resize, "Upsample": upsample}
