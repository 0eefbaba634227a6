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
exit non-zero; the others are kept, and so are those profiled before a Ctrl-C.

Any program (``profile_program``): ncu's own filters select its launches, the report gets
a name no earlier capture has, and a run manifest (stage ``program``) beside it records
the command, the selection, the GEMM's shape and dtype when known, and which launches a
fault makes untrustworthy. A missing cublas/cublaslt reference for ``diff`` is profiled
on demand (``make_reference``) beside the report it is for.
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
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from perfscope import bench, diagnosis, mapcapture
from perfscope import ncu as ncu_mod
from perfscope.digest import local_headers, source_hash
from perfscope.documents import ProfileSummary, StageResult
from perfscope.errors import PerfscopeError
from perfscope.kernels import KERNEL_DIR, Shape, get_spec, normalize_dtype, parse_shape
from perfscope.kernels.epilogue import ELEMENTWISE_SOURCE, ELEMENTWISE_SOURCE_NAME
from perfscope.kernels.launch import driver_device_count
from perfscope.locations import LOCAL_ROOT
from perfscope.manifest import (
    PROGRAM,
    UNKNOWN_LAYOUT,
    UNVERIFIED,
    Capture,
    RunManifest,
    Spread,
    Timing,
    Verification,
    layout_for,
    manifest_path,
    read_manifest,
)
from perfscope.profile import load
from perfscope.reader import report_stem
from perfscope.record import Diagnosed
from perfscope.runner import RunnerJob, nvtx_range, stem_for, write_jobs
from perfscope.tensormaps import KernelMaps

log = logging.getLogger(__name__)

NVTX_COLUMN_PREFIX = "thread Domain:Push/Pop_Range"


@dataclass(frozen=True)
class ProfileRequest:
    """What `perfscope profile` is asked to profile: stages, dtypes, shape and parameters, and where."""

    stages: tuple[str, ...] = ("all",)
    dtypes: tuple[str, ...] = ()
    shape: str = "4096x4096x4096"
    params: dict[str, int] = field(default_factory=dict)
    out: Path | None = None             # default: reports/local/<gpu-slug>
    ncu: ncu_mod.NcuOptions | None = None  # output is filled in; the rest is kept
    resume: bool = False
    timeout: float | None = 1800.0
    tensor_maps: bool = False           # record the tensor maps each launch was passed


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
        hits = [s for s in stems if f":{nvtx_range(s)}:" in cell]
        out.append(max(hits, key=len) if hits else None)
    return out


def launch_spans(owners: Sequence[str | None], report: str) -> dict[str, tuple[int, int]]:
    """owner -> (first launch, count) in a combined report; an owner's launches must be
    contiguous, since a split takes one --launch-skip/--launch-count run per owner."""
    spans: dict[str, tuple[int, int]] = {}
    for i, owner in enumerate(owners):
        if owner is None:
            continue
        first, count = spans.get(owner, (i, 0))
        if first + count != i:
            raise PerfscopeError(f"the launches of {owner} are not contiguous in {report}.")
        spans[owner] = (first, count + 1)
    return spans


def _split(ncu: str, combined: Path, owners: list[str | None], out_dir: Path) -> dict[str, Path]:
    """One report per stem, from contiguous runs of launches in the combined report."""
    spans = launch_spans(owners, combined.name)
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
        except _GroupInterrupted as stop:
            results += stop.results
            raise ProfileInterrupted(ProfileSummary(out_dir, tuple(results)),
                                     tuple(j.stem for j in jobs)) from None
        finally:
            shutil.rmtree(staging, ignore_errors=True)
            keep_sources(out_dir)
    return ProfileSummary(out_dir, tuple(results))


SOURCES_DIR = "sources"


def _hashes_in_use(out_dir: Path) -> set[tuple[str, str]]:
    """(source, source hash) of every run manifest beside a report in out_dir."""
    used = set()
    for path in out_dir.glob("*.json"):
        try:
            compile_info = read_manifest(path).compile
        except PerfscopeError:
            continue   # a bench file or other JSON beside the reports
        if compile_info is not None and compile_info.source_hash:
            used.add((compile_info.source, compile_info.source_hash))
    return used


def _hashes_timed(out_dir: Path) -> set[str]:
    """The source hashes the bench files anywhere under out_dir name (probes/ included): a
    kept tree a timing was compiled from stays readable though no report names it."""
    hashes = set()
    for path in out_dir.rglob("*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        # Read as loosely as written: a bench file of an older version still names its trees.
        manifests = data.get("manifests") if isinstance(data, dict) else None
        for m in manifests if isinstance(manifests, list) else ():
            compile_info = m.get("compile") if isinstance(m, dict) else None
            digest = compile_info.get("source_hash") if isinstance(compile_info, dict) else None
            if isinstance(digest, str) and digest:
                hashes.add(digest)
    return hashes


def _checkout_hash(name: str) -> str | None:
    """The source hash keep_sources will write for this file name, None if it writes none."""
    if name == ELEMENTWISE_SOURCE_NAME:
        return source_hash(ELEMENTWISE_SOURCE)
    path = KERNEL_DIR / name
    return source_hash(path.read_text(), KERNEL_DIR) if path.is_file() else None


def archive_sources(out_dir: Path) -> list[Path]:
    """Copy the sources of an older tree that a report in out_dir still names into
    ``sources/<source hash>/`` before the checkout's copies replace them, so every report
    keeps its lines (perfscope.source looks there first); the folders made. Never fatal:
    keep_sources runs after the reports are written, so a copy that cannot be read or kept
    is left with a warning, and a folder is only ever there whole (written aside, renamed)."""
    target = out_dir / SOURCES_DIR
    made = []
    used = _hashes_in_use(out_dir)
    for old in sorted(target.glob("*.cu")):
        try:
            text = old.read_text()
            kept = source_hash(text, target)
            if (old.name, kept) not in used or (target / kept).exists() \
                    or kept == _checkout_hash(old.name):
                continue
            aside = Path(tempfile.mkdtemp(prefix=f".{kept}-", dir=target))
            try:
                shutil.copyfile(old, aside / old.name)
                for name, header in local_headers(text, target):
                    (aside / name).write_text(header)
                aside.rename(target / kept)
            finally:
                shutil.rmtree(aside, ignore_errors=True)   # gone once renamed
        except (OSError, UnicodeDecodeError) as exc:
            log.warning("not keeping %s's older copy: %s", old, exc)
            continue
        made.append(target / kept)
        log.info("kept %s's sources of tree %s in %s", old.name, kept, target / kept)
    return made


_ARCHIVE_NAME = re.compile(r"[0-9a-f]{16}")


def prune_archives(out_dir: Path) -> list[Path]:
    """Remove the ``sources/<source hash>/`` folders that no run manifest in out_dir and no
    bench file under it names any more (its report replaced since by one of a later tree);
    the folders removed. Only folders named like a source hash are touched, and a failure
    is a warning."""
    target = out_dir / SOURCES_DIR
    named = {h for _, h in _hashes_in_use(out_dir)} | _hashes_timed(out_dir)
    gone = []
    for folder in sorted(p for p in target.glob("*") if p.is_dir()):
        if not _ARCHIVE_NAME.fullmatch(folder.name) or folder.name in named:
            continue
        try:
            shutil.rmtree(folder)
        except OSError as exc:
            log.warning("not removing %s, which no report names: %s", folder, exc)
            continue
        gone.append(folder)
        log.info("removed %s: no report in %s names that tree any more", folder, out_dir)
    return gone


def keep_sources(out_dir: Path) -> None:
    """Copy the ladder's CUDA sources beside the reports (``sources/``): the source view
    shows the lines that were compiled (the run manifests hold their hash) even after the
    checkout's files change. A report compiled from an older tree that the folder still
    holds keeps that tree's sources under ``sources/<source hash>/`` (archive_sources); a
    tree no report names any more loses its folder (prune_archives)."""
    target = out_dir / SOURCES_DIR
    target.mkdir(exist_ok=True)
    archive_sources(out_dir)
    prune_archives(out_dir)
    for src in sorted(KERNEL_DIR.glob("*.cu*")):
        shutil.copyfile(src, target / src.name)
    # The group references' elementwise pass is compiled from a string (kernels/epilogue.py).
    (target / ELEMENTWISE_SOURCE_NAME).write_text(ELEMENTWISE_SOURCE)


class ProfileInterrupted(KeyboardInterrupt):
    """Ctrl-C during `profile`: every stage profiled before it is kept in the summary's
    folder (report and manifest), so `--resume` skips it."""

    def __init__(self, summary: ProfileSummary, asked: tuple[str, ...]) -> None:
        super().__init__("profile was interrupted")
        self.summary = summary
        kept = [r.stem for r in summary.results if r.verdict == "ok" and r.report is not None]
        self.kept = tuple(s for s in kept if s in asked)
        self.asked = asked

    @property
    def sentence(self) -> str:
        """What was kept and how to go on, in one sentence."""
        folder = self.summary.out_dir
        if not self.kept:
            return f"no stage had been profiled yet, so nothing was kept in {folder}"
        names = ", ".join(self.kept[:4]) + (f" and {len(self.kept) - 4} more" if len(self.kept) > 4 else "")
        return (f"kept {len(self.kept)} of {len(self.asked)} stage report(s) in {folder} ({names}); "
                "the same command with --resume profiles only the rest")


class _GroupInterrupted(KeyboardInterrupt):
    def __init__(self, results: list[StageResult]) -> None:
        super().__init__("interrupted")
        self.results = results


def _groups(jobs: list[RunnerJob]) -> list[tuple[str, list[RunnerJob]]]:
    """The ladder in one ncu process, and each cuBLAS reference in one of its own.

    A split report keeps every module the combined report imported, and cuBLAS's SGEMM
    module alone is 14 MB of SASS (about 1 MB compressed): profiled beside the ladder it
    would ride along in every stage's report, and beside the half-precision references
    in theirs (which are about 100 KB alone).
    """
    refs = [j for j in jobs if get_spec(j.stage).is_reference]
    ladder = [j for j in jobs if j not in refs]
    groups = [("ladder", ladder)] if ladder else []
    return groups + [(f"ref-{j.stem}", [j]) for j in refs]


def _run_jobs(ncu: str, req: ProfileRequest, jobs: list[RunnerJob], staging: Path, out_dir: Path,
              on_progress: Callable[[ncu_mod.Progress], None] | None) -> list[StageResult]:
    results: list[StageResult] = []
    for name, group in _groups(jobs):
        try:
            results += _run_group(ncu, req, name, group, staging, out_dir, on_progress)
        except _GroupInterrupted as stop:
            raise _GroupInterrupted(results + stop.results) from None
    return results


def _run_group(ncu: str, req: ProfileRequest, name: str, jobs: list[RunnerJob], staging: Path,
               out_dir: Path, on_progress: Callable[[ncu_mod.Progress], None] | None
               ) -> list[StageResult]:
    jobs_file = staging / f"{name}.jobs.json"
    write_jobs(jobs_file, jobs)
    opts = replace(req.ncu or ncu_mod.NcuOptions(), output=staging / name, kernel_regex=None,
                   nvtx_include=tuple(f"{nvtx_range(j.stem)}/" for j in jobs))
    command = [sys.executable, "-m", "perfscope.runner", str(jobs_file), str(staging)]
    maps_file = staging / f"{name}.maps.jsonl" if req.tensor_maps else None
    if maps_file is not None:
        command = mapcapture.wrap_command(command, mapcapture.build_library(), maps_file.resolve())
    try:
        run = ncu_mod.execute(ncu, opts, command, timeout=req.timeout, on_progress=on_progress)
    except ncu_mod.NcuInterrupted as stop:
        # Keep what ncu had written: the stages profiled so far get their reports and
        # manifests in out_dir, so --resume skips them.
        kept = _collect(ncu, jobs, stop.run, staging, out_dir, opts.clock_control,
                        interrupted=True)
        if stop.run.report is not None:
            stop.run.report.unlink(missing_ok=True)
        raise _GroupInterrupted(kept) from None
    results = _collect(ncu, jobs, run, staging, out_dir, opts.clock_control)
    if maps_file is not None:
        _attach_maps(results, *_read_maps(maps_file))
    if run.failure is not None and not any(r.verdict == "error" for r in results):
        # ncu failed in a way no stage explains (no permission, bad metric name...).
        raise run.failure
    return results


def _collect(ncu: str, jobs: list[RunnerJob], run: ncu_mod.NcuRun, staging: Path, out_dir: Path,
             clock_control: str, interrupted: bool = False) -> list[StageResult]:
    """Split a group's report by stage and put each stage's report and manifest in out_dir,
    each manifest stamped with the capture's clock control.

    After an interrupt only the stages whose launch made it into the report are kept.
    """
    verdicts = _verdicts(run.output)
    reports: dict[str, Path] = {}
    split_error = ""
    if run.report is not None:
        try:
            owners = ranges_by_launch(ncu_mod.raw_csv(ncu, run.report), [j.stem for j in jobs])
            reports = _split(ncu, run.report, owners, out_dir)
        except PerfscopeError as exc:
            split_error = str(exc)
            log.warning("%s", exc)
    if interrupted:
        return [StageResult(j.stem, "ok", reports[j.stem],
                            _keep_manifest(staging, out_dir, j.stem, clock_control))
                for j in jobs if j.stem in reports]
    results = []
    for job in jobs:
        verdict = verdicts.get(job.stem)
        manifest = _keep_manifest(staging, out_dir, job.stem, clock_control)
        if manifest is not None:
            verdict = verdict or json.loads(manifest.read_text())["verification"]["verdict"]
        detail = ""
        if verdict is None:
            verdict = "error"
            detail = str(run.failure) if run.failure else "the runner never reached this stage"
        elif verdict == "ok" and job.stem not in reports:
            detail = split_error or "ncu captured no kernel in this stage's range"
        results.append(StageResult(job.stem, verdict, reports.get(job.stem), manifest, detail))
    return results


def _attach_maps(results: Sequence[StageResult], kernels: Sequence[KernelMaps], note: str) -> None:
    """Write into each stage's manifest the captured maps of the kernels its report holds
    (by mangled name, grid and block), and what the capture found."""
    for r in results:
        if r.report is None or r.manifest is None:
            continue
        doc = json.loads(r.manifest.read_text())
        try:
            launches = load(r.report)
        except PerfscopeError as exc:
            # The stage's verdict stands; only the maps cannot be matched to its launches.
            doc["tensor_maps_note"] = f"the report could not be read to match the maps: {exc}"
        else:
            shapes = {(kp.identity.mangled, kp.identity.grid, kp.identity.block) for kp in launches}
            mine = [k for k in kernels if (k.kernel, k.grid, k.block) in shapes]
            doc["tensor_maps"] = [asdict(k) for k in mine]
            doc["tensor_maps_note"] = (note if mine else
                                       "no launch of this stage was passed a tensor map by value")
        r.manifest.write_text(json.dumps(doc, indent=1) + "\n")


def _keep_manifest(staging: Path, out_dir: Path, stem: str, clock_control: str) -> Path | None:
    """The runner's manifest of `stem`, stamped with the capture's clock control (the
    runner, under ncu, cannot know it), moved into out_dir; None when it wrote none."""
    manifest = staging / f"{stem}.json"
    if not manifest.exists():
        return None
    doc = json.loads(manifest.read_text())
    doc["clock_control"] = clock_control
    manifest.write_text(json.dumps(doc, indent=1) + "\n")
    final = out_dir / manifest.name
    os.replace(manifest, final)
    return final


def profile_command(command: Sequence[str], output: Path, options: ncu_mod.NcuOptions | None = None,
                    timeout: float | None = None,
                    on_progress: Callable[[ncu_mod.Progress], None] | None = None,
                    ncu: str | None = None) -> Path:
    """Profile any program (kernels chosen by options.kernel_regex / nvtx_include)."""
    ncu = ncu or ncu_mod.find_ncu()
    ncu_mod.ncu_version(ncu)
    opts = replace(options or ncu_mod.NcuOptions(output=output), output=output)
    return ncu_mod.run(ncu, opts, command, timeout=timeout, on_progress=on_progress)


# ------------------------------------------------------------------ any program's kernels

PROGRAMS_DIR = LOCAL_ROOT / "programs"
# An NVTX range named like a report stem (``...-bf16-4096x4096x4096``) carries the GEMM's
# dtype and shape, for a capture made with --nvtx and without --shape/--dtype.
_RANGE_SHAPE = re.compile(r"-(fp32|fp16|bf16)-((?:\d+x)?\d+x\d+x\d+)$")
TIMING_METHOD = ("a program's kernel cannot be launched again outside its program (perfscope has "
                 "neither its arguments nor its memory), so it is not event-timed: these are ncu's "
                 "durations (gpu__time_duration) of the captured launches and of the reference's, "
                 "both with caches flushed and clocks as found; when the SM clocks differ, compare "
                 "cycles")


@dataclass(frozen=True)
class ProgramRequest:
    """`perfscope profile [filters] -- COMMAND`: what to run, which launches, what they are."""

    command: tuple[str, ...]
    ncu: ncu_mod.NcuOptions = field(default_factory=ncu_mod.NcuOptions)
    out: Path | None = None             # default: reports/local/programs/<stem>-<time>.ncu-rep
    shape: str | None = None            # the selected kernel's GEMM, when the user knows it
    dtype: str | None = None
    time: bool = False                  # hold the capture against its reference's duration
    timeout: float | None = 1800.0
    tensor_maps: bool = False           # record the tensor maps its kernels were passed


@dataclass(frozen=True)
class ProgramCapture:
    """What `perfscope profile -- COMMAND` wrote, and whether all of it can be believed."""

    report: Path
    launches: int
    manifest: Path
    fault: str | None = None            # one sentence: which kernel faulted, and how
    untrusted: tuple[int, ...] = ()     # launch indices whose counters are not trustworthy
    timing: str = ""                    # what --time measured, in one sentence
    timing_error: str | None = None     # why --time could not measure (the capture is kept)
    tensor_maps: str = ""               # what --tensor-maps found, in one sentence

    @property
    def failed(self) -> bool:
        """Whether the program faulted under ncu."""
        return self.fault is not None


class ProgramInterrupted(KeyboardInterrupt):
    """Ctrl-C during a program's capture; ``sentence`` says what was kept."""

    def __init__(self, sentence: str) -> None:
        super().__init__(sentence)
        self.sentence = sentence


def command_stem(command: Sequence[str]) -> str:
    """The name a capture of command is filed under: the script or module it runs."""
    args = list(command)
    name = Path(args[0]).name if args else "program"
    for i, arg in enumerate(args):
        if arg == "-m" and i + 1 < len(args):
            name = args[i + 1].rsplit(".", 1)[-1]
            break
        if arg.endswith(".py"):
            name = Path(arg).stem
            break
    return re.sub(r"[^A-Za-z0-9_.]+", "_", name).strip("._") or "program"


def default_output(command: Sequence[str], now: datetime | None = None,
                   folder: Path = PROGRAMS_DIR) -> Path:
    """``<folder>/<command stem>-<YYYYmmdd-HHMMSS>[-N].ncu-rep``: never an existing capture."""
    base = f"{command_stem(command)}-{(now or datetime.now()).strftime('%Y%m%d-%H%M%S')}"
    path, n = folder / f"{base}.ncu-rep", 2
    while path.exists() or manifest_path(path).exists():
        path, n = folder / f"{base}-{n}.ncu-rep", n + 1
    return path


def shape_from_ranges(exprs: Sequence[str]) -> tuple[str, Shape] | None:
    """(dtype, shape) named by the first NVTX filter whose range ends ``-<dtype>-MxNxK`` (or
    ``-<dtype>-BxMxNxK`` for a batch)."""
    for expr in exprs:
        parts = [p for p in expr.split("/") if p and p != "*"]
        name = parts[-1].rsplit("@", 1)[-1] if parts else ""
        m = _RANGE_SHAPE.search(name)
        if m:
            return m.group(1), parse_shape(m.group(2))
    return None


def program_shape(req: ProgramRequest) -> tuple[str, Shape] | None:
    """The selected kernel's (dtype, shape): from --shape and --dtype, else an NVTX range name."""
    if (req.shape is None) != (req.dtype is None):
        raise PerfscopeError("give both --shape MxNxK and --dtype D for a program's kernel, or "
                             "neither (a range named ...-<dtype>-MxNxK in --nvtx also says them).")
    if req.shape is not None and req.dtype is not None:
        return normalize_dtype(req.dtype), parse_shape(req.shape)
    return shape_from_ranges(req.ncu.nvtx_include)


def profile_program(req: ProgramRequest,
                    on_progress: Callable[[ncu_mod.Progress], None] | None = None,
                    ncu: str | None = None) -> ProgramCapture:
    """Profile a program's selected kernels into a new report with a run manifest beside it.

    The report is read back (an unreadable one is this command's failure, not a later
    diagnose's). A program that fails while ncu replays one of its kernels keeps the
    launches profiled before it; the one ncu was replaying is marked not trustworthy in the
    manifest (``capture.untrusted_launches``), and the capture's ``fault`` says which.
    """
    if not req.command:
        raise PerfscopeError("no program to profile was given after --.")
    known = program_shape(req)
    if req.time and known is None:
        raise PerfscopeError("--time holds the kernel against its cuBLAS reference, which needs its "
                             "GEMM shape and dtype: add --shape MxNxK --dtype D.")
    target = ncu_mod.report_path(req.out) if req.out is not None else default_output(req.command)
    if target.exists():
        raise PerfscopeError(f"{target} exists; name another --out (perfscope never overwrites a "
                             "capture).")
    ncu = ncu or ncu_mod.find_ncu()
    ncu_mod.ncu_version(ncu)
    command, maps_file = list(req.command), None
    if req.tensor_maps:
        maps_file = target.with_name(f".{report_stem(target)}.maps.jsonl")
        maps_file.parent.mkdir(parents=True, exist_ok=True)
        maps_file.unlink(missing_ok=True)
        command = mapcapture.wrap_command(command, mapcapture.build_library(), maps_file.resolve())
    try:
        run = ncu_mod.execute(ncu, replace(req.ncu, output=target), command,
                              timeout=req.timeout, on_progress=on_progress)
    except ncu_mod.NcuInterrupted as stop:
        raise _program_interrupted(stop.run, target) from None
    finally:
        maps = _read_maps(maps_file) if maps_file is not None else None
    if run.report is None:
        raise run.failure or PerfscopeError("ncu finished but wrote no report.")
    launches = len(load(run.report))
    fault, untrusted = _fault(run, launches)
    manifest = _program_manifest(req, known, launches, fault, untrusted)
    if maps is not None:
        manifest = replace(manifest, tensor_maps=maps[0], tensor_maps_note=maps[1])
    path = _write_manifest(manifest, run.report)
    capture = ProgramCapture(run.report, launches, path, fault, untrusted,
                             tensor_maps=maps[1] if maps else "")
    if req.time and fault is None:
        try:
            capture = _time_against_reference(capture, manifest, on_progress, ncu)
        except PerfscopeError as exc:
            # The capture stands without its timing; the caller says why there is none.
            capture = replace(capture, timing_error=str(exc))
    return capture


def _read_maps(path: Path) -> tuple[tuple[KernelMaps, ...], str]:
    """The kernels and maps the capture library wrote, and what it found in one sentence;
    the file itself is removed (the manifest keeps what it says)."""
    try:
        found = mapcapture.read_capture(path)
        return (found.kernels if found else ()), mapcapture.note(found)
    except (PerfscopeError, OSError) as exc:
        return (), f"the tensor-map capture could not be read: {exc}"
    finally:
        path.unlink(missing_ok=True)


def _program_interrupted(run: ncu_mod.NcuRun, target: Path) -> ProgramInterrupted:
    if run.report is None:
        return ProgramInterrupted("ncu had written no report yet, so nothing was kept")
    try:
        launches = len(load(run.report))
    except PerfscopeError:
        launches = 0
    if not launches:
        run.report.unlink(missing_ok=True)
        return ProgramInterrupted("ncu had profiled no launch yet, so nothing was kept")
    os.replace(run.report, target)
    return ProgramInterrupted(f"kept the {launches} launch(es) profiled so far in {target}")


def _fault(run: ncu_mod.NcuRun, launches: int) -> tuple[str | None, tuple[int, ...]]:
    """Which kernel the failed program was in, and the report's launches that cannot be
    believed: those ncu had not finished replaying when the program died."""
    if run.failure is None:
        return None, ()
    kernels = ncu_mod.profiled_kernels(run.output)
    complete = sum(1 for _, passes in kernels if passes is not None)
    broken = next((name for name, passes in kernels if passes is None), None)
    reason = str(run.failure).rstrip(".")
    if broken is None:
        return f"after its last profiled launch, {reason}", ()
    untrusted = tuple(range(complete, launches))
    where = f"launch #{complete}" + ("" if untrusted else ", not in the report")
    return f"{broken} ({where}) did not finish under ncu: {reason}", untrusted


def _program_manifest(req: ProgramRequest, known: tuple[str, Shape] | None, launches: int,
                      fault: str | None, untrusted: tuple[int, ...]) -> RunManifest:
    o = req.ncu
    capture = Capture(command=tuple(req.command), kernel_regex=o.kernel_regex,
                      launch_skip=o.launch_skip, launch_count=o.launch_count, nvtx=o.nvtx_include,
                      replay_mode=o.replay_mode, launches=launches, fault=fault,
                      untrusted_launches=untrusted)
    # Unknown, the shape is 0x0x0 (RunManifest.shape_known) and the dtype empty.
    dtype, shape = known if known else ("", None)
    m, n, k, batch = (shape.m, shape.n, shape.k, shape.batch) if shape else (0, 0, 0, 1)
    return RunManifest(stage=PROGRAM, family=PROGRAM, dtype=dtype, m=m, n=n, k=k, batch=batch,
                       params={},
                       verification=Verification(UNVERIFIED, detail="a program's own kernel: "
                                                 "perfscope did not make its inputs, so it cannot "
                                                 "check its output"),
                       layout=UNKNOWN_LAYOUT, capture=capture, clock_control=o.clock_control,
                       created=datetime.now(timezone.utc).isoformat(timespec="seconds"))


def _write_manifest(manifest: RunManifest, report: Path) -> Path:
    path = manifest_path(report)
    tmp = path.with_name(f".{path.name}.part")
    tmp.write_text(json.dumps(manifest.to_dict(), indent=1) + "\n")
    os.replace(tmp, path)
    return path


def _time_against_reference(capture: ProgramCapture, manifest: RunManifest,
                            on_progress: Callable[[ncu_mod.Progress], None] | None,
                            ncu: str) -> ProgramCapture:
    """Record the captured launches' durations and the ratio to the reference's (made now,
    beside the report, if it is not there yet) in the manifest."""
    first = next(i for i in range(capture.launches) if i not in capture.untrusted)
    _, side_b = diagnosis.resolve_pair(
        f"{capture.report}#{first}", "cublas", diagnosis.ResolveOptions(),
        make_reference=lambda missing: make_reference(missing, on_progress, ncu))
    records = [r for r in diagnosis.diagnose([capture.report])
               if r.profile.identity.launch_index not in capture.untrusted]
    a_ms = [r.profile.sol.duration_ns / 1e6 for r in records if r.profile.sol.duration_ns]
    b_ns = side_b.profile.sol.duration_ns
    if not a_ms or not b_ns:
        return replace(capture, timing="not timed: ncu's duration (gpu__time_duration) was not "
                       "collected in one of the reports; cycles stay the comparison")
    flops = manifest.flops
    b_ms = b_ns / 1e6
    ratio = b_ms / Spread.of(a_ms).median

    def tflops(times: list[float]) -> Spread:
        return Spread.of([flops / (t * 1e-3) / 1e12 for t in times])

    def clocks(rs: Sequence[Diagnosed]) -> Spread | None:
        mhz = [r.profile.identity.sm_clock_hz / 1e6 for r in rs if r.profile.identity.sm_clock_hz]
        return Spread.of(mhz) if mhz else None

    timing = Timing(runs_per_round=len(a_ms), rounds=1, warmup=0, l2_flush_bytes=0, l2_flush="none",
                    time_ms=Spread.of(a_ms), tflops=tflops(a_ms),
                    reference=side_b.stage.name if side_b.stage else None,
                    reference_time_ms=Spread.of([b_ms]), reference_tflops=tflops([b_ms]),
                    ratio_to_reference=Spread.of([ratio]), round_ratios=(ratio,),
                    sm_clock_mhz=clocks(records), reference_sm_clock_mhz=clocks([side_b]))
    assert manifest.capture is not None
    timed = replace(manifest, timing=timing,
                    capture=replace(manifest.capture, timing_method=TIMING_METHOD))
    _write_manifest(timed, capture.report)
    name = side_b.stage.name if side_b.stage else "the reference"
    return replace(capture, timing=f"{Spread.of(a_ms).median:.3f} ms against {name}'s {b_ms:.3f} ms, "
                   f"{ratio:.2f}x its speed (ncu's durations, not CUDA events: a program's kernel "
                   "cannot be launched outside its program; the manifest's capture.timing_method "
                   "says how)")


# ------------------------------------------------------------------ references on demand


def make_reference(missing: diagnosis.MissingReference,
                   on_progress: Callable[[ncu_mod.Progress], None] | None = None,
                   ncu: str | None = None, timeout: float | None = 1800.0,
                   on_start: Callable[[], None] | None = None) -> Path:
    """Profile the missing reference now: on this GPU, at A's dtype and shape, with the
    clocks as found, in an ncu process of its own; its report and manifest go beside A.

    What makes that impossible here (no ncu, no GPU, another GPU than A's) is refused in
    one sentence that names the command to run where it is possible; on_start is called
    once it is not."""
    stage, dtype, shape, folder = missing.stage, missing.dtype, missing.shape, missing.folder
    command = f"`perfscope profile {stage} --dtype {dtype} --shape {shape} --out {folder}`"
    what = f"no report of {stage} in {dtype} at {shape} is beside {missing.like.path}"
    try:
        ncu = ncu or ncu_mod.find_ncu()
    except PerfscopeError:
        raise PerfscopeError(f"{what}, and Nsight Compute (ncu) is not installed here to make it; on "
                             f"a GPU machine with ncu, {command} makes it.") from None
    if driver_device_count() < 1:
        raise PerfscopeError(f"{what}, and this machine has no GPU to make it on; on A's GPU, "
                             f"{command} makes it.")
    here, there = _gpu_name(), missing.like.profile.identity.device
    if here and there and here != there:
        raise PerfscopeError(f"{what}; A was profiled on an {there} and this machine has an {here}, "
                             f"so a reference made here would not be comparable: run {command} on "
                             f"an {there}.")
    ours = layout_for(dtype)
    layout = missing.like.manifest.layout if missing.like.manifest is not None else ours
    if layout not in (ours, UNKNOWN_LAYOUT):
        raise PerfscopeError(f"{what}, and perfscope profiles {dtype} references only as {ours}, "
                             f"not as A's {layout}.")
    # A whose maps were recorded is compared with the reference's, recorded the same way.
    maps = bool(missing.like.manifest is not None and missing.like.manifest.tensor_maps)
    req = ProfileRequest(stages=(stage,), dtypes=(dtype,), shape=shape, out=folder,
                         ncu=ncu_mod.NcuOptions(clock_control="none"), timeout=timeout,
                         tensor_maps=maps)
    if on_start is not None:
        on_start()
    summary = profile_stages(req, on_progress, ncu)
    result = next(r for r in summary.results if r.stem == stem_for(stage, dtype, shape))
    if result.failed or result.report is None:
        raise PerfscopeError(f"profiling {stage} in {dtype} at {shape} failed ({result.verdict}"
                             + (f": {result.detail.rstrip('.')}" if result.detail else "") + ").")
    return result.report
