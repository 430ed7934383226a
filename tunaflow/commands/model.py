"""`tunaflow build`, `tunaflow run`, `tunaflow tune`: whole models, from ONNX to a loaded library."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from tunaflow import runs
from tunaflow.commands.refine import TopKOpt, print_refine
from tunaflow.commands.rpc import DeviceKeyOpt, RunnerKind, TokenFile, TrackerOpt, runner_choice
from tunaflow.console import err, fail, interrupted, out
from tunaflow.limits import DEFAULT_TENSOR_MB, MAX_THREADS, MaxConstantOpt, MaxTensorOpt, import_limits

ShapeOpt = Annotated[list[str] | None, typer.Option(
    "--input-shape", help="bind an input's (or a symbolic dim's) shape, e.g. input=1x3x224x224 or batch=1")]
TargetOpt = Annotated[str, typer.Option(help="'host', a preset, or 'llvm -mtriple=... -mcpu=...'")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON object at the end, for scripts")]
VerifyOpt = Annotated[bool, typer.Option(
    "--verify/--no-verify", help="run the library once on random inputs and fail the build unless it matches "
                                 "the ONNX model (onnxruntime, else onnx.reference)")]


def _shapes(input_shape: list[str] | None) -> dict[str, tuple[int, ...]]:
    from schemas.errors import ModelError
    from stages.extract import parse_input_shapes

    try:
        return parse_input_shapes(input_shape)
    except ModelError as exc:
        raise fail(str(exc)) from exc


def _graph(model: Path, input_shape: list[str] | None, limits=None):
    from schemas.errors import ModelError
    from stages.pipeline.model import load_graph

    if not model.is_file():
        raise fail(f"{model}: no such model file")
    try:
        return load_graph(model, _shapes(input_shape), limits)
    except ModelError as exc:
        raise fail(str(exc)) from exc


def _target(text: str):
    from schemas import Target, TargetError

    try:
        return Target.parse(text)
    except TargetError as exc:
        raise fail(str(exc)) from exc


def _build(model: Path, graph, target, output: Path, threads: int, log: Path | None, quiet: bool,
           verify: bool = True) -> dict:
    from stages.build.library import BuildError
    from stages.log import LogError
    from stages.pipeline.model import build_checked
    from stages.report.summary import build_summary

    if log is not None and not log.is_dir():
        raise fail(f"{log}: no tuning log there (a directory of Parquet parts); run `tunaflow tune` first")
    try:
        manifest, fallback, verification = build_checked(str(model), graph, target, str(output), threads,
                                                         str(log) if log else None, verify)
    except (BuildError, LogError) as exc:
        raise fail(str(exc)) from exc
    if fallback and not quiet:
        err.print(f"[yellow]{escape(fallback)}[/]", highlight=False)
    return build_summary(manifest, output, verification) | {"fallback": fallback}


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
    summary = _build(model, graph, _target(target), output, threads, log, quiet=json_out, verify=verify)
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
    alone: Annotated[bool, typer.Option("--alone", help="with --profile: also time each tuned anchor's kernel alone "
                                                        "through the tuner's runner (interleaved), to tell why")]
    = False,
    log: Annotated[Path | None, typer.Option(help="with --profile: the tuning log the records came from (default: "
                                                  "the one the manifest names)")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Run a built library on inputs from an .npz (and optionally time it, whole or per op; --profile flags
    every tuned anchor more than 5% off the time its record says, with what can be told about why).

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
    if log is not None and not log.is_dir():
        raise fail(f"--log {log}: no tuning log there (a directory of Parquet parts)")
    try:
        results = model.run(**feeds)
        stats = latency_stats(model.bench(bench, **feeds)) if bench > 0 else None
        deployed = _deployed(model, profile, feeds, log, alone) if profile > 0 else None
    except LoadError as exc:
        raise fail(str(exc)) from exc
    if output is not None:
        np.savez(output, **results)
    report = {"library": str(library), "outputs": {k: list(v.shape) for k, v in results.items()},
              "output_file": str(output) if output else None, "threads": model.manifest.threads, "latency": stats,
              "profile": deployed["profile"] if deployed else None,
              "deployed": deployed["summary"] if deployed else None}
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
        _print_profile(report["profile"], report["deployed"], profile)


def _deployed(model, runs: int, feeds: dict, log: Path | None, alone: bool) -> dict:
    """Per op: its median in the model; per tuned anchor also its record's time and the verdict
    (stages/runtime/deployed.py), with --alone its kernel timed alone too, interleaved with the profile."""
    import numpy as np

    from stages.measure import noise
    from stages.runtime import deployed

    records = deployed.chosen_records(model.manifest, log)
    start = noise.sample()
    if alone:
        ops, samples, times = deployed.profile_and_time_alone(model, runs, feeds, records)
    else:
        (ops, samples), times = model.profile_samples(runs, **feeds), None
    window = noise.between(start, noise.sample())
    verdicts = deployed.anchor_times(model.manifest, ops, samples, records, times, window)
    by_node = {v.node: v for v in verdicts}
    rows = []
    for i, op in enumerate(ops):
        v = by_node.get(op.node)
        rows.append({"node": op.node, "op": op.op, "kind": op.kind, "task": op.task,
                     "median_us": float(np.median(samples[:, i])) * 1e6,
                     "tuned_us": op.record["median_s"] * 1e6 if op.record else None}
                    | (v.model_dump(exclude={"node", "task", "tuned_us"}) if v else {}))
    return {"profile": rows, "summary": deployed.summary(verdicts) | {
        "tolerance": deployed.TOLERANCE, "rounds": deployed.ROUNDS, "records_found": len(records),
        "noise": window.model_dump() if window else None}}


def _print_profile(rows: list[dict], summary: dict, runs: int) -> None:
    from rich.table import Table

    total = sum(r["median_us"] for r in rows) or 1.0
    table = Table(title=f"per-op time, median of {runs} runs (sum {total:.1f} us)")
    cols = ("#", "node", "op", "kind", "us", "share", "when tuned us", "in model / tuned")
    for col in cols:
        table.add_column(col, justify="left" if col in ("node", "op", "kind") else "right")
    for i, r in sorted(enumerate(rows), key=lambda ir: -ir[1]["median_us"]):
        tuned = f"{r['tuned_us']:.1f}" if r["tuned_us"] is not None else "-"
        ratio = f"{r['ratio']:.2f}" + (" off" if r["off"] else "") if "ratio" in r else "-"
        op = r["task"].split("(")[0] if r["task"] else r["op"]  # an anchor's implementation, e.g. conv2d_winograd
        table.add_row(str(i), escape(r["node"]), escape(op), r["kind"], f"{r['median_us']:.1f}",
                      f"{r['median_us'] / total:.0%}", tuned, f"[yellow]{ratio}[/]" if r.get("off") else ratio)
    out.print(table)
    if not summary["anchors"]:
        return
    out.print(f"in model / tuned: the fastest of {summary['rounds']} rounds' medians against the record's figure (the "
              f"tuner's rule); median {summary['median_ratio']:.2f} over {summary['anchors']} tuned anchor(s), "
              f"{summary['off']} off by more than {summary['tolerance']:.0%}")
    for r in rows:
        if r.get("off"):
            alone = (f", alone {r['alone_us']:.1f} us the tuner's way, {r['alone_call_us']:.1f} per call, "
                     f"{r['alone_cold_us']:.1f} cold" if r.get("alone_us") else "")
            out.print(f"  {escape(r['node'])} ({r['deployed_us']:.1f} us in the model, {r['tuned_us']:.1f} when "
                      f"tuned{alone}): {escape('; '.join(r['reasons']))}")


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

    if inputs is None:  # seeded, and valid: token ids within their table, masks with padding
        from stages.runtime.compare import random_feeds

        return random_feeds(model)
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


def tune(
    model: Annotated[Path, typer.Argument(help="the ONNX model")],
    output: Annotated[Path, typer.Option("-o", "--output", help="directory to write the library into")],
    log: Annotated[Path, typer.Option(help="tuning log directory (created if missing; a rerun resumes)")]
    = Path("tuning-log"),
    trials: Annotated[int | None, typer.Option(
        help="trial budget over all tasks, counting those already in the log (default: 64 per "
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
    refine_top_k: TopKOpt = 3,
    max_constant_mb: MaxConstantOpt = None,
    max_tensor_mb: MaxTensorOpt = DEFAULT_TENSOR_MB,
) -> None:
    """Extract MODEL's tasks, tune each one, time each op's top records inside the model (`refine`), then build
    the library and check it (resumable from LOG).

    Example: tunaflow tune model.onnx --trials 32 --log runs/cnn/log -o runs/cnn/lib
    """
    from pydantic import ValidationError

    from schemas import MeasureOptions, TuningOptions

    tgt = _target(target)
    if output.exists() and not output.is_dir():  # refused before the tuning, not after it
        raise fail(f"{output} is a file; the library is a directory")
    if not model.is_file():
        raise fail(f"{model}: no such model file")
    try:
        spec, tgt = runner_choice(runner, key, tracker, token_file, tgt, target)
        options = TuningOptions(**({} if trials is None else {"n_trials": trials}), tuner=tuner, seed=seed,
                                batch_size=batch_size, measure=MeasureOptions(threads=threads), runner=spec,
                                refine_top_k=refine_top_k)
    except (ValidationError, ValueError) as exc:
        raise fail(str(exc)) from exc
    from stages.tune.task_scheduler import SCHEDULERS

    if scheduler not in SCHEDULERS:
        raise fail(f"unknown scheduler {scheduler!r}; choose from {sorted(SCHEDULERS)}")
    try:
        report = runs.tune_model(model, tgt, options, log, output, prefect=prefect, progress=True, budget=trials,
                                 input_shapes=_shapes(input_shape), scheduler=scheduler, verify=verify,
                                 limits=import_limits(max_constant_mb, max_tensor_mb))
    except KeyboardInterrupt:
        raise interrupted(log) from None
    if json_out:
        print(json.dumps(report_json(report)))
    else:
        if report.fallback:
            err.print(f"[yellow]{escape(report.fallback)}[/]", highlight=False)
        print_tune(report)


def report_json(report) -> dict:
    """`tune --json`: the report with the library's summary at the top level, as `build --json` prints it."""
    return report.model_dump(mode="json", exclude={"build"}) | report.build


def print_tune(r) -> None:
    from rich.table import Table

    from tunaflow.commands.tune_op import noise_text

    table = Table(title=f"tasks of {escape(r.model)}")
    for col in ("task", "x", "trials", "new", "best GFLOPS", "default", "CV", "failed", "built"):
        table.add_column(col, justify="left" if col == "task" else "right")
    for t in r.tasks:
        default = f"{t.default_gflops:.1f}" if t.default_gflops is not None else "-"
        cv = t.rounds_cv if t.rounds_cv is not None else t.repeat_cv
        cv_text = ("-" if cv is None else f"{cv:.1%}") + (" unstable" if t.unstable else "")
        table.add_row(escape(t.task), str(t.weight), str(t.trials), str(t.new_trials), f"{t.best_gflops:.1f}",
                      default, cv_text, str(sum(t.errors.values())), "yes" if t.built else "-")
    out.print(table)
    for t in r.tasks:
        if t.noise is not None or t.unstable:
            out.print(f"noise {escape(t.task)}: {escape(noise_text(t))}")
    if r.refine is not None:
        print_refine(r.refine)
    _print_build(r.build)
    out.print(f"tuning log: {escape(r.log)}")
    charts = escape(str(Path(r.charts[0]).parent)) if r.charts else "(none)"
    out.print(f"charts   : {charts} ({len(r.charts)} PNG)")
