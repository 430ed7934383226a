"""float32 3x3 stride-1 conv2d (NCHW, OIHW, one group) by Winograd F(m x m, 3 x 3), fused epilogue.

An alternative implementation of a `conv2d` task, as TVM keeps several per op: task extraction
adds a `conv2d_winograd` twin for every conv this template can serve, both are tuned, and the
build runs whichever measured faster. F(4x4) does 36 multiplies per 16 outputs and channel pair
where the direct kernel does 144, at the price of input/output transforms and a rounding error
about 7 times the direct kernel's (64 channels: 1.6e-4 vs 2.3e-5 on outputs up to 28; inside the
float32 check of every measurement). With no record of either, the default build runs this template's
default where it measured faster (`stages.graph.twins.winograd_default_wins`). See `winograd_kernel` for the loop nest.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir

from schemas.config import Config
from schemas.target import Target
from schemas.task import TuningTask
from stages.codegen.harness import add_harness
from stages.graph.twins import WINOGRAD, winograd_twin
from stages.templates.conv2d import make_inputs, reference
from stages.templates.conv2d import task_from_cli as conv2d_from_cli
from stages.templates.conv2d_shape import geom
from stages.templates.space import ConfigSpace, Knob, Knobs, first_valid
from stages.templates.winograd_kernel import MAX_LANES, G, WinoPlan, build

NAME = WINOGRAD
VERSION = 5  # 2: an output narrower than 16 columns computes only its own tiles; 3: F(4x4) transforms
# share sums; 4: knob `pack`; 5: pack=item items are whole row blocks

M = (2, 4)  # output tile edge
RT = (1, 2, 3, 4)  # tile rows per work item
NK = (1, 2, 4)  # output-channel vectors per GEMM block
CU = (1, 2, 4)  # input channels per unrolled GEMM step
PACK = ("phase", "item")  # X packed for the whole image first, or by each work item for itself

CLI_OPTIONS = ("input", "weight", "pad", "epilogue")


def task_from_cli(opts: dict) -> TuningTask:
    """`tune-op conv2d_winograd --input 1x16x32x32 --weight 16x16x3x3 --pad 1 --epilogue bias,relu`."""
    return winograd_twin(conv2d_from_cli({**opts, "stride": 1, "dilation": 1, "groups": 1}))


def plan(task: TuningTask, knobs: Knobs, target: Target) -> WinoPlan:
    return WinoPlan(geom(task), target.vector_lanes, int(knobs["m"]), int(knobs["rt"]), int(knobs["nk"]),
                    int(knobs["cu"]), str(knobs["pack"]))


def space(task: TuningTask, target: Target) -> ConfigSpace:
    g = geom(task)

    def rule(c: Knobs) -> str | None:
        p = plan(task, c, target)
        if target.vector_lanes % p.m or MAX_LANES % target.vector_lanes:
            return f"m={p.m} and {MAX_LANES} floats must be multiples of the target's {target.vector_lanes} lanes"
        if p.accumulators + p.nk + 1 > target.vector_registers:
            return f"{p.tiles} tiles x {p.nk} channel vectors need {p.accumulators + p.nk + 1} vector registers"
        if p.kb % p.nk:
            return f"nk={p.nk} does not divide the {p.kb} output-channel vectors"
        if g.c % p.cu:
            return f"cu={p.cu} does not divide the {g.c} input channels"
        if (p.rt - 1) * p.m >= g.oh:
            return f"rt={p.rt} tile rows of {p.m} overshoot the output height {g.oh}"
        return None

    return ConfigSpace(knobs=(Knob("m", M), Knob("rt", RT), Knob("nk", NK), Knob("cu", CU), Knob("pack", PACK)),
                       rule=rule)


def default_config(task: TuningTask, target: Target) -> Config:
    """F(4x4), two tile rows (one when the output has only one), then as many channel vectors as keep
    16 accumulators: on 16 lanes 8-16 accumulators measured fastest (16x32x32: 21 us; 4 rows, 25). The
    first of these the space's rule accepts."""
    shapes = [{"m": m, "rt": rt, "nk": nk, "cu": 1, "pack": "phase"}
              for m in (4, 2) for rt in (2, 1) for nk in (4, 2, 1)]
    candidates = [knobs for knobs in shapes if plan(task, knobs, target).accumulators <= 16]
    return first_valid(space(task, target), candidates, f"{task.description} on {target.name}")


def transform_weights(w: np.ndarray, m: int) -> np.ndarray:
    """OIHW 3x3 → `U[xi][C][Kp]` = G g G^T (float64, then float32), output channels zero-padded to
    `MAX_LANES` (whatever the target's lanes, so the packing needs no target)."""
    k, c = w.shape[:2]
    g = np.asarray(G[m], dtype=np.float64)
    u = np.einsum("ir,kcrs,js->ijck", g, w.astype(np.float64), g)
    out = np.zeros((g.shape[0] ** 2, c, -(-k // MAX_LANES) * MAX_LANES), dtype=np.float32)
    out[:, :, :k] = u.reshape(-1, c, k)
    return out


def kernel_args(task: TuningTask, knobs: Knobs, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """`[X, U, *epilogue tensors, (workspace), Y]`; a workspace sized for `MAX_LANES` fits any target's lanes."""
    p = WinoPlan(geom(task), MAX_LANES, int(knobs["m"]), int(knobs["rt"]), int(knobs["nk"]), int(knobs["cu"]),
                 str(knobs["pack"]))
    x, w, *epi = inputs
    ws = [np.zeros(p.workspace, dtype=np.float32)] if p.workspace else []
    return [np.ascontiguousarray(x), transform_weights(w, p.m), *(np.ascontiguousarray(e) for e in epi), *ws,
            np.zeros(task.outputs[0].shape, dtype=np.float32)]


def build_ir(task: TuningTask, knobs: Knobs, target: Target, threads: int = 1) -> ir.Module:
    mod = ir.Module(name=f"conv2d_winograd_{task.signature}")
    mod.triple = target.triple
    add_harness(mod, build(mod, plan(task, knobs, target), task.epilogue, threads))
    return mod


__all__ = ["CLI_OPTIONS", "NAME", "VERSION", "build_ir", "default_config", "kernel_args", "make_inputs",
           "reference", "space", "task_from_cli", "transform_weights"]
