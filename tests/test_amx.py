"""The int8 anchors' AMX paths (`qgemm_amx`, `qconv2d_amx`): exact on a host with AMX tiles, chosen only where
a target has them."""

from __future__ import annotations

import ctypes
import mmap
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from schemas.target import Target, preset
from schemas.task import parse_epilogue
from stages.codegen.compile import assembly, compile_ir
from stages.codegen.jit import LoadedKernel
from stages.templates import qconv2d, qdense, qmatmul
from stages.templates.qgemm_isa import gemm_paths

HOST = Target.host()
EMR = Target.parse("llvm -mtriple=x86_64-unknown-linux-gnu -mcpu=emeraldrapids -name=emr")
ZEN5 = Target.parse("llvm -mtriple=x86_64-unknown-linux-gnu -mcpu=znver5 -name=zen5")
ROOT = Path(__file__).resolve().parent.parent
needs_amx = pytest.mark.skipif("amx" not in gemm_paths(HOST), reason="this host has no AMX-INT8 tiles")


def _run(mod, task, knobs: dict, inputs: list[np.ndarray], threads: int = 1) -> np.ndarray:
    args = mod.kernel_args(task, knobs, inputs)
    args[-1][...] = 0x5A
    LoadedKernel(compile_ir(mod.build_ir(task, knobs, HOST, threads=threads), HOST).data, HOST)(args)
    return args[-1]


def _before_a_guard_page(x: np.ndarray) -> np.ndarray:
    """A copy of `x` whose last byte is the last readable one: the next page faults on any access."""
    page = mmap.PAGESIZE
    pages = -(-x.nbytes // page) + 1
    buf = mmap.mmap(-1, pages * page)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    assert libc.mprotect(base + (pages - 1) * page, page, 0) == 0
    out = np.frombuffer(buf, dtype=x.dtype, count=x.size, offset=(pages - 1) * page - x.nbytes).reshape(x.shape)
    out[...] = x
    return out


@needs_amx
@pytest.mark.parametrize(("m", "n", "k", "mr", "nv", "uk", "threads", "epi"), [
    (16, 16, 64, 16, 1, 1, 1, ""),  # one tile, no edges
    (37, 45, 130, 16, 2, 2, 2, "relu"),  # last row tile overlaps, N edge, 2 bytes of K past the chunks
    (64, 100, 515, 32, 2, 1, 2, "clip:-20:90"),  # K % 64 = 3: vector tail with a partial group
    (129, 33, 67, 16, 3, 1, 1, ""),  # 3 tiles wide, one chunk
    (200, 80, 768, 32, 1, 4, 2, ""),  # unrolled chunk loop
])
def test_amx_is_exact_at_every_edge(m, n, k, mr, nv, uk, threads, epi):
    dense = qdense.task(m, n, k, parse_epilogue(epi), x_zero_point=131, y_zero_point=5)
    for mod, task in ((qdense, dense), (qmatmul, qmatmul.task(m, n, k))):
        knobs = {**mod.default_config(task, HOST).knobs, "isa": "amx", "mr": mr, "nv": nv, "uk": uk,
                 "mc": 2 if m >= 64 else 1, "nc": 2 if n >= 64 else 1, "par": "m" if m > 64 else "n"}
        assert mod.space(task, HOST).reason(knobs) is None
        inputs = mod.make_inputs(task, seed=m + n + k)
        inputs[0] = _before_a_guard_page(inputs[0])  # a tile reading rows past M would fault
        ref = mod.reference(task, inputs)
        assert len(np.unique(ref)) > 3
        np.testing.assert_array_equal(_run(mod, task, knobs, inputs, threads), ref)


@needs_amx
def test_a_fresh_process_gets_the_tile_permission_from_the_kernel():
    """Linux refuses tile instructions (SIGILL) until the process asks for tile data: the kernel asks itself."""
    code = ("import numpy as np\n"
            "from schemas.target import Target\n"
            "from stages.codegen.compile import compile_ir\n"
            "from stages.codegen.jit import LoadedKernel\n"
            "from stages.templates import qmatmul\n"
            "h = Target.host(); t = qmatmul.task(48, 40, 200); kn = qmatmul.default_config(t, h).knobs\n"
            "assert kn['isa'] == 'amx', kn\n"
            "x = qmatmul.make_inputs(t, 3); a = qmatmul.kernel_args(t, kn, x)\n"
            "LoadedKernel(compile_ir(qmatmul.build_ir(t, kn, h), h).data, h)(a)\n"
            "print(np.array_equal(a[-1], qmatmul.reference(t, x)))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "True"


def test_amx_only_where_the_target_has_it_and_the_shape_suits():
    assert gemm_paths(EMR)[:2] == ("amx", "vnni512")
    assert "amx" not in gemm_paths(ZEN5) and "amx" not in gemm_paths(preset("x86-64-avx2"))
    big = qmatmul.task(128, 768, 768)
    assert qmatmul.default_config(big, EMR).knobs["isa"] == "amx"
    assert qmatmul.default_config(big, ZEN5).knobs["isa"] == "vnni512"
    knobs = {**qmatmul.default_config(big, EMR).knobs}
    assert "not available on zen5" in qmatmul.space(big, ZEN5).reason(knobs)
    signed = qdense.task(64, 64, 128, x_dtype="int8")
    assert qdense.default_config(signed, EMR).knobs["isa"] == "vnni512"
    assert "uint8 activations" in qdense.space(signed, EMR).reason({**knobs, "mc": 1, "nc": 1})
    short = qmatmul.task(64, 64, 48)
    assert qmatmul.default_config(short, EMR).knobs["isa"] == "vnni512"
    assert "K >= 64" in qmatmul.space(short, EMR).reason({**knobs, "mc": 1, "nc": 1, "uk": 1})
    assert "16 or 32" in qmatmul.space(big, EMR).reason({**knobs, "mr": 8})
    assert "tile registers" in qmatmul.space(big, EMR).reason({**knobs, "mr": 32, "nv": 3})
    assert qmatmul.default_config(qmatmul.task(8, 64, 256), EMR).knobs["isa"] == "vnni512"  # M < 16


def test_amx_kernels_emit_the_tile_instructions_and_ask_for_permission():
    task = qmatmul.task(64, 64, 256)
    asm = assembly(qmatmul.build_ir(task, {**qmatmul.default_config(task, EMR).knobs, "mr": 32, "nv": 2}, EMR), EMR)
    assert asm.count("tdpbusd") >= 4 and "ldtilecfg" in asm and "tilerelease" in asm
    assert "tf_amx_request" in asm


@needs_amx
@pytest.mark.parametrize(("x", "w", "stride", "pad", "group", "x_dtype", "tiles"), [
    ((1, 64, 56, 56), (72, 64, 1, 1), 1, 0, 1, "uint8", ((16, 2), (32, 2))),  # flattened 1x1: one row
    ((1, 128, 14, 14), (40, 128, 3, 3), 1, 1, 1, "int8", ((32, 1), (16, 1))),  # 2 chunks, last oc tile short
    ((1, 96, 15, 17), (24, 96, 3, 3), 2, 1, 1, "uint8", ((16, 1),)),  # stride phases, a chunk half empty
    ((2, 64, 9, 9), (64, 32, 3, 3), 1, 1, 2, "uint8", ((16, 1), (32, 1))),  # groups of 32 channels, 2 images
])
def test_amx_conv_is_exact(x, w, stride, pad, group, x_dtype, tiles):
    task = qconv2d.task(x, w, (stride, stride), (pad,) * 4, group=group, ops=parse_epilogue("relu"),
                        x_dtype=x_dtype, x_zero_point=-7 if x_dtype == "int8" else 131, y_zero_point=3)
    inputs = qconv2d.make_inputs(task, seed=sum(x) + sum(w))
    ref = qconv2d.reference(task, inputs)
    assert len(np.unique(ref)) > 3
    for mr, nv in tiles:
        knobs = {**qconv2d.default_config(task, HOST).knobs, "isa": "amx", "axis": "w", "rh": 1, "mr": mr, "nv": nv,
                 "uk": 1}
        assert qconv2d.space(task, HOST).reason(knobs) is None
        args = qconv2d.kernel_args(task, knobs, inputs)
        args[-1][...] = 0x5A
        args[4] = _before_a_guard_page(args[4])  # the packed input: the last chunk's tiles must stay inside
        LoadedKernel(compile_ir(qconv2d.build_ir(task, knobs, HOST, threads=2), HOST).data, HOST)(args)
        np.testing.assert_array_equal(args[-1], ref, err_msg=f"mr={mr} nv={nv}")


def test_amx_conv_space():
    task = qconv2d.task((1, 64, 28, 28), (64, 64, 3, 3), pads=(1, 1, 1, 1))
    knobs = {**qconv2d.default_config(task, EMR).knobs, "isa": "amx", "axis": "w", "rh": 1, "mr": 16, "nv": 2, "uk": 1}
    sp = qconv2d.space(task, EMR)
    assert sp.reason(knobs) is None
    assert "not available on zen5" in qconv2d.space(task, ZEN5).reason(knobs)
    assert "rh must be 1" in sp.reason({**knobs, "rh": 2})
    assert "axis must be w" in sp.reason({**knobs, "axis": "oc"})
    assert "16 or 32" in sp.reason({**knobs, "mr": 8})
    assert qconv2d.default_config(task, EMR).knobs == {**knobs, "mr": 32}
    assert qconv2d.default_config(task, ZEN5).knobs["isa"] == "vnni512"
    depthwise = qconv2d.task((1, 64, 28, 28), (64, 1, 3, 3), pads=(1, 1, 1, 1), group=64)
    assert qconv2d.default_config(depthwise, EMR).knobs["axis"] == "dw"
    narrow = qconv2d.task((1, 16, 28, 28), (64, 16, 3, 3), pads=(1, 1, 1, 1))
    assert "idle" in qconv2d.space(narrow, EMR).reason(knobs)
    asm = assembly(qconv2d.build_ir(task, knobs, EMR), EMR)
    assert asm.count("tdpbsud") >= 9 * 2 and "ldtilecfg" in asm and "tf_amx_request" in asm
