"""What travels between the coordinator and a GPU worker, as values with a JSON form.

A worker is another process (a local child with one ``CUDA_VISIBLE_DEVICES``, or a Ray
task), so a task and its outcome are plain JSON: the same encoding serves the local
pipe and Ray's object store.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from perfscope.kernels.spec import Shape
from perfscope.manifest import Environment, Timing
from perfscope.timing import BenchOptions

SCREEN = "screen"    # every configuration: verified, then timed briefly
CONFIRM = "confirm"  # the best few per shape (and the default): timed again, longer
PHASES = (SCREEN, CONFIRM)


@dataclass(frozen=True)
class TrialTask:
    """Verify (when asked) and time one configuration at one shape against cuBLAS."""

    id: int
    stage: str
    dtype: str
    m: int
    n: int
    k: int
    params: dict[str, int]
    arch: str
    phase: str = SCREEN
    verify: bool = True
    runs: int = 10
    rounds: int = 2
    warmup: int = 2
    seed: int = 0
    until: float | None = None      # bench --until's stopping rule (None: `rounds` rounds)
    max_rounds: int = 15

    @property
    def shape(self) -> Shape:
        """The GEMM shape."""
        return Shape(self.m, self.n, self.k)

    def bench_options(self) -> BenchOptions:
        """The timing options this task asks for."""
        return BenchOptions(runs=self.runs, rounds=self.rounds, warmup=self.warmup, seed=self.seed,
                            until=self.until, max_rounds=self.max_rounds)

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialTask:
        """Rebuilt from to_dict()'s form."""
        return cls(**data)


@dataclass(frozen=True)
class TrialOutcome:
    """What a worker found: the verdict, and a timing only for a verified configuration."""

    task_id: int
    verdict: str                     # ok / WRONG / error (perfscope.manifest verdicts)
    detail: str = ""
    rel_error: float | None = None
    timing: Timing | None = None
    verify_s: float = 0.0
    time_s: float = 0.0
    worker: str = ""
    # The CUDA context is broken (an illegal address...): the worker is replaced.
    fatal: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialOutcome:
        """Rebuilt from to_dict()'s form."""
        d = dict(data)
        if d.get("timing") is not None:
            d["timing"] = Timing.from_dict(d["timing"])
        return cls(**d)


@dataclass(frozen=True)
class WorkerInfo:
    """One worker as it introduced itself: which GPU, and what it runs with."""

    name: str                         # "gpu 0", "ray gpu 1", "dry 0"
    environment: Environment
    smem_per_block: int | None = None  # cudaDevAttrMaxSharedMemoryPerBlockOptin
    arch: str | None = None           # the cubin target of its GPU (sm_90a)

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorkerInfo:
        """Rebuilt from to_dict()'s form."""
        d = dict(data)
        d["environment"] = Environment(**d["environment"])
        return cls(**d)
