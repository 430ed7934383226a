"""Convergence charts: one PNG per task, drawn from the tuning log (the record of truth).

Blue dots are every successful trial's GFLOPS in trial order, the orange line is the best so
far, and failed trials are red crosses on the x axis. The plotted series are written beside each PNG as
JSON, for scripts and tests.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from schemas.record import REMEASURE, TuningRecord
from stages.log import TuningLog


def convergence_chart(records: list[TuningRecord], title: str, dest: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = sorted(records, key=lambda r: r.trial)
    xs = list(range(1, len(records) + 1))
    ok = [(x, r.gflops) for x, r in zip(xs, records, strict=True) if r.result.ok]
    failed = [x for x, r in zip(xs, records, strict=True) if not r.result.ok]
    best, running = [], 0.0
    for r in records:
        running = max(running, r.gflops if r.result.ok else 0.0)
        best.append(running)
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    if ok:
        ax.scatter(*zip(*ok, strict=True), s=12, color="tab:blue", label="trial")
    if failed:
        ax.scatter(failed, [0] * len(failed), marker="x", color="tab:red", label=f"failed ({len(failed)})")
    ax.step(xs, best, where="post", color="tab:orange", linewidth=2, label="best so far")
    ax.set_xlabel("trial")
    ax.set_ylabel("GFLOPS")
    ax.set_title(title, fontsize=9)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    dest.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(dest)
    plt.close(fig)
    data = {"trial": xs, "gflops": [r.gflops for r in records], "ok": [r.result.ok for r in records], "best": best}
    dest.with_suffix(".json").write_text(json.dumps(data))
    return dest


def log_charts(log: TuningLog, out_dir: Path, target_key: str | None = None, threads: int | None = None) -> list[Path]:
    """One chart per task in the log (optionally only one target / thread count)."""
    by_task: dict[str, list[TuningRecord]] = {}
    for r in log.records():
        if r.tuner == REMEASURE:
            continue
        if (target_key is None or r.target_key == target_key) and (threads is None or r.threads == threads):
            by_task.setdefault(r.task_signature, []).append(r)
    paths = []
    for sig, recs in by_task.items():
        desc = recs[0].task.description
        slug = re.sub(r"[^A-Za-z0-9]+", "_", desc).strip("_")[:60]
        title = f"{desc}  [{sig}]  {recs[0].threads} thread(s)"
        paths.append(convergence_chart(recs, title, out_dir / f"{slug}_{sig}_t{recs[0].threads}.png"))
    return paths
