"""conv2d kernels vs onnxruntime on ResNet and MobileNet layers, 1 and 2 threads, same run.

For every layer: onnxruntime runs a one-node model (Conv with the same fused epilogue, as ONNX
ops after the Conv, which onnxruntime fuses) on the same thread count; tunaflow runs its default
schedule and the best of a random sweep of the schedule space (each candidate checked against
the numpy reference, then timed natively), winners re-measured interleaved with onnxruntime.
Writes the `kernels:conv` section of benchmarks/RESULTS.md.

    flock /tmp/bench.lock .venv/bin/python benchmarks/kernels_conv.py [--configs 150] [--layers r56,dw]
"""

from __future__ import annotations

import multiprocessing as mp
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernel_bench import Candidate, chosen, command_line, schedule_cell, sweep_parser, time_kernel  # noqa: E402
from results import markdown_table, publish  # noqa: E402

from schemas.target import Target  # noqa: E402
from schemas.task import TuningTask, parse_epilogue  # noqa: E402
from stages.codegen.compile import compile_ir  # noqa: E402
from stages.codegen.jit import LoadedKernel  # noqa: E402
from stages.measure.check import compare, reduction_size  # noqa: E402
from stages.runtime.quiet import settle  # noqa: E402
from stages.templates import conv2d  # noqa: E402

SECTION, TITLE = "kernels:conv", "conv2d vs onnxruntime (`benchmarks/kernels_conv.py`)"
BATCH_S = 0.01  # each timed batch of kernel calls lasts about this long

# name → (input NCHW, weight OIHW, stride, pads, group, epilogue)
LAYERS: dict[str, tuple] = {
    "resnet 56x56x64 3x3": ((1, 64, 56, 56), (64, 64, 3, 3), 1, 1, 1, "bias,relu"),
    "resnet 28x28x128 3x3": ((1, 128, 28, 28), (128, 128, 3, 3), 1, 1, 1, "bias,relu"),
    "resnet 14x14x256 1x1 to 1024 +residual": ((1, 256, 14, 14), (1024, 256, 1, 1), 1, 0, 1,
                                               "bias,residual_add,relu"),
    "resnet 56x56x128 3x3 stride 2": ((1, 128, 56, 56), (128, 128, 3, 3), 2, 1, 1, "bias,relu"),
    "resnet stem 224x224x3 7x7 stride 2": ((1, 3, 224, 224), (64, 3, 7, 7), 2, 3, 1, "bias,relu"),
    "mobilenet dw 112x112x32 3x3": ((1, 32, 112, 112), (32, 1, 3, 3), 1, 1, 32, "bias,clip:0:6"),
}


def layer_task(name: str) -> TuningTask:
    x, w, s, p, g, epi = LAYERS[name]
    return conv2d.conv2d_task(x, w, (s, s), (p, p, p, p), (1, 1), g, parse_epilogue(epi))


# ---- onnxruntime -------------------------------------------------------------------------------

def ort_session(task: TuningTask, inputs: list[np.ndarray], threads: int):
    """A one-node Conv model followed by the epilogue as ONNX ops (onnxruntime fuses them)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    a = task.attrs
    (pt, pl, pb, pr) = a["pads"]
    x, w, *epi = inputs
    inits = [numpy_helper.from_array(w, "W")]
    conv_inputs = ["X", "W"]
    nodes, feeds = [], {"X": x}
    cur = "Y0"
    slots = iter(epi)
    for i, op in enumerate(task.epilogue):
        out = f"Y{i + 1}"
        if op.kind == "bias" and i == 0:
            inits.append(numpy_helper.from_array(next(slots), "B"))
            conv_inputs.append("B")
            out = cur
        elif op.kind == "residual_add":
            feeds["R"] = next(slots)
            nodes.append(helper.make_node("Add", [cur, "R"], [out]))
        elif op.kind == "relu":
            nodes.append(helper.make_node("Relu", [cur], [out]))
        elif op.kind == "clip":
            inits += [numpy_helper.from_array(np.float32(op.attrs["min"]), f"lo{i}"),
                      numpy_helper.from_array(np.float32(op.attrs["max"]), f"hi{i}")]
            nodes.append(helper.make_node("Clip", [cur, f"lo{i}", f"hi{i}"], [out]))
        else:
            raise ValueError(f"benchmark has no ONNX form for epilogue {op.kind!r}")
        cur = out
    conv = helper.make_node("Conv", conv_inputs, ["Y0"], strides=list(a["strides"]), pads=[pt, pl, pb, pr],
                            dilations=list(a["dilations"]), group=int(a["group"]))
    out_shape = task.outputs[0].shape
    graph_inputs = [helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape) for k, v in feeds.items()]
    graph = helper.make_graph([conv, *nodes], "conv", graph_inputs,
                              [helper.make_tensor_value_info(cur, TensorProto.FLOAT, out_shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    binding = sess.io_binding()  # inputs and a preallocated output bound once: no copies per run
    for k, v in feeds.items():
        binding.bind_cpu_input(k, v)
    y = np.empty(out_shape, dtype=np.float32)
    binding.bind_output(cur, "cpu", 0, np.float32, list(out_shape), y.ctypes.data)
    return sess, (binding, y)


def time_ort(sess, bound: tuple, seconds: float = 0.25) -> float:
    """Median seconds per run over batches of runs filling `seconds`."""
    binding = bound[0]
    sess.run_with_iobinding(binding)
    start = time.perf_counter()
    sess.run_with_iobinding(binding)
    one = max(time.perf_counter() - start, 1e-6)
    number = max(1, int(0.02 / one))
    samples = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(samples) < 5:
        t0 = time.perf_counter()
        for _ in range(number):
            sess.run_with_iobinding(binding)
        samples.append((time.perf_counter() - t0) / number)
    return statistics.median(samples)


# ---- tunaflow ----------------------------------------------------------------------------------

def _compile(args: tuple) -> tuple[dict, bytes, float]:
    task, knobs, threads = args
    target = Target.host()
    obj = compile_ir(conv2d.build_ir(task, knobs, target, threads), target)
    return knobs, obj.data, obj.compile_s


def sweep(pool, task: TuningTask, threads: int, n_configs: int, seed: int) -> tuple[Candidate, list[Candidate]]:
    """The default schedule and `n_configs` random valid ones, compiled in parallel, checked, timed."""
    target = Target.host()
    sp = conv2d.space(task, target)
    rng = random.Random(seed)
    default = conv2d.default_config(task, target).knobs
    picked = {sp.index_of(default)}
    while len(picked) < n_configs + 1:
        i = rng.randrange(sp.size)
        if i not in picked and sp.is_valid(i):
            picked.add(i)
    configs = [default] + [sp.knobs_at(i) for i in sorted(picked - {sp.index_of(default)})]
    built = pool.map(_compile, [(task, k, threads) for k in configs], chunksize=4)
    inputs = conv2d.make_inputs(task)
    ref = conv2d.reference(task, inputs)
    cands = []
    for knobs, obj, cs in built:
        kernel = LoadedKernel(obj, target)
        args = conv2d.kernel_args(task, knobs, inputs)
        kernel(args)
        ok, err = compare(args[-1], ref, reduction_size(task))
        if not ok:
            raise AssertionError(f"{task.description} {knobs}: wrong answer (max abs error {err:.3g})")
        c = Candidate(knobs, obj, cs)
        c.cost = time_kernel(kernel, args, 0.03, BATCH_S)
        cands.append(c)
    return cands[0], sorted(cands, key=lambda c: c.cost)


def remeasure(task: TuningTask, cands: list[Candidate], sess, bound, rounds: int = 5) -> tuple[list[float], float]:
    """Median cost of each candidate and of onnxruntime, measured interleaved."""
    target = Target.host()
    inputs = conv2d.make_inputs(task)
    loaded = [(LoadedKernel(c.obj, target), conv2d.kernel_args(task, c.knobs, inputs)) for c in cands]
    costs: list[list[float]] = [[] for _ in cands]
    ort_costs = []
    for _ in range(rounds):
        for i, (k, a) in enumerate(loaded):
            costs[i].append(time_kernel(k, a, 0.05, BATCH_S))
        ort_costs.append(time_ort(sess, bound, 0.1))
        settle()  # onnxruntime's pool threads spin after a run: let them stop before our next kernel
    return [statistics.median(c) for c in costs], statistics.median(ort_costs)


def run_layer(pool, name: str, threads: int, n_configs: int, seed: int) -> dict:
    task = layer_task(name)
    default, ranked = sweep(pool, task, threads, n_configs, seed)
    finalists = [default] + [c for c in ranked if c is not default][:5]
    inputs = conv2d.make_inputs(task)
    sess, bound = ort_session(task, inputs, threads)
    sess.run_with_iobinding(bound[0])
    ok, err = compare(bound[1], conv2d.reference(task, inputs), reduction_size(task))
    if not ok:
        raise AssertionError(f"onnxruntime's model is not the same computation: max abs error {err:.3g}")
    costs, ort_cost = remeasure(task, finalists, sess, bound)
    best_i = min(range(1, len(finalists)), key=lambda i: costs[i])
    best_i = best_i if costs[best_i] < costs[0] else 0
    gf = task.flops / 1e9
    return {"layer": name, "threads": threads, "ort_ms": ort_cost * 1e3, "ort_gflops": gf / ort_cost,
            "default_gflops": gf / costs[0], "best_gflops": gf / costs[best_i],
            "default_ratio": ort_cost / costs[0], "best_ratio": ort_cost / costs[best_i],
            "best_knobs": finalists[best_i].knobs, "compile_s": [c.compile_s for c in ranked]}


def table(rows: list[dict], n_configs: int, command: str) -> str:
    """The section's body (RESULTS.md adds the markers and the title)."""
    import onnxruntime as ort

    compile_ms = statistics.median(s for r in rows for s in r["compile_s"]) * 1e3
    target = Target.host()
    lines = [
        f"`{command}` — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {target.cpu}, "
        f"onnxruntime {ort.__version__} (CPUExecutionProvider, one-node model: Conv + the same epilogue, "
        "graph optimisations on, same thread count). tunaflow: the default schedule, and the best of the "
        f"default plus {n_configs} random valid configs (each checked against numpy), the default and the 5 "
        "fastest re-measured interleaved with onnxruntime (medians of 5 rounds). Ratios > 1 mean faster than "
        "onnxruntime.",
        "",
        *markdown_table(
            ["layer", "threads", "onnxruntime ms", "onnxruntime GFLOPS", "default GFLOPS", "default / ort",
             "best GFLOPS", "best / ort", "best schedule"],
            [[r["layer"], r["threads"], f"{r['ort_ms']:.3f}", f"{r['ort_gflops']:.1f}", f"{r['default_gflops']:.1f}",
              f"{r['default_ratio']:.2f}x", f"{r['best_gflops']:.1f}", f"**{r['best_ratio']:.2f}x**",
              schedule_cell(r["best_knobs"])] for r in rows]),
    ]
    lines += ["", f"Median compile time per candidate (IR build + LLVM O1 + codegen, 2 compiles in parallel): "
              f"**{compile_ms:.0f} ms** over {sum(len(r['compile_s']) for r in rows)} candidates.", "",
              "Goals (issue 10):", *goals(rows, compile_ms)]
    return "\n".join(lines)


def goals(rows: list[dict], compile_ms: float) -> list[str]:
    def verdict(key: str, goal: float) -> str:
        worst = min(rows, key=lambda r: r[key])
        state = "met" if worst[key] >= goal else f"MISSED by {1 - worst[key] / goal:.0%}"
        return f"{state} (lowest {worst[key]:.2f}x: {worst['layer']}, {worst['threads']} thread(s))"

    return [f"- best config >= 1.0x onnxruntime on every layer: {verdict('best_ratio', 1.0)}",
            f"- default schedule >= 0.5x onnxruntime on every layer: {verdict('default_ratio', 0.5)}",
            f"- median compile time <= 150 ms: {'met' if compile_ms <= 150 else 'MISSED'} ({compile_ms:.0f} ms)"]


def main(argv: list[str] | None = None) -> list[dict]:
    args = sweep_parser(__doc__, "layer and thread count", "layers").parse_args(argv)
    names = chosen(list(LAYERS), args.layers)
    rows = []
    with mp.get_context("spawn").Pool(2) as pool:
        for name in names:
            for threads in (1, 2):
                r = run_layer(pool, name, threads, args.configs, args.seed + threads)
                print(f"{name} x{threads}: ort {r['ort_gflops']:.1f} GFLOPS, default {r['default_ratio']:.2f}x, "
                      f"best {r['best_ratio']:.2f}x {r['best_knobs']}", flush=True)
                rows.append(r)
    command = command_line("kernels_conv.py", args.configs, "layers", args.layers)
    publish(SECTION, TITLE, table(rows, args.configs, command), write=not args.no_write)
    return rows


if __name__ == "__main__":
    main()
