"""Stand-ins for `perfscope tune`'s executors and workers, for tests on a machine with no GPU.

``FakeExecutor`` keeps the coordinator's side exact (the store, the strategies, pruning,
resuming) and answers every compile and trial in this process with the dry worker's
synthetic ratio, so a whole sweep runs in a fraction of a second. ``crash_after`` ends the
process with os._exit (no cleanup, like a killed coordinator) once that many outcomes have
been handed back; ``interrupt_after`` raises KeyboardInterrupt instead (Ctrl-C).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence

from perfscope.manifest import ERROR, OK, WRONG, Environment, Spread, Timing
from perfscope.stage import ResourceUsage
from perfscope.tune.compiling import CompileJob, CompileOutcome
from perfscope.tune.tasks import TrialOutcome, TrialTask, WorkerInfo
from perfscope.tune.worker import synthetic_ratio

FAKE_ENV = Environment(gpu="FAKE H200", compute_capability="9.0", sm_count=132, driver="999.01",
                       cuda_driver="13.0", cuda_runtime="13.0", nvrtc="13.0", cupy="14.0",
                       cublas="130000", cuda_bindings="13.3.1", ml_dtypes="0.5", python="3.11",
                       extra={"sm_clock_max_mhz": "1980"})


def matches(params: Mapping[str, int], patterns: Iterable[Mapping[str, int]]) -> bool:
    return any(all(params.get(k) == v for k, v in p.items()) for p in patterns)


def fake_timing(task: TrialTask, ratio: float) -> Timing:
    ref_ms = task.shape.flops / 600e12 * 1e3
    ms = ref_ms / ratio
    spread = Spread(ratio - 0.004, ratio, ratio + 0.003)
    return Timing(runs_per_round=task.runs, rounds=task.rounds, warmup=task.warmup,
                  l2_flush_bytes=512 * 2**20, time_ms=Spread(ms, ms, ms),
                  tflops=Spread(*(task.shape.flops / (ms * 1e-3) / 1e12,) * 3),
                  reference="cublas_bgemm", reference_time_ms=Spread(ref_ms, ref_ms, ref_ms),
                  reference_tflops=Spread(600.0, 600.0, 600.0), ratio_to_reference=spread,
                  round_ratios=(ratio,) * task.rounds, sm_clock_mhz=Spread(1980.0, 1980.0, 1980.0))


class FakeExecutor:
    def __init__(self, gpus: int = 1, wrong: Sequence[Mapping[str, int]] = (),
                 fail: Sequence[Mapping[str, int]] = (), spill: Sequence[Mapping[str, int]] = (),
                 crash_after: int | None = None, interrupt_after: int | None = None,
                 env: Environment = FAKE_ENV, gpu_names: Sequence[str] | None = None,
                 processes: int = 1) -> None:
        self.gpus, self.env, self.processes = gpus, env, processes
        self.wrong, self.fail, self.spill = list(wrong), list(fail), list(spill)
        self.crash_after, self.interrupt_after = crash_after, interrupt_after
        self.gpu_names = gpu_names
        self.submitted: list[TrialTask] = []
        self.compiled: list[CompileJob] = []
        self.batches: list[list[CompileJob]] = []   # each compile call's jobs
        self.pending: list[TrialTask] = []
        self.answered = 0
        self.closed = False

    def start(self) -> tuple[WorkerInfo, ...]:
        names = self.gpu_names or [self.env.gpu] * self.gpus
        return tuple(WorkerInfo(f"fake {i}", Environment(**{**self.env.__dict__, "gpu": g}),
                                232448, "sm_90a") for i, g in enumerate(names))

    @property
    def compile_processes(self) -> int:
        return self.processes

    def compile(self, jobs: Sequence[CompileJob]) -> Iterator[CompileOutcome]:
        self.batches.append(list(jobs))
        for job in jobs:
            self.compiled.append(job)
            spills = 64 if matches(job.config.params, self.spill) else 0
            yield CompileOutcome(job, ResourceUsage(168, 64, 0, spills, spills), "", 0.25, False)

    @property
    def capacity(self) -> int:
        return 2 * self.gpus

    @property
    def busy(self) -> int:
        return len(self.pending)

    def submit(self, task: TrialTask) -> None:
        self.submitted.append(task)
        self.pending.append(task)

    def outcome(self, task: TrialTask) -> TrialOutcome:
        if matches(task.params, self.wrong) and task.verify:
            return TrialOutcome(task.id, WRONG, "12 elements outside the elementwise bound", 0.3,
                                verify_s=0.01, worker="fake 0")
        if matches(task.params, self.fail):
            return TrialOutcome(task.id, ERROR, "CUDA_ERROR_LAUNCH_TIMEOUT", worker="fake 0")
        ratio = synthetic_ratio(task.stage, task.params, task.shape)
        return TrialOutcome(task.id, OK, "", 1e-4, fake_timing(task, ratio), 0.01, 0.05, "fake 0")

    def results(self, timeout: float) -> list[TrialOutcome]:
        # Checked before answering: the outcomes handed back so far are what the store holds.
        if self.crash_after is not None and self.answered >= self.crash_after:
            os._exit(9)
        if self.interrupt_after is not None and self.answered >= self.interrupt_after:
            raise KeyboardInterrupt
        out = [self.outcome(t) for t in self.pending]
        self.pending.clear()
        self.answered += len(out)
        return out

    def close(self) -> None:
        self.closed = True
