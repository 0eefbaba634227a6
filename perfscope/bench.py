"""Correctness against a float64 reference, then CUDA-event timing against cuBLAS.

Correctness comes first and decides whether a stage gets a speed at all: inputs are
fresh standard-normal values (never zeros), the output is poisoned with NaN before the
launch, and the result must pass two checks against ``A·B`` computed in float64 from the
same (already rounded) inputs:

* relative Frobenius error ``||C - ref|| / ||ref||`` under 1e-5 (fp32) or 1e-2 (fp16,
  bf16), and
* elementwise ``|C - ref| <= acc_tol·(|A|·|B|) + out_tol·|ref| + abs_tol``: the first term
  bounds the fp32 accumulation error, the second the rounding of C to its dtype, so one
  wrong element (a missed k-tile, a race) fails even when the norm barely moves.

NaN or infinity anywhere fails. Timing uses CUDA events around each launch, with a
512 MiB buffer rewritten before every launch so that no run finds A or B in the 60 MiB
L2 (that write also keeps the GPU busy while Python enqueues the launch, so host
overhead stays outside the events). Stage and cuBLAS reference are timed in alternating
rounds in one process; each round gives one ratio of the two medians.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata as md
import logging
import os
import platform
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from perfscope.build import nvrtc_version
from perfscope.errors import PerfscopeError
from perfscope.kernels import REFERENCE_FOR_DTYPE, all_specs, get_spec, launch
from perfscope.kernels.launch import (
    Prepared,
    capability_refusal,
    never_run_refusal,
    numpy_dtype,
    prepare,
    require_gpu,
)
from perfscope.kernels.spec import DTYPES, KernelSpec, Shape, normalize_dtype
from perfscope.manifest import (
    ERROR,
    OK,
    REFUSED,
    WRONG,
    CompileInfo,
    Environment,
    RunManifest,
    Spread,
    Timing,
    Verification,
)

log = logging.getLogger(__name__)

# dtype -> (Frobenius tolerance, accumulation tolerance, output rounding, absolute floor)
TOLERANCES: dict[str, tuple[float, float, float, float]] = {
    "fp32": (1e-5, 1e-5, 1e-6, 1e-6),
    # fp16 rounds C to 11 significant bits (2^-11 relative), bf16 to 8 (2^-8); twice that.
    "fp16": (1e-2, 2e-3, 1e-3, 1e-5),
    "bf16": (1e-2, 2e-3, 8e-3, 1e-5),
}

CHECK_SHAPES: tuple[Shape, ...] = (
    Shape(1, 1, 1), Shape(2, 3, 5), Shape(127, 129, 65), Shape(1000, 2000, 500),
    Shape(4096, 4096, 4096),
)
DEFAULT_SHAPE = Shape(4096, 4096, 4096)


@dataclass(frozen=True)
class BenchOptions:
    runs: int = 20
    rounds: int = 3
    warmup: int = 3
    time: bool = True
    seed: int | None = None
    l2_flush_bytes: int = 512 * 2**20

    def __post_init__(self) -> None:
        if self.runs < 1 or self.rounds < 1 or self.warmup < 0:
            raise PerfscopeError("runs and rounds must be at least 1 and warmup at least 0")


@dataclass(frozen=True)
class Job:
    """One (stage, dtype, shape) to run; ``refusal`` set when the shape does not fit."""

    spec: KernelSpec
    dtype: str
    shape: Shape
    refusal: str | None = None


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
            if unfit:
                # Under "all", a stage this GPU cannot run (wgmma off Hopper) is a row.
                jobs.append(Job(spec, dtype, shape, refusal=unfit))
                continue
            jobs.append(Job(spec, dtype, shape))
    if not jobs:
        raise PerfscopeError(f"no stage takes dtype {', '.join(dts)}")
    return jobs


def _apply_params(specs: list[KernelSpec], params: dict[str, int], strict: bool) -> list[KernelSpec]:
    out = []
    for spec in specs:
        mine = {k: v for k, v in params.items() if k in spec.param_dict}
        if strict and len(mine) != len(params):
            spec.with_params(**params)  # raises the one-sentence refusal
        out.append(spec.with_params(**mine) if mine else spec)
    return out


def reference_spec(dtype: str) -> KernelSpec:
    return get_spec(REFERENCE_FOR_DTYPE[dtype])


# ---------------------------------------------------------------------------- correctness


def make_inputs(cp: Any, shape: Shape, dtype: str, seed: int | None) -> tuple[Any, Any]:
    rng = cp.random.default_rng(seed)
    nd = numpy_dtype(dtype)
    a = rng.standard_normal((shape.m, shape.k), dtype=cp.float32).astype(nd)
    b = rng.standard_normal((shape.k, shape.n), dtype=cp.float32).astype(nd)
    return cp.ascontiguousarray(a), cp.ascontiguousarray(b)


def _poisoned(cp: Any, shape: Shape, dtype: str) -> Any:
    # NaN in the output's own type: an element the kernel never writes stays NaN.
    return cp.full((shape.m, shape.n), float("nan"), dtype=cp.float32).astype(numpy_dtype(dtype))


def check_result(cp: Any, a: Any, b: Any, c: Any, dtype: str) -> Verification:
    """Compare c with a·b in float64; see the module docstring for the two checks."""
    fro_tol, acc_tol, out_tol, abs_tol = TOLERANCES[dtype]
    a64, b64 = a.astype(cp.float64), b.astype(cp.float64)
    ref = a64 @ b64
    scale = cp.abs(a64) @ cp.abs(b64)
    del a64, b64
    c64 = c.astype(cp.float64)
    nonfinite = int(cp.count_nonzero(~cp.isfinite(c64)))
    if nonfinite:
        return Verification(WRONG, None, fro_tol, None, nonfinite, nonfinite,
                            f"{nonfinite} of {c.size} outputs are NaN or infinite "
                            "(never written, or overflowed)")
    diff = cp.abs(c64 - ref)
    ref_norm = float(cp.linalg.norm(ref))
    err = float(cp.linalg.norm(diff)) / ref_norm if ref_norm > 0 else float(cp.linalg.norm(diff))
    bound = acc_tol * scale + out_tol * cp.abs(ref) + abs_tol
    ratio = diff / bound
    bad = int(cp.count_nonzero(ratio > 1.0))
    worst = float(ratio.max())
    if err > fro_tol or bad:
        where = ""
        if bad:
            idx = int(cp.argmax(ratio))
            i, j = divmod(idx, c.shape[1])
            where = (f"; worst at C[{i}][{j}] = {float(c64[i, j]):.6g}, "
                     f"reference {float(ref[i, j]):.6g}")
        detail = (f"relative Frobenius error {err:.3g} (tolerance {fro_tol:g}); "
                  f"{bad} elements outside the elementwise bound{where}")
        return Verification(WRONG, err, fro_tol, worst, bad, 0, detail)
    return Verification(OK, err, fro_tol, worst, 0, 0, "")


def verify(prep: Prepared, seed: int | None = None) -> Verification:
    """Fresh inputs, poisoned output, one launch, two checks."""
    cp = require_gpu()
    a, b = make_inputs(cp, prep.shape, prep.dtype, seed)
    c = _poisoned(cp, prep.shape, prep.dtype)
    prep.launch(a, b, c)
    cp.cuda.get_current_stream().synchronize()
    return check_result(cp, a, b, c, prep.dtype)


# ---------------------------------------------------------------------------- timing


class ClockReader:
    """The current SM clock in MHz from NVML (nvidia-ml-py), else nvidia-smi, else None."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._handle: Any = None
        self._smi = shutil.which("nvidia-smi")
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(self._device_index())
            self._nvml = pynvml
        except Exception as exc:  # no NVML is a missing figure, not a failure
            log.info("NVML unavailable (%s); SM clock from nvidia-smi", exc)

    @staticmethod
    def _device_index() -> int:
        import cupy

        return cupy.cuda.Device().id

    def sm_mhz(self) -> float | None:
        if self._nvml is not None:
            try:
                return float(self._nvml.nvmlDeviceGetClockInfo(self._handle,
                                                               self._nvml.NVML_CLOCK_SM))
            except Exception:
                return None
        if self._smi:
            try:
                out = subprocess.run([self._smi, "--query-gpu=clocks.sm",
                                      "--format=csv,noheader,nounits",
                                      f"--id={self._device_index()}"],
                                     capture_output=True, text=True, timeout=10)
                return float(out.stdout.strip().splitlines()[0])
            except (OSError, ValueError, IndexError, subprocess.SubprocessError):
                return None
        return None

    def info(self) -> dict[str, str]:
        """Driver version and clock limits as found (nothing here changes them)."""
        out: dict[str, str] = {}
        nv = self._nvml
        if nv is None:
            return out
        for key, fn in (
            ("driver", lambda: nv.nvmlSystemGetDriverVersion()),
            ("sm_clock_max_mhz", lambda: nv.nvmlDeviceGetMaxClockInfo(self._handle,
                                                                       nv.NVML_CLOCK_SM)),
            ("mem_clock_max_mhz", lambda: nv.nvmlDeviceGetMaxClockInfo(self._handle,
                                                                        nv.NVML_CLOCK_MEM)),
            ("sm_clock_app_mhz", lambda: nv.nvmlDeviceGetApplicationsClock(self._handle,
                                                                            nv.NVML_CLOCK_SM)),
            ("power_limit_w", lambda: nv.nvmlDeviceGetPowerManagementLimit(self._handle) / 1000),
        ):
            try:
                value = fn()
                out[key] = value.decode() if isinstance(value, bytes) else str(value)
            except Exception:
                continue
        return out


@dataclass(frozen=True)
class _Batch:
    times_ms: tuple[float, ...]
    clocks: tuple[float, ...]


class _Timer:
    """Event-timed launches of prepared GEMMs over shared inputs and one flush buffer."""

    def __init__(self, cp: Any, shape: Shape, dtype: str, opts: BenchOptions):
        self.cp, self.opts = cp, opts
        self.a, self.b = make_inputs(cp, shape, dtype, opts.seed)
        self.c = cp.empty((shape.m, shape.n), dtype=numpy_dtype(dtype))
        self.flush = cp.empty(opts.l2_flush_bytes // 4, dtype=cp.float32)
        self.clock = ClockReader()

    def warm(self, prep: Prepared) -> None:
        for _ in range(self.opts.warmup):
            prep.launch(self.a, self.b, self.c)
        self.cp.cuda.get_current_stream().synchronize()

    def batch(self, prep: Prepared) -> _Batch:
        cp = self.cp
        starts = [cp.cuda.Event() for _ in range(self.opts.runs)]
        ends = [cp.cuda.Event() for _ in range(self.opts.runs)]
        for start, end in zip(starts, ends, strict=True):
            self.flush.fill(1.0)
            start.record()
            prep.launch(self.a, self.b, self.c)
            end.record()
        # Sample the clock while the queued launches run, not after they have finished.
        clocks = []
        while not ends[-1].done and len(clocks) < 64:
            mhz = self.clock.sm_mhz()
            if mhz is not None:
                clocks.append(mhz)
            time.sleep(0.002)
        ends[-1].synchronize()
        return _Batch(tuple(cp.cuda.get_elapsed_time(s, e) for s, e in zip(starts, ends, strict=True)),
                      tuple(clocks))


def _median(values: Sequence[float]) -> float:
    return Spread.of(list(values)).median


def time_stage(prep: Prepared, ref: Prepared | None, opts: BenchOptions) -> Timing:
    """Alternating rounds of the stage and its reference; one ratio per round."""
    cp = require_gpu()
    timer = _Timer(cp, prep.shape, prep.dtype, opts)
    timer.warm(prep)
    if ref is not None:
        timer.warm(ref)
    stage_t: list[float] = []
    ref_t: list[float] = []
    stage_clk: list[float] = []
    ref_clk: list[float] = []
    ratios: list[float] = []
    for r in range(opts.rounds):
        order = [("stage", prep), ("ref", ref)] if r % 2 == 0 else [("ref", ref), ("stage", prep)]
        medians = {}
        for who, p in order:
            if p is None:
                continue
            got = timer.batch(p)
            (stage_t if who == "stage" else ref_t).extend(got.times_ms)
            (stage_clk if who == "stage" else ref_clk).extend(got.clocks)
            medians[who] = _median(got.times_ms)
        if "ref" in medians:
            ratios.append(medians["ref"] / medians["stage"])
    flops = prep.shape.flops

    def tflops(times: list[float]) -> Spread:
        return Spread.of([flops / (t * 1e-3) / 1e12 for t in times])

    return Timing(
        runs_per_round=opts.runs, rounds=opts.rounds, warmup=opts.warmup,
        l2_flush_bytes=opts.l2_flush_bytes, time_ms=Spread.of(stage_t),
        tflops=tflops(stage_t),
        reference=ref.spec.name if ref is not None else None,
        reference_time_ms=Spread.of(ref_t) if ref_t else None,
        reference_tflops=tflops(ref_t) if ref_t else None,
        ratio_to_reference=Spread.of(ratios) if ratios else None,
        round_ratios=tuple(ratios),
        sm_clock_mhz=Spread.of(stage_clk) if stage_clk else None,
        reference_sm_clock_mhz=Spread.of(ref_clk) if ref_clk else None)


# ---------------------------------------------------------------------------- environment


def _version(dist: str) -> str:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return ""


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


def collect_environment(cp: Any | None = None) -> Environment:
    """GPU, driver, CUDA, NVRTC, CuPy and cuBLAS versions, and the clocks as found."""
    cp = cp or require_gpu()
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"]
    clock = ClockReader()
    info = clock.info()
    try:
        from cupy_backends.cuda.libs import cublas

        cublas_v = str(cublas.getVersion(dev.cublas_handle))
    except Exception:
        cublas_v = ""
    extra = {k: v for k, v in info.items() if k != "driver"}
    extra["nvidia-cuda-nvrtc"] = _version("nvidia-cuda-nvrtc")
    extra["nvidia-cuda-runtime"] = _version("nvidia-cuda-runtime")
    idle = clock.sm_mhz()
    if idle is not None:
        extra["sm_clock_at_start_mhz"] = str(idle)
    extra["host"] = platform.node()
    # Recorded because it changes what the FP32 reference computes (require_gpu refuses it).
    extra["CUPY_TF32"] = os.environ.get("CUPY_TF32", "")
    return Environment(
        gpu=name.decode() if isinstance(name, bytes) else str(name),
        compute_capability=f"{dev.compute_capability[:-1]}.{dev.compute_capability[-1]}",
        sm_count=int(props["multiProcessorCount"]),
        driver=info.get("driver", ""),
        cuda_driver=_cuda_version(cp.cuda.runtime.driverGetVersion()),
        cuda_runtime=_cuda_version(cp.cuda.runtime.runtimeGetVersion()),
        nvrtc=nvrtc_version(),
        cupy=cp.__version__,
        cublas=cublas_v,
        cuda_bindings=_version("cuda-bindings"),
        ml_dtypes=_version("ml_dtypes"),
        python=platform.python_version(),
        extra=extra)


# ---------------------------------------------------------------------------- driver


def compile_info(prep: Prepared) -> CompileInfo | None:
    mod = prep.module
    if mod is None:
        return None
    expr = prep.spec.name_expression(prep.dtype)
    return CompileInfo(arch=mod.arch, name_expression=expr, mangled=mod.mangled(expr),
                       source=prep.spec.source or "", source_hash=mod.source_hash,
                       options=mod.options, resources=mod.usage(expr).to_dict(),
                       nvrtc=mod.nvrtc_version, dynamic_smem=prep.dynamic_smem,
                       block=prep.block, grid=prep.grid)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def make_manifest(job: Job, verification: Verification, **kw: Any) -> RunManifest:
    s = job.shape
    return RunManifest(stage=job.spec.name, family=job.spec.family, dtype=job.dtype,
                       m=s.m, n=s.n, k=s.k, params=job.spec.param_dict,
                       verification=verification, parent=job.spec.parent,
                       variant=job.spec.variant, created=_now(), **kw)


def is_context_fatal(exc: BaseException) -> bool:
    # After an illegal address or a launch failure the CUDA context is unusable: every
    # later call fails too, so the run must stop rather than blame the next stages.
    text = str(exc)
    return any(code in text for code in ("ILLEGAL_ADDRESS", "LAUNCH_FAILED", "MISALIGNED",
                                         "ILLEGAL_INSTRUCTION", "HARDWARE_STACK_ERROR",
                                         "IllegalAddress", "LaunchFailure", "Misaligned"))


def is_cuda_error(exc: BaseException) -> bool:
    """A CUDA, cuBLAS or NVRTC error raised by CuPy (its classes live in cupy_backends)."""
    return type(exc).__module__.startswith(("cupy", "cupy_backends"))


def _run_one(job: Job, opts: BenchOptions, refs: dict) -> tuple[Prepared, Verification,
                                                               Timing | None]:
    prep = prepare(job.spec, job.dtype, job.shape)
    verdict = verify(prep, opts.seed)
    if verdict.verdict != OK or not opts.time:
        return prep, verdict, None
    ref = None
    if not job.spec.is_reference:
        key = (job.dtype, job.shape)
        if key not in refs:
            rprep = prepare(reference_spec(job.dtype), job.dtype, job.shape)
            refs[key] = (rprep, verify(rprep, opts.seed))
        rprep, rver = refs[key]
        if rver.verdict == OK:
            ref = rprep
        else:
            log.warning("%s failed its own check (%s); no ratio for %s",
                        rprep.spec.name, rver.detail, job.spec.name)
    return prep, verdict, time_stage(prep, ref, opts)


def run_jobs(jobs: Sequence[Job], opts: BenchOptions,
             env: Environment | None = None) -> Iterator[RunManifest]:
    """Verify, then (if right and asked) time each job against its cuBLAS reference.

    Yields one manifest per job as soon as it is done, so a caller keeps what is finished
    when a later stage takes the GPU down. A stage that fails to compile, launch or run
    becomes an ERROR row; one that leaves the CUDA context broken ends the run.
    """
    cp = require_gpu()
    env = env or collect_environment(cp)
    refs: dict[tuple[str, Shape], tuple[Prepared, Verification]] = {}
    for job in jobs:
        if job.refusal is not None:
            yield make_manifest(job, Verification(REFUSED, detail=job.refusal), environment=env)
            continue
        try:
            prep, verdict, timing = _run_one(job, opts, refs)
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


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__



def parse_params(items: Sequence[str]) -> dict[str, int]:
    """``["STAGES=4"]`` -> ``{"STAGES": 4}``; anything else is refused in a sentence."""
    out: dict[str, int] = {}
    for item in items:
        key, sep, value = item.partition("=")
        try:
            if not sep or not key.strip():
                raise ValueError
            out[key.strip()] = int(value)
        except ValueError:
            raise PerfscopeError(
                f"parameter {item!r} is not of the form NAME=INTEGER, e.g. STAGES=4") from None
    return out


def write_bench_json(path: Any, manifests: Sequence[RunManifest], command: str = "") -> None:
    from pathlib import Path

    from perfscope.manifest import BenchFile

    env = next((m.environment for m in manifests if m.environment is not None), None)
    # The environment is written once at the top; each manifest keeps only its own run.
    slim = tuple(replace(m, environment=None) for m in manifests)
    try:
        BenchFile(manifests=slim, environment=env, command=command, created=_now()).write(
            Path(path))
    except OSError as exc:
        raise PerfscopeError(f"cannot write {path}: {exc.strerror}") from None


def _spread_text(s: Spread | None, fmt: str = "{:.1f}") -> str:
    if s is None:
        return "-"
    return f"{fmt.format(s.median)} ({fmt.format(s.min)}-{fmt.format(s.max)})"


def _stage_label(m: RunManifest) -> str:
    """The stage name, its non-default parameters, and whether it is a variant."""
    try:
        defaults = get_spec(m.stage).param_dict
    except PerfscopeError:
        defaults = {}
    changed = [f"{k}={v}" for k, v in m.params.items() if defaults.get(k) != v]
    return (m.stage + (f" [{', '.join(changed)}]" if changed else "")
            + (" (variant)" if m.variant else ""))


def summary_rows(manifests: Sequence[RunManifest]) -> list[tuple[str, ...]]:
    """Plain-text cells for a results table: a WRONG or refused row never shows a speed."""
    rows = []
    for m in manifests:
        v, t = m.verification, m.timing
        err = f"{v.rel_fro_error:.1e}" if v.rel_fro_error is not None else "-"
        res = m.compile.resources if m.compile else {}
        regs = (f"{res['registers']}r" + (f" spill {res['spill_stores']}B"
                                          if res.get("spill_stores") else "")) if res else "-"
        verdict = v.verdict if v.verdict == OK else f"{v.verdict}: {v.detail}"
        clock = f"{t.sm_clock_mhz.median:.0f}" if t and t.sm_clock_mhz else "-"
        rows.append((_stage_label(m), m.dtype, m.shape, verdict,
                     err, _spread_text(t.tflops) if t else "-",
                     _spread_text(t.ratio_to_reference, "{:.2f}") if t else "-", clock, regs))
    return rows


SUMMARY_COLUMNS = ("stage", "dtype", "MxNxK", "verdict", "rel err", "TFLOP/s median (min-max)",
                   "vs cuBLAS median (min-max)", "SM MHz", "regs")


def failed(manifests: Sequence[RunManifest]) -> bool:
    return any(m.verification.verdict in (WRONG, ERROR) for m in manifests)


@dataclass(frozen=True)
class ParentStep:
    """One rung of a ladder against the rung below it, same dtype and shape, same run."""

    stage: str
    dtype: str
    parent: str
    speedup: float  # stage median TFLOP/s over parent median TFLOP/s
    variant: bool

    @property
    def regression(self) -> bool:
        return self.speedup < 1.0 and not self.variant


def parent_steps(manifests: Sequence[RunManifest]) -> list[ParentStep]:
    """Speedup of every timed stage over its timed parent (default parameters only)."""
    def is_default(m: RunManifest) -> bool:
        try:
            return m.params == get_spec(m.stage).param_dict
        except PerfscopeError:
            return False

    timed = {(m.stage, m.dtype, m.shape): m for m in manifests
             if m.timing is not None and is_default(m)}
    steps = []
    for (stage, dtype, shape), m in timed.items():
        parent = timed.get((m.parent, dtype, shape)) if m.parent else None
        if parent is not None:
            steps.append(ParentStep(stage, dtype, parent.stage,
                                    m.timing.tflops.median / parent.timing.tflops.median,
                                    m.variant))
    return steps
