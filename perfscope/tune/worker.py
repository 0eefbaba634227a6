"""The process that verifies and times configurations on one GPU.

    python -m perfscope.tune.worker [--dry] [--name NAME]

It speaks JSON lines: it first writes ``{"hello": WorkerInfo}`` (or ``{"error": sentence}``
when it cannot start), then reads ``{"task": TrialTask}`` lines from stdin and answers
each with ``{"outcome": TrialOutcome}``; ``{"op": "exit"}`` or the end of stdin ends it.
Anything a library prints goes to stderr, never into the protocol.

Per task: prepare the configuration (its cubin is normally in the cache already), verify
it against the float64 reference (made once per shape and dtype and kept for the next
configurations), and only when it is right time it against cuBLAS in alternating rounds
in this process with L2 flushed (perfscope.timing). A configuration that breaks the CUDA
context is answered as an error with ``fatal`` set, and the process exits so the
coordinator starts a fresh one. On Ray the same session lives in a ``RayWorker`` actor, one
per GPU.

``--dry`` does everything but launch: it compiles (prune and record happen in the
coordinator) and answers a synthetic, deterministic timing, for CI machines without a
GPU. Its results carry the GPU name ``DRY_GPU`` so they can never pass for a measurement.

This process runs kernels with CuPy, so it must never load Nsight Compute's report reader
(perfscope.profile, the rules, the renderers).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import sys
import time
import traceback
from collections import OrderedDict
from typing import Any, TextIO

from perfscope.bench import is_context_fatal, one_line, reference_spec
from perfscope.build import nvrtc_version
from perfscope.environment import collect_environment
from perfscope.kernels import get_spec
from perfscope.kernels.launch import Prepared, compile_stage, device_arch, prepare, require_gpu
from perfscope.kernels.spec import KernelSpec, Shape
from perfscope.manifest import ERROR, OK, Environment, Spread, Timing, Verification
from perfscope.timing import time_stage
from perfscope.tune.store import DRY_GPU
from perfscope.tune.tasks import TrialOutcome, TrialTask, WorkerInfo
from perfscope.verify import Reference, reference, verify

log = logging.getLogger("perfscope.tune.worker")

# Float64 references kept per worker: each is A, B, A·B and |A|·|B| of one shape (1.5 GB
# at 8192^3), so a few, for a search that visits its shapes one after another.
REFERENCES_KEPT = 3


class GpuSession:
    """One GPU, its CuPy context, and what is reused from one configuration to the next."""

    def __init__(self, name: str) -> None:
        self.cp = require_gpu()
        self.name = name
        self.env = collect_environment(self.cp)
        self.arch, _ = device_arch(self.cp)
        self._references: OrderedDict[tuple, Reference] = OrderedDict()
        self._cublas: dict[tuple, tuple[Prepared, Verification]] = {}

    def info(self) -> WorkerInfo:
        """How this worker introduces itself to the coordinator."""
        smem = self.cp.cuda.Device().attributes.get("MaxSharedMemoryPerBlockOptin")
        return WorkerInfo(self.name, self.env, int(smem) if smem else None, self.arch)

    def _reference(self, task: TrialTask) -> Reference:
        key = (task.dtype, task.shape, task.seed)
        if key in self._references:
            self._references.move_to_end(key)
            return self._references[key]
        while len(self._references) >= REFERENCES_KEPT:
            self._references.popitem(last=False)
        self._references[key] = made = reference(self.cp, task.shape, task.dtype, task.seed)
        return made

    def _expected(self, prep: Prepared, task: TrialTask) -> Reference | None:
        """The float64 product a plain GEMM is checked against; None for an epilogue stage
        or group, which verify checks on inputs of its own."""
        return None if prep.epilogue is not None else self._reference(task)

    def _reference_kernel(self, task: TrialTask, spec: KernelSpec) -> Prepared | None:
        """What bench times the stage against (cuBLAS, or for a fused stage cuBLAS and the
        elementwise pass of its epilogue) at the task's shape, prepared and verified once per
        reference, shape and dtype."""
        rspec = reference_spec(task.dtype, spec)
        key = (rspec.name, task.dtype, task.shape)
        if key not in self._cublas:
            prep = prepare(rspec, task.dtype, task.shape)
            self._cublas[key] = (prep, verify(prep, task.seed, self._expected(prep, task)))
        prep, verdict = self._cublas[key]
        if verdict.verdict != OK:
            log.warning("%s failed its own check at %s (%s); no ratio", prep.spec.name,
                        task.shape, verdict.detail)
            return None
        return prep

    def run(self, task: TrialTask) -> TrialOutcome:
        """One task's outcome; never raises for what the configuration does."""
        spec = get_spec(task.stage).with_params(**task.params)
        verify_s = 0.0
        rel_error = None
        try:
            start = time.perf_counter()
            prep = prepare(spec, task.dtype, task.shape)
            if task.verify:
                verdict = verify(prep, task.seed, self._expected(prep, task))
                verify_s = time.perf_counter() - start
                rel_error = verdict.rel_fro_error
                if verdict.verdict != OK:
                    return TrialOutcome(task.id, verdict.verdict, verdict.detail, rel_error,
                                        verify_s=verify_s, worker=self.name)
            ref = self._reference_kernel(task, spec)
            start = time.perf_counter()
            timing = time_stage(prep, ref, task.bench_options())
            return TrialOutcome(task.id, OK, "", rel_error, timing, verify_s,
                                time.perf_counter() - start, self.name)
        except Exception as exc:  # a worker answers for every task; the coordinator decides
            log.error("%s %s at %s (%s): %s", task.stage, task.params, task.shape, task.dtype,
                      traceback.format_exc())
            return TrialOutcome(task.id, ERROR, one_line(exc), rel_error, verify_s=verify_s,
                                worker=self.name, fatal=is_context_fatal(exc))


def synthetic_ratio(stage: str, params: dict[str, int], shape: Shape) -> float:
    """A smooth, deterministic stand-in for a measured ratio: best at the stage's defaults,
    lower the further (in log2 steps) a parameter moves, with a wave-quantisation term
    where the stage has BM and BN tiles. What a dry run records instead of a timing."""
    defaults = get_spec(stage).param_dict
    distance = sum((math.log2(v) - math.log2(defaults[k])) ** 2
                   for k, v in params.items() if v > 0 and defaults.get(k, 0) > 0)
    waves = 1.0
    if "BM" in params and "BN" in params:
        tiles = -(-shape.m // params["BM"]) * -(-shape.n // params["BN"])
        waves = tiles / (132 * -(-tiles // 132))
    return round(0.85 + 0.15 * waves - 0.02 * distance, 6)


class DrySession:
    """Compiles and answers a synthetic timing: everything but the launch."""

    # A nominal cuBLAS rate the synthetic times are made from (TFLOP/s).
    REFERENCE_TFLOPS = 600.0

    def __init__(self, name: str, arch: str = "sm_90a") -> None:
        self.name = name
        self.arch = arch
        self.env = dry_environment()

    def info(self) -> WorkerInfo:
        """How this worker introduces itself to the coordinator."""
        return WorkerInfo(self.name, self.env, None, None)

    def run(self, task: TrialTask) -> TrialOutcome:
        """One task's outcome; never raises for what the configuration does."""
        spec = get_spec(task.stage).with_params(**task.params)
        try:
            compile_stage(spec, task.dtype, task.arch)
        except Exception as exc:
            return TrialOutcome(task.id, ERROR, one_line(exc), worker=self.name)
        ratio = synthetic_ratio(task.stage, task.params, task.shape)
        ref_ms = task.shape.flops / (self.REFERENCE_TFLOPS * 1e12) * 1e3
        ms = ref_ms / ratio

        def flat(v: float) -> Spread:
            return Spread(v, v, v)

        timing = Timing(runs_per_round=task.runs, rounds=task.rounds, warmup=task.warmup,
                        l2_flush_bytes=0, l2_flush="none", time_ms=flat(ms),
                        tflops=flat(task.shape.flops / ms / 1e9),
                        reference=reference_spec(task.dtype, spec).name,
                        reference_time_ms=flat(ref_ms),
                        reference_tflops=flat(self.REFERENCE_TFLOPS),
                        ratio_to_reference=flat(ratio), round_ratios=(ratio,) * task.rounds)
        return TrialOutcome(task.id, OK, "", 0.0, timing, 0.0, 0.0, self.name)


def dry_environment() -> Environment:
    """The environment a dry run reports: the DRY_GPU name, this NVRTC."""
    return Environment(gpu=DRY_GPU, compute_capability="", sm_count=0, driver="none",
                       cuda_driver="", cuda_runtime="", nvrtc=nvrtc_version(), cupy="", cublas="",
                       cuda_bindings="", ml_dtypes="", python=platform.python_version())


def session(dry: bool, name: str) -> GpuSession | DrySession:
    """A GPU session, or a dry one."""
    return DrySession(name) if dry else GpuSession(name)


# ---------------------------------------------------------------- the Ray actor

class RayWorker:
    """One GPU of a Ray cluster, as an actor: Ray gives it its GPU (CUDA_VISIBLE_DEVICES) when
    it starts, and it keeps its CUDA context, references and cuBLAS handles across tasks, as
    the local worker does. (A plain Ray task with num_gpus=1 runs in a fresh process each time
    and would pay CuPy's start and the float64 reference for every configuration.)"""

    def __init__(self, dry: bool) -> None:
        devices = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        self._session = session(dry, f"ray {platform.node()} gpu {devices or '?'}")

    def info(self) -> dict[str, Any]:
        """The worker's WorkerInfo, as a dict."""
        return self._session.info().to_dict()

    def run(self, task: dict[str, Any]) -> dict[str, Any]:
        """One task's outcome, as a dict."""
        return self._session.run(TrialTask.from_dict(task)).to_dict()


# ---------------------------------------------------------------- the local worker

def _protocol_stream() -> TextIO:
    """The real stdout, kept for the protocol; fd 1 then points at stderr, so a library's
    stray print cannot corrupt a reply."""
    stream = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return stream


def main(argv: list[str] | None = None) -> int:
    """Serve tasks on stdin until told to stop (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m perfscope.tune.worker")
    parser.add_argument("--dry", action="store_true", help="compile only; synthetic timings")
    parser.add_argument("--name", default="")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s", stream=sys.stderr)
    out = _protocol_stream()

    def send(message: dict[str, Any]) -> None:
        out.write(json.dumps(message, allow_nan=False) + "\n")
        out.flush()

    name = args.name or f"gpu {os.environ.get('CUDA_VISIBLE_DEVICES', '0')}"
    try:
        worker = session(args.dry, name)
        send({"hello": worker.info().to_dict()})
    except Exception as exc:
        send({"error": one_line(exc)})
        return 3
    for line in sys.stdin:
        if not line.strip():
            continue
        message = json.loads(line)
        if message.get("op") == "exit":
            break
        outcome = worker.run(TrialTask.from_dict(message["task"]))
        send({"outcome": outcome.to_dict()})
        if outcome.fatal:
            return 4
    return 0


if __name__ == "__main__":
    sys.exit(main())
