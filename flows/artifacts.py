"""What a tuning run shows in the Prefect UI: live progress, a results table, convergence charts."""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from pathlib import Path

from prefect.artifacts import create_markdown_artifact, create_progress_artifact, update_progress_artifact
from prefect.runtime import flow_run

from schemas.options import MeasureOptions, RunnerSpec
from schemas.target import Target
from stages.rpc.client import RPCRunner
from stages.tune.session import TrialEvent


def resolve_target(target: Target | str, runner: RunnerSpec) -> Target:
    """A flow's target: whole from the CLI; a preset name, 'host' or an LLVM target string from a deployment
    or the UI (parsed once, here, so a preset keeps its cache sizes). With an rpc runner, 'host' is the target
    the devices under its key registered (as for the CLI's `--runner rpc`), so records are keyed on them."""
    if target == "host" and runner.kind == "rpc":
        with RPCRunner.from_spec(runner, MeasureOptions()) as rpc:
            device = rpc.device_target()
        if device is None:
            raise ValueError(f"no device under key {runner.key!r} at {runner.host}:{runner.port}: start one with "
                             f"`tunaflow runner serve --key {runner.key}`, or give the target")
        return device.model_copy(update={"name": runner.key})
    return Target.parse(target) if isinstance(target, str) else target


def run_name(kind: str, what: str) -> Callable[[], str]:
    """A flow run's name from its parameters (`what`: the op task's op or the model path) and target."""
    def name() -> str:
        params = flow_run.parameters
        subject = params[what].op if kind == "tune-op" else Path(params[what]).name
        target = params["target"]
        return f"{kind} {subject} on {target if isinstance(target, str) else target.name}"
    return name


def artifact_key(*parts: str) -> str:
    """Prefect keys allow lowercase letters, digits and dashes only."""
    return re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-")[:120]


class ProgressArtifact:
    """A session observer keeping a progress artifact up to date (once per `every` trials)."""

    def __init__(self, key: str, description: str, every: int):
        self.description = description
        self.every = every
        self.id = create_progress_artifact(0.0, key=key, description=description)

    def __call__(self, ev: TrialEvent) -> None:
        if ev.trial % self.every == 0 or ev.trial >= ev.budget:
            update_progress_artifact(self.id, 100.0 * min(1.0, ev.trial / ev.budget),
                                     description=f"{self.description}: trial {ev.trial}/{ev.budget}, "
                                                 f"best {ev.best_gflops:.1f} GFLOPS")


def results_markdown(rows: list[dict]) -> str:
    """The per-task table: best GFLOPS, latency, trials, speed-up over the default schedule."""
    lines = ["| task | trials | best GFLOPS | latency (ms) | default GFLOPS | speed-up | numpy GFLOPS |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        speedup = f"{r['speedup_over_default']:.2f}x" if r.get("speedup_over_default") else "-"
        latency = f"{r['best_latency_ms']:.3f}" if r.get("best_latency_ms") else "-"
        default = f"{r['default_gflops']:.1f}" if r.get("default_gflops") is not None else "-"
        numpy = f"{r['numpy_gflops']:.1f}" if r.get("numpy_gflops") is not None else "-"
        lines.append(f"| {r['task']} | {r['trials']} | {r['best_gflops']:.1f} | {latency} | "
                     f"{default} | {speedup} | {numpy} |")
    return "\n".join(lines)


def publish_results(key: str, rows: list[dict]) -> None:
    create_markdown_artifact(results_markdown(rows), key=key, description="tuning results per task")


def publish_chart(key: str, png: Path, title: str) -> None:
    """The chart embedded in the artifact (the UI has no access to this machine's files), plus its path."""
    data = base64.b64encode(png.read_bytes()).decode()
    md = f"### {title}\n\n![convergence](data:image/png;base64,{data})\n\nfile: `{png}`"
    create_markdown_artifact(md, key=key, description=f"convergence: {title}")
