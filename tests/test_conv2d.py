"""conv2d template: real LLVM compiles of random shapes and random valid schedules vs the numpy
reference, the onnx package's pytorch-converted Conv2d backend tests, spaces, defaults and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import numpy_helper

from schemas.target import Target, preset
from schemas.task import EpilogueOp, parse_epilogue
from stages.codegen.compile import compile_ir
from stages.codegen.jit import LoadedKernel
from stages.measure.check import compare, reduction_size
from stages.templates import conv2d
from stages.templates.conv2d_shape import numpy_conv

HOST = Target.host()
ONNX_DATA = Path(onnx.__file__).parent / "backend" / "test" / "data" / "pytorch-converted"
CHAINS = ["", "bias", "bias,relu", "scale_shift,clip:0:6", "bias,residual_add,relu", "leaky_relu:0.1",
          "sigmoid", "bias,tanh"]


def run(task, knobs, inputs, threads: int = 1) -> np.ndarray:
    kernel = LoadedKernel(compile_ir(conv2d.build_ir(task, knobs, HOST, threads), HOST).data, HOST)
    args = conv2d.kernel_args(task, knobs, inputs)
    kernel(args)
    return args[-1]


def assert_matches(task, out: np.ndarray, ref: np.ndarray) -> None:
    ok, err = compare(out, ref, reduction_size(task))
    assert ok, f"{task.description} {task.attrs}: max abs error {err:.3g}"


@st.composite
def conv_cases(draw):
    groups = draw(st.sampled_from([1, 1, 2, 3, "dw"]))
    icg = 1 if groups == "dw" else draw(st.integers(1, 6))
    ocg = draw(st.sampled_from([1, 2])) if groups == "dw" else draw(st.integers(1, 9))
    g = draw(st.integers(2, 7)) if groups == "dw" else groups
    kh, kw = draw(st.sampled_from([1, 2, 3, 5, 7])), draw(st.sampled_from([1, 3, 5]))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    pads = tuple(draw(st.integers(0, 3)) for _ in range(4))
    h_min = max(1, dh * (kh - 1) + 1 - pads[0] - pads[2])  # a dilated 7-tall window needs 13 rows
    h = draw(st.integers(h_min, max(h_min, 12)))
    w = draw(st.integers(max(1, dw * (kw - 1) + 1 - pads[1] - pads[3]), 40))
    n = draw(st.integers(1, 2))
    chain = parse_epilogue(draw(st.sampled_from(CHAINS)))
    task = conv2d.conv2d_task((n, g * icg, h, w), (g * ocg, icg, kh, kw), (sh, sw), pads, (dh, dw), g, chain)
    space = conv2d.space(task, HOST)
    for _ in range(400):
        knobs = space.knobs_at(draw(st.integers(0, space.size - 1)))
        if space.reason(knobs) is None:
            return task, knobs, draw(st.integers(1, 2))
    return task, conv2d.default_config(task, HOST).knobs, 1


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv_cases())
def test_random_shapes_and_schedules_match_numpy(case):
    task, knobs, threads = case
    inputs = conv2d.make_inputs(task, seed=1)
    assert_matches(task, run(task, knobs, inputs, threads), conv2d.reference(task, inputs))


def _onnx_case(path: Path):
    model = onnx.load(str(path / "model.onnx"))
    (node,) = model.graph.node
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    data = path / "test_data_set_0"
    feeds = [numpy_helper.to_array(onnx.load_tensor(str(p))) for p in sorted(data.glob("input_*.pb"))]
    expected = numpy_helper.to_array(onnx.load_tensor(str(data / "output_0.pb")))
    x, w, *bias = [inits[name] if name in inits else feeds.pop(0) for name in node.input]
    task = conv2d.conv2d_task(x.shape, w.shape, tuple(attrs.get("strides", (1, 1))),
                              tuple(attrs.get("pads", (0, 0, 0, 0))), tuple(attrs.get("dilations", (1, 1))),
                              attrs.get("group", 1), (EpilogueOp(kind="bias"),) if bias else ())
    return task, [x, w, *bias], expected


ONNX_CASES = sorted(p.name for p in ONNX_DATA.glob("test_Conv2d*"))


def test_the_onnx_package_ships_the_conv2d_backend_tests():
    assert {"test_Conv2d", "test_Conv2d_depthwise", "test_Conv2d_dilated", "test_Conv2d_groups",
            "test_Conv2d_strided", "test_Conv2d_padding"} <= set(ONNX_CASES)


@pytest.mark.parametrize("name", ONNX_CASES)
def test_onnx_backend_conv2d_data_as_single_op_graphs(name):
    task, inputs, expected = _onnx_case(ONNX_DATA / name)
    out = run(task, conv2d.default_config(task, HOST).knobs, inputs, threads=2)
    assert_matches(task, out, expected)


RESNET_LIKE = [((1, 64, 56, 56), (64, 64, 3, 3), 1, 1, 1), ((1, 256, 14, 14), (1024, 256, 1, 1), 1, 0, 1),
               ((1, 3, 224, 224), (64, 3, 7, 7), 2, 3, 1), ((1, 32, 112, 112), (32, 1, 3, 3), 1, 1, 32),
               ((1, 128, 56, 56), (128, 128, 3, 3), 2, 1, 1), ((8, 512, 7, 7), (512, 512, 3, 3), 1, 1, 1)]


@pytest.mark.parametrize("layer", RESNET_LIKE)
def test_default_schedules_are_valid_and_fill_the_registers(layer):
    x, w, s, p, g = layer
    task = conv2d.conv2d_task(x, w, (s, s), (p,) * 4, (1, 1), g)
    for target in (HOST, preset("x86-64-avx2")):
        knobs = conv2d.default_config(task, target).knobs
        assert conv2d.space(task, target).reason(knobs) is None
        assert knobs["vw"] in (target.vector_lanes, target.vector_lanes // 2)
        accumulators = knobs["mr"] * knobs["rh"] * knobs["nw"]
        if g == 1:  # a depthwise tile's channels share no loads: it is sized by its rows (below)
            assert accumulators >= target.vector_registers // 2


DEPTHWISE = [  # (input, window, stride, pad) -> (nw, rh, flat) of the default's depthwise tile on 16 lanes
    ((1, 144, 56, 56), 3, 1, 1, (2, 2, 0)), ((1, 384, 14, 14), 3, 1, 1, (1, 2, 0)),
    ((1, 672, 14, 14), 5, 1, 2, (1, 3, 0)), ((1, 96, 112, 112), 3, 2, 1, (2, 2, 0)),
    ((1, 960, 7, 7), 3, 1, 1, (4, 1, 1)), ((1, 672, 14, 14), 5, 2, 2, (4, 1, 1)),
    ((1, 240, 28, 28), 5, 1, 2, (2, 2, 0)), ((1, 144, 56, 56), 5, 2, 2, (2, 2, 0))]  # 3 rows of 2 vectors spilled


@pytest.mark.parametrize("x,k,s,p,tile", DEPTHWISE)
def test_depthwise_defaults_unroll_the_window_over_full_vectors_and_match_numpy(x, k, s, p, tile):
    c = x[1]
    task = conv2d.conv2d_task(x, (c, 1, k, k), (s, s), (p,) * 4, (1, 1), c, parse_epilogue("bias,clip:0:6"))
    knobs = conv2d.default_config(task, preset("x86-64-avx512")).knobs
    assert (knobs["vw"], knobs["mr"], knobs["unroll"], knobs["axis"]) == (16, conv2d.DW_MR, 2, "w"), knobs
    assert (knobs["nw"], knobs["rh"], knobs["flat"]) == tile, knobs
    small = conv2d.conv2d_task((1, 6, *x[2:]), (6, 1, k, k), (s, s), (p,) * 4, (1, 1), 6, task.epilogue)
    knobs = conv2d.default_config(small, HOST).knobs
    inputs = conv2d.make_inputs(small, seed=1)
    assert_matches(small, run(small, knobs, inputs, threads=2), conv2d.reference(small, inputs))


def test_a_depthwise_layer_whose_flat_grid_wastes_the_lanes_keeps_the_column_tile_where_halves_run_as_fast():
    """Zen 4 runs 8-lane FMAs at the 16-lane rate, so 7 of 8 lanes beat the flat grid's 49 of 128; on a
    full-rate AVX-512 core an 8-lane FMA is half the work per cycle and the flat 16-lane grid wins
    (Zen 5, 1152x7x7 5x5 + bias + swish: 41 vs 31.5 GFLOPS)."""
    task = conv2d.conv2d_task((1, 1152, 7, 7), (1152, 1, 5, 5), (1, 1), (2, 2, 2, 2), (1, 1), 1152)
    zen4 = preset("x86-64-avx512").model_copy(update={"cpu": "znver4"})
    assert zen4.double_pumped and not preset("x86-64-avx512").double_pumped
    knobs = conv2d.default_config(task, zen4).knobs
    assert (knobs["vw"], knobs["flat"], knobs["unroll"]) == (8, 0, 1), knobs  # 49 of 128 lanes flat
    knobs = conv2d.default_config(task, preset("x86-64-avx512")).knobs
    assert (knobs["vw"], knobs["flat"]) == (16, 1), knobs


@pytest.mark.parametrize("x,w,stride,pad", [((1, 3, 224, 224), (64, 3, 7, 7), 2, 3),
                                            ((1, 3, 224, 224), (32, 3, 3, 3), 2, 1),
                                            ((1, 144, 28, 28), (40, 144, 1, 1), 1, 0),
                                            ((1, 64, 73, 73), (80, 64, 1, 1), 1, 0)])
def test_column_tiles_take_full_width_vectors_on_full_rate_avx512(x, w, stride, pad):
    """Stems on 3 channels and 1x1 layers with too few output channels for channel vectors: 8-lane
    vectors (which tile 112- and 28-wide outputs exactly) ran them at 0.5-0.6x the 16-lane tile on Zen 5
    (7x7 stem 127 -> 245 GFLOPS, 3x3 stem 105 -> 184, 144x28x28 -> 40 126 -> 201, 64x73x73 -> 80 118 -> 211)."""
    task = conv2d.conv2d_task(x, w, (stride, stride), (pad,) * 4)
    full = preset("x86-64-avx512")
    assert conv2d.default_config(task, full).knobs["vw"] == 16
    assert conv2d.default_config(task, full.model_copy(update={"cpu": "znver4"})).knobs["vw"] == 8


@pytest.mark.parametrize("x,oc,axis", [((1, 64, 14, 14), 384, "oc"), ((1, 768, 17, 17), 192, "oc"),
                                       ((1, 96, 14, 14), 576, "oc"), ((1, 64, 56, 56), 256, "w"),
                                       ((1, 16, 14, 14), 96, "w"), ((1, 32, 28, 28), 192, "w"),
                                       ((1, 512, 28, 28), 256, "w"), ((1, 2048, 8, 8), 448, "w"),
                                       ((1, 192, 35, 35), 48, "w"), ((1, 192, 35, 35), 64, "oc")])
def test_1x1_gemms_put_channels_on_the_lanes_where_pixel_columns_waste_lanes(x, oc, axis):
    """Channel vectors from 32 input channels on 14x14 and 17x17 images (column tiles fill 88-90% of their
    lanes there), not where the image fills whole 32-pixel tiles (8x8, 28x28), nor where one channel vector
    would broadcast two rows of pixels per weight load (48 channels on 35x35)."""
    task = conv2d.conv2d_task(x, (oc, x[1], 1, 1))
    assert conv2d.default_config(task, preset("x86-64-avx512")).knobs["axis"] == axis


@pytest.mark.parametrize("x,w,stride,par", [((1, 288, 35, 35), (384, 288, 3, 3), 2, "oc"),
                                            ((1, 192, 17, 17), (320, 192, 3, 3), 2, "oc"),
                                            ((1, 64, 56, 56), (64, 64, 3, 3), 1, "oh")])
def test_threads_split_channel_blocks_where_row_items_would_re_read_large_weights(x, w, stride, par):
    """Row items walk every channel tile: with weights over half of L2 that re-reads them once per output row."""
    task = conv2d.conv2d_task(x, w, (stride, stride), (0, 0, 0, 0) if stride == 2 else (1, 1, 1, 1))
    assert conv2d.default_config(task, preset("x86-64-avx512")).knobs["par"] == par


@pytest.mark.parametrize("x,oc", [((1, 240, 28, 28), 40), ((1, 2048, 8, 8), 448), ((1, 64, 73, 73), 80)])
def test_1x1_gemm_column_tiles_are_two_vectors_wide_or_more(x, oc):
    """One-vector tiles load a weight per FMA: 24 x 1 ran EfficientNet-B0's 240x28x28 -> 40 at 86 GFLOPS, 12 x 2
    at 100 (Emerald Rapids)."""
    task = conv2d.conv2d_task(x, (oc, x[1], 1, 1))
    knobs = conv2d.default_config(task, preset("x86-64-avx512")).knobs
    assert knobs["axis"] == "w" and knobs["nw"] * knobs["rh"] >= 2, knobs


@pytest.mark.parametrize("stride,icb,par,threads",
                         [(1, 4, "oh", 2), (2, 16, "oc", 1), (1, 16, "oh", 1), (3, 2, "oc", 2)])
def test_flat_grid_tiles_store_around_the_padding_columns(stride, icb, par, threads):
    """Vectors spanning output rows, channel blocks accumulated through Y, a residual read the same way."""
    task = conv2d.conv2d_task((2, 12, 13, 11), (10, 12, 3, 3), (stride, stride), (1, 2, 1, 0), (1, 1), 1,
                              parse_epilogue("bias,residual_add,relu"))
    knobs = {**conv2d.default_config(task, HOST).knobs, "flat": 1, "rh": 1, "vw": 8, "nw": 2, "mr": 3, "icb": icb,
             "par": par, "ocn": 2}
    assert conv2d.space(task, HOST).reason(knobs) is None
    inputs = conv2d.make_inputs(task)
    assert_matches(task, run(task, knobs, inputs, threads), conv2d.reference(task, inputs))


@pytest.mark.parametrize("vw,mr,rh,flat,stride",
                         [(8, 16, 1, 1, 1), (16, 16, 1, 0, 2), (8, 8, 2, 0, 1), (4, 8, 1, 1, 2)])
def test_channel_vector_tiles_are_transposed_into_the_output(vw, mr, rh, flat, stride):
    task = conv2d.conv2d_task((1, 6, 12, 19), (21, 6, 3, 3), (stride, stride), (1, 1, 0, 2), (1, 1), 1,
                              parse_epilogue("bias,residual_add,relu"))
    knobs = {**conv2d.default_config(task, HOST).knobs, "axis": "oc", "vw": vw, "mr": mr, "rh": rh, "nw": 1,
             "flat": flat, "icb": 8, "ocn": 1}
    assert conv2d.space(task, HOST).reason(knobs) is None
    inputs = conv2d.make_inputs(task)
    assert_matches(task, run(task, knobs, inputs, 2), conv2d.reference(task, inputs))
    assert "whole reduction" in conv2d.space(task, HOST).reason({**knobs, "icb": 4})
    assert "multiple of vw" in conv2d.space(task, HOST).reason({**knobs, "mr": 10})


def test_channel_vector_tiles_split_the_row_evenly_and_compute_only_their_pixels():
    """28 columns: two tiles of 14 pixels, so a step is 2 channel vectors x 14 pixels = 28 FMAs (not 32),
    a 32x14 tile fits the registers a 32x16 one would not, and the output is still right."""
    task = conv2d.conv2d_task((1, 32, 28, 28), (40, 32, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1,
                              parse_epilogue("bias,relu"))
    knobs = {**conv2d.default_config(task, HOST).knobs, "axis": "oc", "vw": 16, "mr": 32, "nw": 1, "rh": 1,
             "flat": 0, "unroll": 0, "uk": 1, "icb": 32, "ocn": 1}
    assert conv2d.space(task, HOST).reason(knobs) is None
    plan = conv2d.plan(task, knobs)
    assert (plan.tile_w, plan.w_tiles, plan.accumulators) == (14, 2, 28)
    assert str(conv2d.build_ir(task, knobs, HOST)).count('= call <16 x float> @"llvm.fma.v16f32"(') == 28
    inputs = conv2d.make_inputs(task)
    assert_matches(task, run(task, knobs, inputs, 2), conv2d.reference(task, inputs))
    assert "groups of 16 pixels exceed" in conv2d.space(task, HOST).reason({**knobs, "mr": 16, "nw": 3, "rh": 1})


@pytest.mark.parametrize("shape,kernel,stride,pads,rh,threads",
                         [((2, 5, 13, 11), 3, (2, 1), (2, 1, 0, 1), 2, 2),
                          ((3, 4, 9, 10), 1, (2, 2), (0, 0, 0, 0), 1, 2),
                          ((1, 6, 12, 19), 5, (1, 1), (2, 2, 2, 2), 3, 1)])
def test_row_tiles_pack_the_rows_they_read_without_a_pack_phase(shape, kernel, stride, pads, rh, threads):
    """Segments are (image, row tile): a thread's range packs, into a buffer on its own stack, the
    padded rows it is first to need, across image boundaries, halo rows again in each thread."""
    task = conv2d.conv2d_task(shape, (7, shape[1], kernel, kernel), stride, pads, (1, 1), 1,
                              parse_epilogue("bias,relu"))
    knobs = {**conv2d.default_config(task, HOST).knobs, "axis": "w", "vw": 8, "mr": 4, "nw": 1, "rh": rh,
             "flat": 0, "par": "oh", "icb": 2, "ocn": 1, "unroll": 0, "uk": 1}
    assert conv2d.space(task, HOST).reason(knobs) is None and conv2d.plan(task, knobs).pack_rows
    ir_text = str(conv2d.build_ir(task, knobs, HOST, threads))
    assert '@"tf_pack_rows"' in ir_text and '@"tf_pack"' not in ir_text
    inputs = conv2d.make_inputs(task)
    assert_matches(task, run(task, knobs, inputs, threads), conv2d.reference(task, inputs))


@pytest.mark.parametrize("shape,weight,groups,knobs,items", [
    ((2, 64, 8, 8), (64, 64, 3, 3), 1, {"axis": "oc", "vw": 16, "mr": 16, "rh": 3, "par": "oh", "ocn": 4}, 2 * 3 * 4),
    ((1, 64, 8, 8), (64, 64, 3, 3), 1, {"axis": "w", "vw": 8, "mr": 3, "rh": 4, "par": "oc", "ocn": 8}, 22),
    ((1, 8, 9, 9), (8, 2, 3, 3), 4, {"axis": "w", "vw": 8, "mr": 1, "rh": 1, "par": "oc", "ocn": 2, "icb": 2}, 8)])
def test_threads_split_channel_tiles_not_blocks(shape, weight, groups, knobs, items):
    """The parallel items are single channel tiles of a segment, so 3 row tiles x 4 channel tiles split
    6 + 6 on two threads (they were 1 + 2 row tiles), 22 tiles in blocks of 8 split 11 + 11 (not 8 + 14),
    and a range may start inside a group (3 threads: tiles [5, 8) of 2-channel groups), whose planes
    both threads then pack."""
    task = conv2d.conv2d_task(shape, weight, (1, 1), (1, 1, 1, 1), (1, 1), groups, parse_epilogue("bias,relu"))
    knobs = {**conv2d.default_config(task, HOST).knobs, "nw": 1, "flat": 0, "icb": weight[1], "unroll": 0, "uk": 1,
             **knobs}
    assert conv2d.space(task, HOST).reason(knobs) is None
    assert f"i64 {items}, i64 2)" in str(conv2d.build_ir(task, knobs, HOST, 2))  # tf_parallel_for(.., extent, threads)
    inputs = conv2d.make_inputs(task)
    ref = conv2d.reference(task, inputs)
    for threads in (2, 3):
        assert_matches(task, run(task, knobs, inputs, threads), ref)


@pytest.mark.parametrize("axis,threads", [("oc", 2), ("w", 1)])
def test_row_tiles_of_a_large_image_pack_into_a_stack_slab(axis, threads):
    """A packed image past L2 (here 2 images x 1.3 MB): each row tile packs its rows into a small
    buffer of its own (no workspace at all), halo rows again for the next tile."""
    task = conv2d.conv2d_task((2, 64, 70, 70), (16, 64, 3, 3), (2, 2), (1, 0, 1, 1), (1, 1), 1,
                              parse_epilogue("bias,relu"))
    knobs = {**conv2d.default_config(task, HOST).knobs, "axis": axis, "vw": 16, "mr": 16 if axis == "oc" else 8,
             "nw": 1, "rh": 2, "flat": 0, "par": "oh", "icb": 64, "ocn": 1, "unroll": 0, "uk": 1}
    assert conv2d.space(task, HOST).reason(knobs) is None
    plan = conv2d.plan(task, knobs)
    assert plan.slab and plan.workspace == 0 and plan.stack_floats * 4 < 1 << 20
    inputs = conv2d.make_inputs(task)
    assert len(conv2d.kernel_args(task, knobs, inputs)) == 4  # X, W, bias, Y: no packed-input buffer
    assert_matches(task, run(task, knobs, inputs, threads), conv2d.reference(task, inputs))


def test_defaults_pick_the_vector_axis_and_the_flat_grid():
    def default(x, w, s=1, target=HOST):
        return conv2d.default_config(conv2d.conv2d_task(x, w, (s, s), (1, 1, 1, 1)), target).knobs

    for x, w, s in (((1, 64, 56, 56), (64, 64, 3, 3), 1), ((1, 128, 28, 28), (128, 128, 3, 3), 1),
                    ((1, 128, 56, 56), (128, 128, 3, 3), 2)):  # 32 channels x 14 pixels, one channel block
        assert {k: default(x, w, s)[k] for k in ("axis", "vw", "mr", "nw", "rh", "flat", "icb")} == \
            {"axis": "oc", "vw": 16, "mr": 32, "nw": 1, "rh": 1, "flat": 0, "icb": x[1]}
    zen4, full = preset("x86-64-avx512").model_copy(update={"cpu": "znver4"}), preset("x86-64-avx512")
    assert default((1, 8, 28, 28), (64, 8, 3, 3), target=zen4)["flat"] == 1  # 28 of 32 lanes in rows; 784 of 840 flat
    assert default((1, 8, 56, 56), (64, 8, 3, 3), target=zen4)["flat"] == 0  # 56 columns fill 7 half vectors exactly
    # at full rate a half vector is half the FMAs: 16 lanes on the flat grid (Zen 5: 194 vs 127 GFLOPS)
    assert {k: default((1, 8, 56, 56), (64, 8, 3, 3), target=full)[k] for k in ("vw", "flat")} == {"vw": 16, "flat": 1}
    assert default((1, 64, 56, 56), (64, 64, 3, 3), target=preset("x86-64-avx2"))["axis"] == "w"


def test_strided_input_is_packed_in_phases_of_both_axes():
    task = conv2d.conv2d_task((1, 2, 5, 6), (4, 2, 3, 3), (2, 2), (1, 1, 1, 1))
    knobs = conv2d.default_config(task, HOST).knobs
    x = conv2d.make_inputs(task)[0]
    p = conv2d.plan(task, knobs)
    assert (p.hq, p.wq, p.plane) == (4, 4, 64) and p.tap(2, 1) == (1 * 4 + 1) * 4  # row 2 → phase 0 row 1
    args = conv2d.kernel_args(task, knobs, conv2d.make_inputs(task))
    assert args[2].size == p.workspace >= 2 * p.plane
    LoadedKernel(compile_ir(conv2d.build_ir(task, knobs, HOST, 1), HOST).data, HOST)(args)
    planes = args[2][: 2 * p.plane].reshape(2, 2, 2, 4, 4)  # [c][row phase][column phase][row][column]
    xpad = np.pad(x, ((0, 0), (0, 0), (1, 2), (1, 1)))  # rows padded up to 2 phases x 4
    for rph in (0, 1):
        for cph in (0, 1):
            np.testing.assert_array_equal(planes[:, rph, cph], xpad[0, :, rph::2, cph::2])


@pytest.mark.parametrize("stride,pads", [(1, (1, 2, 0, 3)), (2, (1, 1, 1, 1)), (2, (0, 3, 1, 0)), (3, (2, 2, 0, 1))])
def test_wide_rows_are_packed_in_vector_blocks(stride, pads):
    """Stride 1: rows copied in vectors of 16 with masked edges. Stride s: blocks of s*8 columns
    split into every column phase at once, scalar copies and zeros around them. Either way the
    packed planes equal the padded input's phases."""
    task = conv2d.conv2d_task((1, 3, 7, 101), (4, 3, 3, 3), (stride, stride), pads)
    knobs = {**conv2d.default_config(task, HOST).knobs, "par": "oc"}
    p = conv2d.plan(task, knobs)
    if stride > 1:  # one load of stride*8 columns feeds every phase
        assert f"load <{8 * stride} x float>" in str(conv2d.build_ir(task, knobs, HOST, 1))
    x = conv2d.make_inputs(task)[0]
    args = conv2d.kernel_args(task, knobs, conv2d.make_inputs(task))
    LoadedKernel(compile_ir(conv2d.build_ir(task, knobs, HOST, 1), HOST).data, HOST)(args)
    planes = args[2][: 3 * p.plane].reshape(3, stride, stride, p.hq, p.wq)
    xpad = np.pad(x[0], ((0, 0), (pads[0], p.hq * stride - 7 - pads[0]), (pads[1], p.wq * stride - 101 - pads[1])))
    for rph in range(stride):
        for cph in range(stride):
            np.testing.assert_array_equal(planes[:, rph, cph], xpad[:, rph::stride, cph::stride])


def test_a_default_schedule_runs_a_batched_resnet_block_correctly():
    task = conv2d.conv2d_task((2, 32, 14, 14), (48, 32, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1,
                              parse_epilogue("scale_shift,residual_add,relu"))
    inputs = conv2d.make_inputs(task)
    assert_matches(task, run(task, conv2d.default_config(task, HOST).knobs, inputs, 2),
                   conv2d.reference(task, inputs))


def test_invalid_schedules_are_rejected_with_reasons():
    task = conv2d.conv2d_task((1, 8, 10, 10), (12, 2, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 4)
    space = conv2d.space(task, preset("x86-64-avx2"))
    base = dict(conv2d.default_config(task, preset("x86-64-avx2")).knobs)
    assert "lanes" in space.reason({**base, "vw": 16})
    assert "vector registers" in space.reason({**base, "mr": 16, "nw": 2, "rh": 2})
    assert "per group" in space.reason({**base, "mr": 2})  # 3 output channels per group
    assert "input channels per group" in space.reason({**base, "icb": 8})


def test_the_1x1_path_reads_the_image_in_place_and_other_convs_pack_it():
    gemm = conv2d.conv2d_task((1, 16, 7, 7), (32, 16, 1, 1))
    knobs = conv2d.default_config(gemm, HOST).knobs
    assert len(conv2d.kernel_args(gemm, knobs, conv2d.make_inputs(gemm))) == 3  # X, W panels, Y
    padded = conv2d.conv2d_task((1, 16, 7, 7), (32, 16, 1, 1), pads=(1, 1, 1, 1))
    knobs = {**conv2d.default_config(padded, HOST).knobs, "par": "oc"}  # a pack phase into the workspace
    args = conv2d.kernel_args(padded, knobs, conv2d.make_inputs(padded))
    assert len(args) == 4 and args[2].size >= 16 * 9 * 9
    rows = conv2d.plan(padded, {**knobs, "par": "oh", "flat": 0})  # row tiles pack on their own stack instead
    assert rows.pack_rows and rows.workspace == 0 and rows.stack_floats >= 16 * 9 * 9


def test_weights_are_packed_once_into_tile_panels():
    task = conv2d.conv2d_task((1, 5, 6, 6), (7, 5, 3, 3))
    w = conv2d.make_inputs(task)[1]
    for order in ("chw", "hwc"):
        knobs = {**conv2d.default_config(task, HOST).knobs, "mr": 4, "icb": 2, "order": order}
        packed = conv2d.kernel_args(task, knobs, conv2d.make_inputs(task))[1]
        if order == "chw":
            assert packed.shape == (2, 5, 3, 3, 4)  # OIHW[4]o, output channels zero-padded to 8
            assert packed[1, 2, 0, 1, 2] == w[6, 2, 0, 1] and packed[1, :, :, :, 3].sum() == 0
        else:
            assert packed.shape == (2, 3, 3, 3, 2, 4)  # OIHW[2]i[4]o, input channels padded to 6
            assert packed[1, 1, 0, 1, 0, 2] == w[6, 2, 0, 1]


def test_compiles_for_an_avx2_machine():
    task = conv2d.conv2d_task((1, 16, 14, 14), (32, 16, 3, 3), pads=(1, 1, 1, 1),
                              epilogue_ops=parse_epilogue("bias,relu"))
    avx2 = preset("x86-64-avx2")
    obj = compile_ir(conv2d.build_ir(task, conv2d.default_config(task, avx2).knobs, avx2, 2), avx2)
    assert obj.data[:4] == b"\x7fELF"


def test_numpy_conv_is_the_same_convolution():
    task = conv2d.conv2d_task((2, 6, 9, 11), (6, 2, 3, 2), (2, 1), (1, 0, 2, 1), (2, 1), 3)
    inputs = conv2d.make_inputs(task)
    np.testing.assert_allclose(numpy_conv(task, inputs), conv2d.reference(task, inputs), atol=1e-5)


def test_cli_options_make_the_task():
    task = conv2d.task_from_cli({"input": "1x64x56x56", "weight": "64x64x3x3", "stride": "1", "pad": "1",
                                 "groups": 1, "epilogue": "bias,relu"})
    assert task.attrs == {"strides": (1, 1), "pads": (1, 1, 1, 1), "dilations": (1, 1), "group": 1}
    assert task.outputs[0].shape == (1, 64, 56, 56) and [e.kind for e in task.epilogue] == ["bias", "relu"]
    assert task.inputs[2].shape == (64,)
    task = conv2d.task_from_cli({"input": "1x4x9x9", "weight": "4x1x3x3", "stride": "2x1", "pad": "0,1,2,1",
                                 "dilation": "2", "groups": 4})
    assert task.attrs["pads"] == (0, 1, 2, 1) and task.attrs["strides"] == (2, 1)
    assert task.outputs[0].shape == (1, 4, 4, 7)
    with pytest.raises(ValueError, match="--weight"):
        conv2d.task_from_cli({"input": "1x4x9x9"})
    with pytest.raises(ValueError, match="group"):
        conv2d.task_from_cli({"input": "1x4x9x9", "weight": "4x3x3x3", "groups": 2})
    with pytest.raises(ValueError, match="does not fit"):
        conv2d.task_from_cli({"input": "1x4x2x2", "weight": "4x4x5x5"})


def test_tune_op_conv2d_cli_json(tmp_path):
    """The issue's command line, on a small layer: real builds, real runs, a real log, JSON out."""
    args = ["tune-op", "conv2d", "--input", "1x8x12x12", "--weight", "16x8x3x3", "--stride", "1", "--pad", "1",
            "--groups", "1", "--epilogue", "bias,relu", "--log", str(tmp_path / "log"), "--no-prefect", "--json",
            "--trials", "6", "--batch-size", "3", "--remeasure-top-k", "0"]
    done = subprocess.run([sys.executable, "-m", "tunaflow", *args], cwd=Path(__file__).resolve().parent.parent,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["trials"] == 6 and out["best_gflops"] > 0 and out["default_gflops"] > 0 and out["numpy_gflops"] > 0
    assert out["task"] == "conv2d(1x8x12x12,16x8x3x3,16)+bias+relu"
    assert {"mr", "nw", "vw", "icb"} <= set(out["best_config"])


HALO_KNOBS = [dict(vw=16, mr=6, nw=1, rh=1, icb=8, order="hwc", unroll=0, uk=2, ocn=1, par="oh", flat=0, axis="w"),
              dict(vw=16, mr=16, nw=1, rh=2, icb=16, order="chw", unroll=0, uk=1, ocn=2, par="oh", flat=0, axis="oc"),
              dict(vw=8, mr=4, nw=2, rh=1, icb=4, order="chw", unroll=1, uk=1, ocn=2, par="oc", flat=1, axis="w"),
              dict(vw=16, mr=5, nw=1, rh=3, icb=16, order="chw", unroll=0, uk=1, ocn=1, par="oc", flat=0, axis="w")]


@pytest.mark.parametrize("knobs", HALO_KNOBS)
@pytest.mark.parametrize("threads,flat_producer", [(1, False), (2, False), (2, True)])
def test_a_conv_writes_inside_zero_borders_that_the_next_conv_reads_as_its_padding(knobs, threads, flat_producer):
    """Producer Y stored with the consumer's pads (borders zeroed over whatever the buffer held; a flat
    producer's vectors span rows), the consumer skipping its pack: the same result as both convs on
    plain tensors."""
    first = conv2d.conv2d_task((2, 5, 14, 19), (16, 5, 3, 3), (2, 1), (1, 1, 1, 1), (1, 1), 1,
                               parse_epilogue("bias,relu"))
    second = conv2d.conv2d_task((2, 16, 7, 19), (20, 16, 3, 3), (1, 1), (1, 2, 0, 1), (1, 1), 1,
                                parse_epilogue("bias,residual_add"))
    k1 = conv2d.default_config(first, HOST).knobs
    if flat_producer:
        k1 = {**k1, "flat": 1, "rh": 1, "vw": 8, "nw": 2, "mr": 4, "axis": "w", "par": "oh", "icb": 2, "ocn": 2}
        assert conv2d.space(first, HOST).reason(k1) is None
    assert conv2d.space(second, HOST).reason(knobs) is None
    pads, floats = conv2d.padded_input(second, knobs)
    assert pads == (1, 2, 0, 1) and floats >= 2 * 16 * (7 + 1) * (19 + 3)
    x1 = conv2d.make_inputs(first, seed=3)
    mid = conv2d.reference(first, x1)
    x2 = [mid, *conv2d.make_inputs(second, seed=4)[1:]]
    want = conv2d.reference(second, x2)

    padded = np.full(floats, np.nan, dtype=np.float32)  # a reused buffer: borders hold garbage
    produce = conv2d.Halo(y_pad=pads)
    args = conv2d.kernel_args(first, k1, x1, produce)
    args[-1] = padded
    LoadedKernel(compile_ir(conv2d.build_ir(first, k1, HOST, threads, produce), HOST).data, HOST)(args)
    image = padded[:2 * 16 * 8 * 22].reshape(2, 16, 8, 22)
    assert_matches(first, image[:, :, 1:, 2:-1].copy(), mid)
    assert not image[:, :, :1].any() and not image[:, :, :, :2].any() and not image[:, :, :, -1:].any()

    consume = conv2d.Halo(x_padded=True)
    args = conv2d.kernel_args(second, knobs, x2, consume)
    assert len(args) == 5  # X, W, bias, residual, Y: no packed-input workspace
    args[0] = padded
    LoadedKernel(compile_ir(conv2d.build_ir(second, knobs, HOST, threads, consume), HOST).data, HOST)(args)
    assert_matches(second, args[-1], want)


def test_a_padded_output_refuses_y_shaped_epilogue_operands():
    task = conv2d.conv2d_task((1, 4, 6, 6), (4, 4, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1,
                              parse_epilogue("bias,residual_add"))
    with pytest.raises(ValueError, match="Y-shaped epilogue operands"):
        conv2d.build_ir(task, conv2d.default_config(task, HOST).knobs, HOST, 1, conv2d.Halo(y_pad=(1, 1, 1, 1)))


def test_1x1_channel_tiles_take_one_row_of_pixels_on_a_tie():
    for x, oc, s in (((1, 256, 56, 56), 64, 1), ((1, 256, 56, 56), 512, 2)):  # 28 pixels of one row, not 2 x 14
        knobs = conv2d.default_config(conv2d.conv2d_task(x, (oc, x[1], 1, 1), (s, s)), preset("x86-64-avx512")).knobs
        assert (knobs["axis"], knobs["mr"], knobs["nw"], knobs["rh"]) == ("oc", 16, 2, 1), knobs


@pytest.mark.parametrize("x,w,stride,groups,mr,ocn,planes,threads", [
    ((1, 24, 29, 31), (24, 1, 3, 3), 2, 24, 2, 1, 2, 1),  # depthwise, stride 2: two planes per block
    ((1, 24, 29, 31), (24, 1, 5, 5), 1, 24, 2, 2, 4, 2),
    ((2, 12, 15, 17), (24, 4, 3, 3), 2, 3, 4, 2, 8, 2),  # 8 channels a group in tiles of 4: blocks may start mid-group
])
def test_channel_blocks_pack_their_planes_into_a_stack_buffer(x, w, stride, groups, mr, ocn, planes, threads):
    """Grouped convs split by channel blocks pack each block's planes into one buffer on the thread's
    stack, reused block after block (no whole-image workspace), and stay exact."""
    task = conv2d.conv2d_task(x, w, (stride, stride), (w[2] // 2,) * 4, (1, 1), groups, parse_epilogue("bias,relu"))
    knobs = {**conv2d.default_config(task, HOST).knobs, "vw": 16, "mr": mr, "nw": 1, "rh": 2, "flat": 0,
             "par": "oc", "ocn": ocn, "axis": "w", "icb": w[1], "unroll": 2, "uk": 1}
    assert conv2d.space(task, HOST).reason(knobs) is None
    p = conv2d.plan(task, knobs)
    assert p.pack_in_item and p.item_stack and p.workspace == 0 and p.item_planes == planes
    inputs = conv2d.make_inputs(task)
    assert len(conv2d.kernel_args(task, knobs, inputs)) == 4  # X, W, bias, Y: no packed-input buffer
    assert_matches(task, run(task, knobs, inputs, threads), conv2d.reference(task, inputs))


def test_channel_vector_tiles_prefetch_the_next_tiles_weights():
    """Each weight vector load of a channel-vector tile comes with a prefetch one panel ahead (the next
    tile's weights, streamed from memory in a model); column-vector tiles broadcast weights and prefetch none."""
    task = conv2d.conv2d_task((1, 192, 7, 7), (1152, 192, 1, 1))
    knobs = conv2d.default_config(task, HOST).knobs
    assert knobs["axis"] == "oc"
    p = conv2d.plan(task, knobs)
    text = str(conv2d.build_ir(task, knobs, HOST, 1))
    assert text.count("call void @\"llvm.prefetch.p0\"") == p.mr // p.vw
    at = text.index('call void @"llvm.prefetch.p0"')
    assert f", {p.panel}\n" in text[at - 300:at]  # the weight offset plus one panel
    columns = {**knobs, "axis": "w", "mr": 8, "nw": 2, "icb": 64}
    assert conv2d.space(task, HOST).reason(columns) is None
    assert "llvm.prefetch" not in str(conv2d.build_ir(task, columns, HOST, 1))
