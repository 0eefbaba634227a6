"""Rich progress displays: ncu's own pass counter (per kernel and over kernels), and
`perfscope tune`'s compiles and trials with an ETA."""

from __future__ import annotations

from typing import Protocol

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn


class NcuEvent(Protocol):
    """One progress event of ncu's pass counter (perfscope.ncu.Progress has this shape)."""

    kernel: str
    percent: float
    done: bool
    passes: int | None


class NcuProgress:
    """Context manager; ``update`` takes ncu.Progress events.

    Two bars: the kernel ncu is replaying now (its share of passes done), and the kernels
    done over those expected (``total``, when the caller knows it).
    """

    def __init__(self, total: int | None = None) -> None:
        self._progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                  TextColumn("{task.completed:.0f}/{task.total:.0f}"),
                                  transient=True)
        self._overall: TaskID | None = None
        self._task: TaskID | None = None
        self._total = total
        self._done = 0

    def __enter__(self) -> NcuProgress:
        self._progress.__enter__()
        if self._total:
            self._overall = self._progress.add_task("kernels profiled", total=self._total)
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.__exit__(*exc)

    def update(self, event: NcuEvent) -> None:
        """Move the bars on one ncu progress event, and log each kernel done."""
        label = f"[{self._done + 1}] {event.kernel[:60]} (% of passes)"
        if self._task is None:
            self._task = self._progress.add_task(label, total=100)
        self._progress.update(self._task, description=label, completed=event.percent)
        if event.done:
            self._done += 1
            if self._overall is not None:
                self._progress.update(self._overall, completed=self._done)
            passes = f" ({event.passes} passes)" if event.passes else ""
            self._progress.console.log(f"profiled {event.kernel[:70]}{passes}")


class TuneEvent(Protocol):
    """One progress event of a tune (perfscope.tune.workflow.TuneProgress has this shape)."""

    phase: str
    compiled: int
    to_compile: int
    pruned: int
    verified: int
    wrong: int
    errors: int
    timed: int
    done: int
    planned: int
    eta_s: float | None
    message: str


class TuneProgressBar:
    """Context manager; ``update`` takes workflow.TuneProgress events: one bar for the
    compiles of a batch, one for the trials of the phase running, with its ETA."""

    def __init__(self) -> None:
        # On stderr: stdout carries the results (JSON or Markdown with --json/--markdown).
        self._progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                  TextColumn("{task.completed:.0f}/{task.total:.0f}"),
                                  TextColumn("{task.fields[eta]}"), transient=True,
                                  console=Console(stderr=True))
        self._tasks: dict[str, TaskID] = {}

    def __enter__(self) -> TuneProgressBar:
        self._progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.__exit__(*exc)

    def _task(self, name: str, total: int) -> TaskID:
        if name not in self._tasks:
            self._tasks[name] = self._progress.add_task(name, total=max(total, 1), eta="")
        return self._tasks[name]

    def update(self, event: TuneEvent) -> None:
        """Move the bar of the event's phase, and log the profiler's messages."""
        if event.phase == "compile":
            task = self._task("compiled", event.to_compile)
            self._progress.update(task, completed=event.compiled, total=max(event.to_compile, 1),
                                  description=f"compiled ({event.pruned} pruned)")
        elif event.phase in ("search", "confirm"):
            task = self._task(event.phase, event.planned)
            eta = f"ETA {event.eta_s:.0f} s" if event.eta_s is not None else ""
            label = (f"{event.phase}: {event.verified} verified, {event.wrong} wrong, "
                     f"{event.errors} failed, {event.timed} timed")
            self._progress.update(task, completed=event.done, total=max(event.planned, 1),
                                  description=label, eta=eta)
            if event.message:
                self._progress.update(self._task("last", 1), description=event.message[:100],
                                      completed=1)
        elif event.phase == "profile" and event.message:
            self._progress.console.log(event.message)
