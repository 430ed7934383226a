"""Allocation bombs: ONNX models of a few hundred bytes whose import would fold (or whose build would
allocate) tens of GiB, and a child-process importer that runs one under an address-space limit.

Each constant bomb ends in ReduceSum (or feeds the graph) so its constant is needed, and the graph
is y = x + that: a valid model, not one that fails for another reason. Used by
tests/test_import_bounds.py and benchmarks/attacks/imports.py.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

N = 100_000  # [N, N] float32 is 37 GiB
ROOT = Path(__file__).resolve().parents[2]


def _wrap(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], x_shape: tuple[int, ...] = (1, 4),
          y_shape: tuple[int, ...] = (1, 4)) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "bomb", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _model(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto]) -> onnx.ModelProto:
    """x -> Add(x, ReduceSum(bomb)) -> y around the bomb's nodes, whose last output is `bomb`."""
    tail = [helper.make_node("ReduceSum", ["bomb"], ["total"], keepdims=0),
            helper.make_node("Add", ["x", "total"], ["y"])]
    return _wrap([*nodes, *tail], inits)


def _ints(name: str, values) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, np.int64), name)


def _floats(name: str, values) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, np.float32), name)


def constant_of_shape(n: int = N) -> onnx.ModelProto:
    return _model([helper.make_node("ConstantOfShape", ["s"], ["bomb"])], [_ints("s", [n, n])])


def range_(n: int = N) -> onnx.ModelProto:
    return _model([helper.make_node("Range", ["a", "b", "d"], ["i"]), helper.make_node("Cast", ["i"], ["bomb"], to=1)],
                  [_ints("a", 0), _ints("b", n * n), _ints("d", 1)])


def expand(n: int = N) -> onnx.ModelProto:
    return _model([helper.make_node("Expand", ["one", "s"], ["e"]), helper.make_node("Neg", ["e"], ["bomb"])],
                  [_floats("one", [1.0]), _ints("s", [n, n])])


def tile(n: int = N) -> onnx.ModelProto:
    return _model([helper.make_node("Tile", ["one", "r"], ["bomb"])], [_floats("one", [[1.0]]), _ints("r", [n, n])])


def pad(n: int = N) -> onnx.ModelProto:
    return _model([helper.make_node("Pad", ["one", "p"], ["bomb"])], [_floats("one", [1.0]), _ints("p", [0, n * n])])


def gather(n: int = N) -> onnx.ModelProto:
    """A [1, n] row gathered n times: both inputs are small ConstantOfShape results, the output is [n, n]."""
    zeros = helper.make_tensor("z", TensorProto.INT64, [1], [0])
    return _model([helper.make_node("ConstantOfShape", ["rs"], ["row"]),
                   helper.make_node("ConstantOfShape", ["is"], ["idx"], value=zeros),
                   helper.make_node("Gather", ["row", "idx"], ["bomb"], axis=0)],
                  [_ints("rs", [1, n]), _ints("is", [n])])


def broadcast(n: int = N) -> onnx.ModelProto:
    """A column [n, 1] plus a row [1, n] of constants."""
    return _model([helper.make_node("Range", ["a", "b", "d"], ["v"]),
                   helper.make_node("Reshape", ["v", "cs"], ["col"]), helper.make_node("Reshape", ["v", "rs"], ["row"]),
                   helper.make_node("Add", ["col", "row"], ["bomb"])],
                  [_floats("a", 0.0), _floats("b", float(n)), _floats("d", 1.0), _ints("cs", [n, 1]),
                   _ints("rs", [1, n])])


def concat(doublings: int = 34) -> onnx.ModelProto:
    """One float doubled by Concat with itself 34 times: 2**34 floats (64 GiB)."""
    nodes = [helper.make_node("Concat", [f"c{i}", f"c{i}"], [f"c{i + 1}" if i + 1 < doublings else "bomb"], axis=0)
             for i in range(doublings)]
    return _model(nodes, [_floats("c0", [1.0])])


def pool(n: int = N) -> onnx.ModelProto:
    """MaxPool of a constant 1x1 image with n pixels of padding and a stride of n: a 2x2 output, but the
    reference pads the input to (n + 1) x (n + 1) first."""
    return _model([helper.make_node("MaxPool", ["img"], ["bomb"], kernel_shape=[1, 1], pads=[0, 0, n, n],
                                    strides=[n, n])], [_floats("img", [[[[1.0]]]])])


def declared_input(n: int = N) -> onnx.ModelProto:
    """No constant at all: a declared 1x3x100000x100000 input (112 GiB of float32)."""
    return _wrap([helper.make_node("Relu", ["x"], ["y"])], [], (1, 3, n, n), (1, 3, n, n))


def runtime_tile(n: int = N) -> onnx.ModelProto:
    """A small input tiled at run time into a [n, n] intermediate: shape inference alone sees it."""
    return _wrap([helper.make_node("Tile", ["x", "r"], ["t"]), helper.make_node("ReduceSum", ["t"], ["y"], keepdims=1)],
                 [_ints("r", [n, n // 4])], y_shape=(1, 1))


CONSTANT_BOMBS: dict[str, Callable[[], onnx.ModelProto]] = {
    "ConstantOfShape": constant_of_shape, "Range": range_, "Expand": expand, "Tile": tile, "Pad": pad,
    "Gather": gather, "Add (broadcast)": broadcast, "Concat (doubling)": concat, "MaxPool (padding)": pool,
}
TENSOR_BOMBS: dict[str, Callable[[], onnx.ModelProto]] = {
    "declared input": declared_input, "run-time Tile": runtime_tile,
}

# The peak is this process's own VmHWM: ru_maxrss survives execve, so it would report the parent's size.
_CHILD = """
import json, sys
from stages.extract import ModelError, load_model
def peak_rss():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
kwargs = json.loads(sys.argv[1])
for path in sys.argv[2:]:
    try:
        load_model(path, **kwargs)
        outcome, message = "ok", ""
    except ModelError as exc:
        outcome, message = "ModelError", str(exc)
    except MemoryError as exc:
        outcome, message = "MemoryError", str(exc)
    print(json.dumps({"outcome": outcome, "message": message, "peak_rss": peak_rss()}), flush=True)
"""


def import_in_child(paths: list[Path], limit_bytes: int = 2 * 2**30, timeout_s: float = 120.0,
                    **kwargs) -> list[dict]:
    """Import each of `paths` with load_model(**kwargs), in order, in one fresh process whose address space is
    capped at `limit_bytes` (a regression fails with MemoryError instead of swapping).

    One dict per path: outcome ('ok', 'ModelError', 'MemoryError', or 'died: ...' for this path and the rest
    when the child dies), the error message, and the child's peak RSS in bytes so far (a peak only grows, so
    each is an upper bound of that import's own)."""
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(kwargs), *map(str, paths)], capture_output=True,
                          text=True, timeout=timeout_s, preexec_fn=cap, env=env, cwd=ROOT)
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    tail = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1][:200]
    died = {"outcome": f"died: {tail}", "message": proc.stderr[-2000:], "peak_rss": None}
    return results + [died] * (len(paths) - len(results))
