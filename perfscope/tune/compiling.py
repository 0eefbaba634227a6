"""Compile configurations in parallel: NVRTC in a pool of processes, one cubin each.

NVRTC holds the GIL and one core per compile, so configurations go to a pool of
``spawn``-started processes (a fork of a process with threads can deadlock). Every compile
lands in the cubin cache (perfscope.build), which is keyed by source, options and name
expression: a rerun, or a GPU worker preparing the same configuration, reads it back for
free. Each outcome carries its own wall time, so the sum over a batch is what compiling
it serially would cost on the same host.
"""

from __future__ import annotations

import logging
import multiprocessing
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass

from perfscope.build import CompileError
from perfscope.errors import PerfscopeError
from perfscope.kernels import get_spec
from perfscope.kernels.launch import compile_stage
from perfscope.stage import ResourceUsage
from perfscope.tune.space import Config

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CompileJob:
    """One configuration of one stage in one dtype, for one target."""
    stage: str
    dtype: str
    arch: str
    config: Config


@dataclass(frozen=True)
class CompileOutcome:
    """What compiling a job gave: ptxas's resource usage, or why it did not compile."""
    job: CompileJob
    usage: ResourceUsage | None   # None: it did not compile
    reason: str                   # why it did not compile ("" when it did)
    seconds: float
    from_cache: bool


def compile_one(job: CompileJob) -> CompileOutcome:
    """Compile one configuration (or read it from the cache); never raises for bad code."""
    spec = get_spec(job.stage).with_params(**job.config.params)
    start = time.perf_counter()
    try:
        module = compile_stage(spec, job.dtype, job.arch)
    except CompileError as exc:
        return CompileOutcome(job, None, "does not compile: " + _first_error(exc.log),
                              time.perf_counter() - start, False)
    except PerfscopeError as exc:
        return CompileOutcome(job, None, str(exc), time.perf_counter() - start, False)
    return CompileOutcome(job, module.usage(spec.name_expression(job.dtype)), "",
                          time.perf_counter() - start, module.from_cache)


def _first_error(text: str) -> str:
    for line in text.splitlines():
        if "error" in line.lower():
            # "hopper.cu(123): error: static assertion failed with "...""
            return line.split("error:", 1)[-1].strip() or line.strip()
    return (text.strip().splitlines() or ["NVRTC gave no log"])[0]


class CompilePool:
    """A pool of compiler processes, kept for the whole tune (Bayesian search compiles a
    few configurations at a time); ``processes=1`` compiles in this process, serially."""

    def __init__(self, processes: int) -> None:
        self.processes = max(1, processes)
        self._pool: ProcessPoolExecutor | None = None

    def run(self, jobs: Sequence[CompileJob]) -> Iterator[CompileOutcome]:
        """The outcomes of jobs, each as soon as it is done (not in order)."""
        if self.processes == 1 or len(jobs) == 1:
            for job in jobs:
                yield compile_one(job)
            return
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.processes,
                                             mp_context=multiprocessing.get_context("spawn"))
        futures = [self._pool.submit(compile_one, job) for job in jobs]
        for future in as_completed(futures):
            yield future.result()

    def close(self) -> None:
        """Stop the compiler processes."""
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None

    def __enter__(self) -> CompilePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
