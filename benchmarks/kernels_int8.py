"""int8 kernels (issue 26): tunaflow's qconv2d / qdense against onnxruntime's QLinearConv / QLinearMatMul
on single-node models of the same shape, and against tunaflow's own float32 template, same run.

Per shape (ResNet-50's 1x1 and 3x3 layers, BERT-base's 128x768 -> 3072 dense): the int8 default
schedule, a short tuning session (the real loop, `--trials` trials, cost-model tuner, in a temporary
log) and its chosen config, onnxruntime (1 intra-op thread, sequential, all graph optimisations),
and the float32 template's default; all timed interleaved in rounds (medians of rounds, each a
median of batches), 1 thread. Every tunaflow kernel's output is checked against the reference first.

    flock /tmp/bench.lock .venv/bin/python benchmarks/kernels_int8.py [--trials 32] [--rounds 5] [--cases all]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernel_bench import time_kernel  # noqa: E402

from schemas.options import MeasureOptions, TuningOptions  # noqa: E402
from schemas.target import Target  # noqa: E402
from schemas.task import TuningTask  # noqa: E402
from stages.codegen.compile import compile_ir  # noqa: E402
from stages.codegen.jit import LoadedKernel  # noqa: E402
from stages.log import TuningLog  # noqa: E402
from stages.templates import conv2d, dense, qconv2d, qdense, template_for  # noqa: E402
from stages.tune.loop import tune_task  # noqa: E402

BATCH_S = 0.005
ROUND_S = 0.6
X_SCALE, Y_SCALE = 0.02, 0.05

# name -> (input NCHW, weight OIHW, stride, pad) for convs, or (M, N, K) for dense
CASES: dict[str, tuple] = {
    "r50 1x1 64->256 @56": ((1, 64, 56, 56), (256, 64, 1, 1), 1, 0),
    "r50 1x1 256->64 @56": ((1, 256, 56, 56), (64, 256, 1, 1), 1, 0),
    "r50 3x3 64 @56": ((1, 64, 56, 56), (64, 64, 3, 3), 1, 1),
    "r50 3x3 128 s2 @56": ((1, 128, 56, 56), (128, 128, 3, 3), 2, 1),
    "r50 3x3 256 @14": ((1, 256, 14, 14), (256, 256, 3, 3), 1, 1),
    "r50 3x3 512 @7": ((1, 512, 7, 7), (512, 512, 3, 3), 1, 1),
    "r50 1x1 1024->2048 s2 @14": ((1, 1024, 14, 14), (2048, 1024, 1, 1), 2, 0),
    "bert dense 128x3072x768": (128, 3072, 768),
}


def tasks(case: tuple) -> tuple[TuningTask, TuningTask]:
    """(the int8 task, its float32 twin), with onnxruntime's usual activation zero point."""
    if len(case) == 3:
        m, n, k = case
        return qdense.task(m, n, k, x_zero_point=128, y_zero_point=128), dense.task(m, n, k)
    x, w, s, p = case
    q = qconv2d.task(x, w, (s, s), (p,) * 4, x_zero_point=128, y_zero_point=128)
    return q, conv2d.conv2d_task(x, w, (s, s), (p,) * 4)


def ort_session(task: TuningTask, inputs: list[np.ndarray]) -> tuple[ort.InferenceSession, dict]:
    """A one-node QLinearConv / QLinearMatMul model computing the same int8 product (per-channel weight
    scales for the conv, as onnxruntime's quantizer writes them; per-tensor for the matmul, which has
    no bias input)."""
    x, w, bias, scale = inputs
    zx, zy = task.attrs["x_zero_point"], task.attrs["y_zero_point"]
    w_scale = (scale * Y_SCALE / X_SCALE).astype(np.float32)

    def const(name: str, v: np.ndarray) -> onnx.TensorProto:
        return numpy_helper.from_array(np.asarray(v), name)

    inits = [const("xs", np.float32(X_SCALE)), const("xz", np.uint8(zx)), const("ys", np.float32(Y_SCALE)),
             const("yz", np.uint8(zy))]
    if task.op == "qconv2d":
        a = task.attrs
        inits += [const("w", w), const("ws", w_scale), const("wz", np.zeros(w.shape[0], np.int8)), const("b", bias)]
        node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y"],
                                strides=list(a["strides"]), pads=[a["pads"][0], a["pads"][1], a["pads"][2],
                                                                  a["pads"][3]],
                                dilations=list(a["dilations"]), group=int(a["group"]))
    else:
        inits += [const("w", np.ascontiguousarray(w.T)), const("ws", np.float32(w_scale.mean())),
                  const("wz", np.int8(0))]
        node = helper.make_node("QLinearMatMul", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y"])
    graph = helper.make_graph([node], "q", [helper.make_tensor_value_info("x", TensorProto.UINT8, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess, {"x": x}


def loaded(task: TuningTask, knobs: dict, target: Target) -> tuple[LoadedKernel, list[np.ndarray]]:
    tpl = template_for(task)
    inputs = tpl.make_inputs(task, seed=0)
    args = tpl.kernel_args(task, knobs, inputs)
    kernel = LoadedKernel(compile_ir(tpl.build_ir(task, knobs, target, 1), target).data, target)
    kernel(args)
    ref = tpl.reference(task, inputs)
    ok = np.array_equal(args[-1], ref) if task.op in ("qdense", "qconv2d") else \
        np.allclose(args[-1], ref, rtol=1e-3, atol=1e-3 * max(1.0, float(np.abs(ref).max())))
    if not ok:
        raise SystemExit(f"{task.description} with {knobs}: output differs from the reference")
    return kernel, args


def ort_time(sess: ort.InferenceSession, feed: dict, seconds: float) -> float:
    sess.run(None, feed)
    start = time.perf_counter()
    sess.run(None, feed)
    one = max(time.perf_counter() - start, 1e-7)
    number = max(1, int(BATCH_S / one))
    samples = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(samples) < 3:
        start = time.perf_counter()
        for _ in range(number):
            sess.run(None, feed)
        samples.append((time.perf_counter() - start) / number)
    return statistics.median(samples)


def tuned_knobs(task: TuningTask, target: Target, trials: int, log_dir: Path) -> dict:
    options = TuningOptions(n_trials=trials, batch_size=8, top_k_remeasure=3, measure=MeasureOptions(threads=1))
    summary = tune_task(task, target, options, TuningLog(log_dir))
    if summary.best is None:
        raise SystemExit(f"{task.description}: no successful trial in {trials}")
    return dict(summary.best.config.knobs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cases", default="all", help=f"comma list of case indices 0-{len(CASES) - 1}, or all")
    opts = ap.parse_args()
    names = list(CASES) if opts.cases == "all" else [list(CASES)[int(i)] for i in opts.cases.split(",")]
    target = Target.host()
    rows = []
    with tempfile.TemporaryDirectory(prefix="kernels-int8-") as tmp:
        for idx, name in enumerate(names):
            q, f = tasks(CASES[name])
            default = dict(template_for(q).default_config(q, target).knobs)
            tuned = tuned_knobs(q, target, opts.trials, Path(tmp) / f"log{idx}")
            runs = {"default": loaded(q, default, target), "tuned": loaded(q, tuned, target),
                    "fp32": loaded(f, dict(template_for(f).default_config(f, target).knobs), target)}
            sess, feed = ort_session(q, template_for(q).make_inputs(q, seed=0))
            times: dict[str, list[float]] = {k: [] for k in (*runs, "ort")}
            for _ in range(opts.rounds):  # interleaved: every contender once per round
                for key, (kernel, args) in runs.items():
                    times[key].append(time_kernel(kernel, args, ROUND_S / 4, BATCH_S))
                times["ort"].append(ort_time(sess, feed, ROUND_S / 4))
            gops = {k: q.flops / statistics.median(v) / 1e9 for k, v in times.items()}
            rows.append((name, gops, tuned))
            print(f"{name}: " + "  ".join(f"{k} {v:.0f}" for k, v in gops.items()), file=sys.stderr, flush=True)
    print(f"\nint8 kernels, 1 thread, GOPS (2 ops per multiply-add), medians of {opts.rounds} interleaved rounds; "
          f"tuned = {opts.trials} trials; {target.cpu}")
    print("| shape | int8 default | int8 tuned | onnxruntime int8 | tuned / ort | fp32 default (GFLOPS) | "
          "tuned / fp32 | tuned schedule |")
    print("|---|---|---|---|---|---|---|---|")
    for name, g, tuned in rows:
        knobs = " ".join(f"{k}={v}" for k, v in tuned.items())
        print(f"| {name} | {g['default']:.0f} | {g['tuned']:.0f} | {g['ort']:.0f} | {g['tuned'] / g['ort']:.2f}x | "
              f"{g['fp32']:.0f} | {g['tuned'] / g['fp32']:.2f}x | {knobs} |")
    ratios = [g["tuned"] / g["ort"] for _, g, _ in rows]
    print(f"\ngeometric mean tuned / onnxruntime: {float(np.exp(np.mean(np.log(ratios)))):.2f}x")


if __name__ == "__main__":
    main()
