"""The padded conv-to-conv hand-off (stages/build/halo.py) for random pairs of convs and random valid
schedules of both: the producer writes its output inside the consumer's zero borders over a buffer
full of NaN (a reused workspace), the consumer reads it as its packed input. Both must give what
the two convs give on plain tensors, for any shape, stride, padding, dilation, groups, tile and
thread count the build may pair (a 1x1 producer on a 56-wide image gave NaN: its flat GEMM tiles
ignored the padded row pitch)."""

from __future__ import annotations

import numpy as np
import pytest

from schemas.target import Target, preset
from schemas.task import parse_epilogue
from stages.codegen.compile import compile_ir
from stages.codegen.jit import LoadedKernel
from stages.measure.check import compare, reduction_size
from stages.templates import conv2d
from stages.templates.space import ConfigSpace, Knobs

HOST = Target.host()
CASES = 40


def random_config(space: ConfigSpace, rng: np.random.Generator, prefer: dict | None = None) -> Knobs:
    """A uniformly drawn valid config (rejection sampling), optionally with some knobs forced."""
    for _ in range(200_000):
        knobs = space.knobs_at(int(rng.integers(space.size)))
        knobs.update(prefer or {})
        if space.reason(knobs) is None:
            return knobs
    raise AssertionError("no valid config drawn")


def random_pair(rng: np.random.Generator):
    """A producer conv of any kind and a stride-1 consumer that reads it through its padding."""
    n = int(rng.integers(1, 3))
    c_in = int(rng.choice([1, 3, 8, 17, 32]))
    c_mid = int(rng.choice([4, 16, 24, 32, 48]))
    k1 = int(rng.choice([1, 1, 3, 5]))
    s1 = int(rng.choice([1, 1, 2]))
    p1 = (k1 // 2,) * 4 if rng.random() < 0.7 else tuple(int(v) for v in rng.integers(0, 3, 4))
    g1 = int(rng.choice([1, 1, c_in])) if c_mid % c_in == 0 else 1
    h, w = int(rng.integers(6, 40)), int(rng.integers(6, 60))
    chain1 = parse_epilogue(str(rng.choice(["", "bias", "bias,relu", "scale_shift,clip:0:6", "sigmoid"])))
    first = conv2d.conv2d_task((n, c_in, h, w), (c_mid, c_in // g1, k1, k1), (s1, s1), p1, (1, 1), g1, chain1)
    _, _, oh, ow = first.outputs[0].shape
    k2 = int(rng.choice([3, 3, 5, 7]))
    d2 = int(rng.choice([1, 1, 2]))
    reach = d2 * (k2 - 1)
    pads = tuple(int(v) for v in rng.integers(0, reach + 1, 4)) if rng.random() < 0.5 else (reach // 2,) * 4
    if oh + pads[0] + pads[2] <= reach or ow + pads[1] + pads[3] <= reach:
        pads = (reach // 2 + 1,) * 4
    g2 = int(rng.choice([1, 1, c_mid, 2 if c_mid % 2 == 0 else 1]))
    c_out = c_mid if g2 == c_mid else int(rng.choice([8, 16, 20, 48]))
    c_out -= c_out % g2
    c_out = max(c_out, g2)
    chain2 = parse_epilogue(str(rng.choice(["", "bias", "bias,relu", "bias,residual_add"])))
    second = conv2d.conv2d_task((n, c_mid, oh, ow), (c_out, c_mid // g2, k2, k2), (1, 1), pads, (d2, d2), g2, chain2)
    return first, second


def kernel(task, knobs, threads, halo):
    return LoadedKernel(compile_ir(conv2d.build_ir(task, knobs, HOST, threads, halo), HOST).data, HOST)


@pytest.mark.parametrize("case", range(CASES))
def test_random_conv_pairs_hand_over_padded_tensors(case):
    rng = np.random.default_rng(1000 + case)
    first, second = random_pair(rng)
    threads = int(rng.integers(1, 3))
    prefer = {"flat": 1, "rh": 1} if case % 3 == 0 else None  # flat producers span rows with their vectors
    try:
        k1 = random_config(conv2d.space(first, HOST), rng, prefer)
    except AssertionError:
        k1 = random_config(conv2d.space(first, HOST), rng)
    k2 = random_config(conv2d.space(second, HOST), rng)
    padded = conv2d.padded_input(second, k2)
    assert padded is not None, "a stride-1 consumer with a window reads its input padded"
    pads, floats = padded
    label = f"{first.description} {first.attrs} {k1} -> {second.description} {second.attrs} {k2}, {threads}T"

    x1 = conv2d.make_inputs(first, seed=case)
    mid = conv2d.reference(first, x1).astype(np.float32)
    x2 = [mid, *conv2d.make_inputs(second, seed=case + 1)[1:]]
    want = conv2d.reference(second, x2)

    buffer = np.full(floats, np.nan, dtype=np.float32)  # a reused workspace: borders and slack hold garbage
    args = conv2d.kernel_args(first, k1, x1, conv2d.Halo(y_pad=pads))
    args[-1] = buffer
    kernel(first, k1, threads, conv2d.Halo(y_pad=pads))(args)
    n, c, oh, ow = mid.shape
    top, left, bottom, right = pads
    image = buffer[: n * c * (oh + top + bottom) * (ow + left + right)].reshape(
        n, c, oh + top + bottom, ow + left + right)
    ok, err = compare(image[:, :, top: top + oh, left: left + ow].copy(), mid, reduction_size(first))
    assert ok, f"producer: max abs error {err:.3g}: {label}"
    inner = np.zeros_like(image, dtype=bool)
    inner[:, :, top: top + oh, left: left + ow] = True
    assert not np.any(image[~inner]), f"producer left non-zero borders: {label}"

    args = conv2d.kernel_args(second, k2, x2, conv2d.Halo(x_padded=True))
    args[0] = buffer
    kernel(second, k2, threads, conv2d.Halo(x_padded=True))(args)
    ok, err = compare(args[-1], want, reduction_size(second))
    assert ok, f"consumer: max abs error {err:.3g}: {label}"


def test_a_flat_1x1_producer_stores_rows_at_the_padded_pitch():
    """The reported case: 64 channels at 56x56 (a 16-lane vector spans two rows of 56), 1x1 -> 3x3."""
    first = conv2d.conv2d_task((1, 64, 56, 56), (64, 64, 1, 1), epilogue_ops=parse_epilogue("relu"))
    second = conv2d.conv2d_task((1, 64, 56, 56), (64, 64, 3, 3), pads=(1, 1, 1, 1))
    target = preset("x86-64-avx512") if HOST.vector_lanes >= 16 else HOST
    k1 = {**conv2d.default_config(first, target).knobs, "flat": 1, "rh": 1}
    assert conv2d.space(first, HOST).reason(k1) is None
    pads, floats = conv2d.padded_input(second, conv2d.default_config(second, HOST).knobs)
    x1 = conv2d.make_inputs(first, seed=0)
    buffer = np.full(floats, np.nan, dtype=np.float32)
    args = conv2d.kernel_args(first, k1, x1, conv2d.Halo(y_pad=pads))
    args[-1] = buffer
    kernel(first, k1, 1, conv2d.Halo(y_pad=pads))(args)
    image = buffer[: 64 * 58 * 58].reshape(1, 64, 58, 58)
    ok, err = compare(image[:, :, 1:57, 1:57].copy(), conv2d.reference(first, x1), reduction_size(first))
    assert ok, f"max abs error {err:.3g}"
