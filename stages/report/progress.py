"""Live progress for a tuning session: a rich bar on a terminal, plain lines in CI logs."""

from __future__ import annotations

import sys
from typing import Self, TextIO

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from stages.tune.session import TrialEvent


class _LiveView:
    """Starts and stops the rich display, when there is one (a terminal)."""

    _progress: Progress | None

    def __enter__(self) -> Self:
        if self._progress:
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress:
            self._progress.stop()


class TerminalProgress(_LiveView):
    """An observer; use as a context manager around the session."""

    def __init__(self, description: str, total: int, stream: TextIO | None = None, every: int = 8):
        self.stream = stream or sys.stderr
        self.console = Console(file=self.stream, emoji=False)
        self.live = self.console.is_terminal
        self.every = every
        self.description = description
        self._progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("cur {task.fields[cur]:>7.1f} GFLOPS  best {task.fields[best]:>7.1f} GFLOPS"),
            TimeElapsedColumn(), TimeRemainingColumn(), console=self.console,
        ) if self.live else None
        self._id = (self._progress.add_task(escape(description), total=total, cur=0.0, best=0.0)
                    if self._progress else None)

    def __call__(self, ev: TrialEvent) -> None:
        if self._progress is not None:
            self._progress.update(self._id, completed=ev.trial, total=ev.budget, cur=ev.gflops, best=ev.best_gflops)
            return
        if ev.trial % self.every == 0 or ev.trial == ev.budget or not ev.result.ok:
            status = "ok" if ev.result.ok else ev.result.error_no.name
            print(f"{self.description} trial {ev.trial}/{ev.budget} cur {ev.gflops:.1f} GFLOPS "
                  f"best {ev.best_gflops:.1f} GFLOPS [{status}]", file=self.stream, flush=True)


class ModelProgress(_LiveView):
    """Live view of a model's tuning: one row per task (trials, current and best GFLOPS) and an
    overall bar against the global budget with its ETA; plain lines when not on a terminal."""

    def __init__(self, descriptions: list[str], budget: int, stream: TextIO | None = None, every: int = 8):
        self.stream = stream or sys.stderr
        self.console = Console(file=self.stream, emoji=False)
        self.budget = budget
        self.every = every
        self.trials: dict[str, int] = dict.fromkeys(descriptions, 0)
        self._events = 0
        self._progress = Progress(
            TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed:>5.0f} trials"),
            TextColumn("cur {task.fields[cur]:>7.1f}  best {task.fields[best]:>7.1f} GFLOPS"),
            TimeRemainingColumn(), console=self.console,
        ) if self.console.is_terminal else None
        self._rows: dict[str, object] = {}
        if self._progress is not None:
            self._overall = self._progress.add_task("[bold]all tasks", total=budget, cur=0.0, best=0.0)
            for d in descriptions:
                self._rows[d] = self._progress.add_task(escape(d), total=None, cur=0.0, best=0.0)

    def observer(self, description: str):
        """The observer to hand the session of the task with this description."""

        def observe(ev: TrialEvent) -> None:
            self.trials[description] = ev.trial
            self._events += 1
            done = sum(self.trials.values())
            if self._progress is not None:
                self._progress.update(self._rows[description], completed=ev.trial, cur=ev.gflops,
                                      best=ev.best_gflops)
                self._progress.update(self._overall, completed=min(done, self.budget))
            elif self._events % self.every == 0 or done >= self.budget:
                print(f"[{min(done, self.budget)}/{self.budget}] {description} trial {ev.trial} "
                      f"cur {ev.gflops:.1f} best {ev.best_gflops:.1f} GFLOPS", file=self.stream, flush=True)

        return observe
