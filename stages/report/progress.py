"""Live progress of a tuning session: a rich display on a terminal, an occasional plain line elsewhere.

Both views print on the shared stderr console (`stages/report/terminal.py`) unless given another, so
stdout keeps only a command's result (`--json`) and anything else printed on that console while the
display is live (Prefect's warnings, a message) lands above it. The ETA comes from the rate measured
in this run: rich's own estimate looks at the last few updates, and a batch's trials arrive within
milliseconds of each other, so it read 0:00:01 with half the run to go.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Self

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Column
from rich.text import Text

from schemas.task import TuningTask
from stages.graph.tasks import ExtractedTask
from stages.report.terminal import STDERR
from stages.tune.session import Observer, TrialEvent


class RateEta(ProgressColumn):
    """Time left at the rate measured so far (trials of this run per second since the view started),
    for rows that carry `new` (trials measured in this run) and `since` (when the view started)."""

    def render(self, task: Task) -> Text:
        if "since" not in task.fields:
            return Text("")
        elapsed, new = time.monotonic() - task.fields["since"], task.fields["new"]
        if task.total is None or new == 0 or elapsed <= 0:
            return Text("eta -:--:--", style="progress.remaining")
        left = max(0.0, task.total - task.completed) * elapsed / new
        return Text(f"eta {timedelta(seconds=round(left))}", style="progress.remaining")


class _LiveView:
    """Starts and stops the rich display when the console is a terminal, and starts the rate clock."""

    _progress: Progress | None
    _timed: TaskID | None  # the row showing the ETA

    def __init__(self, console: Console | None, every: int):
        self.console = console or STDERR
        self.live = self.console.is_terminal
        self.every = every
        self.new = 0  # trials measured since the view started
        self.since = time.monotonic()

    def __enter__(self) -> Self:
        self.since = time.monotonic()
        if self._progress is not None:
            if self._timed is not None:
                self._progress.update(self._timed, since=self.since)
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def line(self, text: str) -> None:
        """One plain line (no markup, never wrapped or cut), for a console that is not a terminal."""
        self.console.print(Text(text), soft_wrap=True)


class TerminalProgress(_LiveView):
    """One task's trials against its budget; an observer, used as a context manager around the session."""

    def __init__(self, description: str, total: int, console: Console | None = None, every: int = 8):
        super().__init__(console, every)
        self.description = description
        columns = [MofNCompleteColumn(table_column=_fixed()), TextColumn("{task.fields[stats]}", table_column=_fixed()),
                   TimeElapsedColumn(table_column=_fixed()), RateEta(table_column=_fixed())]
        width = len(f"{total}/{total}") + len(_stats(0.0, 0.0)) + len("0:00:00") + len("eta 0:00:00")
        self._progress = Progress(*_fitted(self.console, [description], columns, width, "[bold]{task.description}"),
                                  console=self.console) if self.live else None
        self._timed = (self._progress.add_task(escape(description), total=total, stats=_stats(0.0, 0.0), new=0,
                                               since=self.since) if self._progress else None)

    def __call__(self, ev: TrialEvent) -> None:
        self.new += 1
        if self._progress is not None:
            self._progress.update(self._timed, completed=ev.trial, total=ev.budget, new=self.new,
                                  stats=_stats(ev.gflops, ev.best_gflops))
            return
        if ev.trial % self.every == 0 or ev.trial == ev.budget or not ev.result.ok:
            status = "ok" if ev.result.ok else ev.result.error_no.name
            self.line(f"{self.description} trial {ev.trial}/{ev.budget} cur {ev.gflops:.1f} GFLOPS "
                      f"best {ev.best_gflops:.1f} GFLOPS [{status}]")


class ModelProgress(_LiveView):
    """A model's tuning: an "all tasks" row (trials against the global budget, the estimated time of the
    model's tuned kernels, the ETA) over one row per task (its trials against an even share of the
    budget, current and best GFLOPS). A plain line every `every` trials when not on a terminal.

    The estimate is the sum over the model's ops of occurrences x the fastest time measured so far of
    the op or of an alternative implementation of it (a conv and its Winograd twin: the build runs
    the faster), over the ops measured so far."""

    def __init__(self, tasks: Sequence[ExtractedTask], budget: int, console: Console | None = None,
                 every: int = 8):
        super().__init__(console, every)
        self.budget = budget
        self.tasks = {t.task.signature: t for t in tasks}
        self.trials: dict[str, int] = dict.fromkeys(self.tasks, 0)
        self.best_s: dict[str, float] = {}  # per task signature, its fastest time so far
        self.share = math.ceil(budget / max(1, len(tasks)))
        columns = [MofNCompleteColumn(table_column=_fixed()), TextColumn("{task.fields[stats]}", table_column=_fixed()),
                   RateEta(table_column=_fixed())]
        width = len(f"{budget}/{budget}") + len(_stats(0.0, 0.0)) + len("eta 0:00:00")
        self._progress = Progress(*_fitted(self.console, [t.task.description for t in tasks], columns, width),
                                  console=self.console) if self.live else None
        self._rows: dict[str, TaskID] = {}
        self._timed = None
        if self._progress is not None:
            self._timed = self._progress.add_task("[bold]all tasks", total=budget, stats=self.estimate(),
                                                    new=0, since=self.since)
            for t in tasks:
                self._rows[t.task.signature] = self._progress.add_task(escape(t.task.description), total=self.share,
                                                                       stats=_stats(0.0, 0.0))

    @property
    def done(self) -> int:
        return min(sum(self.trials.values()), self.budget)

    def estimate(self) -> str:
        """The model's tuned kernels, estimated from the best times so far: "kernels 0.412 ms" (three digits)."""
        fastest: dict[str, tuple[int, float]] = {}  # per op (the signature it is an alternative to)
        for sig, seconds in self.best_s.items():
            t = self.tasks[sig]
            op = t.alternative_to or sig
            if op not in fastest or seconds < fastest[op][1]:
                fastest[op] = (t.weight, seconds)
        ops = {t.alternative_to or sig for sig, t in self.tasks.items()}
        ms = sum(w * s for w, s in fastest.values()) * 1e3
        text = f"kernels {ms:.3g} ms" if ms < 1000 else f"kernels {ms:.0f} ms"
        text = text if fastest else "kernels -"
        return text if len(fastest) == len(ops) else f"{text} ({len(fastest)} of {len(ops)} ops)"

    def observer(self, task: TuningTask) -> Observer:
        """The observer to hand the session of `task` (one of the view's tasks)."""
        sig = task.signature
        if sig not in self.tasks:
            raise ValueError(f"{task.description} is not one of the tasks this view shows")

        def observe(ev: TrialEvent) -> None:
            self.trials[sig] = ev.trial
            self.new += 1
            if ev.best_gflops > 0:
                self.best_s[sig] = ev.task.flops / (ev.best_gflops * 1e9)
            if self._progress is not None:
                self._update(sig, ev)
            elif self.new % self.every == 0 or self.done >= self.budget:
                self.line(f"[{self.done}/{self.budget}] {ev.task.description} trial {ev.trial} cur {ev.gflops:.1f} "
                          f"best {ev.best_gflops:.1f} GFLOPS; {self.estimate()}")

        return observe

    def _update(self, sig: str, ev: TrialEvent) -> None:
        assert self._progress is not None
        self._progress.update(self._rows[sig], completed=ev.trial, total=max(self.share, ev.trial),
                              stats=_stats(ev.gflops, ev.best_gflops))
        self._progress.update(self._timed, completed=self.done, stats=self.estimate(), new=self.new)
        if self.done >= self.budget:  # the budget is spent: each task got what it gets, its bar is full
            for s, row in self._rows.items():
                self._progress.update(row, total=max(1, self.trials[s]))


def _stats(cur: float, best: float) -> str:
    return f"cur {cur:>7.1f}  best {best:>7.1f} GFLOPS"



def _fitted(console: Console, names: list[str], columns: list[ProgressColumn], width: int,
            name_format: str = "{task.description}") -> list[ProgressColumn]:
    """A name and a bar before `columns` (`width` cells in all), on one line of the console: the bar
    gives way (down to 10 cells) before a name is cut short."""
    room = console.width - width - len(columns) - 1  # a space between two columns
    bar = max(10, min(40, room - max(map(len, names), default=0)))
    name = Column(no_wrap=True, overflow="ellipsis", max_width=max(10, room - bar))
    return [TextColumn(name_format, table_column=name), BarColumn(bar_width=bar), *columns]


def _fixed() -> Column:
    return Column(no_wrap=True)
