"""Tune one workload with Apache TVM MetaSchedule from scratch and export its best as a shared library.

    peers_tvm.py WORKLOAD.json TRIALS TARGET.json WORK_DIR OUT.so [BUILD_TIMEOUT_S]   → a PEERS_RESULT line

Runs in the peers venv (never in the project's): the caller sets TVM_NUM_THREADS. MetaSchedule
is looked up where the installed TVM keeps it (`tvm.s_tir.meta_schedule` in 0.27, `tvm.meta_schedule`
before). `tune_tir` runs with its defaults (xgb cost model, evolutionary search, 64 trials per round);
only the LocalBuilder's timeout (30 s) can be raised, for a loaded machine.
"""

from __future__ import annotations

import importlib
import json
import math
import sys
import time


def meta_schedule():
    for name in ("tvm.s_tir.meta_schedule", "tvm.meta_schedule"):
        try:
            return importlib.import_module(name), name
        except ImportError:
            continue
    raise ImportError("this TVM has no MetaSchedule (neither tvm.s_tir.meta_schedule nor tvm.meta_schedule)")


def prim_func(w: dict):
    """The workload in TE, with the same inputs (and layouts) the other contenders get, output last."""
    from tvm import te, topi

    if w["kind"] == "matmul":
        a = te.placeholder((w["m"], w["k"]), name="A")
        b = te.placeholder((w["k"], w["n"]), name="B")
        r = te.reduce_axis((0, w["k"]), name="r")
        y = te.compute((w["m"], w["n"]), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
        args = [a, b]
        bias_at = lambda t, i, j: t[j]  # noqa: E731
    else:
        a = te.placeholder(tuple(w["x"]), name="X")
        b = te.placeholder(tuple(w["w"]), name="W")
        y = topi.nn.conv2d_nchw(a, b, w["stride"], w["pad"], 1)
        args = [a, b]
        bias_at = lambda t, n, c, h, x: t[c]  # noqa: E731
    if w["bias"]:
        bias = te.placeholder((y.shape[1],), name="bias")
        args.append(bias)
        prev = y
        y = te.compute(prev.shape, lambda *i: prev(*i) + bias_at(bias, *i), name="biased")
    if w["relu"]:
        prev = y
        y = te.compute(prev.shape, lambda *i: te.max(prev(*i), te.const(0, "float32")), name="relu")
    return te.create_prim_func([*args, y]).with_attr("global_symbol", "main")


def tune(w: dict, trials: int, target_json: dict, work_dir: str, out: str, build_timeout: float | None) -> dict:
    import tvm

    ms, ms_name = meta_schedule()
    target = tvm.target.Target(target_json)
    mod = tvm.IRModule({"main": prim_func(w)})
    start = time.perf_counter()
    builder = ms.builder.LocalBuilder(timeout_sec=build_timeout) if build_timeout else "local"
    database = ms.tune_tir(mod, target, work_dir, max_trials_global=trials, builder=builder)
    sch = ms.tir_integration.compile_tir(database, mod, target)
    tune_s = time.perf_counter() - start
    if sch is None:
        raise RuntimeError("MetaSchedule found no valid schedule")
    build = getattr(tvm, "compile", None) or tvm.build
    build(sch.mod, target=target).export_library(out)
    records = database.get_all_tuning_records()
    costs = [sum(x.value for x in r.run_secs) / len(r.run_secs) if r.run_secs else math.inf for r in records]
    ok = [c for c in costs if 0 < c < 1e9]
    return {"wall_s": tune_s, "trials": len(records), "failed": len(records) - len(ok),
            "tuning_best_s": min(ok) if ok else None, "meta_schedule": ms_name, "tvm": tvm.__version__,
            "target": str(target), "build_timeout_s": build_timeout or 30.0}


if __name__ == "__main__":
    workload, n, target_file, work, lib = sys.argv[1:6]
    timeout = float(sys.argv[6]) if len(sys.argv) > 6 else None
    with open(workload) as fh, open(target_file) as tf:
        result = tune(json.load(fh), int(n), json.load(tf), work, lib, timeout)
    print("PEERS_RESULT " + json.dumps(result))
