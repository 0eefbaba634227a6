"""`perfscope profile`: ladder stages, or any program, under Nsight Compute.

Stages: the whole ladder is one ncu invocation over one runner process (a stage costs
its replay passes, not a process start); the cuBLAS references get a second one, so
cuBLAS's large modules stay out of the ladder's reports. The runner launches each verified stage once
inside an NVTX range named after it; ncu profiles only those ranges. The combined report
is then split, one report per stage, by importing it with launch filters, and each
stage's run manifest is put beside its report:

    reports/local/<gpu-slug>/<stage>[@params]-<dtype>-<M>x<N>x<K>.ncu-rep
    reports/local/<gpu-slug>/<stage>[@params]-<dtype>-<M>x<N>x<K>.json

A stage that is refused, wrong or crashes is listed at the end and makes the command
exit non-zero; the others are kept.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from perfscope import bench
from perfscope import ncu as ncu_mod
from perfscope.documents import ProfileSummary, StageResult
from perfscope.errors import PerfscopeError
from perfscope.kernels import get_spec, parse_shape
from perfscope.locations import LOCAL_ROOT
from perfscope.profile import load
from perfscope.runner import RunnerJob, stem_for, write_jobs

log = logging.getLogger(__name__)

NVTX_COLUMN_PREFIX = "thread Domain:Push/Pop_Range"


@dataclass(frozen=True)
class ProfileRequest:
    stages: tuple[str, ...] = ("all",)
    dtypes: tuple[str, ...] = ()
    shape: str = "4096x4096x4096"
    params: dict[str, int] = field(default_factory=dict)
    out: Path | None = None             # default: reports/local/<gpu-slug>
    ncu: ncu_mod.NcuOptions | None = None  # output is filled in; the rest is kept
    resume: bool = False
    timeout: float | None = 1800.0


@dataclass(frozen=True)
class ProfilePlan:
    """The runner jobs of a request and the refusals known before any GPU work."""

    jobs: tuple[RunnerJob, ...]
    refused: tuple[StageResult, ...]


def gpu_slug(name: str | None) -> str:
    """'NVIDIA H200' -> 'h200'; unknown -> 'gpu'."""
    if not name:
        return "gpu"
    text = re.sub(r"^nvidia\s+", "", name.strip(), flags=re.IGNORECASE).lower()
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-") or "gpu"


def _gpu_name() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    first = out.stdout.strip().splitlines()
    return first[0].strip() if out.returncode == 0 and first else None


def plan_jobs(req: ProfileRequest) -> ProfilePlan:
    """Runner jobs for the request, and the refusals that need no GPU to know."""
    shape = parse_shape(req.shape)
    jobs, refused = [], []
    for job in bench.plan(list(req.stages), list(req.dtypes), shape, dict(req.params)):
        default = get_spec(job.spec.name).param_dict
        changed = {k: v for k, v in job.spec.param_dict.items() if default.get(k) != v}
        stem = stem_for(job.spec.name, job.dtype, str(shape), changed)
        if job.refusal is not None:
            refused.append(StageResult(stem, "refused", detail=job.refusal))
        else:
            jobs.append(RunnerJob(stem, job.spec.name, job.dtype, str(shape), changed))
    return ProfilePlan(tuple(jobs), tuple(refused))


def _loads(path: Path) -> bool:
    try:
        return bool(load(path))
    except PerfscopeError:
        return False


def ranges_by_launch(csv_text: str, stems: Sequence[str]) -> list[str | None]:
    """The job stem of every launch (in report order), from the raw page's NVTX column."""
    rows = list(csv.reader(io.StringIO(csv_text)))
    if len(rows) < 2:
        return []
    header = rows[0]
    cols = [i for i, h in enumerate(header) if h.startswith(NVTX_COLUMN_PREFIX)]
    out: list[str | None] = []
    for row in rows[2:]:
        cell = " ".join(row[i] for i in cols if i < len(row))
        # Exact ":<stem>:" so one stem that prefixes another cannot match it.
        hits = [s for s in stems if f":{s}:" in cell]
        out.append(max(hits, key=len) if hits else None)
    return out


def _split(ncu: str, combined: Path, owners: list[str | None], out_dir: Path) -> dict[str, Path]:
    """One report per stem, from contiguous runs of launches in the combined report."""
    spans: dict[str, tuple[int, int]] = {}
    for i, stem in enumerate(owners):
        if stem is None:
            continue
        first, count = spans.get(stem, (i, 0))
        if first + count != i:
            raise PerfscopeError(f"the launches of {stem} are not contiguous in {combined.name}.")
        spans[stem] = (first, count + 1)
    reports = {}
    for stem, (first, count) in spans.items():
        target = out_dir / f"{stem}.ncu-rep"
        if len(spans) == 1 and count == len(owners):
            shutil.copyfile(combined, target)
        else:
            ncu_mod.export_launches(ncu, combined, first, count, target)
        reports[stem] = target
    return reports


def _verdicts(output: str) -> dict[str, str]:
    return dict(m.groups() for m in re.finditer(r"^perfscope-runner: (\S+) (\S+)$", output, re.M))


def profile_stages(req: ProfileRequest,
                   on_progress: Callable[[ncu_mod.Progress], None] | None = None,
                   ncu: str | None = None, plan: ProfilePlan | None = None) -> ProfileSummary:
    """Profile the requested stages (plan: the request's plan, when already made)."""
    plan = plan or plan_jobs(req)
    jobs, results = list(plan.jobs), list(plan.refused)
    ncu = ncu or ncu_mod.find_ncu()
    ncu_mod.ncu_version(ncu)
    out_dir = req.out or (LOCAL_ROOT / gpu_slug(_gpu_name()))
    out_dir.mkdir(parents=True, exist_ok=True)
    if req.resume:
        kept = [j for j in jobs if (out_dir / f"{j.stem}.ncu-rep").exists()
                and _loads(out_dir / f"{j.stem}.ncu-rep")]
        results += [StageResult(j.stem, "skipped", out_dir / f"{j.stem}.ncu-rep",
                                detail="report exists (--resume)") for j in kept]
        jobs = [j for j in jobs if j not in kept]
    if jobs:
        staging = out_dir / f".staging-{os.getpid()}"
        staging.mkdir(exist_ok=True)
        try:
            results += _run_jobs(ncu, req, jobs, staging, out_dir, on_progress)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return ProfileSummary(out_dir, tuple(results))


def _groups(jobs: list[RunnerJob]) -> list[tuple[str, list[RunnerJob]]]:
    """The ladder in one ncu process, the cuBLAS references in another.

    A split report keeps every module the combined report imported, and cuBLAS's SGEMM
    module alone is 14 MB of SASS (about 1 MB compressed): profiled beside the ladder it
    would ride along in every stage's report.
    """
    refs = [j for j in jobs if get_spec(j.stage).is_reference]
    ladder = [j for j in jobs if j not in refs]
    return [(name, group) for name, group in (("ladder", ladder), ("cublas", refs)) if group]


def _run_jobs(ncu: str, req: ProfileRequest, jobs: list[RunnerJob], staging: Path, out_dir: Path,
              on_progress: Callable[[ncu_mod.Progress], None] | None) -> list[StageResult]:
    results: list[StageResult] = []
    for name, group in _groups(jobs):
        results += _run_group(ncu, req, name, group, staging, out_dir, on_progress)
    return results


def _run_group(ncu: str, req: ProfileRequest, name: str, jobs: list[RunnerJob], staging: Path,
               out_dir: Path, on_progress: Callable[[ncu_mod.Progress], None] | None
               ) -> list[StageResult]:
    jobs_file = staging / f"{name}.jobs.json"
    write_jobs(jobs_file, jobs)
    opts = replace(req.ncu or ncu_mod.NcuOptions(), output=staging / name, kernel_regex=None,
                   nvtx_include=tuple(f"{j.stem}/" for j in jobs))
    command = [sys.executable, "-m", "perfscope.runner", str(jobs_file), str(staging)]
    run = ncu_mod.execute(ncu, opts, command, timeout=req.timeout, on_progress=on_progress)
    verdicts = _verdicts(run.output)
    reports: dict[str, Path] = {}
    split_error = ""
    if run.report is not None:
        try:
            owners = ranges_by_launch(ncu_mod.raw_csv(ncu, run.report), [j.stem for j in jobs])
            reports = _split(ncu, run.report, owners, out_dir)
        except PerfscopeError as exc:
            split_error = str(exc)
    results = []
    for job in jobs:
        manifest = staging / f"{job.stem}.json"
        verdict = verdicts.get(job.stem)
        if manifest.exists():
            final = out_dir / manifest.name
            os.replace(manifest, final)
            manifest = final
            verdict = verdict or json.loads(final.read_text())["verification"]["verdict"]
        else:
            manifest = None
        detail = ""
        if verdict is None:
            verdict = "error"
            detail = str(run.failure) if run.failure else "the runner never reached this stage"
        elif verdict == "ok" and job.stem not in reports:
            detail = split_error or "ncu captured no kernel in this stage's range"
        results.append(StageResult(job.stem, verdict, reports.get(job.stem), manifest, detail))
    if run.failure is not None and not any(r.verdict == "error" for r in results):
        # ncu failed in a way no stage explains (no permission, bad metric name...).
        raise run.failure
    return results


def profile_command(command: Sequence[str], output: Path, options: ncu_mod.NcuOptions | None = None,
                    timeout: float | None = None,
                    on_progress: Callable[[ncu_mod.Progress], None] | None = None,
                    ncu: str | None = None) -> Path:
    """Profile any program (kernels chosen by options.kernel_regex / nvtx_include)."""
    ncu = ncu or ncu_mod.find_ncu()
    ncu_mod.ncu_version(ncu)
    opts = replace(options or ncu_mod.NcuOptions(output=output), output=output)
    return ncu_mod.run(ncu, opts, command, timeout=timeout, on_progress=on_progress)


@dataclass(frozen=True)
class ProgramCapture:
    """What `perfscope profile -- COMMAND` wrote."""

    report: Path
    launches: int


def profile_program(command: Sequence[str], output: Path, options: ncu_mod.NcuOptions | None = None,
                    timeout: float | None = None,
                    on_progress: Callable[[ncu_mod.Progress], None] | None = None,
                    ncu: str | None = None) -> ProgramCapture:
    """Profile a program and read the report back: an unreadable report is this command's
    failure, not a later diagnose's."""
    report = profile_command(command, output, options, timeout, on_progress, ncu)
    return ProgramCapture(report, len(load(report)))
