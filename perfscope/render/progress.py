"""A rich progress display fed by ncu's own pass counter: per kernel and over kernels."""

from __future__ import annotations

from typing import Protocol

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
