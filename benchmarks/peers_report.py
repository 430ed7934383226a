"""Pure helpers of benchmarks/peers.py: workload specs for the peers, goal verdicts, Markdown tables."""

from __future__ import annotations

import math

# Goals of issue 8: tunaflow/TVM GFLOPS >= 1 at every budget; tunaflow/numpy >= 1 at 256 trials;
# tunaflow/TVM tuning wall time <= 0.25; tunaflow/onnxruntime end-to-end latency <= 1.
GOAL_VS_TVM, GOAL_VS_NUMPY, GOAL_WALL, GOAL_E2E = 1.0, 1.0, 0.25, 1.0
NUMPY_GOAL_BUDGET = 256


def peer_spec(name: str, op: str, opts: dict) -> dict:
    """The workload as the peers' scripts take it (plain JSON, no tunaflow types). Only the epilogues
    every peer builds (`bias`, then `relu`) are accepted, so all contenders compute the same thing."""
    epi = [e for e in str(opts.get("epilogue") or "").split(",") if e]
    if epi not in ([], ["bias"], ["relu"], ["bias", "relu"]):
        raise ValueError(f"{name}: epilogue {epi} not supported by the peers (use bias, relu or bias,relu)")
    spec: dict = {"name": name, "kind": op, "bias": "bias" in epi, "relu": "relu" in epi}
    if op == "matmul":
        spec.update(m=int(opts["m"]), n=int(opts["n"]), k=int(opts["k"]))
    elif op == "conv2d":
        x = [int(d) for d in str(opts["input"]).lower().split("x")]
        w = [int(d) for d in str(opts["weight"]).lower().split("x")]
        if len(x) != 4 or len(w) != 4 or x[0] != 1 or x[1] != w[1]:
            raise ValueError(f"{name}: conv2d peers take NCHW batch-1 input and OIHW weight, groups 1: {x}, {w}")
        spec.update(x=x, w=w, stride=int(opts.get("stride") or 1), pad=int(opts.get("pad") or 0))
    else:
        raise ValueError(f"{name}: no peer workload for op {op!r}")
    return spec


def verdict(ratio: float | None, goal: float, higher_is_better: bool) -> str:
    """'met (1.12x, goal >= 1.0x)' or 'missed by 23% (0.77x, goal >= 1.0x)'; a missing figure is a miss."""
    sign = ">=" if higher_is_better else "<="
    if ratio is None or not math.isfinite(ratio):
        return f"not measured (goal {sign} {goal:g}x)"
    met = ratio >= goal if higher_is_better else ratio <= goal
    if met:
        return f"met ({ratio:.2f}x, goal {sign} {goal:g}x)"
    by = (goal - ratio) / goal if higher_is_better else (ratio - goal) / goal
    return f"missed by {by:.0%} ({ratio:.2f}x, goal {sign} {goal:g}x)"


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0 or not (math.isfinite(a) and math.isfinite(b)):
        return None
    return a / b


def fmt(v: float | None, digits: int = 1) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v:.{digits}f}"


def gflops_of(harness: dict, name: str) -> float | None:
    r = harness.get("results", {}).get(name, {})
    return r.get("gflops")


def op_rows(workload: str, budgets: list[int], tuned: dict, harness: dict) -> list[list[str]]:
    """Table rows per budget: tunaflow and TVM best GFLOPS (re-measured), references, wall times, trials/s."""
    numpy_g, ort_g = gflops_of(harness, "numpy"), gflops_of(harness, "onnxruntime")
    rows = []
    for b in budgets:
        tf, tv = tuned.get(("tunaflow", b), {}), tuned.get(("tvm", b), {})
        tf_g, tv_g = gflops_of(harness, f"tunaflow@{b}"), gflops_of(harness, f"tvm@{b}")
        rows.append([workload, str(b), fmt(tf_g), fmt(tv_g), fmt(numpy_g), fmt(ort_g),
                     fmt(ratio(tf_g, tv_g), 2), fmt(ratio(tf_g, numpy_g), 2),
                     fmt(tf.get("wall_s"), 0), fmt(tv.get("wall_s"), 0),
                     fmt(ratio(tf.get("wall_s"), tv.get("wall_s")), 2),
                     f"{trials_per_s(tf)} / {trials_per_s(tv)}"])
    return rows


def trials_per_s(t: dict) -> str:
    if not t.get("trials") or not t.get("wall_s"):
        return "-"
    return f"{t['trials'] / t['wall_s']:.2f}"


def goal_lines(workload: str, budgets: list[int], tuned: dict, harness: dict) -> list[str]:
    out = []
    numpy_g = gflops_of(harness, "numpy")
    for b in budgets:
        tf_g, tv_g = gflops_of(harness, f"tunaflow@{b}"), gflops_of(harness, f"tvm@{b}")
        wall = ratio(tuned.get(("tunaflow", b), {}).get("wall_s"), tuned.get(("tvm", b), {}).get("wall_s"))
        out.append(f"- {workload} @ {b}: GFLOPS vs TVM {verdict(ratio(tf_g, tv_g), GOAL_VS_TVM, True)}; "
                   f"tuning wall time vs TVM {verdict(wall, GOAL_WALL, False)}")
        if b == NUMPY_GOAL_BUDGET:
            out.append(f"- {workload} @ {b}: GFLOPS vs numpy {verdict(ratio(tf_g, numpy_g), GOAL_VS_NUMPY, True)}")
    return out


def markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]
