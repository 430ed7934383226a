"""ONNX model → Graph with static shapes, constants folded, attributes normalised.

Order matters for the user: first every unsupported operator type is listed at once (nothing
else runs before that), then input shapes are bound (`name=1x3x224x224`, or a symbolic dim by
its name, `batch=1`), then nodes are walked once in order: a node whose inputs are all constants
is evaluated with the numpy reference and becomes a constant (this folds initializer arithmetic
and Shape/Gather/Concat/Unsqueeze/Reshape chains on shapes); every other node is normalised and
its output shapes inferred.

Memory is bounded before it is used (stages/extract/budget.py): each fold's result and scratch
shapes are computed first and must fit in the constant budget, and every run-time tensor (inputs
included) must fit in the per-tensor limit, so a tiny model cannot make the import, or the build
after it, allocate gigabytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from schemas.errors import ModelError, UnsupportedOpsError
from stages.extract.budget import DEFAULT_TENSOR_MB, Budget
from stages.extract.dtypes import RUNTIME_DTYPES, check_runtime, onnx_dtype, out_dtypes, stored
from stages.extract.external import read_model
from stages.extract.folding import FOLD_ONLY, scratch
from stages.extract.normalize import NORMALIZERS as FLOAT_NORMALIZERS
from stages.extract.normalize import Ctx
from stages.extract.normalize_einsum import EINSUM_NORMALIZERS
from stages.extract.normalize_index import INDEX_NORMALIZERS
from stages.extract.normalize_resize import RESIZE_NORMALIZERS
from stages.extract.quant import QUANT_NORMALIZERS, keep_unfolded
from stages.extract.shapes import SHAPES, infer
from stages.extract.text_fields import check_text_fields
from stages.extract.weights import has_data
from stages.graph.ir import Graph, Node, Value
from stages.graph.reference import OPS

MIN_OPSET = 6  # the issue asks for 9+; 6-8 differ only in legacy broadcasting, which we handle


# Ops answered from static shapes alone, whatever their input.
SHAPE_ONLY: dict[str, Callable[[dict, tuple[int, ...]], np.ndarray]] = {
    "Shape": lambda raw, shape: np.array(shape[raw.get("start", 0): raw.get("end", len(shape))], dtype=np.int64),
    "Size": lambda raw, shape: np.array(math.prod(shape), dtype=np.int64),
}
ALIASES = ("Identity", "Dropout")
NORMALIZERS = {**FLOAT_NORMALIZERS, **INDEX_NORMALIZERS, **RESIZE_NORMALIZERS, **EINSUM_NORMALIZERS,
               **QUANT_NORMALIZERS}
SUPPORTED = sorted({*NORMALIZERS, *FOLD_ONLY, *SHAPE_ONLY, *ALIASES})


def parse_input_shapes(items: list[str] | None) -> dict[str, tuple[int, ...]]:
    """`["x=1x3x224x224", "batch=1"]` → {"x": (1, 3, 224, 224), "batch": (1,)}."""
    bound = {}
    for item in items or []:
        name, sep, dims = item.partition("=")
        try:
            shape = tuple(int(d) for d in dims.lower().split("x"))
        except ValueError:
            shape = ()
        if not sep or not name or not shape or any(d <= 0 for d in shape):
            raise ModelError(f"--input-shape {item!r}: expected NAME=1x3x224x224 (or SYMBOL=8), positive dims")
        bound[name] = shape
    return bound


def load_model(model: str | Path | onnx.ModelProto, input_shapes: dict[str, tuple[int, ...]] | None = None,
               name: str | None = None, *, max_constant_mb: float | None = None,
               max_tensor_mb: float = DEFAULT_TENSOR_MB) -> Graph:
    """Import an ONNX model (path or proto) as a Graph with static shapes.

    `max_constant_mb` bounds what folding may compute (default: the larger of 256 MB and 4x the model's
    own tensors), `max_tensor_mb` every run-time tensor (float32); either is a ModelError before allocating."""
    proto = model if isinstance(model, onnx.ModelProto) else read_model(Path(model))
    check_text_fields(proto, "model" if isinstance(model, onnx.ModelProto) else str(model))
    graph_name = name or (Path(model).stem if not isinstance(model, onnx.ModelProto) else proto.graph.name)
    check_supported(proto)
    opset = _opset(proto)
    init_names = {t.name for t in proto.graph.initializer}
    consts = {t.name: _initializer(t) for t in proto.graph.initializer}
    budget = Budget.for_model(_own_bytes(proto, consts), max_constant_mb, max_tensor_mb)
    inputs = _bind_inputs([v for v in proto.graph.input if v.name not in init_names], input_shapes or {}, budget)
    used = {i for node in proto.graph.node for i in node.input} | {o.name for o in proto.graph.output}
    ctx = Ctx(opset=opset, op="", shapes={v.name: v.shape for v in inputs}, consts=consts, used=used,
              dtypes={v.name: v.dtype for v in inputs})
    for n, arr in consts.items():
        ctx.shapes[n] = arr.shape
    nodes: list[Node] = []
    alias: dict[str, str] = {}
    seen: set[str] = set()
    for index, onode in enumerate(proto.graph.node):
        node_name = onode.name if onode.name and onode.name not in seen else f"{onode.name or onode.op_type}_{index}"
        seen.add(node_name)
        ins = [alias.get(i, i) for i in onode.input]
        missing = [i for i in ins if i and i not in ctx.shapes]
        if missing:
            raise ModelError(f"{onode.op_type} {node_name!r} reads {missing}, which no earlier node produces")
        clash = [o for o in onode.output if o and (o in ctx.shapes or o in alias)]
        if clash:
            raise ModelError(f"{onode.op_type} {node_name!r} writes {clash}, which the model already defines")
        ctx.node, ctx.op = node_name, onode.op_type
        raw = {a.name: _attr(a, onode.op_type, node_name) for a in onode.attribute}
        try:
            _import_node(onode.op_type, node_name, ins, list(onode.output), raw, ctx, nodes, alias, budget)
        except ModelError:
            raise
        except (ArithmeticError, KeyError, IndexError, TypeError, ValueError) as exc:  # a malformed node, named
            why = f"missing attribute or input {exc}" if isinstance(exc, KeyError) else str(exc) or type(exc).__name__
            raise ModelError(f"{onode.op_type} {node_name!r} is malformed: {why}") from None
    outputs = _outputs(proto, alias, nodes, ctx)
    live = {i for node in nodes for i in node.inputs} | {v.name for v in outputs}
    values = {v.name: v for v in inputs}
    for node in nodes:
        for out in node.outputs:
            values[out] = Value(out, ctx.shapes[out], ctx.dtypes[out])
    # reshape: ascontiguousarray makes a 0-d constant 1-d; it stays 0-d
    constants = {k: np.ascontiguousarray(v, dtype=stored(v.dtype)).reshape(v.shape) for k, v in consts.items()
                 if k in live}
    for k, v in constants.items():
        values[k] = Value(k, v.shape, v.dtype.name)
    return Graph(name=graph_name, inputs=inputs, outputs=outputs, nodes=nodes, values=values, constants=constants)


def check_supported(proto: onnx.ModelProto) -> None:
    """Raise one UnsupportedOpsError naming every unsupported op type and its nodes."""
    bad: dict[str, list[str]] = {}
    for i, node in enumerate(proto.graph.node):
        op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
        if op not in SUPPORTED:
            bad.setdefault(op, []).append(node.name or f"{node.op_type}_{i}")
    if bad:
        raise UnsupportedOpsError(bad)


def _opset(proto: onnx.ModelProto) -> int:
    versions = [o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")]
    opset = versions[0] if versions else 1
    newest = onnx.defs.onnx_opset_version()
    if not MIN_OPSET <= opset <= newest:
        raise ModelError(f"the model uses opset {opset}; tunaflow imports opsets {MIN_OPSET} to {newest}")
    return opset


def _initializer(t: onnx.TensorProto) -> np.ndarray:
    if not has_data(t):
        raise ModelError(f"initializer {t.name!r} has no data: the model is weightless (shapes and statistics "
                         "only); give it weights first with stages.extract.weights.fill_weights")
    try:
        return numpy_helper.to_array(t)
    except (KeyError, TypeError, ValueError, OSError, RuntimeError, onnx.checker.ValidationError) as exc:
        raise ModelError(f"initializer {t.name!r} cannot be read: {exc}") from None


def _own_bytes(proto: onnx.ModelProto, consts: dict[str, np.ndarray]) -> int:
    """Bytes of the tensors the model carries (initializers, Constant nodes), what the default budget scales with.

    Constant nodes count by their serialised size: their declared dims could claim any size."""
    stored = sum(a.t.ByteSize() for n in proto.graph.node if n.op_type == "Constant" for a in n.attribute
                 if a.name == "value")
    return sum(a.nbytes for a in consts.values()) + stored


def _attr(a: onnx.AttributeProto, op: str, node: str):
    """The attribute's value with its strings decoded, alone or in lists, so every string an op reads is a str;
    one that is not UTF-8 is a ModelError naming the attribute."""
    try:
        v = helper.get_attribute_value(a)
        if isinstance(v, bytes):
            return v.decode()
        return [e.decode() if isinstance(e, bytes) else e for e in v] if isinstance(v, list | tuple) else v
    except (UnicodeDecodeError, ValueError) as exc:
        raise ModelError(f"{op} {node!r}: attribute {a.name!r} cannot be read ({exc})") from None


def _bind_inputs(vis: list[onnx.ValueInfoProto], bound: dict[str, tuple[int, ...]], budget: Budget) -> list[Value]:
    names = {v.name for v in vis}
    symbols = {d.dim_param for v in vis for d in v.type.tensor_type.shape.dim if d.dim_param}
    unknown = sorted(set(bound) - names - symbols)
    if unknown:
        raise ModelError(f"--input-shape names {unknown}, but the model's inputs are {sorted(names)}"
                         + (f" and its symbolic dims {sorted(symbols)}" if symbols else ""))
    values = []
    for v in vis:
        tt = v.type.tensor_type
        dtype = onnx_dtype(tt.elem_type)
        if dtype not in RUNTIME_DTYPES:
            raise ModelError(f"input {v.name!r} is {dtype}; tunaflow's inputs are {', '.join(RUNTIME_DTYPES)}")
        dims = list(tt.shape.dim)
        if v.name in bound:
            shape = bound[v.name]
            static = [(i, d.dim_value) for i, d in enumerate(dims) if d.dim_value > 0]
            if len(shape) != len(dims) or any(shape[i] != d for i, d in static):
                raise ModelError(f"--input-shape {v.name}={'x'.join(map(str, shape))} does not fit the model's "
                                 f"shape {[d.dim_value or d.dim_param or '?' for d in dims]}")
        else:
            shape = []
            for i, d in enumerate(dims):
                if d.dim_value > 0:
                    shape.append(d.dim_value)
                elif d.dim_param in bound:
                    shape.append(bound[d.dim_param][0])
                else:
                    label = repr(d.dim_param) if d.dim_param else "unnamed"
                    raise ModelError(f"input {v.name!r} has a dynamic dimension ({label}, axis {i}); bind it with "
                                     f"--input-shape {v.name}=" + "x".join(str(x.dim_value or "N") for x in dims))
        budget.tensor(f"input {v.name!r}", shape)
        values.append(Value(v.name, tuple(shape), dtype))
    return values


def _import_node(op: str, name: str, ins: list[str], outs: list[str], raw: dict, ctx: Ctx, nodes: list[Node],
                 alias: dict[str, str], budget: Budget) -> None:
    if op in ALIASES:
        if op == "Dropout" and ctx.extra_outputs_read(outs):
            raise ModelError(f"Dropout {name!r}: its mask output is not supported")
        _alias(ctx, alias, outs[0], ins[0])
        return
    if op in SHAPE_ONLY:
        _set_const(ctx, outs[0], SHAPE_ONLY[op](raw, ctx.shapes[ins[0]]))
        return
    if op == "Cast" and ins[0] not in ctx.consts and stored(onnx_dtype(raw["to"])) == ctx.dtype(ins[0]):
        _alias(ctx, alias, outs[0], ins[0])  # a run-time cast to the type it is stored in already
        return
    if op in FOLD_ONLY:
        args = [ctx.const(i, f"input {k}") for k, i in enumerate(ins) if i]
        plan, fold = FOLD_ONLY[op]
        try:
            planned = plan(raw, args, ctx)
            if planned is not None:
                budget.fold(op, name, planned)
            value = fold(raw, args, ctx)
        except ModelError:
            raise
        except (ValueError, IndexError) as exc:
            raise ModelError(f"{op} {name!r}: folding failed: {exc}") from None
        if planned is not None:
            budget.spend([value])
        _set_const(ctx, outs[0], value)
        return
    emitted: dict[str, int] = {}  # node names this ONNX node has given, so two Reshapes of one Einsum differ
    for new_op, new_ins, new_outs, attrs in NORMALIZERS[op](ins, outs, raw, ctx):
        live_ins = [i for i in new_ins if i]
        if all(i in ctx.consts for i in live_ins) and not keep_unfolded(new_op, attrs):
            _fold_normalised(op, name, new_op, new_outs, [ctx.consts[i] for i in live_ins], attrs, ctx, budget)
            continue
        in_shapes = [ctx.shapes[i] for i in live_ins]
        shapes = infer(new_op, name, in_shapes, attrs)
        dtypes = [stored(d) for d in out_dtypes(new_op, [ctx.dtype(i) for i in live_ins], attrs, len(new_outs))]
        for out, shape, dtype in zip(new_outs, shapes, dtypes, strict=True):
            budget.tensor(f"{op} {name!r}", shape)
            check_runtime(dtype, f"{op} {name!r}: its output {out!r}")
            ctx.shapes[out], ctx.dtypes[out] = shape, dtype
        for shape in scratch(new_op, in_shapes, attrs, shapes):  # what verifying it with the reference makes
            budget.tensor(f"{op} {name!r}", shape, "scratch array")
        base = name + ("" if len(new_outs) == len(outs) and new_outs[0] == outs[0] else f"/{new_op}")
        emitted[base] = emitted.get(base, 0) + 1
        nodes.append(Node(name=base + (f"#{emitted[base]}" if emitted[base] > 1 else ""), op=new_op, inputs=live_ins,
                          outputs=list(new_outs), attrs=attrs))


def _fold_normalised(op: str, name: str, new_op: str, outs: list[str], args: list[np.ndarray], attrs: dict,
                     ctx: Ctx, budget: Budget) -> None:
    """Evaluate a normalised node on constant inputs, once its outputs and scratch are known to fit the budget."""
    shapes = [a.shape for a in args]
    try:
        planned = SHAPES[new_op](shapes, attrs)
        widest = max((a.dtype for a in args), key=lambda d: d.itemsize).name
        dtypes = out_dtypes(new_op, [widest] * len(args), attrs, len(planned))
        budget.fold(op, name, list(zip(planned, dtypes, strict=True)), scratch(new_op, shapes, attrs, planned))
        results = [np.asarray(r) for r in OPS[new_op](args, attrs)]
    except ModelError:
        raise
    except (ValueError, IndexError) as exc:
        raise ModelError(f"{op} {name!r}: folding its constant inputs failed: {exc}") from None
    budget.spend(results)
    for out, res in zip(outs, results, strict=True):
        _set_const(ctx, out, res)


def _alias(ctx: Ctx, alias: dict[str, str], out: str, src: str) -> None:
    alias[out] = src
    ctx.shapes[out] = ctx.shapes[src]
    if src in ctx.consts:
        ctx.consts[out] = ctx.consts[src]
    else:
        ctx.dtypes[out] = ctx.dtypes[src]


def _set_const(ctx: Ctx, name: str, value: np.ndarray) -> None:
    ctx.consts[name] = value
    ctx.shapes[name] = value.shape


def _outputs(proto: onnx.ModelProto, alias: dict[str, str], nodes: list[Node], ctx: Ctx) -> list[Value]:
    """Graph outputs under their ONNX names (an aliased output takes over its source's name)."""
    produced = {o: node for node in nodes for o in node.outputs}
    graph_outs = {o.name for o in proto.graph.output}
    outputs = []
    for o in proto.graph.output:
        src = o.name
        while src in alias:
            src = alias[src]
        if src != o.name:
            if src in produced and src not in graph_outs:
                _rename(nodes, src, o.name)
                produced[o.name] = produced.pop(src)
            else:
                nodes.append(Node(name=f"{o.name}/copy", op="Reshape", inputs=[src], outputs=[o.name],
                                  attrs={"shape": list(ctx.shapes[src])}))
            ctx.shapes[o.name], ctx.dtypes[o.name] = ctx.shapes[src], ctx.dtypes.get(src, "float32")
        if o.name not in produced and not any(o.name in n.outputs for n in nodes):
            raise ModelError(f"output {o.name!r} is a constant; tunaflow needs outputs computed from the inputs")
        outputs.append(Value(o.name, ctx.shapes[o.name], ctx.dtypes[o.name]))
    return outputs


def _rename(nodes: list[Node], old: str, new: str) -> None:
    for node in nodes:
        node.inputs = [new if i == old else i for i in node.inputs]
        node.outputs = [new if o == old else o for o in node.outputs]
