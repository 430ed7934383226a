"""The terminal views stay readable in CI logs: plain lines when the stream is not a terminal."""

import io

from schemas import Config, MeasureResult, matmul_task
from stages.report.progress import ModelProgress, TerminalProgress
from stages.tune.session import TrialEvent


def event(task, trial: int, gflops: float, best: float, budget: int = 8) -> TrialEvent:
    return TrialEvent(task, trial, budget, Config(index=trial, knobs={}), MeasureResult(costs=(1.0,)), gflops, best)


def test_model_progress_prints_overall_and_per_task_lines():
    a, b = matmul_task(4, 4, 4), matmul_task(8, 8, 8)
    stream = io.StringIO()
    with ModelProgress([a.description, b.description], budget=6, stream=stream, every=2) as view:
        oa, ob = view.observer(a.description), view.observer(b.description)
        oa(event(a, 1, 10.0, 10.0))
        ob(event(b, 1, 20.0, 20.0))
        oa(event(a, 2, 5.0, 10.0))
        ob(event(b, 2, 30.0, 30.0))
        ob(event(b, 3, 1.0, 30.0))
        oa(event(a, 3, 12.0, 12.0))
    lines = stream.getvalue().splitlines()
    assert lines == [
        f"[2/6] {b.description} trial 1 cur 20.0 best 20.0 GFLOPS",
        f"[4/6] {b.description} trial 2 cur 30.0 best 30.0 GFLOPS",
        f"[6/6] {a.description} trial 3 cur 12.0 best 12.0 GFLOPS",
    ]


def test_terminal_progress_plain_lines_every_batch_and_on_failure():
    t = matmul_task(4, 4, 4)
    stream = io.StringIO()
    with TerminalProgress(t.description, 4, stream=stream, every=2) as bar:
        bar(event(t, 1, 1.0, 1.0, 4))
        bar(event(t, 2, 2.0, 2.0, 4))
    assert stream.getvalue().splitlines() == [f"{t.description} trial 2/4 cur 2.0 GFLOPS best 2.0 GFLOPS [ok]"]
