"""The child process that ncu profiles: ``python -m perfscope.runner JOBS.json MANIFEST_DIR``.

For every job (stage, dtype, shape, parameters) it builds the stage, makes seeded random
inputs, verifies the result against a float64 reference first (a wrong stage is written
down as wrong and never launched inside its range, so it is not profiled as if fine),
warms up, then launches the kernel exactly once inside an NVTX push/pop range named
after the job (a group reference, cuBLAS then its elementwise pass: both launches).
ncu's NVTX filter selects only those ranges, so CuPy's own helper kernels
(random numbers, casts, the reference check) are never captured.

One manifest per job is written into MANIFEST_DIR as ``<stem>.json``. The process stops
at the first stage that leaves the CUDA context broken (what ran before is kept).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfscope import bench
from perfscope.environment import collect_environment
from perfscope.errors import PerfscopeError
from perfscope.kernels import get_spec, parse_shape
from perfscope.kernels.launch import prepare, require_gpu
from perfscope.kernels.spec import param_tag
from perfscope.manifest import ERROR, OK, Verification
from perfscope.verify import launch_operands, verify

log = logging.getLogger("perfscope.runner")

WARMUP_LAUNCHES = 2
SEED = 20261130


@dataclass(frozen=True)
class RunnerJob:
    """One (stage, dtype, shape, parameters) as the parent planned it."""

    stem: str
    stage: str
    dtype: str
    shape: str
    params: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        """The job as JSON-ready values, the way write_jobs stores it."""
        return {"stem": self.stem, "stage": self.stage, "dtype": self.dtype,
                "shape": self.shape, "params": self.params}


def stem_for(stage: str, dtype: str, shape: str, params: dict[str, int] | None = None) -> str:
    """``<stage>[@K=V,...]-<dtype>-<M>x<N>x<K>``: the report's file stem and NVTX range."""
    return f"{stage}{param_tag(params)}-{dtype}-{shape}"


def nvtx_range(stem: str) -> str:
    """The NVTX range a job's launch runs in: its stem with '@' spelled '+', because ncu's
    --nvtx-include reads '@' as "domain@range" (a tuned stage's "stage@BN=256-..." filter
    would name a domain and match nothing)."""
    return stem.replace("@", "+")


def write_jobs(path: Path, jobs: list[RunnerJob]) -> None:
    """Write the jobs file the child process reads."""
    path.write_text(json.dumps([j.to_dict() for j in jobs], indent=1))


def read_jobs(path: Path) -> list[RunnerJob]:
    """The jobs the parent wrote with write_jobs."""
    return [RunnerJob(**d) for d in json.loads(path.read_text())]


def _write_manifest(manifest_dir: Path, stem: str, manifest: Any) -> None:
    tmp = manifest_dir / f".{stem}.json.part"
    tmp.write_text(manifest.to_json() if hasattr(manifest, "to_json")
                   else json.dumps(manifest.to_dict(), indent=1))
    os.replace(tmp, manifest_dir / f"{stem}.json")


def _nvtx() -> Any:
    import cupy.cuda.nvtx as nvtx

    return nvtx


def run_job(job: RunnerJob, manifest_dir: Path, env: Any) -> str:
    """Verify, then launch once inside the job's NVTX range; return the verdict."""
    spec = get_spec(job.stage)
    if job.params:
        spec = spec.with_params(**job.params)
    plan = bench.Job(spec, job.dtype, parse_shape(job.shape))
    try:
        prep = prepare(spec, job.dtype, plan.shape)
        verdict = verify(prep, SEED)
    except Exception as exc:
        if not isinstance(exc, PerfscopeError) and not bench.is_cuda_error(exc):
            raise
        manifest = bench.make_manifest(plan, Verification(ERROR, detail=bench.one_line(exc)),
                                       environment=env)
        _write_manifest(manifest_dir, job.stem, manifest)
        if bench.is_context_fatal(exc):
            raise
        return ERROR
    manifest = bench.make_manifest(plan, verdict, compile=bench.compile_info(prep), environment=env)
    _write_manifest(manifest_dir, job.stem, manifest)
    if verdict.verdict != OK:
        return verdict.verdict
    cp = require_gpu()
    ops = launch_operands(cp, prep, SEED)
    a, b, c, extra = ops.a, prep.weight(ops.b), ops.c, ops.extra
    for _ in range(WARMUP_LAUNCHES):
        prep.launch(a, b, c, extra)
    cp.cuda.get_current_stream().synchronize()
    nvtx = _nvtx()
    nvtx.RangePush(nvtx_range(job.stem))
    try:
        prep.launch(a, b, c, extra)
        cp.cuda.get_current_stream().synchronize()
    finally:
        nvtx.RangePop()
    return OK


def main(argv: list[str] | None = None) -> int:
    """Run every job of JOBS.json, a line per stage on stdout; exit 2 on bad usage, 3 on an error."""
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s", stream=sys.stderr)
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m perfscope.runner JOBS.json MANIFEST_DIR", file=sys.stderr)
        return 2
    jobs, manifest_dir = read_jobs(Path(args[0])), Path(args[1])
    manifest_dir.mkdir(parents=True, exist_ok=True)
    try:
        env = collect_environment(require_gpu())
        for job in jobs:
            verdict = run_job(job, manifest_dir, env)
            # The parent reads these lines to report progress and failures by stage.
            print(f"perfscope-runner: {job.stem} {verdict}", flush=True)
    except PerfscopeError as exc:
        print(f"perfscope-runner: error: {exc}", file=sys.stderr, flush=True)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
