"""Build one shared library for a whole graph: tuned anchor kernels + generated ops + `tf_run`.

Each anchor kernel is its template's module (with the chosen schedule) compiled to its own
object, its `tf_main` renamed so many kernels link into one library. Every other op is
generated into one module together with

    int64_t tf_run(void **inputs, void **outputs, char *weights, char *workspace, int64_t status[3])

which calls the kernels in graph order, each with an argument array pointing into the
caller's inputs/outputs, the packed weights file, or the statically planned workspace, and
`tf_profile` (the same, with `double *seconds` before `status`: each call's time, in manifest op
order). Both return 0, or k + 1 when call k met bad data (an index out of range) and stopped the
run: `status` then holds 1, the bad value and the extent it had to be in.
The objects are linked with the system C compiler (`cc -shared`), together with the native runtime
(`stages/codegen/runtime.c`, hidden inside the library) whose worker pool runs threaded kernels.
The generated module also carries `tf_facts` (`stages/build/facts.py`): the I/O signature, sizes,
format version and target the loader checks the manifest against before it opens the library.
"""

from __future__ import annotations

import hashlib
import math
import re
import shutil
import subprocess
import tempfile
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from llvmlite import ir

from schemas.manifest import (
    FORMAT_VERSION,
    LIBRARY,
    MANIFEST,
    PROFILE,
    SIGNATURE,
    WEIGHTS,
    Manifest,
    OpInfo,
    TensorInfo,
    artifact_key,
    file_digest,
    log_digest,
    signature,
)
from schemas.target import Target
from stages.build import facts
from stages.build.apply_best import Choice, apply_verdicts, choose, fallback_message, implementations
from stages.build.gemm_views import plan_gemm_views
from stages.build.halo import HaloPlan, plan_halos
from stages.build.inputs import input_infos
from stages.build.memplan import Step, aligned, plan_workspace
from stages.codegen import runtime
from stages.codegen.compile import GENERATED_OPS_LEVEL, compile_ir
from stages.codegen.harness import monotonic_clock
from stages.codegen.irb import F64, I64, VOIDP, i64, intrinsic
from stages.extract.dtypes import stored
from stages.graph.ir import Graph, Node
from stages.graph.twins import alternatives
from stages.log import TuningLog
from stages.memops.anchor import GENERIC_OPS, generic_anchor
from stages.memops.opctx import STATUS
from stages.memops.registry import ALIASES, OpCtx, UnsupportedOp, generator, unsupported_nodes
from stages.templates import TEMPLATES, qgemm_isa, template_for
from stages.templates.batch_matmul import Views
from stages.templates.conv2d import Halo

RUN = "tf_run"
COMPILED = 1024  # anchor kernels' object code kept per process (tens of KB each)
_COMPILED: OrderedDict[tuple[str, str], bytes] = OrderedDict()


class BuildError(Exception):
    """The graph cannot be built into a library; the message says which node and why."""


@dataclass
class _Call:
    node: Node
    symbol: str
    slots: list[str]
    anchor: bool


# A library for another architecture links with Debian's cross compiler for it: (compiler, its package).
CROSS_COMPILERS = {"aarch64": ("aarch64-linux-gnu-gcc", "gcc-aarch64-linux-gnu")}


def find_compiler(cc: str | None = None, triple: str | None = None) -> str:
    """`cc` if given, else the cross compiler of `triple`'s architecture when it is not this machine's,
    else the system's cc, gcc or clang."""
    import llvmlite.binding as llvm

    arch = triple.split("-")[0] if triple else ""
    if not cc and arch and arch != llvm.get_default_triple().split("-")[0]:
        if arch not in CROSS_COMPILERS:
            raise BuildError(f"no cross C compiler known for {triple}'s architecture {arch}; known: "
                             + ", ".join(f"{c} for {a}" for a, (c, _) in sorted(CROSS_COMPILERS.items())))
        cross, package = CROSS_COMPILERS[arch]
        found = shutil.which(cross)
        if not found:
            raise BuildError(f"no {cross} found to link the library for {triple}: apt-get install {package}")
        return found
    found = shutil.which(cc) if cc else next(filter(None, map(shutil.which, ("cc", "gcc", "clang"))), None)
    if not found:
        raise BuildError(f"no C compiler found ({cc or 'cc, gcc or clang'}) to link the library: "
                         "install one (e.g. apt-get install gcc) or pass its path")
    return found


def build_library(graph: Graph, target: Target, out: Path, threads: int = 1, log: Path | None = None,
                  on_fallback: Callable[[str], None] | None = None, cc: str | None = None,
                  key: str | bytes | None = None) -> Manifest:
    """Write OUT/model.so, OUT/weights.bin and OUT/manifest.json, and OUT/manifest.sig when there is a key
    (`key`, else TUNAFLOW_ARTIFACT_KEY); returns the manifest."""
    start = time.perf_counter()
    missing = unsupported_nodes(graph.nodes)
    if missing:
        raise BuildError("no kernel for these op types (nodes): " + "; ".join(missing))
    no_kernel = sorted({n.task.op for n in graph.nodes if n.task is not None} - set(TEMPLATES) - GENERIC_OPS)
    if no_kernel:
        raise BuildError(f"no template for anchor op(s) {no_kernel}; templates exist for {sorted(TEMPLATES)}")
    compiler = find_compiler(cc, target.triple)
    tuning_log = TuningLog(log) if log is not None else None
    graph, choices = _implementations(graph, tuning_log, target, threads)

    for v in graph.outputs:
        if v.name in graph.constants or v.name in {i.name for i in graph.inputs}:
            raise BuildError(f"graph output {v.name!r} is a graph input or a constant; nothing computes it")
    module = ir.Module(name="tf_model")
    module.triple = target.triple
    templated = {s: c for s, c in choices.items() if c.config is not None}
    views = plan_gemm_views(graph, templated)
    graph = views.graph
    halo = plan_halos(graph, templated)
    low = _lower(graph, module, choices, target, threads, halo, views.views)
    calls, constants = low.calls, low.constants
    message = _fallbacks(choices, low.generic)
    if message and on_fallback:
        on_fallback(message)

    for c in calls:
        c.slots = [low.root.get(s, s) for s in c.slots]
    constants.update({s: graph.constants[s] for c in calls for s in c.slots if s in graph.constants})
    weight_offsets, weights_blob = _pack_weights(constants)
    work = _work_tensors(graph, calls, constants)
    work.update({name: 4 * floats for name, floats in halo.floats.items() if name in work})
    plan = plan_workspace([Step(tuple(s for s in c.slots if s not in c.node.outputs),
                                tuple(s for s in c.slots if s in c.node.outputs)) for c in calls], work)
    _check_computed(graph, calls, constants)
    _emit_run(module, calls, graph, weight_offsets, plan.offsets)
    inputs = input_infos(graph)
    outputs = tuple(TensorInfo(name=v.name, shape=v.shape, dtype=v.dtype) for v in graph.outputs)
    facts.emit(module, facts.Facts(
        format_version=FORMAT_VERSION, inputs=inputs, outputs=outputs, workspace_bytes=plan.size,
        weights_bytes=len(weights_blob), weights_sha256=hashlib.sha256(weights_blob).hexdigest(), calls=len(calls),
        threads=threads, triple=target.triple, cpu=target.cpu, features=target.features))
    objects = [*low.objects, compile_ir(module, target, GENERATED_OPS_LEVEL).data]

    out.mkdir(parents=True, exist_ok=True)
    _link(compiler, objects, out / LIBRARY)
    (out / WEIGHTS).write_bytes(weights_blob)
    manifest = Manifest(
        model=graph.name, inputs=inputs, outputs=outputs, target=target, target_key=target.key, threads=threads,
        log=str(log) if log is not None else None,
        log_digest=log_digest(log) if log is not None else None,
        workspace_bytes=plan.size, naive_workspace_bytes=plan.naive_size, weights_bytes=len(weights_blob),
        ops=tuple(low.infos),
        files={LIBRARY: file_digest(out / LIBRARY), WEIGHTS: file_digest(out / WEIGHTS)},
        build_s=time.perf_counter() - start,
    )
    text = manifest.model_dump_json(indent=1).encode()
    (out / MANIFEST).write_bytes(text)
    secret = artifact_key(key)
    if secret is None:
        (out / SIGNATURE).unlink(missing_ok=True)  # a stale one would sign another manifest
    else:
        (out / SIGNATURE).write_text(signature(text, secret) + "\n")
    return manifest


def _implementations(graph: Graph, log: TuningLog | None, target: Target, threads: int) \
        -> tuple[Graph, dict[str, Choice]]:
    """A copy of `graph` whose anchors carry the task they are built as (their own, or an alternative
    implementation that measured faster: `implementations`), and the schedule of each of those tasks."""
    tasks = [n.task for n in graph.nodes if n.task is not None and n.task.op in TEMPLATES]
    choices = choose(tasks + [alt for t in tasks for alt in alternatives(t)], log, target, threads)
    picked = implementations(tasks, choices)
    apply_verdicts(tasks, picked, choices, log, target, threads)
    nodes = [replace(n, task=picked[n.task.signature])
             if n.task is not None and n.task.signature in picked and n.inputs[1] in graph.constants else n
             for n in graph.nodes]
    used = {n.task.signature for n in nodes if n.task is not None}
    return replace(graph, nodes=nodes), {s: c for s, c in choices.items() if s in used}


@dataclass
class _Lowered:
    """Every node turned into a kernel call (or an alias), before memory is planned."""

    calls: list[_Call] = field(default_factory=list)
    objects: list[bytes] = field(default_factory=list)
    infos: list[OpInfo] = field(default_factory=list)
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    root: dict[str, str] = field(default_factory=dict)  # alias output → the tensor whose buffer it is
    generic: dict[str, str] = field(default_factory=dict)  # task description → why it runs the generic kernel
    kernels: dict[str, str] = field(default_factory=dict)  # anchor kernel IR → the symbol it was compiled as


def _lower(graph: Graph, module: ir.Module, choices: dict[str, Choice], target: Target, threads: int,
           halo: HaloPlan, views: dict[str, Views]) -> _Lowered:
    outputs = {v.name for v in graph.outputs}
    low = _Lowered()
    for idx, node in enumerate(graph.nodes):
        symbol = f"tf_op{idx}"
        anchor = None
        choice = choices.get(node.task.signature) if node.task is not None else None
        if choice is not None and choice.config is not None:
            layout = {"halo": halo.halos[node.name]} if node.name in halo.halos else \
                {"views": views[node.name]} if node.name in views else {}
            try:
                anchor = _anchor(graph, node, choice, target, threads, symbol, low.kernels, layout)
            except _RunTimeOperand as exc:
                if layout:
                    raise BuildError(f"node {node.name!r}: planned its operands' layout, but {exc}") from exc
                low.generic[node.task.description] = str(exc)
        elif node.task is not None:
            low.generic[node.task.description] = choice.why_default if choice else f"no template for {node.task.op}"
        if anchor is not None:
            slots, packed, obj, symbol = anchor
            low.constants.update(packed)
            if obj is not None:
                low.objects.append(obj)
            low.calls.append(_Call(node, symbol, slots, anchor=True))
            low.infos.append(_anchor_info(node, choices[node.task.signature], layout))
        elif node.op in ALIASES and node.outputs[0] not in outputs:
            low.root[node.outputs[0]] = low.root.get(node.inputs[0], node.inputs[0])
            low.infos.append(OpInfo(node=node.name, op=node.op, kind="alias"))
        else:
            ctx = OpCtx.open(module, graph, node, symbol, threads, qgemm_isa.available(target)[0],
                             qgemm_isa.byte_permute(target))
            try:
                (generic_anchor if node.task is not None and node.task.op in GENERIC_OPS else generator(ctx))(ctx)
            except (UnsupportedOp, ValueError) as exc:
                raise BuildError(str(exc)) from exc
            ctx.close()
            low.constants.update(ctx.new_constants)
            low.calls.append(_Call(node, symbol, ctx.slots, anchor=False))
            low.infos.append(OpInfo(node=node.name, op=node.op, kind="generated" if node.task is None else "generic",
                                    task=node.task.description if node.task else None,
                                    task_signature=node.task.signature if node.task else None))
    return low


def _anchor(graph: Graph, node: Node, choice: Choice, target: Target, threads: int, symbol: str,
            kernels: dict[str, str], layout: dict[str, Halo | Views]) \
        -> tuple[list[str], dict[str, np.ndarray], bytes | None, str]:
    """Slots, packed weights, the compiled object of one anchor kernel and its symbol (`layout`: a conv2d's
    padded X / Y `halo`, see `stages/build/halo.py`, or a batch matmul's strided `views`, see
    `stages/build/gemm_views.py`). A kernel whose IR an earlier anchor already compiled
    (`kernels`) is called under that anchor's symbol with no new object: identical tasks on the same
    schedule are common (DenseNet-121: 121 anchors, 67 tasks) and LLVM's codegen is most of a build."""
    task, knobs = node.task, dict(choice.config.knobs)
    tpl = template_for(task)
    inputs = [n for n in node.inputs if n]
    specs = task.inputs
    if len(specs) != len(inputs):
        raise BuildError(f"node {node.name!r}: task {task.description} takes {len(specs)} inputs, "
                         f"the node has {len(inputs)}")
    views = layout.get("views")
    viewed = {k for k, v in enumerate((views.a, views.b)) if v is not None} if isinstance(views, Views) else set()
    for k, (name, spec) in enumerate(zip(inputs, specs, strict=True)):
        value = graph.constants.get(name)
        size = value.size if value is not None else math.prod(graph.values[name].shape)
        if size != spec.size and k not in viewed:  # (a view's source is larger: the plan derived it from the copy)
            raise BuildError(f"node {node.name!r}: input {name!r} has {size} elements, the task expects {spec.shape}")
    arrays = _operands(graph, inputs, specs, 0, viewed)
    args = tpl.kernel_args(task, knobs, arrays, **layout)
    # An argument packed from run-time data cannot be baked into the weights. Float stand-ins are NaN, which
    # survives packing; integer ones cannot be told apart by value, so the operands are packed a second time
    # from other stand-in values and any argument that changes depends on them.
    integer = any(s.dtype != "float32" and n not in graph.constants for n, s in zip(inputs, specs, strict=True))
    again = tpl.kernel_args(task, knobs, _operands(graph, inputs, specs, 1, viewed), **layout) if integer else None
    slots: list[str] = []
    packed: dict[str, np.ndarray] = {}
    for k, arg in enumerate(args[:-1]):
        same = [n for n, a in zip(inputs, arrays, strict=True)
                if n not in graph.constants and arg.ctypes.data == a.ctypes.data and arg.nbytes == a.nbytes]
        if same:
            slots.append(same[0])
        elif (arg.dtype.kind == "f" and np.isnan(arg).any()) or (again is not None and
                                                                 not np.array_equal(arg, again[k])):
            raise _RunTimeOperand(f"template {tpl.NAME} packs an operand at build time that this graph computes "
                                  "at run time")
        else:
            packed[f"{node.name}/arg{k}"] = np.ascontiguousarray(arg)
            slots.append(f"{node.name}/arg{k}")
    if args[-1].size != math.prod(graph.values[node.outputs[0]].shape):
        raise BuildError(f"node {node.name!r}: kernel output has {args[-1].size} elements, "
                         f"the graph's {node.outputs[0]!r} is {graph.values[node.outputs[0]].shape}")
    slots.append(node.outputs[0])
    text = str(tpl.build_ir(task, knobs, target, threads, **layout))
    # The tuner's timing harness has no caller in a library: internal, LLVM drops it.
    text = re.sub(r'define (double @"?tf_bench"?)(?=[\s(])', r'define internal \1', text)
    if text in kernels:
        return slots, packed, None, kernels[text]
    kernels[text] = symbol
    renamed = re.sub(r'@"?tf_main"?(?=[\s(,)])', f'@"{symbol}_main"', text)
    if f'@"{symbol}_main"' not in renamed or re.search(r'@"?tf_main\b', renamed):
        raise BuildError(f"node {node.name!r}: template {tpl.NAME} did not export tf_main as expected")
    try:
        return slots, packed, _compiled(renamed, target), symbol
    except ValueError as exc:
        raise BuildError(f"node {node.name!r}: {exc}") from exc


def _compiled(text: str, target: Target) -> bytes:
    """The object code of an anchor kernel's IR, compiled once per process (`COMPILED` kept): a rebuild of a
    model compiles only the kernels that changed (refine's variants, then `tune`'s final build)."""
    key = (hashlib.sha256(text.encode()).hexdigest(), target.key)
    if key in _COMPILED:
        _COMPILED.move_to_end(key)
        return _COMPILED[key]
    data = compile_ir(text, target).data
    _COMPILED[key] = data
    if len(_COMPILED) > COMPILED:
        _COMPILED.popitem(last=False)
    return data


def _operands(graph: Graph, inputs: list[str], specs, fill: int, viewed: set[int]) -> list[np.ndarray]:
    """The anchor's operands in the task's dtypes: constants as they are, run-time ones as stand-in values
    (NaN for floats; `fill` for integers), those read as views (`viewed`) in their source's shape."""
    out = []
    for k, (name, spec) in enumerate(zip(inputs, specs, strict=True)):
        value = graph.constants.get(name)
        if value is not None:
            out.append(np.ascontiguousarray(value, dtype=spec.dtype).reshape(spec.shape))
        else:
            shape = graph.values[name].shape if k in viewed else spec.shape
            out.append(np.full(shape, np.nan if spec.dtype == "float32" else fill, dtype=spec.dtype))
    return out


class _RunTimeOperand(Exception):
    """The template packs an operand that is not a constant here: the anchor takes the generic kernel."""


def _fallbacks(choices: dict[str, Choice], generic: dict[str, str]) -> str | None:
    """One message for every task on its default schedule and every anchor on the generic kernel."""
    lines = []
    message = fallback_message({s: c for s, c in choices.items() if c.task.description not in generic})
    if message:
        lines.append(message)
    if generic:
        lines.append(f"{len(generic)} anchor task(s) run the generic untuned kernel:")
        lines += [f"  {desc}: {why}" for desc, why in generic.items()]
    return "\n".join(lines) or None


def _anchor_info(node: Node, choice: Choice, layout: dict[str, Halo | Views]) -> OpInfo:
    rec = choice.record
    return OpInfo(
        node=node.name, op=node.op, kind="tuned" if rec else "default", task=choice.task.description,
        task_signature=choice.task.signature, knobs=dict(choice.config.knobs),
        record=None if rec is None else {"session_id": rec.session_id, "trial": rec.trial,
                                         "median_s": rec.cost_s, "gflops": rec.gflops},
        layout=next((v.label for v in layout.values()), None),
    )


def _pack_weights(constants: dict[str, np.ndarray]) -> tuple[dict[str, int], bytes]:
    offsets: dict[str, int] = {}
    chunks: list[bytes] = []
    pos = 0
    for name, arr in constants.items():
        data = np.ascontiguousarray(arr, dtype=stored(arr.dtype)).tobytes()
        offsets[name] = pos
        chunks.append(data + b"\0" * (aligned(len(data)) - len(data)))
        pos += aligned(len(data))
    return offsets, b"".join(chunks)


def _work_tensors(graph: Graph, calls: list[_Call], constants: dict[str, np.ndarray]) -> dict[str, int]:
    external = {v.name for v in graph.inputs} | {v.name for v in graph.outputs} | set(constants) | {STATUS}
    return {s: np.dtype(graph.values[s].dtype).itemsize * math.prod(graph.values[s].shape)
            for c in calls for s in c.slots if s not in external}


def _check_computed(graph: Graph, calls: list[_Call], constants: dict[str, np.ndarray]) -> None:
    ready = {v.name for v in graph.inputs} | set(constants) | {STATUS}
    for c in calls:
        for s in c.slots:
            if s not in c.node.outputs and s not in ready:
                raise BuildError(f"node {c.node.name!r} reads {s!r}, which no earlier kernel computes")
        ready.update(s for s in c.slots if s in c.node.outputs)
    lost = [v.name for v in graph.outputs if v.name not in ready]
    if lost:
        raise BuildError(f"graph output(s) {lost} are never computed")


def _emit_run(module: ir.Module, calls: list[_Call], graph: Graph, weights: dict[str, int],
              work: dict[str, int]) -> None:
    """`tf_run`, and `tf_profile`: the same calls, each timed into `seconds[i]`; both stop after a call that
    reports bad data in the status and return its number."""
    vpp = VOIDP.as_pointer()
    for name, timed in ((RUN, False), (PROFILE, True)):
        params = [vpp, vpp, VOIDP, VOIDP] + ([F64.as_pointer()] if timed else []) + [I64.as_pointer()]
        fn = ir.Function(module, ir.FunctionType(I64, params), name=name)
        # Straight-line calls with nothing to optimise: at O2 these two functions (one call per graph node,
        # the op functions inlined into them) took most of a large model's build (DenseNet-121: 34 s of 52).
        fn.attributes.add("noinline")
        fn.attributes.add("optnone")
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        status = fn.args[-1]
        b.store(i64(0), status)
        # Denormals as zero while the model runs (runtime.c says why); the caller's mode comes back after.
        saved = b.call(intrinsic(module, "tf_fp_enter", I64, []), [])
        now = monotonic_clock(b) if timed else None
        _emit_calls(b, fn.args, calls, graph, weights, work, now, saved)
        b.call(intrinsic(module, "tf_fp_leave", ir.VoidType(), [I64]), [saved])
        b.ret(i64(0))


def _emit_calls(b: ir.IRBuilder, fargs, calls: list[_Call], graph: Graph, weights: dict[str, int],
                work: dict[str, int], now: Callable[[], ir.Value] | None, saved: ir.Value) -> None:
    inputs, outputs, wbase, wsbase = fargs[:4]
    status = fargs[-1]
    module = b.module
    in_idx = {v.name: i for i, v in enumerate(graph.inputs)}
    out_idx = {v.name: j for j, v in enumerate(graph.outputs)}

    def pointer(name: str) -> ir.Value:
        if name == STATUS:
            return b.bitcast(status, VOIDP)
        if name in out_idx:
            return b.load(b.gep(outputs, [i64(out_idx[name])]))
        if name in in_idx:
            return b.load(b.gep(inputs, [i64(in_idx[name])]))
        if name in weights:
            return b.gep(wbase, [i64(weights[name])])
        return b.gep(wsbase, [i64(work[name])])

    for i, c in enumerate(calls):
        arr = b.alloca(VOIDP, size=i64(len(c.slots)))
        for k, name in enumerate(c.slots):
            b.store(pointer(name), b.gep(arr, [i64(k)]))
        start = now() if now else None
        if c.anchor:
            main = intrinsic(module, f"{c.symbol}_main", ir.VoidType(), [VOIDP])
            b.call(main, [b.bitcast(arr, VOIDP)])
        else:
            b.call(module.globals[c.symbol], [arr])
        if now is not None:
            b.store(b.fsub(now(), start), b.gep(fargs[4], [i64(i)]))
        if STATUS in c.slots:
            with b.if_then(b.icmp_signed("!=", b.load(status), i64(0)), likely=False):
                b.call(intrinsic(module, "tf_fp_leave", ir.VoidType(), [I64]), [saved])
                b.ret(i64(i + 1))


def _link(compiler: str, objects: list[bytes], dest: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="tunaflow-link-") as tmp:
        paths = []
        for i, data in enumerate(objects):
            p = Path(tmp) / f"k{i}.o"
            p.write_bytes(data)
            paths.append(str(p))
        tmp_out = Path(tmp) / LIBRARY
        proc = subprocess.run(runtime.link_command(compiler, paths, str(tmp_out)), capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildError(f"linking with {compiler} failed:\n{proc.stderr.strip()}")
        shutil.move(str(tmp_out), dest)
