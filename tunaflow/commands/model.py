"""`tunaflow build`, `tunaflow run`, `tunaflow tune`: whole models, from ONNX to a loaded library."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from tunaflow.commands.rpc import DeviceKeyOpt, RunnerKind, TokenFile, TrackerOpt, runner_choice
from tunaflow.console import err, fail, interrupted, out, prefect_env
from tunaflow.limits import DEFAULT_TENSOR_MB, MAX_THREADS, MaxConstantOpt, MaxTensorOpt, import_limits

ShapeOpt = Annotated[list[str] | None, typer.Option(
    "--input-shape", help="bind an input's (or a symbolic dim's) shape, e.g. input=1x3x224x224 or batch=1")]
TargetOpt = Annotated[str, typer.Option(help="'host', a preset, or 'llvm -mtriple=... -mcpu=...'")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON object at the end, for scripts")]
VerifyOpt = Annotated[bool, typer.Option(
    "--verify/--no-verify", help="run the library once on random inputs and fail the build unless it matches "
                                 "the ONNX model (onnxruntime, else onnx.reference)")]


def _graph(model: Path, input_shape: list[str] | None, limits=None):
    from schemas.options import ImportLimits
    from stages.extract import ModelError, load_model, parse_input_shapes
    from stages.graph.passes import optimize

    if not model.is_file():
        raise fail(f"{model}: no such model file")
    try:
        return optimize(load_model(model, parse_input_shapes(input_shape), **(limits or ImportLimits()).model_dump()))
    except ModelError as exc:
        raise fail(str(exc)) from exc


def _target(text: str):
    from schemas import Target, TargetError

    try:
        return Target.parse(text)
    except TargetError as exc:
        raise fail(str(exc)) from exc


def _build(model: Path, graph, target, output: Path, threads: int, log: Path | None, quiet: bool,
           verify: bool = True):
    from stages.build.library import BuildError
    from stages.build.verify import build_verified
    from stages.log import LogError

    if log is not None and not log.is_dir():
        raise fail(f"{log}: no tuning log there (a directory of Parquet parts); run `tunaflow tune` first")
    notes: list[str] = []
    try:
        manifest, verification = build_verified(model, graph, target, output, threads, log,
                                                on_fallback=notes.append, verify=verify)
    except (BuildError, LogError) as exc:
        raise fail(str(exc)) from exc
    if notes and not quiet:
        err.print(f"[yellow]{escape(notes[0])}[/]", highlight=False)
    return manifest, (notes[0] if notes else None), verification


def build_summary(manifest, output: Path, verification=None) -> dict:
    """What `build` and `tune` report; `verification` is the build's self-check (None: built without one)."""
    kinds: dict[str, int] = {}
    templates: dict[str, int] = {}  # anchors per implementation: which ran Winograd, which the direct kernel
    for op in manifest.ops:
        kinds[op.kind] = kinds.get(op.kind, 0) + 1
        if op.kind in ("tuned", "default") and op.task:
            name = op.task.split("(")[0]
            templates[name] = templates.get(name, 0) + 1
    return {"library": str(output), "ops": kinds, "templates": templates, "threads": manifest.threads,
            "target_key": manifest.target_key,
            "log_digest": manifest.log_digest, "workspace_bytes": manifest.workspace_bytes,
            "naive_workspace_bytes": manifest.naive_workspace_bytes, "weights_bytes": manifest.weights_bytes,
            "build_s": round(manifest.build_s, 2),
            "padded_hand_offs": sum(1 for op in manifest.ops if op.layout and "x padded" in op.layout),
            "verify": verification.summary() if verification is not None else None}


def _print_build(s: dict) -> None:
    ops = ", ".join(f"{n} {k}" for k, n in sorted(s["ops"].items()))
    out.print(f"built    : {escape(s['library'])} ({escape(ops)}; {s['threads']} thread(s); {s['build_s']:.1f} s)")
    out.print(f"memory   : workspace {s['workspace_bytes'] / 2**20:.2f} MiB (without reuse "
              f"{s['naive_workspace_bytes'] / 2**20:.2f} MiB), weights {s['weights_bytes'] / 2**20:.2f} MiB")
    if s["templates"]:
        out.print("kernels  : " + ", ".join(f"{n} x {escape(name)}" for name, n in sorted(s["templates"].items())))
    if s["padded_hand_offs"]:
        out.print(f"layout   : {s['padded_hand_offs']} conv input(s) written padded by the op before (no pack)")
    v = s["verify"]
    if v is None:
        return
    if v["status"] == "passed":
        out.print(f"verified : matches {v['reference']} on seeded random inputs (worst output off by "
                  f"{v['max_error']:.1e} of its max abs; {v['verify_s']:.2f} s, "
                  f"{v['verify_s'] / max(s['build_s'], 1e-9):.0%} of the build)")
        from stages.build.verify import REL_TOL, SPREAD_FACTOR

        if (v.get("reference_spread") or 0) * SPREAD_FACTOR > REL_TOL:
            out.print(f"           the model is ill-conditioned on these inputs: {v['spread_basis']} "
                      f"{v['reference_spread']:.1e}, so the tolerance was {SPREAD_FACTOR}x that, not {REL_TOL:g}")
    else:
        out.print(f"[yellow]not verified: {escape(v['reason'])}[/]")


def build(
    model: Annotated[Path, typer.Argument(help="the ONNX model")],
    output: Annotated[Path, typer.Option("-o", "--output", help="directory to write the library into")],
    log: Annotated[Path | None, typer.Option(help="tuning log to take the best schedules from")] = None,
    threads: Annotated[int, typer.Option(min=1, max=MAX_THREADS,
                                         help="threads the anchor kernels run with (match the log's)")] = 1,
    target: TargetOpt = "host",
    input_shape: ShapeOpt = None,
    json_out: JsonOpt = False,
    verify: VerifyOpt = True,
    max_constant_mb: MaxConstantOpt = None,
    max_tensor_mb: MaxTensorOpt = DEFAULT_TENSOR_MB,
) -> None:
    """Build MODEL into one shared library: tuned kernels where the log has them, defaults elsewhere; then
    check it against the ONNX model (OUT is only written when it matches).

    Example: tunaflow build model.onnx --log runs/cnn/log -o runs/cnn/lib
    """
    graph = _graph(model, input_shape, import_limits(max_constant_mb, max_tensor_mb))
    manifest, fallback, verification = _build(model, graph, _target(target), output, threads, log, quiet=json_out,
                                              verify=verify)
    summary = build_summary(manifest, output, verification) | {"fallback": fallback}
    if json_out:
        print(json.dumps(summary))
    else:
        _print_build(summary)


def run(
    library: Annotated[Path, typer.Argument(help="directory written by `tunaflow build`")],
    inputs: Annotated[Path | None, typer.Option(help=".npz with one array per model input (default: random)")] = None,
    output: Annotated[Path | None, typer.Option(help="write the outputs to this .npz (the suffix is added if missing)")]
    = None,
    bench: Annotated[int, typer.Option(min=0, help="time this many calls and report median / p90 latency")] = 0,
    profile: Annotated[int, typer.Option(min=0, help="time each kernel over this many runs: median per op, its share, "
                                              "and the time its record had when tuned")] = 0,
    threads: Annotated[int | None, typer.Option(min=1, max=MAX_THREADS,
                                                help="check the library was built for this many threads")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Run a built library on inputs from an .npz (and optionally time it, whole or per op).

    Example: tunaflow run runs/cnn/lib --inputs in.npz --output out.npz --bench 50 --profile 50
    """
    import numpy as np

    from stages.runtime import LoadError, load
    from stages.runtime.loader import latency_stats

    try:
        model = load(library)
    except LoadError as exc:
        raise fail(str(exc)) from exc
    if threads is not None and threads != model.manifest.threads:
        raise fail(f"{library} was built for {model.manifest.threads} thread(s); rebuild it with "
                   f"`tunaflow build ... --threads {threads}` (the kernels' threading is compiled in)")
    output = _npz_path(output) if output is not None else None
    feeds = _feeds(model, inputs)
    try:
        results = model.run(**feeds)
        stats = latency_stats(model.bench(bench, **feeds)) if bench > 0 else None
        per_op = model.profile(profile, **feeds) if profile > 0 else None
    except LoadError as exc:
        raise fail(str(exc)) from exc
    if output is not None:
        np.savez(output, **results)
    report = {"library": str(library), "outputs": {k: list(v.shape) for k, v in results.items()},
              "output_file": str(output) if output else None, "threads": model.manifest.threads, "latency": stats,
              "profile": [{"node": op.node, "op": op.op, "kind": op.kind, "task": op.task, "median_us": s * 1e6,
                           "tuned_us": op.record["median_s"] * 1e6 if op.record else None}
                          for op, s in per_op] if per_op is not None else None}
    if json_out:
        print(json.dumps(report))
        return
    for name, arr in results.items():
        out.print(f"output {escape(name)}: shape {list(arr.shape)}, mean {float(arr.mean()):.6g}, "
                  f"max {float(arr.max()):.6g}")
    if output is not None:
        out.print(f"written  : {escape(str(output))}")
    if stats:
        out.print(f"latency  : median {stats['median_ms']:.3f} ms, p90 {stats['p90_ms']:.3f} ms over "
                  f"{stats['calls']} calls ({model.manifest.threads} thread(s))")
    if report["profile"] is not None:
        _print_profile(report["profile"], profile)


def _print_profile(rows: list[dict], runs: int) -> None:
    from rich.table import Table

    total = sum(r["median_us"] for r in rows) or 1.0
    table = Table(title=f"per-op time, median of {runs} runs (sum {total:.1f} us)")
    for col in ("#", "node", "op", "kind", "us", "share", "when tuned us"):
        table.add_column(col, justify="right" if col in ("#", "us", "share", "when tuned us") else "left")
    for i, r in sorted(enumerate(rows), key=lambda ir: -ir[1]["median_us"]):
        tuned = f"{r['tuned_us']:.1f}" if r["tuned_us"] is not None else "-"
        op = r["task"].split("(")[0] if r["task"] else r["op"]  # an anchor's implementation, e.g. conv2d_winograd
        table.add_row(str(i), escape(r["node"]), escape(op), r["kind"], f"{r['median_us']:.1f}",
                      f"{r['median_us'] / total:.0%}", tuned)
    out.print(table)


def _npz_path(output: Path) -> Path:
    """Where numpy.savez really writes `output` (it adds .npz); a directory or an unwritable place is
    refused before the run."""
    path = output if output.suffix == ".npz" else output.with_name(output.name + ".npz")
    if output.is_dir() or path.is_dir():
        raise fail(f"--output {output}: is a directory; name the .npz file to write, e.g. {output / 'out.npz'}")
    if not path.parent.is_dir():
        raise fail(f"--output {output}: no directory {path.parent} to write into")
    return path


def _feeds(model, inputs: Path | None) -> dict:
    import numpy as np

    if inputs is None:
        rng = np.random.default_rng(0)
        return {i.name: rng.standard_normal(i.shape).astype(i.dtype) for i in model.inputs}
    if not inputs.is_file():
        raise fail(f"{inputs}: no such file")
    try:
        data = np.load(inputs)
        if not isinstance(data, np.lib.npyio.NpzFile):
            raise ValueError("it holds one unnamed array (a .npy), not named arrays")
        with data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise fail(f"{inputs}: not a readable .npz archive ({exc}); write one with numpy.savez") from exc
    names = [i.name for i in model.inputs]
    if set(arrays) != set(names) and len(arrays) == len(names) == 1:
        arrays = {names[0]: next(iter(arrays.values()))}
    return arrays


TRIALS_PER_TASK = 64  # the bundled CNN: 10 tasks and 5 Winograd twins, 960 trials


def default_budget(graph) -> int:
    """`tunaflow tune`'s budget when none is given: TRIALS_PER_TASK for each tunable task."""
    from stages.graph.tasks import extract_tasks
    from stages.tune.model import tunable

    return TRIALS_PER_TASK * max(1, sum(tunable([t.task])[0] for t in extract_tasks(graph)))


def tune(
    model: Annotated[Path, typer.Argument(help="the ONNX model")],
    output: Annotated[Path, typer.Option("-o", "--output", help="directory to write the library into")],
    log: Annotated[Path, typer.Option(help="tuning log directory (created if missing; a rerun resumes)")]
    = Path("tuning-log"),
    trials: Annotated[int | None, typer.Option(
        help=f"trial budget over all tasks, counting those already in the log (default: {TRIALS_PER_TASK} per "
             "tunable task, alternative implementations included)", show_default=False)] = None,
    scheduler: Annotated[str, typer.Option(help="which task gets the next batch: gradient or round-robin")]
    = "gradient",
    threads: Annotated[int, typer.Option(min=1, max=MAX_THREADS,
                                         help="threads each kernel is tuned and built with")] = 1,
    tuner: Annotated[str, typer.Option(help="search policy: lgbm, lgbm-rank, ga, random, grid")] = "lgbm",
    batch_size: Annotated[int, typer.Option(help="candidates built and measured per round and task")] = 8,
    seed: Annotated[int, typer.Option(help="seed of the search")] = 0,
    target: TargetOpt = "host",
    input_shape: ShapeOpt = None,
    json_out: JsonOpt = False,
    prefect: Annotated[bool, typer.Option("--prefect/--no-prefect", help="run as a Prefect flow or directly")]
    = True,
    runner: RunnerKind = "local",
    key: DeviceKeyOpt = None,
    tracker: TrackerOpt = "127.0.0.1:9190",
    token_file: TokenFile = None,
    verify: VerifyOpt = True,
    max_constant_mb: MaxConstantOpt = None,
    max_tensor_mb: MaxTensorOpt = DEFAULT_TENSOR_MB,
) -> None:
    """Extract MODEL's tasks, tune each one, then build the library and check it (resumable from LOG).

    Example: tunaflow tune model.onnx --trials 32 --log runs/cnn/log -o runs/cnn/lib
    """
    from pydantic import ValidationError

    from schemas import MeasureOptions, TuningOptions

    tgt = _target(target)
    if output.exists() and not output.is_dir():  # refused before the tuning, not after it
        raise fail(f"{output} is a file; the library is a directory")
    limits = import_limits(max_constant_mb, max_tensor_mb)
    if trials is None:
        trials = default_budget(_graph(model, input_shape, limits))
    try:
        spec, tgt = runner_choice(runner, key, tracker, token_file, tgt, target)
        options = TuningOptions(n_trials=trials, tuner=tuner, seed=seed, batch_size=batch_size,
                                measure=MeasureOptions(threads=threads), runner=spec)
    except (ValidationError, ValueError) as exc:
        raise fail(str(exc)) from exc
    from stages.tune.task_scheduler import SCHEDULERS

    if scheduler not in SCHEDULERS:
        raise fail(f"unknown scheduler {scheduler!r}; choose from {sorted(SCHEDULERS)}")
    try:
        result = tune_model(model, tgt, options, log, output, input_shape, prefect, quiet=json_out,
                            scheduler=scheduler, verify=verify, limits=limits)
    except KeyboardInterrupt:
        raise interrupted(log) from None
    if json_out:
        print(json.dumps(result))
    else:
        print_tune(result)


def tune_model(model: Path, target, options, log: Path, output: Path, input_shape: list[str] | None,
               prefect: bool, quiet: bool, charts_dir: Path | None = None, scheduler: str = "gradient",
               verify: bool = True, limits=None) -> dict:
    """Extract → tune → build → charts, through the Prefect flow or directly; a JSON-able report."""
    from schemas.options import ImportLimits

    limits = limits or ImportLimits()
    from stages.log import LogError, TuningLog

    try:
        TuningLog(log).records()
    except LogError as exc:
        raise fail(str(exc)) from exc
    charts_dir = charts_dir or output / "charts"
    if prefect:
        from stages.build.library import BuildError
        from stages.extract import ModelError, parse_input_shapes

        prefect_env()
        from flows.server import local_server
        from flows.tune_model import tune_model as flow

        try:
            shapes = parse_input_shapes(input_shape)
            with local_server():
                r = flow(str(model), target.to_string() if target.name != "host" else "host", options, str(log),
                         str(output), shapes, str(charts_dir), scheduler, progress=not quiet, verify=verify,
                         limits=limits)
        except (ModelError, BuildError, LogError) as exc:
            raise fail(str(exc)) from exc
        tasks, summaries, manifest, fallback, verification, charts = (
            r[k] for k in ("tasks", "summaries", "manifest", "fallback", "verification", "charts"))
    else:
        from stages.graph.tasks import extract_tasks
        from stages.report.charts import log_charts
        from stages.tune.model import tunable, tune_tasks

        graph = _graph(model, input_shape, limits)
        tasks = [t for t in extract_tasks(graph) if tunable([t.task])[0]]
        if not quiet:
            out.print(f"[bold]{escape(model.name)}[/]: {len(tasks)} task(s), {options.n_trials} trials in all "
                      f"({scheduler})")
        from stages.report.progress import ModelProgress

        with ModelProgress([t.task.description for t in tasks], options.n_trials,
                           every=options.batch_size) as view:
            try:
                summaries = tune_tasks([t.task for t in tasks], [t.weight for t in tasks], target, options,
                                       TuningLog(log), options.n_trials, scheduler,
                                       (lambda t: [] if quiet else [view.observer(t.description)]))
            except LogError as exc:  # unwritable or busy log: one line, the records already there are intact
                raise fail(str(exc)) from exc
        manifest, fallback, verification = _build(model, graph, target, output, options.measure.threads, log,
                                                  quiet=True, verify=verify)
        charts = [str(p) for p in log_charts(TuningLog(log), charts_dir, target.key, options.measure.threads)]
    if fallback and not quiet:
        err.print(f"[yellow]{escape(fallback)}[/]", highlight=False)
    built = {op.task_signature for op in manifest.ops if op.task_signature}  # of a conv and its twin, the faster
    return {
        "model": str(model), "log": str(log), "charts": charts, "fallback": fallback,
        "tasks": [{"task": t.task.description, "signature": t.task.signature, "weight": t.weight,
                   "trials": s.trials, "new_trials": s.new_trials, "best_gflops": round(s.best_gflops, 2),
                   "errors": s.errors, "built": t.task.signature in built}
                  for t, s in zip(tasks, summaries, strict=True)],
        **build_summary(manifest, output, verification),
    }


def print_tune(r: dict) -> None:
    from rich.table import Table

    table = Table(title=f"tasks of {escape(r['model'])}")
    for col in ("task", "x", "trials", "new", "best GFLOPS", "failed", "built"):
        table.add_column(col, justify="left" if col == "task" else "right")
    for t in r["tasks"]:
        table.add_row(escape(t["task"]), str(t["weight"]), str(t["trials"]), str(t["new_trials"]),
                      f"{t['best_gflops']:.1f}", str(sum(t["errors"].values())), "yes" if t["built"] else "-")
    out.print(table)
    _print_build(r)
    out.print(f"tuning log: {escape(r['log'])}")
    charts = escape(str(Path(r["charts"][0]).parent)) if r["charts"] else "(none)"
    out.print(f"charts   : {charts} ({len(r['charts'])} PNG)")
