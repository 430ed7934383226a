"""The ONNX backend test cases, built into libraries and compared with their expected outputs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from schemas.target import Target
from stages.build.library import BuildError, build_library
from stages.graph.passes import optimize
from stages.runtime import load
from stages.templates import TEMPLATES
from testing.backend_cases import BackendCase

RTOL, ATOL = 1e-3, 1e-4


@dataclass(frozen=True)
class CaseResult:
    case: str
    status: str  # "pass", "mismatch", "error", "no-template"
    detail: str = ""


def check_case(case: BackendCase, target: Target, workdir: Path) -> CaseResult:
    """Import, optimise, build and run one case; compare every output (rtol 1e-3, atol 1e-4, NaN == NaN)."""
    graph = optimize(case.graph())
    missing = sorted({n.task.op for n in graph.nodes if n.task is not None} - set(TEMPLATES))
    if missing:
        return CaseResult(case.id, "no-template", f"no template for {missing}")
    try:
        build_library(graph, target, workdir)
    except BuildError as exc:
        return CaseResult(case.id, "error", str(exc))
    got = load(workdir).run(**case.inputs)
    for name, want in case.outputs.items():
        if not np.allclose(got[name], want, rtol=RTOL, atol=ATOL, equal_nan=True):
            err = float(np.nanmax(np.abs(got[name].astype(np.float64) - want)))
            return CaseResult(case.id, "mismatch", f"output {name!r}: max abs error {err:.3g}")
    return CaseResult(case.id, "pass")
