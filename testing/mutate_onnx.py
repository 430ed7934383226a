"""Hostile model files: valid ONNX files mutated at the byte and the message level, and the import
pipeline (load, optimise, extract tasks) run on each under a time bound.

The documented failure of an import is `ModelError` (a ValueError); anything else that escapes,
a hang past the bound, or a dead process is a bug. Used by tests/test_fuzz_onnx.py (hypothesis
drives the random choices) and benchmarks/faults.py (10,000 seeded cases in a child process).
"""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from stages.extract import SUPPORTED, ModelError, load_model
from stages.graph.passes import optimize
from stages.graph.tasks import extract_tasks

MODELS = Path(__file__).resolve().parents[1] / "data" / "models"
INTS = (-(2**63), -(2**31), -7, -1, 0, 1, 2, 3, 5, 64, 2**31 - 1, 2**40, 2**62)
FLOATS = (float("nan"), float("inf"), -float("inf"), -1.0, 0.0, 1e-38, 1e38)
OP_TYPES = (*SUPPORTED, "Loop", "If", "Scan", "NonMaxSuppression", "", "custom.Op")


class Hang(Exception):
    """The import ran past its time bound."""


def bundled_models() -> dict[str, bytes]:
    return {p.stem: p.read_bytes() for p in sorted(MODELS.glob("*.onnx"))}


def mutate(data: bytes, rng: random.Random) -> bytes:
    """One hostile variant of the model file `data`: byte edits half the time, message edits otherwise."""
    if rng.random() < 0.5:
        return _mutate_bytes(data, rng)
    proto = onnx.load_model_from_string(data)
    for _ in range(rng.randint(1, 3)):
        rng.choice(_EDITS)(proto, rng)
    return proto.SerializeToString()


def _mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    """Flip, overwrite, insert, delete or truncate; most edits land in the node section, which the
    serialiser writes before the (large) initializer data."""
    buf = bytearray(data)
    head = min(len(buf), 8192)
    for _ in range(rng.randint(1, 8)):
        at = rng.randrange(head) if rng.random() < 0.7 else rng.randrange(len(buf))
        op = rng.randrange(5)
        if op == 0:
            buf[at] ^= 1 << rng.randrange(8)
        elif op == 1:
            buf[at] = rng.choice((0, 1, 0x7F, 0x80, 0xFF, rng.randrange(256)))
        elif op == 2:
            buf[at:at] = rng.randbytes(rng.randint(1, 16))
        elif op == 3:
            del buf[at:at + rng.randint(1, 64)]
        else:
            del buf[at:]
        if not buf:
            break
        head = min(len(buf), head)
    return bytes(buf)


def _node(proto, rng):
    nodes = proto.graph.node
    return nodes[rng.randrange(len(nodes))] if nodes else None


def _names(proto) -> list[str]:
    g = proto.graph
    return [*(o for n in g.node for o in n.output), *(t.name for t in g.initializer), *(i.name for i in g.input)]


def _op_type(proto, rng):
    if (n := _node(proto, rng)) is not None:
        n.op_type = rng.choice(OP_TYPES)


def _node_order(proto, rng):
    nodes = list(proto.graph.node)
    if len(nodes) > 1:
        op = rng.randrange(3)
        i, j = rng.randrange(len(nodes)), rng.randrange(len(nodes))
        if op == 0:
            nodes[i], nodes[j] = nodes[j], nodes[i]
        elif op == 1:
            del nodes[i]
        else:
            nodes.insert(j, nodes[i])
        del proto.graph.node[:]
        proto.graph.node.extend(nodes)


def _wiring(proto, rng):
    if (n := _node(proto, rng)) is None:
        return
    names = _names(proto) or ["x"]
    op = rng.randrange(4)
    if op == 0 and n.input:
        n.input[rng.randrange(len(n.input))] = rng.choice([*names, "", "no_such_value"])
    elif op == 1:
        n.input.append(rng.choice(names))
    elif op == 2 and n.input:
        del n.input[rng.randrange(len(n.input))]
    elif n.output:
        n.output[rng.randrange(len(n.output))] = rng.choice([*names, "", "fresh"])


def _attribute(proto, rng):
    if (n := _node(proto, rng)) is None:
        return
    if not n.attribute or rng.random() < 0.2:
        name = rng.choice(("axis", "perm", "pads", "strides", "kernel_shape", "group", "transB", "epsilon", "to",
                           "value", "dilations", "junk"))
        n.attribute.append(helper.make_attribute(name, rng.choice([rng.choice(INTS), rng.choice(FLOATS),
                                                                   [rng.choice(INTS) for _ in range(rng.randint(1, 6))],
                                                                   "str"])))
        return
    a = n.attribute[rng.randrange(len(n.attribute))]
    if rng.random() < 0.2:
        n.attribute.remove(a)
    elif a.type == onnx.AttributeProto.INT:
        a.i = rng.choice(INTS)
    elif a.type == onnx.AttributeProto.FLOAT:
        a.f = rng.choice(FLOATS)
    elif a.type == onnx.AttributeProto.INTS:
        del a.ints[:]
        a.ints.extend(rng.choice(INTS[2:11]) for _ in range(rng.randrange(7)))
    elif a.type == onnx.AttributeProto.TENSOR:
        _tensor(a.t, rng)
    else:
        a.type = rng.randrange(16)


def _tensor(t: TensorProto, rng):
    op = rng.randrange(4)
    if op == 0 and t.dims:
        t.dims[rng.randrange(len(t.dims))] = rng.choice(INTS[2:])
    elif op == 1:
        t.data_type = rng.randrange(25)
    elif op == 2:
        t.raw_data = t.raw_data[: rng.randrange(len(t.raw_data) + 1)]
    else:
        t.dims.append(rng.choice((0, 1, 2, 3)))


def _initializer(proto, rng):
    inits = proto.graph.initializer
    if inits:
        t = inits[rng.randrange(len(inits))]
        if rng.random() < 0.15:
            inits.remove(t)
        else:
            _tensor(t, rng)


def _io(proto, rng):
    g = proto.graph
    values = [*g.input, *g.output]
    if not values:
        return
    v = rng.choice(values)
    tt = v.type.tensor_type
    op = rng.randrange(5)
    if op == 0 and tt.shape.dim:
        tt.shape.dim[rng.randrange(len(tt.shape.dim))].dim_value = rng.choice(INTS[2:])
    elif op == 1 and tt.shape.dim:
        tt.shape.dim[rng.randrange(len(tt.shape.dim))].dim_param = rng.choice(("batch", "", "N"))
    elif op == 2:
        tt.elem_type = rng.randrange(25)
    elif op == 3:
        tt.ClearField("shape")
    else:
        v.name = rng.choice(_names(proto) or ["x"])


def _opset(proto, rng):
    if proto.opset_import:
        proto.opset_import[0].version = rng.choice((1, 5, 6, 9, 13, 17, 21, 99, 2**40))


_EDITS = (_op_type, _node_order, _wiring, _attribute, _initializer, _io, _opset)


def import_case(path: Path, time_limit_s: float) -> str:
    """Run the import pipeline on one file: 'ok', 'ModelError', or the unexpected exception's type and
    message; Hang if it runs past `time_limit_s` (SIGALRM: call from the main thread)."""

    def alarm(signum, frame):
        raise Hang(f"import ran past {time_limit_s:g} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, time_limit_s)
    try:
        extract_tasks(optimize(load_model(path)))
        return "ok"
    except ModelError:
        return "ModelError"
    except Hang:
        raise
    except Exception as exc:  # noqa: BLE001 - the point is to catch what should not escape
        return f"{type(exc).__name__}: {str(exc)[:200]}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run_seeds(seeds: range, workdir: Path, time_limit_s: float = 10.0) -> dict[int, tuple[str, float]]:
    """Outcome and seconds per seed (seed → model and mutation); the model file of a case that
    did not end in 'ok' or 'ModelError' is kept in `workdir` to reproduce it."""
    models = bundled_models()
    names = sorted(models)
    out: dict[int, tuple[str, float]] = {}
    for seed in seeds:
        rng = random.Random(seed)
        name = names[seed % len(names)]
        path = workdir / f"case_{seed}_{name}.onnx"
        path.write_bytes(mutate(models[name], rng))
        start = time.perf_counter()
        try:
            outcome = import_case(path, time_limit_s)
        except Hang:
            outcome = "hang"
        out[seed] = (outcome, time.perf_counter() - start)
        if outcome in ("ok", "ModelError"):
            path.unlink()
    return out
