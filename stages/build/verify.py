"""Build-time self-check: a finished library must compute what the original ONNX model computes.

`build_verified` is the one entry point every command and flow builds through. It builds into a
temporary sibling of OUT, runs the library once on seeded random inputs, and compares every output
with the ORIGINAL ONNX model run by an implementation that shares nothing with tunaflow's import and
passes: onnxruntime when it is importable (much faster), else `onnx.reference.ReferenceEvaluator`.
Only a library that passes (max abs error <= 1e-3 x max abs reference per output; a NaN or Inf where
the reference is finite fails) is moved into OUT, file by file (OUT may hold other files, such as a
tuning run's charts); a failed build leaves OUT exactly as it was, a previous library included.

A mismatch names the first diverging node. The library exposes only graph outputs, so a checking
build exposes every intermediate tensor and each node is compared twice: with the ONNX model's
tensor of the same name (the importer keeps ONNX tensor names) and with tunaflow's numpy interpreter
run on the node's own inputs (a wrong kernel, whatever came before it). Exposing a tensor changes the
build itself (a padded conv-to-conv hand-off, an alias, a reused buffer is planned only for an
internal tensor), so when the checking build is right everywhere the search bisects over how many
nodes keep their outputs internal: the node whose internal hand-off breaks the library, and the
first node after it that diverges, are named.
"""

from __future__ import annotations

import math
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx

from schemas.manifest import MANIFEST, SIGNATURE, Manifest
from schemas.target import Target
from stages.build.inputs import input_infos
from stages.build.library import BuildError, build_library
from stages.graph.ir import Graph, Node
from stages.graph.reference import run_node
from stages.runtime.feeds import sample_inputs
from stages.runtime.loader import host_features, load, missing_features

REL_TOL = 1e-3  # max abs error allowed, as a fraction of the output's max abs reference value
# The smallest scale errors are judged against: the library runs with float32 denormals flushed to zero (the
# reference keeps them), so each op may lose ~1.2e-38 per term, and a tensor whose values all lie near that
# range (an untrained MobileViT's activations fall to 1e-35, its outputs to 3e-40) has no digits to compare.
# Below it, REL_TOL of this scale (1e-30) is the absolute error allowed: still a wrong-kernel check, as no
# real output is that small.
FLUSH_SCALE = 1e-27
SEED = 0


class VerifyError(BuildError):
    """The built library disagrees with the ONNX model; the message names the first diverging node."""


@dataclass(frozen=True)
class Verification:
    status: str  # "passed" or "skipped"
    reference: str | None = None  # what ran the ONNX model, e.g. "onnxruntime 1.32.0"
    verify_s: float = 0.0
    max_error: float | None = None  # the worst output's max abs error / its max abs reference
    reason: str | None = None  # why the check was skipped
    spread: float | None = None  # how far the reference's own float32 answer moves, when the tolerance needed it
    spread_basis: str | None = None  # what measured `spread`: SPREAD_KERNELS or SPREAD_FLOAT64

    def summary(self) -> dict:
        return {"status": self.status, "reference": self.reference, "verify_s": round(self.verify_s, 3),
                "max_error": self.max_error, "reason": self.reason, "reference_spread": self.spread,
                "spread_basis": self.spread_basis}


SPREAD_KERNELS = "onnxruntime's two kernel sets differ by"
SPREAD_FLOAT64 = "the reference itself is off a float64 evaluation (onnx.reference) by"


def build_verified(model: str | Path, graph: Graph, target: Target, out: Path, threads: int = 1,
                   log: Path | None = None, on_fallback: Callable[[str], None] | None = None,
                   verify: bool = True) -> tuple[Manifest, Verification]:
    """`build_library` of `graph` (imported from `model`) into OUT, checked against `model` unless
    `verify` is off or the library cannot run here; raises VerifyError (OUT untouched) on a mismatch."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise BuildError(f"{out} is a file; the library is a directory")
    skip = "--no-verify" if not verify else unrunnable(target)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.parent / f".{out.name}.{os.getpid()}-{secrets.token_hex(4)}.building"  # mode as OUT's would be
    staging.mkdir()
    try:
        manifest = build_library(graph, target, staging, threads, log, on_fallback)
        if skip is not None:
            result = Verification("skipped", reason=skip)
        else:
            try:
                result = check(Path(model), graph, target, staging, threads, log)
            except VerifyError as exc:
                kept = "keeps its previous library" if (out / MANIFEST).is_file() else "has no library written"
                raise VerifyError(f"{exc}\n{out} {kept}; `--no-verify` builds without the check") from None
        _install(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return manifest, result


def unrunnable(target: Target) -> str | None:
    """Why a library for `target` cannot run on this machine (so cannot be checked here), or None."""
    import llvmlite.binding as llvm

    host = llvm.get_default_triple().split("-")[0]
    if target.triple.split("-")[0] != host:
        return f"target {target.triple} does not run on this {host} machine"
    lacking = missing_features(target.features, host_features())
    if lacking:
        return f"target CPU {target.cpu} needs features this CPU lacks ({', '.join(lacking[:6])})"
    return None


def _install(staging: Path, out: Path) -> None:
    """Move the built files into OUT: a new OUT in one rename, else file by file with the manifest last
    (until it lands, the loader refuses the mix: the files do not match its digests)."""
    if not out.exists():
        os.rename(staging, out)
        return
    built = sorted(staging.iterdir(), key=lambda p: p.name == MANIFEST)
    if SIGNATURE not in {f.name for f in built}:
        (out / SIGNATURE).unlink(missing_ok=True)  # a build without the key: an old signature signs another manifest
    for f in built:
        os.replace(f, out / f.name)


def check(model: Path, graph: Graph, target: Target, library: Path, threads: int, log: Path | None) -> Verification:
    """Run the library in `library` and the ONNX model on the same seeded inputs; VerifyError on a mismatch."""
    start = time.perf_counter()
    feeds = random_feeds(graph)
    try:
        name, reference = reference_runner(str(model), threads)
        want = reference(feeds, [v.name for v in graph.outputs])
    except Exception as exc:  # onnxruntime's errors derive from Exception alone
        raise VerifyError(f"the reference could not run {model} to check the library: {type(exc).__name__}: "
                          f"{exc}") from exc
    got = load(library).run(**feeds)
    errors = {v.name: relative_error(got[v.name], want[v.name]) for v in graph.outputs}
    spread: dict[str, float] = {}
    basis = None
    if any(not e <= REL_TOL for e in errors.values()):
        spread, basis = reference_spread(str(model), threads, feeds, list(errors), want), SPREAD_KERNELS
    bad = [k for k, e in errors.items() if not e <= tolerance(spread.get(k))]
    if bad:
        # The second arbiter, slow but exact enough: both float32 answers judged against a float64 evaluation.
        # An ill-conditioned model (EfficientNet-B3 with random weights: onnxruntime 0.42 off float64, while its
        # two kernel sets agree to 2e-3) gets the reference's own distance as its yardstick.
        truth = float64_reference(str(model), feeds, bad)
        if truth:
            basis = SPREAD_FLOAT64
            for k in bad:
                spread[k] = relative_error(want[k], truth[k])
                errors[k] = relative_error(got[k], truth[k])
            bad = [k for k in bad if not errors[k] <= tolerance(spread[k])]
    if bad:
        first = bad[0]
        culprit = locate(model, graph, target, threads, log, feeds)
        raise VerifyError(f"the built library disagrees with the ONNX model ({name}, seeded random inputs): output "
                          f"{first!r} is off by {errors[first]:.3g} of its max abs reference value (tolerance "
                          f"{tolerance(spread.get(first)):.3g}).\n{culprit}")
    return Verification("passed", name, time.perf_counter() - start, max(errors.values(), default=0.0),
                        spread=max(spread.values()) if spread else None, spread_basis=basis if spread else None)


SPREAD_FACTOR = 2  # a library may differ from the reference twice as much as two runs of the reference do


def tolerance(spread: float | None) -> float:
    """REL_TOL, or more where the model's float32 answer is itself only that precise: an ill-conditioned model
    (saturated sigmoid gates, activations in the thousands: EfficientNet-B0 with random weights) gives two
    correct float32 implementations outputs 6e-3 apart, so no library could be held to 1e-3 there."""
    return max(REL_TOL, SPREAD_FACTOR * spread) if spread is not None and math.isfinite(spread) else REL_TOL


def reference_spread(model: str | onnx.ModelProto, threads: int, feeds: dict[str, np.ndarray], names: list[str],
                     want: dict[str, np.ndarray]) -> dict[str, float]:
    """Per tensor, how far the reference's answer moves with its own float32 rounding: onnxruntime with every
    graph rewrite on (fused, blocked-layout kernels: other roundings) against the run in `want` (basic
    rewrites, the same kernels as none); empty for onnx's evaluator (it has one way)."""
    try:
        import onnxruntime as ort
    except ImportError:
        return {}
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.log_severity_level = 3
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    try:
        other = ort.InferenceSession(source, opts, providers=["CPUExecutionProvider"]).run(names, feeds)
    except Exception:  # onnxruntime's errors derive from Exception alone; then the plain tolerance holds
        return {}
    return {n: relative_error(o, want[n]) for n, o in zip(names, other, strict=True)}


def float64_reference(model: str | onnx.ModelProto, feeds: dict[str, np.ndarray], names: list[str]
                      ) -> dict[str, np.ndarray]:
    """The named outputs of the ONNX model evaluated in float64 by `onnx.reference` (every float32 tensor,
    Cast and I/O type widened); empty when the evaluator cannot run the model."""
    from onnx import TensorProto, numpy_helper
    from onnx.reference import ReferenceEvaluator

    proto = onnx.ModelProto()
    proto.CopyFrom(model if isinstance(model, onnx.ModelProto) else onnx.load(model))

    def widen(t: onnx.TensorProto) -> None:
        if t.data_type == TensorProto.FLOAT:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64), t.name))

    for t in proto.graph.initializer:
        widen(t)
    for vi in (*proto.graph.input, *proto.graph.output, *proto.graph.value_info):
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            vi.type.tensor_type.elem_type = TensorProto.DOUBLE
    for node in proto.graph.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                widen(a.t)
            elif node.op_type == "Cast" and a.name == "to" and a.i == TensorProto.FLOAT:
                a.i = TensorProto.DOUBLE
    wide = {k: v.astype(np.float64) if v.dtype == np.float32 else v for k, v in feeds.items()}
    try:
        with np.errstate(all="ignore"):
            return dict(zip(names, ReferenceEvaluator(proto).run(names, wide), strict=True))
    except Exception:  # noqa: BLE001 - an op the evaluator lacks in float64: the float32 verdict stands
        return {}


def random_feeds(graph: Graph, seed: int = SEED) -> dict[str, np.ndarray]:
    """Seeded inputs the model accepts: token ids within the table they index, masks with padding."""
    return sample_inputs(input_infos(graph), seed)


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """Max abs error over the reference's finite values / their max abs (at least FLUSH_SCALE); inf when the
    library is not finite where the reference is, or differs where the reference is NaN or Inf."""
    want = np.asarray(want, dtype=np.float64)
    got = np.asarray(got, dtype=np.float64).reshape(want.shape)
    finite = np.isfinite(want)
    if not np.isfinite(got[finite]).all() or not np.array_equal(got[~finite], want[~finite], equal_nan=True):
        return math.inf
    if not finite.any():
        return 0.0
    err = float(np.abs(got[finite] - want[finite]).max())
    return err / max(float(np.abs(want[finite]).max()), FLUSH_SCALE)


Runner = Callable[[dict[str, np.ndarray], list[str]], dict[str, np.ndarray]]


def reference_runner(model: str | onnx.ModelProto, threads: int) -> tuple[str, Runner]:
    """(name, run(feeds, output names) → arrays by name) of onnxruntime, or of onnx's reference evaluator
    when onnxruntime is not installed (it is a dev dependency)."""
    try:
        import onnxruntime as ort
    except ImportError:
        from onnx.reference import ReferenceEvaluator

        evaluator = ReferenceEvaluator(model)
        return f"onnx.reference {onnx.__version__}", lambda feeds, names: dict(
            zip(names, evaluator.run(names, feeds), strict=True))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3  # its warnings about unused initializers are not the user's business here
    # Basic rewrites only: on ResNet-50 a session then takes 0.06 s to make and 0.14 s to run, 0.39 + 0.07 with all.
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    sess = ort.InferenceSession(source, opts, providers=["CPUExecutionProvider"])
    return f"onnxruntime {ort.__version__}", lambda feeds, names: dict(
        zip(names, sess.run(names, feeds), strict=True))


# --- finding the first diverging node -------------------------------------------------------------

@dataclass(frozen=True)
class _Divergence:
    node: Node
    tensor: str
    error: float
    against: str  # "interpreter": its kernel is wrong; "onnx": the graph computes something else;
    # "onnx, internal inputs": wrong, but what it reads is internal to this build


def locate(model: Path, graph: Graph, target: Target, threads: int, log: Path | None,
           feeds: dict[str, np.ndarray]) -> str:
    """A sentence naming the first node whose output diverges, found as the module docstring says."""
    proto = onnx.load(str(model))
    computed = [o for n in graph.nodes for o in n.outputs if _exposable(graph, o)]
    onnx_names = {o for n in proto.graph.node for o in n.output if o}
    finals = [v.name for v in graph.outputs]
    names = list(dict.fromkeys([*finals, *(o for o in computed if o in onnx_names)]))
    try:
        ref_name, reference = reference_runner(_with_outputs(proto, names), threads)
        want = reference(feeds, names)
        spread = reference_spread(_with_outputs(proto, names), threads, feeds, names, want)
    except Exception as exc:  # as in `check`
        return f"The reference could not run the model with its intermediate tensors as outputs: {exc}"

    builds: dict[int, tuple[dict[str, np.ndarray], Manifest]] = {}

    def build_run(internal: int) -> tuple[dict[str, np.ndarray], Manifest]:
        """Outputs (and manifest) of a build whose first `internal` nodes keep their outputs internal, the
        rest also output theirs."""
        if internal not in builds:
            kept = {o for n in graph.nodes[:internal] for o in n.outputs}
            extra = [o for o in computed if o not in kept and o not in finals]
            checking = replace(graph, outputs=[*graph.outputs, *(graph.values[o] for o in extra)])
            with tempfile.TemporaryDirectory(prefix="tunaflow-verify-") as tmp:
                manifest = build_library(checking, target, Path(tmp), threads, log)
                builds[internal] = load(tmp).run(**feeds), manifest
        return builds[internal]

    try:
        found = _first_divergence(graph, build_run(0)[0], want, feeds, spread)
        if found is not None:
            return _describe(found, proto, ref_name)
        lo, hi = 0, len(graph.nodes)  # every output exposed: right (just seen); none (the real build): wrong
        while hi - lo > 1:
            mid = (lo + hi) // 2
            got = build_run(mid)[0]
            if all(relative_error(got[n], want[n]) <= tolerance(spread.get(n)) for n in finals):
                lo = mid
            else:
                hi = mid
        got, manifest = build_run(hi)
        found = _first_divergence(graph, got, want, feeds, spread, after=hi)
    except BuildError as exc:
        return f"A checking build, which also outputs the intermediate tensors, failed: {exc}"
    keeper = graph.nodes[lo]
    op = next((o for o in manifest.ops if o.node == keeper.name), None)
    how = (f"written {op.layout}" if op is not None and op.layout else
           "an alias of its input's buffer" if op is not None and op.kind == "alias" else "a workspace buffer")
    users = graph.consumers()
    readers = sorted({n.name for o in keeper.outputs for n in users.get(o, [])})
    handoff = (f"Every node's output is right when the intermediate tensors are also graph outputs. The library "
               f"turns wrong when node {keeper.name!r} ({_onnx_label(keeper, proto)}) keeps its output "
               f"{', '.join(map(repr, keeper.outputs))} internal ({how}; read by {', '.join(map(repr, readers))}): "
               "the fault is in that hand-off.")
    if found is None:
        return handoff + " No later node's output diverges on its own."
    return handoff + " " + _describe(found, proto, ref_name)


def _exposable(graph: Graph, name: str) -> bool:
    value = graph.values.get(name)
    return (value is not None and value.dtype == "float32" and name not in graph.constants
            and name not in {v.name for v in graph.inputs})


def _with_outputs(proto: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    """A copy of `proto` that also outputs the tensors `names` (types left to the runtime to infer)."""
    aug = onnx.ModelProto()
    aug.CopyFrom(proto)
    have = {o.name for o in aug.graph.output}
    aug.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in names if n not in have)
    return aug


def _first_divergence(graph: Graph, got: dict[str, np.ndarray], want: dict[str, np.ndarray],
                      feeds: dict[str, np.ndarray], spread: dict[str, float], after: int = 0) -> _Divergence | None:
    """The first node (from index `after`) whose exposed output differs from tunaflow's interpreter on the
    node's own inputs, or from the ONNX model's tensor of that name."""
    values = {**graph.constants, **feeds, **got}
    for node in graph.nodes[after:]:
        outs = [o for o in node.outputs if o in got]
        if not outs:
            continue
        alone = all(i in values for i in node.inputs)  # else it reads a tensor this build keeps internal
        if alone and (off := kernel_divergence(node, [values[i] for i in node.inputs], got)) is not None:
            return _Divergence(node, *off, "interpreter")
        for o in (o for o in outs if o in want and np.size(want[o]) == got[o].size):
            if not (err := relative_error(got[o], want[o])) <= tolerance(spread.get(o)):
                return _Divergence(node, o, err, "onnx" if alone else "onnx, internal inputs")
    return None


def kernel_divergence(node: Node, inputs: list[np.ndarray], got: dict[str, np.ndarray]) -> tuple[str, float] | None:
    """(output, error) of the first output of `node` in `got` that differs from tunaflow's interpreter run on
    `inputs`: integer and boolean tensors exactly (an integer kernel has no rounding to forgive), floats beyond
    REL_TOL of the max abs value; None when every exposed output agrees."""
    with np.errstate(all="ignore"):
        expect = run_node(node, inputs)
    for name, want in zip(node.outputs, expect, strict=True):
        if name not in got:
            continue
        have, want = np.asarray(got[name]), np.asarray(want)
        err = relative_error(have, want)
        if not (np.array_equal(have, want) if have.dtype.kind in "iub" else err <= REL_TOL):
            return name, err
    return None


def _describe(d: _Divergence, proto: onnx.ModelProto, ref_name: str) -> str:
    node = d.node
    built = f"built as {node.task.description}" if node.task is not None else f"built as {node.op}"
    head = f"First diverging node: {node.name!r} ({_onnx_label(node, proto)}; {built}), output {d.tensor!r}"
    if d.against == "interpreter":
        return (f"{head}: its kernel is off by {d.error:.3g} of the max abs value tunaflow's numpy interpreter "
                "computes from the same inputs.")
    if d.against == "onnx, internal inputs":
        return f"{head}, the first to diverge after it: off by {d.error:.3g} of the ONNX tensor's max abs value."
    return (f"{head}: off by {d.error:.3g} of the max abs value of the ONNX model's tensor ({ref_name}), although "
            "its kernel agrees with tunaflow's numpy interpreter on its inputs: the import or a graph pass "
            "changed what this node computes.")


def _onnx_label(node: Node, proto: onnx.ModelProto) -> str:
    """The ONNX node(s) behind a tunaflow node: its namesake (the anchor of a fused node, or the node a
    pass rewrote as `name/...`) and the producer of its output tensor (the last node fused into it)."""
    by_name = {n.name: n for n in proto.graph.node if n.name}
    producer = {o: (i, n) for i, n in enumerate(proto.graph.node) for o in n.output}
    found = []
    own = by_name.get(node.name) or by_name.get(node.name.rsplit("/", 1)[0])
    if own is not None:
        found.append(own)
    tail = producer.get(node.outputs[0]) if node.outputs else None
    if tail is not None and tail[1] is not own:
        found.append(tail[1])
    if not found:
        return "no ONNX node of that name: added by a graph pass"
    labels = [f"{n.op_type} {n.name!r}" if n.name else f"{n.op_type} (unnamed, #{producer[n.output[0]][0]})"
              for n in found]
    return "ONNX " + " fused up to ".join(labels)


__all__ = ["REL_TOL", "SPREAD_FACTOR", "Verification", "VerifyError", "build_verified", "check", "locate",
           "reference_runner", "relative_error", "unrunnable"]
