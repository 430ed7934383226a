"""The int8 dot-product instruction paths and which of them a target can run.

Every path reads the same operands: 4-byte groups of consecutive reduction elements, one i32 lane
each (u8 activations, s8 weights), and accumulates exact int32 sums of the 4 products per lane:

- `vnni512`: `vpdpbusd` on 16 lanes (AVX-512 VNNI);
- `vnni256`: `vpdpbusd` on 8 lanes (AVX-VNNI, or AVX-512 VNNI with VL);
- `avx2`: no VNNI. `vpmaddubsw` would add two u8 x s8 products in a saturating int16 (255 x -128
  twice overflows), so the bytes are widened to int16 and `vpmaddwd` adds pairs into int32: an
  accumulator is two vectors of pair sums, folded into one at the end;
- `generic`: plain LLVM integer vectors (widen to i32, multiply, add the 4 products), for any target;
- `amx`: Intel AMX tiles (`tdpbusd` on 16 x 64-byte tiles, `qgemm_amx`) for whole 64-byte chunks of the
  reduction, `vnni512` for the rest and the epilogue, so it needs both.
"""

from __future__ import annotations

from llvmlite import ir

from schemas.target import Target
from stages.codegen.irb import I32, intrinsic

ISAS = ("vnni512", "vnni256", "avx2", "generic")  # the vector paths; the GEMM adds `amx` (`gemm_paths`)
LANES = {"amx": 16, "vnni512": 16, "vnni256": 8, "avx2": 8, "generic": 4}
PARTS = {"amx": 1, "vnni512": 1, "vnni256": 1, "avx2": 2, "generic": 1}  # vectors per accumulator
I8, I16 = ir.IntType(8), ir.IntType(16)

# CPUs (LLVM names) that have the feature when a target string names only the CPU.
_IMPLIED = {
    "avx512vnni": {"cascadelake", "cooperlake", "icelake-client", "icelake-server", "tigerlake", "rocketlake",
                   "sapphirerapids", "emeraldrapids", "graniterapids", "znver4", "znver5"},
    "avxvnni": {"alderlake", "raptorlake", "meteorlake", "arrowlake", "lunarlake", "sierraforest", "grandridge",
                "sapphirerapids", "emeraldrapids", "graniterapids", "znver5"},
    "avx2": {"haswell", "broadwell", "skylake", "skylake-avx512", "cascadelake", "cooperlake", "icelake-client",
             "icelake-server", "tigerlake", "rocketlake", "alderlake", "raptorlake", "meteorlake", "sapphirerapids",
             "emeraldrapids", "graniterapids", "znver1", "znver2", "znver3", "znver4", "znver5", "x86-64-v3",
             "x86-64-v4"},
}
_IMPLIED["amx-int8"] = _IMPLIED["amx-tile"] = {"sapphirerapids", "emeraldrapids", "graniterapids", "graniterapids-d",
                                              "diamondrapids"}
_IMPLIED["avx512vl"] = _IMPLIED["avx512vnni"] | {"skylake-avx512", "x86-64-v4"}
_IMPLIED["avx512vbmi"] = (_IMPLIED["avx512vnni"] - {"cascadelake", "cooperlake"}) | {"cannonlake"}


def _has(target: Target, feature: str) -> bool:
    feats = set(target.features.split(","))
    if f"-{feature}" in feats:
        return False
    return f"+{feature}" in feats or target.cpu in _IMPLIED.get(feature, set())


def available(target: Target) -> tuple[str, ...]:
    """The paths `target` runs, fastest first (`generic` always)."""
    if not target.triple.startswith(("x86_64", "i686", "i386")):
        return ("generic",)
    out = []
    if target.vector_bits == 512 and _has(target, "avx512vnni"):
        out.append("vnni512")
    if _has(target, "avxvnni") or (_has(target, "avx512vnni") and _has(target, "avx512vl")):
        out.append("vnni256")
    if _has(target, "avx2"):
        out.append("avx2")
    return (*out, "generic")


def gemm_paths(target: Target) -> tuple[str, ...]:
    """The GEMM's paths on `target`: `amx` first where it has AMX-INT8 tiles and the `vnni512` path they
    hand over to, then the vector paths."""
    vector = available(target)
    amx = "vnni512" in vector and _has(target, "amx-int8") and _has(target, "amx-tile")
    return ("amx", *vector) if amx else vector


def registers(isa: str, target: Target) -> int:
    """Vector registers the path's accumulators, operands and temporaries share."""
    return 32 if target.vector_bits == 512 and isa != "generic" else 16


def ivec(lanes: int, bits: int = 32) -> ir.VectorType:
    return ir.VectorType(ir.IntType(bits), lanes)


def zero_acc(isa: str) -> list[ir.Value]:
    return [ir.Constant(ivec(LANES[isa]), None)] * PARTS[isa]


def vector_isa(isa: str) -> str:
    """The vector path an ISA's sums, tails and epilogue run on (`amx` tiles hand over to `vnni512`)."""
    return "vnni512" if isa == "amx" else isa


def dot4(b: ir.IRBuilder, isa: str, acc: list[ir.Value], u8: ir.Value, s8: ir.Value) -> list[ir.Value]:
    """`acc` + per-lane sum of the 4 products of `u8` (unsigned bytes) and `s8` (signed), both `<lanes x i32>`."""
    lanes = LANES[isa]
    ty = ivec(lanes)
    if isa in ("vnni512", "vnni256"):
        fn = intrinsic(b.module, f"llvm.x86.avx512.vpdpbusd.{lanes * 32}", ty, [ty, ty, ty])
        return [b.call(fn, [acc[0], u8, s8])]
    wide = ir.VectorType(I16 if isa == "avx2" else I32, 4 * lanes)
    ua = b.zext(b.bitcast(u8, ir.VectorType(I8, 4 * lanes)), wide)
    sa = b.sext(b.bitcast(s8, ir.VectorType(I8, 4 * lanes)), wide)
    if isa == "avx2":
        half = ir.VectorType(I16, 16)
        fn = intrinsic(b.module, "llvm.x86.avx2.pmadd.wd", ty, [half, half])
        out = []
        for part in range(2):
            idx = ir.Constant(ivec(16), list(range(16 * part, 16 * part + 16)))
            lo, hi = b.shuffle_vector(ua, ua, idx), b.shuffle_vector(sa, sa, idx)
            out.append(b.add(acc[part], b.call(fn, [lo, hi])))
        return out
    prod = b.mul(ua, sa)
    total = acc[0]
    for q in range(4):
        total = b.add(total, b.shuffle_vector(prod, prod, ir.Constant(ivec(lanes), [4 * lane + q
                                                                                     for lane in range(lanes)])))
    return [total]


def finish(b: ir.IRBuilder, isa: str, acc: list[ir.Value]) -> ir.Value:
    """One `<lanes x i32>` of sums from an accumulator (the avx2 path's pair sums folded)."""
    if PARTS[isa] == 1:
        return acc[0]
    lanes = LANES[isa]
    even = ir.Constant(ivec(lanes), [2 * lane for lane in range(lanes)])
    odd = ir.Constant(ivec(lanes), [2 * lane + 1 for lane in range(lanes)])
    return b.add(b.shuffle_vector(acc[0], acc[1], even), b.shuffle_vector(acc[0], acc[1], odd))


def splat_i32(b: ir.IRBuilder, x: ir.Value, lanes: int) -> ir.Value:
    v = b.insert_element(ir.Constant(ivec(lanes), ir.Undefined), x, ir.Constant(I32, 0))
    return b.shuffle_vector(v, ir.Constant(ivec(lanes), ir.Undefined), ir.Constant(ivec(lanes), None))


def byte_permute(target: Target) -> bool:
    """Whether `target` runs AVX-512 VBMI's byte permutes on 64 lanes (`vpermi2b`: a 128-byte table per
    instruction), which the int8 table lookups use."""
    return target.triple.startswith("x86_64") and target.vector_bits == 512 and _has(target, "avx512vbmi")
