"""`perfscope bench`: plan the runs, verify each stage, time the right ones against cuBLAS.

Correctness comes first and decides whether a stage gets a speed at all (perfscope.verify);
timing is CUDA events in alternating rounds against the stage's cuBLAS reference in the
same process (perfscope.timing); every run becomes a RunManifest with the machine it ran
on (perfscope.environment). A wrong stage is written down as wrong, never with a speed.
"""

from __future__ import annotations

import datetime as _dt
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from perfscope.documents import BenchSummary
from perfscope.environment import collect_environment
from perfscope.errors import PerfscopeError, one_line
from perfscope.kernels import REFERENCE_FOR_DTYPE, all_specs, get_spec, launch
from perfscope.kernels.epilogue import epilogue_of
from perfscope.kernels.fused_specs import H200_MULTIPROCESSORS, SMALL_M_TILED, small_m_for
from perfscope.kernels.launch import (
    Prepared,
    capability_refusal,
    never_run_refusal,
    prepare,
    require_gpu,
)
from perfscope.kernels.registry import declared_params, reference_name
from perfscope.kernels.spec import DTYPES, KernelSpec, Shape, normalize_dtype
from perfscope.manifest import (
    ERROR,
    OK,
    REFUSED,
    WRONG,
    BenchFile,
    CompileInfo,
    Environment,
    RunManifest,
    Timing,
    Verification,
    layout_for,
)
from perfscope.stage import at_defaults
from perfscope.timing import BenchOptions, time_stage
from perfscope.tune.space import Config, limits_for, static_prune
from perfscope.verify import verify

log = logging.getLogger(__name__)

DEFAULT_SHAPE = Shape(4096, 4096, 4096)


@dataclass(frozen=True)
class Job:
    """One (stage, dtype, shape) to run; ``refusal`` set when the shape does not fit."""

    spec: KernelSpec
    dtype: str
    shape: Shape
    refusal: str | None = None
    # Whether the spec is its stage as a plain `perfscope bench STAGE --shape` runs it: the
    # declared defaults, with hgemm_small_m's tile chosen by the host for the shape (no
    # --param moved it). Such a job may be a ladder step timed head to head with its parent.
    declared: bool = False


def plan(stages: Sequence[str], dtypes: Sequence[str], shape: Shape,
         params: dict[str, int] | None = None) -> list[Job]:
    """Resolve names ("all" or stage names) and dtypes into jobs, refusing bad input.

    Named stages must take every dtype asked for and fit the shape; under "all", stages
    are picked per dtype and a shape a stage refuses becomes a REFUSED row, not an error.
    With no dtype given, a named stage runs in its first dtype and "all" in every dtype.
    """
    dts = [normalize_dtype(d) for d in dtypes]
    everything = not stages or any(s == "all" for s in stages)
    if everything and len(stages) > 1:
        raise PerfscopeError("'all' cannot be combined with stage names")
    specs = list(all_specs()) if everything else [get_spec(s) for s in stages]
    for spec in specs:
        # "all" never holds such a stage (all_specs); named, it is refused before any job.
        if spec.never_run:
            raise PerfscopeError(never_run_refusal(spec, launch.driver_compute_capability()))
    if params:
        specs = _apply_params(specs, params, strict=not everything)
    for spec in specs:
        epilogue_of(spec)  # an ACT or RESIDUAL the kernel has no code for: one sentence
    # hgemm_small_m takes its tile (rows, columns, ring depth) from the shape, and whether
    # it splits over the grid from this GPU's multiprocessors (the H200's without one).
    sms = launch.driver_multiprocessors() if any(s.name in SMALL_M_TILED for s in specs) else None
    sms = sms or H200_MULTIPROCESSORS
    specs = [small_m_for(spec, shape, params, sms) for spec in specs]
    jobs: list[Job] = []
    cc = launch.driver_compute_capability() if everything else None
    for spec in specs:
        wanted = dts or (list(DTYPES) if everything else [spec.dtypes[0]])
        for dtype in wanted:
            if dtype not in spec.dtypes:
                if everything:
                    continue
                spec.check_dtype(dtype)
            try:
                spec.check_shape(shape)
            except PerfscopeError as exc:
                if not everything:
                    raise
                jobs.append(Job(spec, dtype, shape, refusal=str(exc)))
                continue
            unfit = capability_refusal(spec, cc) if cc is not None else None
            beyond = _beyond_limits(spec, dtype) if params else None
            if beyond and not everything:
                raise PerfscopeError(beyond)
            unfit = unfit or beyond
            if unfit:
                # Under "all", a stage this GPU cannot run (wgmma off Hopper) is a row.
                jobs.append(Job(spec, dtype, shape, refusal=unfit))
                continue
            jobs.append(Job(spec, dtype, shape, declared=_as_declared(spec, shape, sms)))
    if not jobs:
        raise PerfscopeError(f"no stage takes dtype {', '.join(dts)}")
    return jobs


def _beyond_limits(spec: KernelSpec, dtype: str) -> str | None:
    """Why the stage at its --param values cannot launch, as tune prunes it before compiling
    (a ring larger than a block's shared memory, too many threads, a TMA box too wide), so
    the user reads the limit rather than the driver's CUDA_ERROR_INVALID_VALUE."""
    if spec.space is None:
        return None
    why = static_prune(spec, Config.of(spec, spec.param_dict), dtype, limits_for(spec.archs[0]))
    if why is None:
        return None
    defaults = get_spec(spec.name).param_dict
    changed = " ".join(f"{k}={v}" for k, v in spec.params if defaults.get(k) != v)
    return f"{spec.name} with {changed or 'its defaults'} ({dtype}) cannot launch: {why}"


def _apply_params(specs: list[KernelSpec], params: dict[str, int], strict: bool) -> list[KernelSpec]:
    out = []
    for spec in specs:
        mine = {k: v for k, v in params.items() if k in spec.param_dict}
        if strict and len(mine) != len(params):
            spec.with_params(**params)  # raises the one-sentence refusal
        out.append(spec.with_params(**mine) if mine else spec)
    return out


def reference_spec(dtype: str, spec: KernelSpec | None = None) -> KernelSpec:
    """The reference a stage is timed against: cuBLAS of its dtype, or for a fused stage the
    group that computes the same epilogue unfused (cuBLAS, then an elementwise pass)."""
    if spec is not None:
        return get_spec(reference_name(spec, dtype))
    return get_spec(REFERENCE_FOR_DTYPE[dtype])


# ---------------------------------------------------------------------------- driver


def compile_info(prep: Prepared) -> CompileInfo | None:
    """How a prepared stage was compiled, for its manifest; None when nothing was compiled."""
    mod = prep.module
    if mod is None:
        return None
    expr = prep.expression
    return CompileInfo(arch=mod.arch, name_expression=expr, mangled=mod.mangled(expr),
                       source=prep.source_name, source_hash=mod.source_hash,
                       options=mod.options, resources=mod.usage(expr).to_dict(),
                       nvrtc=mod.nvrtc_version, dynamic_smem=prep.dynamic_smem,
                       block=prep.block, grid=prep.grid)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def make_manifest(job: Job, verification: Verification, **kw: Any) -> RunManifest:
    """The run manifest of one job, with its verification and whatever else the run measured."""
    s = job.shape
    return RunManifest(stage=job.spec.name, family=job.spec.family, dtype=job.dtype,
                       m=s.m, n=s.n, k=s.k, batch=s.batch, params=job.spec.param_dict,
                       verification=verification, parent=job.spec.parent,
                       variant=job.spec.variant, layout=layout_for(job.dtype), created=_now(),
                       **kw)


def is_context_fatal(exc: BaseException) -> bool:
    """Whether a CUDA error leaves the context unusable, so the run must stop."""
    # After an illegal address or a launch failure the CUDA context is unusable: every
    # later call fails too, so the run must stop rather than blame the next stages.
    text = str(exc)
    return any(code in text for code in ("ILLEGAL_ADDRESS", "LAUNCH_FAILED", "MISALIGNED",
                                         "ILLEGAL_INSTRUCTION", "HARDWARE_STACK_ERROR",
                                         "IllegalAddress", "LaunchFailure", "Misaligned"))


def is_cuda_error(exc: BaseException) -> bool:
    """A CUDA, cuBLAS or NVRTC error raised by CuPy (its classes live in cupy_backends)."""
    return type(exc).__module__.startswith(("cupy", "cupy_backends"))


def _as_declared(spec: KernelSpec, shape: Shape, multiprocessors: int) -> bool:
    """Whether the spec is its registry stage as declared for this shape: its defaults (with
    hgemm_small_m's host-chosen tile, small_m_for), built from the package's kernels with its
    flags (kernel_ab's other side, built from another tree's kernels under the same name,
    is not)."""
    params = declared_params(spec.name, shape, multiprocessors)
    if params is None:
        return False
    declared = get_spec(spec.name)
    return (spec.kernel_dir == declared.kernel_dir and spec.flags == declared.flags
            and at_defaults(spec.param_dict, params))


Steps = dict[tuple[str, str, Shape], Prepared]


def _parent_for(job: Job, prep: Prepared, steps: Steps) -> Prepared | None:
    """The job's parent stage as this run prepared and verified it, when both run as
    declared for the shape (Job.declared) and compute the same epilogue (a ladder step bench
    times head to head)."""
    parent = steps.get((job.spec.parent, job.dtype, job.shape)) if job.spec.parent else None
    if parent is None or not job.declared or parent.epilogue != prep.epilogue:
        return None
    return parent


def _run_one(job: Job, opts: BenchOptions, refs: dict,
             steps: Steps) -> tuple[Prepared, Verification, Timing | None]:
    prep = prepare(job.spec, job.dtype, job.shape)
    verdict = verify(prep, opts.seed, quant_scale=opts.quant_scale)
    if verdict.verdict != OK or not opts.time:
        return prep, verdict, None
    ref = None
    if not job.spec.is_reference:
        rspec = reference_spec(job.dtype, job.spec)
        key = (rspec.name, job.dtype, job.shape)
        if key not in refs:
            refs[key] = _prepared_reference(rspec, job, opts)
        rprep, rver = refs[key]
        if rver.verdict == OK:
            ref = rprep
        else:
            log.warning("%s %s (%s); no ratio for %s", rspec.name,
                        "refused the shape" if rver.verdict == REFUSED else "failed its own check",
                        rver.detail, job.spec.name)
    timing = time_stage(prep, ref, opts, _parent_for(job, prep, steps))
    # A parent for the steps above it once it has verified and timed (a stage whose timing
    # failed is no one's parent).
    if not job.spec.is_reference and job.declared:
        steps[(job.spec.name, job.dtype, job.shape)] = prep
    return prep, verdict, timing


def _prepared_reference(rspec: KernelSpec, job: Job,
                        opts: BenchOptions) -> tuple[Prepared | None, Verification]:
    """The reference prepared and checked at the job's shape, or refused where it cannot take
    that shape (cuBLASLt's FP8 GEMM: dimensions divisible by 16): the stage is still timed."""
    try:
        rspec.check_shape(job.shape)
    except PerfscopeError as exc:
        return None, Verification(REFUSED, detail=str(exc))
    rprep = prepare(rspec, job.dtype, job.shape)
    return rprep, verify(rprep, opts.seed, quant_scale=opts.quant_scale)


def run_jobs(jobs: Sequence[Job], opts: BenchOptions,
             env: Environment | None = None) -> Iterator[RunManifest]:
    """Verify, then (if right and asked) time each job against its cuBLAS reference.

    Yields one manifest per job as soon as it is done, so a caller keeps what is finished
    when a later stage takes the GPU down. A stage that fails to compile, launch or run
    becomes an ERROR row; one that leaves the CUDA context broken ends the run.
    """
    cp = require_gpu()
    env = env or collect_environment(cp)
    refs: dict[tuple[str, str, Shape], tuple[Prepared, Verification]] = {}
    # Stages verified at their defaults, for the ladder steps above them (ladder order runs
    # a parent before its children).
    steps: Steps = {}
    for job in jobs:
        if job.refusal is not None:
            yield make_manifest(job, Verification(REFUSED, detail=job.refusal), environment=env)
            continue
        try:
            prep, verdict, timing = _run_one(job, opts, refs, steps)
        except Exception as exc:
            if not isinstance(exc, PerfscopeError) and not is_cuda_error(exc):
                raise
            log.error("%s (%s, %s): %s", job.spec.name, job.dtype, job.shape, exc)
            yield make_manifest(job, Verification(ERROR, detail=one_line(exc)), environment=env)
            if is_context_fatal(exc):
                raise PerfscopeError(f"{job.spec.name} ({job.dtype}, {job.shape}) crashed on the "
                                     f"GPU ({one_line(exc)}); the remaining stages were not "
                                     "run") from None
            continue
        yield make_manifest(job, verdict, timing=timing, compile=compile_info(prep),
                        environment=env)



def write_bench_json(path: Any, manifests: Sequence[RunManifest], command: str = "") -> None:
    """The bench file: the environment once, each manifest with only its own run."""
    env = next((m.environment for m in manifests if m.environment is not None), None)
    # The environment is written once at the top; each manifest keeps only its own run.
    slim = tuple(replace(m, environment=None) for m in manifests)
    try:
        BenchFile(manifests=slim, environment=env, command=command, created=_now()).write(
            Path(path))
    except OSError as exc:
        raise PerfscopeError(f"cannot write {path}: {exc.strerror}") from None


def summary(manifests: Sequence[RunManifest], title: str | None = None) -> BenchSummary:
    """The bench results document: the runs and how each stage is named."""
    return BenchSummary(tuple(manifests), tuple(stage_label(m) for m in manifests), title)


def stage_label(m: RunManifest) -> str:
    """The stage name, its non-default parameters, and whether it is a variant."""
    try:
        defaults = get_spec(m.stage).param_dict
    except PerfscopeError:
        defaults = {}
    changed = [f"{k}={v}" for k, v in m.params.items() if defaults.get(k) != v]
    return (m.stage + (f" [{', '.join(changed)}]" if changed else "")
            + (" (variant)" if m.variant else ""))


def failed(manifests: Sequence[RunManifest]) -> bool:
    """Whether any run came out wrong or failed with an error."""
    return any(m.verification.verdict in (WRONG, ERROR) for m in manifests)


# A ladder step within this fraction of its parent is a tie, whatever its rounds say: two
# builds of one kernel measured 0.998-1.009 of each other in alternating rounds on the H200
# (benchmarks/small_m_probe.py against an identical source), and five rounds of two equal
# sides all fall on one side of 1 one time in sixteen. The stream-K stage at 4096^3, which
# does not split there and is the persistent stage with its unused fixup compiled in, read
# 0.996-0.999 of it in every round (2026-12-04).
STEP_TIE = 0.005


@dataclass(frozen=True)
class ParentStep:
    """One rung of a ladder against the rung below it, same dtype and shape, same run."""

    stage: str
    dtype: str
    parent: str
    # Head to head (the parent timed in the stage's own rounds): the median of the parent's
    # time over the stage's per round. Otherwise the stage's median TFLOP/s over the
    # parent's, from separate rounds.
    speedup: float
    variant: bool
    # Whether the speedup is beyond the rounds' spread: head to head, every round on the
    # same side of 1; otherwise the two stages' ratios to the reference do not overlap,
    # every round of the slower one below every round of the faster (no ratios: the
    # medians alone decide).
    apart: bool = True
    head_to_head: bool = False

    @property
    def regression(self) -> bool:
        """Whether the stage is slower than its parent beyond the rounds' spread and by more
        than STEP_TIE (a tie is no regression; a variant may be slower, on purpose)."""
        return self.speedup < 1.0 - STEP_TIE and self.apart and not self.variant


def parent_steps(manifests: Sequence[RunManifest]) -> list[ParentStep]:
    """Speedup of every timed stage over its timed parent (each run as declared for its
    shape: the defaults, hgemm_small_m's tile the host's choice on the run's GPU)."""
    def is_default(m: RunManifest) -> bool:
        sms = m.environment.sm_count if m.environment is not None else H200_MULTIPROCESSORS
        params = declared_params(m.stage, Shape(m.m, m.n, m.k, m.batch), sms)
        return params is not None and at_defaults(m.params, params)

    timed = {(m.stage, m.dtype, m.shape): m for m in manifests
             if m.timing is not None and is_default(m)}
    steps = []
    for (stage, dtype, shape), m in timed.items():
        parent = timed.get((m.parent, dtype, shape)) if m.parent else None
        if parent is None:
            continue
        h2h = m.timing.step_ratio(parent.stage)
        if h2h is not None:
            steps.append(ParentStep(stage, dtype, parent.stage, h2h.median, m.variant,
                                    h2h.max < 1.0 or h2h.min > 1.0, head_to_head=True))
        else:
            steps.append(ParentStep(stage, dtype, parent.stage,
                                    m.timing.tflops.median / parent.timing.tflops.median,
                                    m.variant, _apart(m.timing, parent.timing)))
    return steps


def _apart(a: Timing, b: Timing) -> bool:
    ra, rb = a.ratio_to_reference, b.ratio_to_reference
    if ra is None or rb is None:
        return True
    return ra.max < rb.min or rb.max < ra.min
