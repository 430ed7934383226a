"""Activation fusion on EfficientNet-B0-like blocks: per-op time with the written-out activations fused
(`optimize`) and left as separate ops (the same passes without `rewrite_activations`, what tunaflow did
before), default schedules, both libraries profiled in alternating rounds.

Blocks: a conv followed by SiLU as exported (x * Sigmoid(x)), and MBConv's depthwise conv + SiLU +
squeeze-and-excitation (GlobalAveragePool -> 1x1 conv -> SiLU -> 1x1 conv -> Sigmoid -> Mul) + the 1x1
projection conv, at B0's shapes. The SE's per-channel Mul by a run-time scale stays a memory pass in
both; its share of the block is printed. Last, what moving that scale onto the projection's weights
would save: the Mul (C x H x W values) against a Mul of the Cout x C weights plus the bias then added
separately (Cout x H x W values), with the projection as a batch_matmul of run-time operands.

    flock /tmp/bench.lock .venv/bin/python benchmarks/fusions.py [--threads 1] [--rounds 7]
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from schemas import Target  # noqa: E402
from stages.build.library import build_library  # noqa: E402
from stages.extract import load_model  # noqa: E402
from stages.graph.ir import Graph  # noqa: E402
from stages.graph.passes import eliminate_dead, fold_batchnorm, optimize  # noqa: E402
from stages.graph.passes_fuse import fuse  # noqa: E402
from stages.graph.passes_norm import rewrite_layernorm  # noqa: E402
from stages.runtime import load  # noqa: E402

RNG = np.random.default_rng(0)
# (channels, H = W, squeeze channels, projection channels) of B0's MBConv blocks with SE after the depthwise conv
SE_BLOCKS = [(96, 56, 4, 24), (144, 56, 6, 24), (240, 28, 10, 40), (480, 14, 20, 80), (672, 14, 28, 112),
             (1152, 7, 48, 192)]
# (in, out, kernel, stride, H = W of the input, groups) of convs followed by SiLU
CONV_SILU = [(3, 32, 3, 2, 224, 1), (16, 96, 1, 1, 112, 1), (24, 144, 1, 1, 56, 1), (144, 144, 3, 1, 56, 144),
             (80, 480, 1, 1, 14, 1)]


def _w(name: str, shape) -> onnx.TensorProto:
    return numpy_helper.from_array((RNG.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32),
                                   name)


def _silu(x: str, y: str) -> list:
    return [helper.make_node("Sigmoid", [x], [x + "_s"]), helper.make_node("Mul", [x, x + "_s"], [y])]


def _model(nodes, inits, x_shape, path: Path) -> Path:
    g = helper.make_graph(nodes, "b", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


def conv_silu(cin: int, cout: int, k: int, s: int, h: int, groups: int, path: Path) -> tuple[Path, tuple]:
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[k // 2] * 4, strides=[s, s], group=groups),
             *_silu("c", "y")]
    return _model(nodes, [_w("w", (cout, cin // groups, k, k)), _w("b", (cout,))], (1, cin, h, h), path), \
        (1, cin, h, h)


def se_block(c: int, h: int, sq: int, cout: int, path: Path) -> tuple[Path, tuple]:
    nodes = [helper.make_node("Conv", ["x", "wd", "bd"], ["d"], pads=[1] * 4, group=c), *_silu("d", "a"),
             helper.make_node("GlobalAveragePool", ["a"], ["p"]),
             helper.make_node("Conv", ["p", "w1", "b1"], ["q"]), *_silu("q", "r"),
             helper.make_node("Conv", ["r", "w2", "b2"], ["t"]), helper.make_node("Sigmoid", ["t"], ["g"]),
             helper.make_node("Mul", ["a", "g"], ["m"]), helper.make_node("Conv", ["m", "wp", "bp"], ["y"])]
    inits = [_w("wd", (c, 1, 3, 3)), _w("bd", (c,)), _w("w1", (sq, c, 1, 1)), _w("b1", (sq,)),
             _w("w2", (c, sq, 1, 1)), _w("b2", (c,)), _w("wp", (cout, c, 1, 1)), _w("bp", (cout,))]
    return _model(nodes, inits, (1, c, h, h), path), (1, c, h, h)


def se_projection(c: int, h: int, cout: int, path: Path, scale_weights: bool, seed: int) -> Path:
    """The SE's Mul(a, g) then the 1x1 projection conv, or (`scale_weights`) the projection as
    MatMul(W * g, a as C x HW) + bias, the scale applied to the Cout x C weights instead."""
    ins = [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, c, h, h]),
           helper.make_tensor_value_info("g", TensorProto.FLOAT, [1, c, 1, 1])]
    rng = np.random.default_rng(seed)
    w, b = (numpy_helper.from_array((rng.standard_normal(s) / np.sqrt(c)).astype(np.float32), n)
            for n, s in (("w", (cout, c, 1, 1)), ("b", (cout,))))
    if not scale_weights:
        nodes, inits = [helper.make_node("Mul", ["a", "g"], ["m"]), helper.make_node("Conv", ["m", "w", "b"], ["y"])], \
            [w, b]
    else:
        shapes = {"s1": [1, c], "s2": [c, h * h], "s3": [1, cout, h, h]}
        nodes = [helper.make_node("Reshape", ["g", "s1"], ["g2"]), helper.make_node("Mul", ["w", "g2"], ["ws"]),
                 helper.make_node("Reshape", ["a", "s2"], ["a2"]), helper.make_node("MatMul", ["ws", "a2"], ["mm"]),
                 helper.make_node("Add", ["mm", "b"], ["yb"]), helper.make_node("Reshape", ["yb", "s3"], ["y"])]
        inits = [numpy_helper.from_array(numpy_helper.to_array(w).reshape(cout, c), "w"),
                 numpy_helper.from_array(numpy_helper.to_array(b).reshape(cout, 1), "b"),
                 *(numpy_helper.from_array(np.array(v, np.int64), k) for k, v in shapes.items())]
    g = helper.make_graph(nodes, "p", ins, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


def unfused(graph: Graph) -> Graph:
    """`optimize` without the activation rewrites: x * Sigmoid(x) stays a Sigmoid and a Mul."""
    g = copy.deepcopy(graph, memo={id(a): a for a in graph.constants.values()})
    for p in (fold_batchnorm, rewrite_layernorm, fuse, eliminate_dead):
        p(g)
    return g


def _label(op) -> str:
    """`conv2d+bias+swish` for an anchor (its task without shapes), the op type for a generated op."""
    if op.task is None:
        return op.op
    name, _, rest = op.task.partition("(")
    return name + "".join("+" + e for e in rest.split(")", 1)[1].split("+")[1:])


def profile_pair(graphs: dict[str, Graph], feeds: dict[str, np.ndarray], target: Target, threads: int,
                 rounds: int, work: Path) -> dict[str, list[tuple[str, float]]]:
    """Build each graph, check they agree, profile them in alternating rounds: per op (label, median us)."""
    models = {}
    for name, g in graphs.items():
        build_library(g, target, work / name, threads=threads)
        models[name] = load(work / name)
    outs = [m.run(**feeds)["y"] for m in models.values()]
    assert all(np.abs(o - outs[0]).max() <= 1e-4 * np.abs(outs[0]).max() for o in outs)
    runs: dict[str, list] = {name: [] for name in models}
    for _ in range(rounds):
        for name, m in models.items():
            runs[name].append(m.profile(50, **feeds))
    out = {}
    for name, rs in runs.items():
        secs = np.median(np.array([[s for _, s in r] for r in rs]), axis=0) * 1e6
        out[name] = [(_label(op), float(t)) for (op, _), t in zip(rs[0], secs, strict=True)]
    return out


def _row(ops: list[tuple[str, float]]) -> str:
    return ", ".join(f"{k} {t:.1f}" for k, t in ops)


def before_after(path: Path, x_shape: tuple, target: Target, threads: int, rounds: int, work: Path):
    graph = load_model(path)
    r = profile_pair({"before": unfused(graph), "after": optimize(graph)},
                     {"x": RNG.standard_normal(x_shape).astype(np.float32)}, target, threads, rounds, work)
    return r, sum(t for _, t in r["before"]), sum(t for _, t in r["after"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    target = Target.host()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        print(f"threads {args.threads}, {args.rounds} alternating rounds of 50 profiled calls; medians in us")
        for i, spec in enumerate(CONV_SILU):
            (d := work / f"cs{i}").mkdir()
            r, b, a = before_after(*conv_silu(*spec, d / "m.onnx"), target, args.threads, args.rounds, d)
            print(f"conv {spec[0]}->{spec[1]} k{spec[2]} s{spec[3]} {spec[4]}x{spec[4]} g{spec[5]} + SiLU: "
                  f"before {b:.1f} ({_row(r['before'])}); after {a:.1f} ({_row(r['after'])}); {b / a:.2f}x")
        for i, (c, h, sq, cout) in enumerate(SE_BLOCKS):
            (d := work / f"se{i}").mkdir()
            r, b, a = before_after(*se_block(c, h, sq, cout, d / "m.onnx"), target, args.threads, args.rounds, d)
            mul = next(t for k, t in r["after"] if k == "Mul")
            print(f"MBConv dw+SE+project {c}x{h}x{h} (squeeze {sq}, project {cout}): before {b:.1f}, after {a:.1f} "
                  f"({b / a:.2f}x); after: {_row(r['after'])}; SE Mul {mul:.1f} = {100 * mul / a:.1f}% of the block")
        print("SE Mul + projection, vs the scale on the projection's weights (MatMul(W * g) + bias Add); the final "
              "Reshape is a copy into the graph output only here")
        for i, (c, h, _, cout) in enumerate(SE_BLOCKS):
            (d := work / f"sp{i}").mkdir()
            graphs = {name: optimize(load_model(se_projection(c, h, cout, d / f"{name}.onnx", name == "weights", i)))
                      for name in ("mul", "weights")}
            feeds = {"a": RNG.standard_normal((1, c, h, h)).astype(np.float32),
                     "g": RNG.random((1, c, 1, 1)).astype(np.float32)}
            r = profile_pair(graphs, feeds, target, args.threads, args.rounds, d)
            saved = next(t for k, t in r["mul"] if k == "Mul")
            extra = sum(t for k, t in r["weights"] if k in ("Mul", "Add"))
            print(f"{c}x{h}x{h} -> {cout}: Mul {saved:.1f} ({c * h * h} values) vs weight Mul + bias Add {extra:.1f} "
                  f"({cout * c} + {cout * h * h} values): {saved - extra:+.1f} us; kernels: conv2d "
                  f"{next(t for k, t in r['mul'] if k.startswith('conv2d')):.1f}, batch_matmul "
                  f"{next(t for k, t in r['weights'] if k.startswith('batch_matmul')):.1f}")


if __name__ == "__main__":
    main()
