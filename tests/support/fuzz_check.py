"""Differential check of fuzz cases: tunaflow's library against onnxruntime, one forked process per case.

Each case is built twice, with default schedules and with a tuning log of random valid configs for
every anchor task and its Winograd twin (random costs, so the build sometimes runs the twin), and
run on the case's seeded inputs. A build passes iff on every output max |got - want| <= 1e-3 *
max |want|. Cases run in processes forked from a clean server, so a segfault or a hang is a
recorded crash, not a dead fuzzer.

With `int8`, the case is first quantized as users do (onnxruntime's `quantize_static`: QDQ, int8
weights per channel or per tensor, uint8 or int8 activations, calibrated on two random inputs) and judged
by onnxruntime's int8 run: every element of an output a DequantizeLinear produces within one quantization
step (other outputs: the float rule). Builds: default and random tuned configs on the host, and the default
build on the `x86-64-avx2` preset (the fallback kernels). Where onnxruntime's float islands round
differently from ONNX's definition (its Tanh and Erf approximations flip a step that later layers amplify),
a build that disagrees with onnxruntime still passes if it agrees, by the same rule, with `onnx.reference`
running the quantized model; such builds are counted in `ort_off`. Transformer cases are quantized as users
quantize transformers, by `quantize_dynamic` (int8 weights, MatMulInteger, activations quantized at run time by
DynamicQuantizeLinear); their float outputs are judged by the float rule against onnxruntime's int8 run (both
compute the same integers, so the two agree to float rounding: 3e-7 of the output's scale, measured, while the
int8 model is 1e-2 off the float one). A float difference of an ulp before a run-time quantization can still
flip one step of it, which later layers carry to the output (2e-3 to 6e-3, measured): onnxruntime's own fused
and unfused runs differ so on some cases, so a build that agrees with its basic level (no fusions) also passes,
counted in `ort_off`. Where neither does, the build still passes, counted in `ulp_off`, only if both halves
of the difference are accounted for: tunaflow's numpy interpreter agrees with onnxruntime on the outputs (the
graph means what the model means), and a build that also outputs every intermediate tensor has each node's
output equal to the interpreter's on that build's own inputs (integers exactly, floats to `REL_TOL`): every
kernel computes its op, and the outputs differ only where an ulp of float order landed on an exact rounding
tie of a run-time quantization (seen: LayerNorm's -33.499996 against -33.5 steps, 82 against 81).
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import tempfile
import time
import traceback
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from multiprocessing.connection import wait
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from schemas import Config, MeasureResult, Target, TuningRecord
from schemas.errors import UnsupportedOpsError
from schemas.target import preset
from stages.build.library import BuildError, build_library
from stages.build.verify import kernel_divergence
from stages.extract import load_model
from stages.graph import reference as interpreter
from stages.graph.ir import Graph
from stages.graph.passes import optimize
from stages.graph.passes_chain import CHAIN
from stages.graph.twins import alternatives
from stages.log import TuningLog
from stages.runtime import load
from stages.templates import TEMPLATES, template_for
from support.fuzz_graphs import Case, make_case
from support.fuzz_transformers import make_transformer_case
from testing.quantize import quantize_dynamic, quantize_static

RTOL = 1e-3
STEPS = 1.0  # int8: quantization steps of the output's scale an element may be off
FAMILIES = {"cnn": make_case, "transformer": make_transformer_case}  # case generators by graph family
STATUSES = ("pass", "mismatch", "crash", "unsupported")
SAMPLE_TRIES = 4000


@dataclass(frozen=True)
class Outcome:
    seed: int
    index: int
    description: str
    status: str  # one of STATUSES
    detail: str = ""  # which build failed and how
    seconds: float = 0.0
    anchors: int = 0  # anchor kernels per build
    winograd: int = 0  # of them built as Winograd in the tuned build
    halo: int = 0  # convs handing over padded tensors, over both builds
    views: int = 0  # batch matmuls reading or writing strided views (stages/build/gemm_views.py), over both builds
    chains: int = 0  # element-wise chains run as one pass (stages/graph/passes_chain.py), Concat-headed or not
    ort_off: int = 0  # int8: builds off onnxruntime but on the ONNX reference (onnxruntime's rounding)
    ulp_off: int = 0  # dynamic int8: builds off every reference by a rounding tie's flip, every kernel right alone


def reference(case: Case, level: ort.GraphOptimizationLevel = ort.GraphOptimizationLevel.ORT_ENABLE_ALL) \
        -> dict[str, np.ndarray]:
    """onnxruntime's outputs on one intra-op thread (its graph optimisations at `level`)."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    opts.graph_optimization_level = level
    sess = ort.InferenceSession(case.model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, case.feeds), strict=True))


def quantized(case: Case) -> Case:
    """The case as `quantize_static` writes it, its options drawn from the case's seed (per-channel weights in
    7 of 10 cases, int8 activations in 3 of 10, else uint8); the description says which (`q:u8/pc`)."""
    rng = np.random.default_rng([case.seed, case.index, 2])
    per_channel, activation = bool(rng.random() < 0.7), "int8" if rng.random() < 0.3 else "uint8"
    model = quantize_static(case.model, per_channel=per_channel, activation=activation)
    words = f"q:{'s8' if activation == 'int8' else 'u8'}/{'pc' if per_channel else 'pt'}"
    return Case(case.seed, case.index, model, case.feeds, case.threads, f"{words} {case.description}")


def quantized_dynamic(case: Case) -> Case:
    """The case as `quantize_dynamic` writes it (`qd` in the description)."""
    return Case(case.seed, case.index, quantize_dynamic(case.model), case.feeds, case.threads, f"qd {case.description}")


def spec_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The model run by `onnx.reference` (ONNX's definition in numpy), at an opset whose DequantizeLinear
    it implements (19; the fuzz graphs' ops mean the same there)."""
    from onnx.reference import ReferenceEvaluator

    proto = onnx.ModelProto()
    proto.CopyFrom(model)
    for op in proto.opset_import:
        if op.domain in ("", "ai.onnx"):
            op.version = max(op.version, 19)
    return dict(zip([o.name for o in proto.graph.output], ReferenceEvaluator(proto).run(None, feeds), strict=True))


def output_steps(model: onnx.ModelProto) -> dict[str, float]:
    """Per graph output, the scale of the DequantizeLinear that produces it (outputs made otherwise: absent)."""
    init = {t.name: t for t in model.graph.initializer}
    made = {out: n for n in model.graph.node for out in n.output}
    steps = {}
    for o in model.graph.output:
        node = made.get(o.name)
        if node is not None and node.op_type == "DequantizeLinear" and node.input[1] in init:
            steps[o.name] = float(np.max(numpy_helper.to_array(init[node.input[1]])))
    return steps


def disagreement(got: dict[str, np.ndarray], want: dict[str, np.ndarray], steps: dict[str, float]) -> str | None:
    """None if every output is within the rule (STEPS quantization steps where `steps` names the output's
    scale, else RTOL x its max |value|), else what is off."""
    for name, ref in want.items():
        if got[name].shape != ref.shape:
            return f"output {name} has shape {got[name].shape}, want {ref.shape}"
        err = float(np.max(np.abs(got[name].astype(np.float64) - ref))) if ref.size else 0.0
        if name in steps:
            if not err <= STEPS * steps[name] * (1 + 1e-4):  # float32 rounding of both dequantized values
                return f"output {name} off by {err / steps[name]:.3g} quantization steps (> {STEPS:g})"
            continue
        scale = float(np.max(np.abs(ref))) if ref.size else 0.0
        if not err <= RTOL * scale:
            return f"output {name} max abs error {err:.3g} vs {RTOL:g} x max |ref| {scale:.3g}"
    return None


def wrong_alone(graph: Graph, target: Target, threads: int, log: Path | None, feeds: dict[str, np.ndarray],
                workdir: Path) -> str | None:
    """The first node whose output, in a build that outputs every intermediate tensor, differs from the
    interpreter's on that build's own inputs (integers exactly, floats beyond REL_TOL); None if none does."""
    fixed = {v.name for v in graph.inputs} | {v.name for v in graph.outputs} | set(graph.constants)
    extra = [graph.values[o] for n in graph.nodes for o in n.outputs if o in graph.values and o not in fixed]
    build_library(replace(graph, outputs=[*graph.outputs, *extra]), target, workdir, threads, log)
    got = load(workdir).run(**feeds)
    values = {**graph.constants, **feeds, **got}
    for node in graph.nodes:
        off = kernel_divergence(node, [values[i] for i in node.inputs if i], got)
        if off is not None:
            return f"node {node.name!r} ({node.op}) output {off[0]!r} differs from the interpreter on its inputs"
    return None


def random_log(graph, target, threads: int, rng: np.random.Generator, path: Path) -> int:
    """A tuning log with one record per anchor task and per twin: a random valid config of its
    template's space at a random cost. Returns the number of records."""
    tasks = {}
    for node in graph.nodes:
        if node.task is not None and node.task.op in TEMPLATES:
            for task in (node.task, *alternatives(node.task)):
                tasks.setdefault(task.signature, task)
    records = []
    for task in tasks.values():
        tpl = template_for(task)
        space = tpl.space(task, target)
        config = next((Config(index=i, knobs=space.knobs_at(i)) for i in rng.integers(space.size, size=SAMPLE_TRIES)
                       if space.is_valid(int(i))), None) or tpl.default_config(task, target)
        cost = float(rng.lognormal(-9, 1))
        records.append(TuningRecord(
            tunaflow_version="fuzz", session_id="fuzz", trial=len(records), tuner="random", target_key=target.key,
            task_signature=task.signature, task=task, template_version=tpl.VERSION, threads=threads,
            config=Config(index=int(config.index), knobs=config.knobs), result=MeasureResult(costs=(cost,)),
            gflops=task.flops / cost / 1e9))
    if records:
        TuningLog(path).append(records)
    return len(records)


def _unsupported(exc: BaseException) -> bool:
    """An op tunaflow does not claim to support (anything else failing is a crash)."""
    return isinstance(exc, UnsupportedOpsError) or (
        isinstance(exc, BuildError) and str(exc).startswith("no kernel for these op types"))


def _error(exc: BaseException) -> str:
    where = traceback.extract_tb(exc.__traceback__)[-1]
    return f"{type(exc).__name__}: {str(exc).strip()[:400]} [{Path(where.filename).name}:{where.lineno}]"


def check(case: Case, workdir: Path, int8: bool = False, family: str = "cnn") -> Outcome:
    """Import, build (default, then tuned; with `int8`, also the default on the x86-64-avx2 preset), run and
    compare one case (with `int8`, the case quantized: statically, or dynamically for the transformer family)."""
    start = time.perf_counter()
    facts = {"anchors": 0, "winograd": 0, "halo": 0, "views": 0, "chains": 0, "ort_off": 0, "ulp_off": 0}

    def done(status: str, detail: str = "") -> Outcome:
        return Outcome(case.seed, case.index, case.description, status, detail, time.perf_counter() - start, **facts)

    host = Target.host()
    builds = [("default", host), ("tuned", host)] + ([("avx2 default", preset("x86-64-avx2"))] if int8 else [])
    stage = "quantize" if int8 else "onnxruntime"  # a failure there is the generator's bug, reported as a crash
    try:
        if int8:
            case = quantized_dynamic(case) if family == "transformer" else quantized(case)
            stage = "onnxruntime"
        want = reference(case)
        steps = output_steps(case.model)
        spec = None
        stage = "import"
        graph = optimize(load_model(case.model))
        facts["chains"] = sum(n.op == CHAIN for n in graph.nodes)
        for schedule, target in builds:
            stage = schedule
            log = None
            if schedule == "tuned":
                log = workdir / "log"
                if not random_log(graph, target, case.threads, np.random.default_rng([case.seed, case.index, 1]), log):
                    continue  # no anchor: the tuned build would be the default one
            out = workdir / schedule.replace(" ", "-")
            manifest = build_library(graph, target, out, case.threads, log)
            anchors = [op for op in manifest.ops if op.task is not None]
            facts["anchors"] = len(anchors)
            facts["halo"] += sum(op.layout is not None and "padded" in op.layout for op in anchors)
            facts["views"] += sum(op.layout is not None and "strided" in op.layout for op in anchors)
            if schedule == "tuned":
                facts["winograd"] = sum(op.task.startswith("conv2d_winograd") for op in anchors)
            got = load(out).run(**case.feeds)
            off = disagreement(got, want, steps)
            if off is not None and int8 and family == "transformer":
                stage = f"{schedule} (onnxruntime unfused)"  # its fusions (SkipLayerNormalization...) round
                unfused = reference(case, ort.GraphOptimizationLevel.ORT_ENABLE_BASIC)  # otherwise: a step flips
                if disagreement(got, unfused, steps) is None:
                    facts["ort_off"] += 1
                    continue
                off += f"; vs onnxruntime's basic level: {disagreement(got, unfused, steps)}"
            if off is not None and int8:
                stage = f"{schedule} (onnx.reference)"
                spec = spec if spec is not None else spec_outputs(case.model, case.feeds)
                if disagreement(got, spec, steps) is None:
                    facts["ort_off"] += 1
                    continue
                off += f"; vs onnx.reference: {disagreement(got, spec, steps)}"
            if off is not None and int8 and family == "transformer":
                stage = f"{schedule} (alone)"
                meaning = disagreement(interpreter.run(graph, case.feeds), want, steps)
                wrong = None if meaning else wrong_alone(graph, target, case.threads, log, case.feeds,
                                                         workdir / f"{out.name}-alone")
                if meaning is None and wrong is None:
                    facts["ulp_off"] += 1
                    continue
                off += f"; the interpreter vs onnxruntime: {meaning}" if meaning else f"; {wrong}"
            if off is not None:
                return done("mismatch", f"{schedule}: {off}")
    except Exception as exc:  # every failure is a finding, classified
        return done("unsupported" if _unsupported(exc) else "crash", f"{stage}: {_error(exc)}")
    return done("pass")


def _child(seed: int, index: int, int8: bool, family: str, conn) -> None:
    case = FAMILIES[family](seed, index)
    with tempfile.TemporaryDirectory(prefix="tf-fuzz-") as tmp:
        conn.send(check(case, Path(tmp), int8, family))
    conn.close()


def _died(seed: int, index: int, family: str, how: str, started: float) -> Outcome:
    return Outcome(seed, index, FAMILIES[family](seed, index).description, "crash", how, time.monotonic() - started)


def run_cases(seed: int, indices: Iterable[int], jobs: int = 1, timeout_s: float = 120.0,
              int8: bool = False, family: str = "cnn") -> Iterator[Outcome]:
    """Outcomes of the `family`'s cases (quantized with `int8`) as they finish, `jobs` forked processes at a
    time."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["support.fuzz_check"])
    todo = list(indices)
    running: dict = {}  # sentinel -> (process, connection, index, start)
    while todo or running:
        while todo and len(running) < jobs:
            index = todo.pop(0)
            recv, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_child, args=(seed, index, int8, family, send), daemon=True)
            proc.start()
            send.close()
            running[proc.sentinel] = (proc, recv, index, time.monotonic())
        ready = wait([*running, *(r[1] for r in running.values())], timeout=1.0)
        now = time.monotonic()
        for key, (proc, recv, index, started) in list(running.items()):
            outcome = None
            if recv in ready or key in ready:
                if recv.poll():
                    try:
                        outcome = recv.recv()
                    except EOFError:
                        pass
                if outcome is None:
                    proc.join(5)
                    if proc.exitcode is None:
                        continue
                    code = proc.exitcode
                    how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
                    outcome = _died(seed, index, family, f"process {how}", started)
            elif now - started > timeout_s:
                proc.kill()
                outcome = _died(seed, index, family, f"timeout after {timeout_s:.0f} s", started)
            else:
                continue
            proc.join(5)
            recv.close()
            del running[key]
            yield outcome


def counts(outcomes: Iterable[Outcome]) -> dict[str, int]:
    tally = dict.fromkeys(STATUSES, 0)
    for o in outcomes:
        tally[o.status] += 1
    return tally
