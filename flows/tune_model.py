"""Tune a whole model as a Prefect flow: `stages.pipeline.model.tune_model` with each step (extract, every
round's propose/build/measure/record, build-library, charts, latency) a task run, plus the UI's
artifacts. The tuning log, not Prefect's database, is the record of truth: a rerun resumes."""

from __future__ import annotations

import contextlib
from pathlib import Path

from prefect import flow
from prefect.artifacts import create_markdown_artifact

from flows.artifacts import ProgressArtifact, artifact_key, publish_chart, publish_results, resolve_target, run_name
from flows.steps import STEPS
from schemas.manifest import Manifest
from schemas.options import ImportLimits, TuningOptions
from schemas.report import ModelReport
from schemas.target import Target
from schemas.task import TuningTask
from stages.graph.tasks import ExtractedTask
from stages.pipeline import model as pipeline
from stages.report.progress import ModelProgress


@flow(name="tune-model", flow_run_name=run_name("tune-model", "model"), log_prints=True)
def tune_model(model: str, target: Target | str, options: TuningOptions, log_path: str, out: str,
               budget: int | None = None, input_shapes: dict[str, tuple[int, ...]] | None = None,
               charts_dir: str | None = None, scheduler: str = "gradient", compare_default: bool = True,
               default_out: str | None = None, progress: bool = False, verify: bool = True,
               limits: ImportLimits | None = None) -> ModelReport:
    """`budget` trials (log included; default 64 per task) over the tasks of `model`, then the library in `out`."""
    target = resolve_target(target, options.runner)

    @contextlib.contextmanager
    def view(tasks: list[ExtractedTask], total: int):
        live = ModelProgress(tasks, total, every=options.batch_size)

        def observers(t: TuningTask) -> list:
            artifact = ProgressArtifact(artifact_key("progress", t.op, t.signature),
                                        f"{t.description} on {target.name}", options.batch_size)
            return [artifact, live.observer(t)] if progress else [artifact]

        with live if progress else contextlib.nullcontext():
            yield observers

    report, manifest = pipeline.tune_model(
        Path(model), target, options, Path(log_path), Path(out), budget=budget, input_shapes=input_shapes,
        limits=limits, scheduler=scheduler, verify=verify, compare_default=compare_default,
        default_out=Path(default_out) if default_out else None, charts_dir=Path(charts_dir) if charts_dir else None,
        view=view, steps=STEPS)
    publish_results(artifact_key("results", Path(model).stem, target.name),
                    [t.model_dump() | {"task": f"{t.task} x{t.weight}"} for t in report.tasks])
    for t in report.tasks:
        png = next((p for p in report.charts if t.task_signature in Path(p).name), None)
        if png:
            publish_chart(artifact_key("convergence", t.task.split("(")[0], t.task_signature), Path(png), t.task)
    create_markdown_artifact(_build_report(report, manifest), key=artifact_key("build", Path(model).stem),
                             description=f"build report of {model}")
    return report


def _build_report(report: ModelReport, manifest: Manifest) -> str:
    lines = ["| node | op | schedule | task | from record |", "| --- | --- | --- | --- | --- |"]
    for op in manifest.ops:
        rec = f"trial {op.record['trial']} of {op.record['session_id']}" if op.record else "-"
        lines.append(f"| {op.node} | {op.op} | {op.kind} | {op.task or '-'} | {rec} |")
    head = [f"**{manifest.model}** for `{manifest.target_key}`, {manifest.threads} thread(s), "
            f"built in {manifest.build_s:.1f} s."]
    if report.fallback:
        head.append(f"Fallbacks: {report.fallback}")
    v = report.build["verify"]
    head.append(f"Checked against {v['reference']} on seeded random inputs in {v['verify_s']:.2f} s "
                f"(worst output off by {v['max_error']:.1e} of its max abs)." if v["status"] == "passed"
                else f"Not checked: {v['reason']}.")
    if report.latency:
        t, d = report.latency["tuned"]["median_ms"], report.latency["default"]["median_ms"]
        head.append(f"End-to-end latency (median): tuned {t:.3f} ms, default-schedule build {d:.3f} ms "
                    f"({d / t:.2f}x faster tuned).")
    return "\n\n".join(head) + "\n\n" + "\n".join(lines)
