"""The FP32-peak probe the models benchmark bounds its ratios with."""

import numpy as np

from benchmarks.peak import CHAINS, fp32_peak_gflops, peak_module
from schemas import Target
from stages.codegen.compile import compile_ir
from stages.codegen.jit import LoadedKernel


def test_peak_kernel_computes_its_chains_and_reports_a_possible_rate():
    target = Target.host()
    kernel = LoadedKernel(compile_ir(peak_module(target, 2), target).data, target)
    out = np.zeros(2 * target.vector_lanes, dtype=np.float32)
    kernel([out])
    # Every chain x -> 0.999 x + 0.001 reaches its fixed point 1 long before a million steps.
    np.testing.assert_allclose(out, CHAINS, rtol=1e-4)
    gflops = fp32_peak_gflops(target, 1, repeats=2)
    # Two FMAs (4 FLOPs) per lane and cycle at 6 GHz is more than any core does.
    assert 1.0 < gflops < 4 * target.vector_lanes * 6.0
