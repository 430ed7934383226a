"""`tunaflow tasks MODEL.onnx`: the tuning tasks a model brings, after fusion."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from tunaflow.console import fail, out
from tunaflow.limits import DEFAULT_TENSOR_MB, MaxConstantOpt, MaxTensorOpt, import_limits


def tasks(
    model: Annotated[Path, typer.Argument(help="ONNX model file")],
    input_shape: Annotated[list[str] | None, typer.Option(
        "--input-shape", help="bind a dynamic input: NAME=1x3x224x224, or one symbolic dim: SYMBOL=8 (repeatable)")]
    = None,
    json_out: Annotated[bool, typer.Option("--json", help="print the tasks as JSON lines, for scripts")] = False,
    max_constant_mb: MaxConstantOpt = None,
    max_tensor_mb: MaxTensorOpt = DEFAULT_TENSOR_MB,
) -> None:
    """List the tuning tasks of a model: op, shapes, fused epilogue, occurrences, FLOPs.

    Example: tunaflow tasks data/models/cnn.onnx
    """
    from schemas.errors import ModelError
    from stages.extract import parse_input_shapes
    from stages.graph.tasks import extract_tasks, untuned_ops
    from stages.pipeline.model import load_graph

    if not model.is_file():
        raise fail(f"no model file {model}")
    try:
        graph = load_graph(model, parse_input_shapes(input_shape), import_limits(max_constant_mb, max_tensor_mb))
    except ModelError as exc:
        raise fail(str(exc)) from exc
    found = extract_tasks(graph)
    if json_out:
        for e in found:
            print(json.dumps({"signature": e.task.signature, "op": e.task.op, "description": e.task.description,
                              "weight": e.weight, "flops": e.flops, "nodes": list(e.nodes),
                              "alternative_to": e.alternative_to,
                              "task": e.task.model_dump(mode="json")}))
        return
    own = [e for e in found if e.alternative_to is None]
    twins = f" ({len(found) - len(own)} alternative implementations, marked ↳)" if len(found) > len(own) else ""
    table = Table(title=f"{escape(graph.name)}: {len(found)} tasks from {sum(e.weight for e in own)} anchor ops{twins}")
    for col, justify in (("#", "right"), ("op", "left"), ("input", "left"), ("weight", "left"), ("output", "left"),
                         ("epilogue", "left"), ("count", "right"), ("MFLOP", "right")):
        table.add_column(col, justify=justify)
    for i, e in enumerate(found):
        t = e.task
        x, w, y = ("x".join(map(str, s.shape)) for s in (t.inputs[0], t.inputs[1], t.outputs[0]))
        epi = ",".join(op.kind + "".join(f":{v:g}" for v in op.attrs.values()) for op in t.epilogue)
        op = t.op if e.alternative_to is None else "↳ " + t.op.split("_", 1)[-1]
        table.add_row(str(i), escape(op), x, w, y, escape(epi or "-"), str(e.weight), f"{e.flops / 1e6:.2f}")
    out.print(table)
    total = sum(e.flops * e.weight for e in own)
    rest = ", ".join(f"{op} x{n}" for op, n in sorted(untuned_ops(graph).items()))
    out.print(f"total {total / 1e6:.1f} MFLOPs in tuned ops; not tuned (memory-bound): {escape(rest or 'none')}")
