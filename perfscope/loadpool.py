"""Reading many reports at once, in worker processes that take the reader's memory with them.

The report reader keeps a report's whole context alive for as long as its process lives
once per-instruction metrics are read from it (profile.load says why): about 20 MB a report,
so `perfscope diagnose` of the committed reference folder (100 files, 142 launches) held
2.1 GB in one process. ``prefetch(paths)`` reads such a list in worker processes that
each exit after BATCH reports, and hands the profiles to ``profile.load``'s memory, so
the caller's own loop reads them from there as before. A profile comes back detached
(KernelProfile.detached): its views whole, its metrics those the views and rules read by
name (rules.read_metrics), for a page its source view's reads (`pages`), and its report
reopened in this process only for anything else. With two workers that diagnose also
takes 13 s instead of 31 s and at most 0.74 GB (two cores, 2026-12-06). Workers start only
where PERFSCOPE_LOAD_WORKERS asks for them: the `perfscope` command does (WORKERS_ENV says
why a library call does not by itself).

A report a worker cannot read is left to the caller's loop, which reads it here and says
why in its own sentence; the reports of a worker that dies (the reader crashing) are read
here too, and the other batches still go to workers of their own.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
from collections.abc import Iterable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from perfscope.errors import PerfscopeError
from perfscope.locations import LOAD_WORKERS_ENV
from perfscope.manifest import manifest_beside
from perfscope.metrics import PAGE_METRICS
from perfscope.profile import KernelProfile, hand_over, load, load_key, loaded
from perfscope.reader import find_reports
from perfscope.rules import read_metrics
from perfscope.source import source_view

log = logging.getLogger(__name__)

# Below this many reports to read, workers cost more to start (each imports the reader)
# than they save, and one process holds the few contexts easily.
POOL_MIN_FILES = 8
# Reports a worker reads before it exits and returns its memory. Each worker is a pool of
# one process, shut down after its batch: ProcessPoolExecutor's own max_tasks_per_child
# deadlocks on Python 3.11 once workers start exiting, and multiprocessing.Pool never
# returns a task whose worker died.
BATCH = 12
# At most this many workers: reading is CPU work, and each holds up to BATCH contexts.
WORKERS_MAX = 8
# Workers start only where this is set: a worker imports the program's main module, which
# only an entry point that keeps its work under `if __name__ == "__main__":` survives. The
# `perfscope` command sets it to "auto" (one a CPU); a script sets it where it is guarded.
WORKERS_ENV = LOAD_WORKERS_ENV


def workers_for(files: int, env: Mapping[str, str] | None = None) -> int:
    """How many workers read this many reports: 0 reads them in this process (unset, a
    number below 2, or fewer than POOL_MIN_FILES reports)."""
    env = os.environ if env is None else env
    given = env.get(WORKERS_ENV, "").strip()
    if given == "auto":
        n = min(os.cpu_count() or 1, WORKERS_MAX)
    elif given:
        try:
            n = int(given)
        except ValueError:
            raise PerfscopeError(f"{WORKERS_ENV}={given} is neither a whole number of workers "
                                 "nor 'auto'.") from None
    else:
        n = 0
    if files < POOL_MIN_FILES or n < 2:
        return 0
    return min(n, files)


def main_importable(main: object | None = None) -> bool:
    """Whether a spawned worker can import the program's main module again, as spawn does
    before any task: by its module name, or from its file. A program read from standard
    input (`python - < script`) names a file, "<stdin>", that is not there, and every
    worker would die before its first report."""
    main = sys.modules.get("__main__") if main is None else main
    if getattr(getattr(main, "__spec__", None), "name", None) is not None:
        return True
    path = getattr(main, "__file__", None)
    return path is None or Path(path).is_file()


def _read_batch(paths: list[str], kernel: str | None, pages: bool
                ) -> list[list[KernelProfile] | None]:
    """Reports' profiles, in a worker, detached; None for one it cannot read (the caller's
    loop reads it again and says why). pages: each kernel's source view is read here too,
    from the open report, and answered again from memory where a page asks for it."""
    names = read_metrics() | frozenset(PAGE_METRICS)
    out: list[list[KernelProfile] | None] = []
    for path in paths:
        try:
            profiles = load(path, kernel)
        except PerfscopeError:
            out.append(None)
            continue
        if pages:
            manifest = manifest_beside(Path(path))
            for kp in profiles:
                if kp.correlation is not None:
                    kp.correlation.record()
                    source_view(kp, manifest.compile if manifest is not None else None)
        out.append([kp.detached(names) for kp in profiles])
    return out


def load_many(paths: Iterable[str | os.PathLike[str]], kernel: str | None = None
              ) -> list[KernelProfile]:
    """All launches of all reports under paths (files or folders); kernel filters by name
    (many reports in worker processes where WORKERS_ENV asks for them)."""
    files = find_reports(paths)
    prefetch(files, kernel)
    profiles: list[KernelProfile] = []
    for p in files:
        profiles += load(p, kernel)
    if kernel is not None and not profiles:
        raise PerfscopeError(f"no kernel matches {kernel!r} in the given reports.")
    return profiles


def prefetch(paths: Iterable[Path], kernel: str | None = None, pages: bool = False) -> int:
    """Read the reports load does not hold yet in worker processes (as many as workers_for
    says), into load's memory; returns how many were read so. pages: with each kernel's
    source view (a page will ask for it)."""
    todo = [p for p in dict.fromkeys(paths) if p.is_file() and not loaded(load_key(p, kernel))]
    workers = workers_for(len(todo))
    if not workers:
        return 0
    if not main_importable():
        log.info("reading %d reports in this process: workers could not import this "
                 "program's main module", len(todo))
        return 0
    batches = iter([todo[i:i + BATCH] for i in range(0, len(todo), BATCH)])
    # spawn: the reader's threads make fork unsafe.
    ctx = multiprocessing.get_context("spawn")
    running: dict[Future[list[list[KernelProfile] | None]], tuple[ProcessPoolExecutor, list[Path]]] = {}

    def start() -> None:
        batch = next(batches, None)
        if batch is not None:
            pool = ProcessPoolExecutor(1, mp_context=ctx)
            running[pool.submit(_read_batch, [str(p) for p in batch], kernel, pages)] = (pool, batch)

    done = 0
    try:
        for _ in range(workers):
            start()
        while running:
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in finished:
                pool, batch = running.pop(fut)
                pool.shutdown()
                try:
                    results = fut.result()
                except BrokenProcessPool:
                    log.warning("a worker stopped while reading %s and %d more reports; they "
                                "are read in this process", batch[0], len(batch) - 1)
                    results = [None] * len(batch)
                for p, profiles in zip(batch, results, strict=True):
                    if profiles is not None:
                        hand_over(load_key(p, kernel), profiles)
                        done += 1
                start()
    except OSError as exc:      # no worker could be started: read here, as with one CPU
        log.warning("reading reports in this process: no worker process started (%s)", exc)
    finally:
        for pool, _ in running.values():   # interrupted: no worker outlives the command
            pool.shutdown(wait=False, cancel_futures=True)
    return done
