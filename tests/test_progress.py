"""The progress views: on a terminal, one live display with real totals, determinate bars, an ETA from
the measured rate and log lines above it; elsewhere (CI logs, `2> file`), plain lines."""

from __future__ import annotations

import io
import logging
import time

from rich.console import Console
from rich.progress import Progress
from support.vt import Screen

from schemas import Config, MeasureResult, matmul_task
from stages.graph.tasks import ExtractedTask
from stages.report.progress import ModelProgress, RateEta, TerminalProgress
from stages.tune.session import TrialEvent
from tunaflow.prefect_logging import ConsoleLogHandler

WIDTH = 160


def event(task, trial: int, gflops: float, best: float, budget: int = 8) -> TrialEvent:
    seconds = task.flops / (gflops * 1e9)
    return TrialEvent(task, trial, budget, Config(index=trial, knobs={}), MeasureResult(costs=(seconds,)), gflops, best)


def terminal() -> tuple[Console, io.StringIO]:
    stream = io.StringIO()
    return Console(file=stream, force_terminal=True, width=WIDTH, height=40, emoji=False), stream


A, B = matmul_task(64, 64, 64), matmul_task(128, 128, 128)


def two_tasks(twin: bool = False) -> list[ExtractedTask]:
    """A (twice in the model) and B; with `twin`, B is another implementation of A."""
    return [ExtractedTask(A, 2, ("n1", "n2")), ExtractedTask(B, 2 if twin else 1, ("n3",),
                                                              alternative_to=A.signature if twin else None)]


def test_model_progress_prints_plain_lines_off_a_terminal():
    stream = io.StringIO()
    with ModelProgress(two_tasks(), budget=6, console=Console(file=stream), every=2) as view:
        oa, ob = view.observer(A), view.observer(B)
        oa(event(A, 1, 10.0, 10.0))
        ob(event(B, 1, 20.0, 20.0))
        oa(event(A, 2, 5.0, 10.0))
        ob(event(B, 2, 30.0, 30.0))
        ob(event(B, 3, 1.0, 30.0))
        oa(event(A, 3, 12.0, 12.0))
    # A: 2 x 524288 FLOPs at 10 GFLOPS = 0.105 ms; B: 4194304 FLOPs at 20 GFLOPS = 0.210 ms
    assert stream.getvalue().splitlines() == [
        f"[2/6] {B.description} trial 1 cur 20.0 best 20.0 GFLOPS; kernels 0.315 ms",
        f"[4/6] {B.description} trial 2 cur 30.0 best 30.0 GFLOPS; kernels 0.245 ms",
        f"[6/6] {A.description} trial 3 cur 12.0 best 12.0 GFLOPS; kernels 0.227 ms",
    ]


def test_terminal_progress_plain_lines_every_batch_and_on_failure():
    stream = io.StringIO()
    with TerminalProgress(A.description, 4, console=Console(file=stream), every=2) as bar:
        bar(event(A, 1, 1.0, 1.0, 4))
        bar(event(A, 2, 2.0, 2.0, 4))
    assert stream.getvalue().splitlines() == [f"{A.description} trial 2/4 cur 2.0 GFLOPS best 2.0 GFLOPS [ok]"]


def run_model_view(console: Console, during=None) -> None:
    """Six trials over A and B (A four, B two); `during(view)` between the third and the fourth."""
    with ModelProgress(two_tasks(), budget=6, console=console) as view:
        oa, ob = view.observer(A), view.observer(B)
        for trial in (1, 2, 3):
            oa(event(A, trial, 10.0 * trial, 10.0 * trial))
        if during:
            during(view)
        oa(event(A, 4, 5.0, 30.0))
        ob(event(B, 1, 40.0, 40.0))
        ob(event(B, 2, 20.0, 40.0))


def test_model_progress_on_a_terminal_shows_real_totals_and_full_bars():
    console, stream = terminal()
    run_model_view(console)
    lines = Screen(WIDTH).feed(stream.getvalue()).lines
    assert len(lines) == 3, lines  # one copy of the display, nothing torn
    overall, a, b = lines
    # 2 x A at 30 GFLOPS (0.0350 ms) + B at 40 GFLOPS (0.105 ms)
    assert overall.startswith("all tasks") and " 6/6 " in overall and "kernels 0.14 ms" in overall, overall
    assert "eta 0:00:00" in overall
    # the budget is spent: each task's bar counts its own trials as its share
    assert a.startswith(A.description) and " 4/4 " in a and "best    30.0 GFLOPS" in a, a
    assert b.startswith(B.description) and " 2/2 " in b and "best    40.0 GFLOPS" in b, b


def test_a_twin_counts_once_in_the_estimate_at_its_faster():
    stream = io.StringIO()
    with ModelProgress(two_tasks(twin=True), budget=2, console=Console(file=stream), every=1) as view:
        view.observer(A)(event(A, 1, 10.0, 10.0))
        view.observer(B)(event(B, 1, 1000.0, 1000.0))  # the twin: as fast as A at 125 GFLOPS (8x A's FLOPs)
    first, second = stream.getvalue().splitlines()
    assert first.endswith("kernels 0.105 ms")  # 2 x A at 10 GFLOPS; the op is measured, the twin need not be
    assert second.endswith("kernels 0.00839 ms")  # 2 x the twin's 4.19 us


def test_progress_counts_toward_its_share_before_the_budget_is_spent():
    console, stream = terminal()
    with ModelProgress(two_tasks(), budget=8, console=console) as view:
        view.observer(A)(event(A, 1, 10.0, 10.0))
    overall, a, b = Screen(WIDTH).feed(stream.getvalue()).lines
    assert " 1/8 " in overall and "kernels 0.105 ms (1 of 2 ops)" in overall
    assert " 1/4 " in a and " 0/4 " in b


def test_log_lines_print_above_the_live_display():
    console, stream = terminal()
    log = logging.getLogger("tunaflow.test.progress")
    log.propagate = False
    log.addHandler(ConsoleLogHandler(console))
    run_model_view(console, during=lambda view: (log.warning("a [bold]warning[/]"), time.sleep(0.2)))
    lines = Screen(WIDTH).feed(stream.getvalue()).lines
    assert lines[0] == "a [bold]warning[/]"
    assert [line for line in lines if line.startswith("all tasks")] == [lines[1]]
    assert len(lines) == 4


def test_a_line_written_around_the_console_tears_the_display():
    """What Prefect's own console handler did (a rich console of its own on the same stream): the
    display leaves a torn copy of its rows behind, the bug the handler above fixes."""
    console, stream = terminal()
    run_model_view(console, during=lambda view: (stream.write("12:00:00.000 | INFO    | Task run 'x'\n"),
                                                 time.sleep(0.2)))
    lines = Screen(WIDTH).feed(stream.getvalue()).lines
    assert len([line for line in lines if line.startswith("all tasks")]) > 1


def test_eta_comes_from_the_rate_measured_so_far():
    progress = Progress(console=Console(file=io.StringIO()))
    row = progress.add_task("t", total=20, completed=5, new=5, since=time.monotonic() - 10.0)
    assert RateEta().render(progress.tasks[row]).plain == "eta 0:00:30"  # 5 trials in 10 s, 15 to go
    progress.update(row, new=0)
    assert RateEta().render(progress.tasks[row]).plain == "eta -:--:--"
    plain = progress.add_task("per task", total=4)
    assert RateEta().render(progress.tasks[plain]).plain == ""


def test_the_display_fits_a_narrow_terminal_and_keeps_names_whole_on_a_wide_one():
    long = matmul_task(1024, 1024, 1024)  # matmul(1024x1024,1024x1024): 25 characters
    for width, whole in ((80, False), (WIDTH, True)):
        stream = io.StringIO()
        console = Console(file=stream, force_terminal=True, width=width, height=40)
        with ModelProgress([ExtractedTask(long, 1, ("n",))], budget=960, console=console) as view:
            view.observer(long)(event(long, 1, 10.0, 10.0))
        overall, row = Screen(width).feed(stream.getvalue()).lines
        assert len(row) <= width and " 1/960 " in overall and "━" in row and "best    10.0 GFLOPS" in row, row
        assert row.startswith(long.description) == whole, row
        stream = io.StringIO()
        console = Console(file=stream, force_terminal=True, width=width, height=40)
        with TerminalProgress(long.description, 64, console=console) as bar:
            bar(event(long, 1, 10.0, 10.0, 64))
        (line,) = Screen(width).feed(stream.getvalue()).lines
        assert len(line) <= width and " 1/64 " in line and "━" in line and "eta " in line, line
        assert line.startswith(long.description) == whole, line
