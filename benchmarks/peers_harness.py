"""One timing loop for every contender of a workload; runs in the peers venv (`.venv-peers`).

    peers_harness.py PLAN.json   → one JSON object on stdout

PLAN names the workload, its inputs (`inputs.npz`: x0, x1, ... and `ref`, the float64 numpy
reference of the output) and the contenders: `tunaflow` (a shared library exporting
`tf_main(void **args)`, with its packed arguments, output last, in an `.npz`), `tvm` (a library
exported by TVM), `numpy` and `onnxruntime` (the same op as a small ONNX model). Each output is
checked against `ref` first; then all contenders take turns for `rounds` rounds and each keeps its
fastest round (best of N, interleaved). A contender that fails is reported with its error.
Imports nothing from tunaflow: only numpy, threadpoolctl, onnx, onnxruntime and (for `tvm`) tvm.
"""

from __future__ import annotations

import ctypes
import json
import math
import sys
import time
import traceback
from collections.abc import Callable
from importlib import metadata

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

TOLERANCE = 1e-4  # max |got - ref| / max |ref|


def rel_error(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(got.astype(np.float64) - ref).max() / max(float(np.abs(ref).max()), 1e-30))


def numpy_fn(w: dict, xs: list[np.ndarray]) -> Callable[[], np.ndarray]:
    """numpy (BLAS) computing the workload, epilogue as extra passes; conv2d as im2col + one matmul."""
    if w["kind"] == "matmul":
        a, b, *rest = xs

        def run() -> np.ndarray:
            y = a @ b
            if w["bias"]:
                y += rest[0]
            return np.maximum(y, 0, out=y) if w["relu"] else y
        return run
    x, wt, *rest = xs
    cout, cin, kh, kw = wt.shape
    s, p = w["stride"], w["pad"]
    wmat = wt.reshape(cout, cin * kh * kw)
    bias = rest[0].reshape(cout, 1) if w["bias"] else None

    def run_conv() -> np.ndarray:
        xp = np.pad(x[0], ((0, 0), (p, p), (p, p)))
        win = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(1, 2))[:, ::s, ::s]
        oh, ow = win.shape[1], win.shape[2]
        cols = np.ascontiguousarray(win.transpose(0, 3, 4, 1, 2)).reshape(cin * kh * kw, oh * ow)
        y = wmat @ cols
        if bias is not None:
            y += bias
        if w["relu"]:
            np.maximum(y, 0, out=y)
        return y.reshape(1, cout, oh, ow)
    return run_conv


def onnx_model(w: dict, xs: list[np.ndarray]) -> bytes:
    """The workload as a small ONNX model: the activation is the input, weights are initializers."""
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(xs[1], "W")]
    if w["kind"] == "matmul":
        nodes = [helper.make_node("MatMul", ["X", "W"], ["Y0"])]
        if w["bias"]:
            inits.append(numpy_helper.from_array(xs[2], "B"))
            nodes.append(helper.make_node("Add", ["Y0", "B"], ["Y1"]))
    else:
        conv_in = ["X", "W"]
        if w["bias"]:
            inits.append(numpy_helper.from_array(xs[2], "B"))
            conv_in.append("B")
        p, s = w["pad"], w["stride"]
        nodes = [helper.make_node("Conv", conv_in, ["Y1"], pads=[p] * 4, strides=[s, s])]
    last = nodes[-1].output[0]
    if w["relu"]:
        nodes.append(helper.make_node("Relu", [last], ["Y"]))
    else:
        nodes[-1].output[0] = "Y"
    graph = helper.make_graph(nodes, w["name"], [helper.make_tensor_value_info("X", TensorProto.FLOAT, xs[0].shape)],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def onnxruntime_fn(w: dict, xs: list[np.ndarray], threads: int) -> Callable[[], np.ndarray]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(onnx_model(w, xs), opts, providers=["CPUExecutionProvider"])
    feeds = {"X": xs[0]}
    return lambda: sess.run(None, feeds)[0]


def tunaflow_fn(c: dict) -> Callable[[], np.ndarray]:
    lib = ctypes.CDLL(c["lib"])
    main = lib.tf_main
    main.argtypes, main.restype = [ctypes.c_void_p], None
    with np.load(c["args"]) as z:
        args = [np.ascontiguousarray(z[f"a{i}"]) for i in range(len(z.files))]
    ptrs = (ctypes.c_void_p * len(args))(*[a.ctypes.data for a in args])
    out = args[-1]

    def run() -> np.ndarray:
        main(ptrs)
        return out
    run.keep = (lib, args, ptrs)  # the library and buffers live as long as the callable
    return run


def tvm_fn(c: dict, xs: list[np.ndarray], out_shape: tuple[int, ...]) -> Callable[[], np.ndarray]:
    import tvm

    lib = tvm.runtime.load_module(c["lib"])
    f = lib[c.get("func", "main")]
    make = getattr(tvm.runtime, "tensor", None) or tvm.nd.array
    args = [make(x) for x in xs] + [make(np.zeros(out_shape, dtype=np.float32))]

    def run() -> np.ndarray:
        f(*args)
        return args[-1]
    run.keep = (lib, f)
    run.fetch = lambda: args[-1].numpy()
    return run


def contender(c: dict, w: dict, xs: list[np.ndarray], ref: np.ndarray, threads: int) -> Callable[[], object]:
    kind = c["kind"]
    if kind == "tunaflow":
        return tunaflow_fn(c)
    if kind == "tvm":
        return tvm_fn(c, xs, ref.shape)
    if kind == "numpy":
        return numpy_fn(w, xs)
    if kind == "onnxruntime":
        return onnxruntime_fn(w, xs, threads)
    raise ValueError(f"unknown contender kind {kind!r}")


def output_of(fn: Callable[[], object]) -> np.ndarray:
    got = fn()
    fetch = getattr(fn, "fetch", None)
    return fetch() if fetch else np.asarray(got)


def calibrate(fn: Callable[[], object], min_round_s: float) -> int:
    """Calls per round so that a round lasts about `min_round_s` (estimated over >= 1/10 of that)."""
    fn()
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        dt = time.perf_counter() - t0
        if dt >= min_round_s / 10:
            return max(1, math.ceil(min_round_s * n / dt))
        n *= 2


def run_plan(plan: dict) -> dict:
    w, threads = plan["workload"], plan["threads"]
    with np.load(plan["inputs"]) as z:
        xs = [z[f"x{i}"] for i in range(sum(1 for k in z.files if k.startswith("x")))]
        ref = z["ref"]
    results: dict[str, dict] = {}
    ready: dict[str, tuple[Callable[[], object], int]] = {}
    with threadpool_limits(limits=threads):
        for c in plan["contenders"]:
            try:
                fn = contender(c, w, xs, ref, threads)
                err = rel_error(output_of(fn), ref)
                results[c["name"]] = {"kind": c["kind"], "rel_err": err}
                if err > TOLERANCE:
                    results[c["name"]]["error"] = f"wrong output: max relative error {err:.2e} > {TOLERANCE:g}"
                    continue
                ready[c["name"]] = (fn, calibrate(fn, plan["min_round_s"]))
            except Exception as exc:  # a peer that fails is reported, never dropped
                results[c["name"]] = {"kind": c["kind"], "error": f"{type(exc).__name__}: {exc}",
                                      "trace": traceback.format_exc(limit=4)[-1500:]}
        best = {name: math.inf for name in ready}
        for _ in range(plan["rounds"]):
            for name, (fn, number) in ready.items():
                t0 = time.perf_counter()
                for _ in range(number):
                    fn()
                best[name] = min(best[name], (time.perf_counter() - t0) / number)
    for name, s in best.items():
        results[name].update(best_s=s, gflops=plan["flops"] / s / 1e9, calls_per_round=ready[name][1])
    return {"results": results, "versions": versions(), "blas": blas_kernel(), "rounds": plan["rounds"]}


def versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0]}
    for pkg in ("numpy", "onnxruntime", "onnx", "apache-tvm", "apache-tvm-ffi", "threadpoolctl"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def blas_kernel() -> str:
    infos = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    return ", ".join(f"{i['internal_api']} {i.get('version', '')} {i.get('architecture', '?')}" for i in infos) \
        or "unknown"


if __name__ == "__main__":
    with open(sys.argv[1]) as fh:
        print(json.dumps(run_plan(json.load(fh))))
