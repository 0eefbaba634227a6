"""RunManifest: what a `.ncu-rep` cannot hold about one run of one stage.

Stage, parameters, dtype, shape and layout; the verification error and verdict; the
event-timed speed with its spread and the ratio to cuBLAS measured in the same process;
the SM clock while timing; how the kernel was compiled and what the compiler said about
it; and the versions of everything that could change the numbers. ``bench`` writes it;
``profile`` writes the same record beside each report. The JSON is versioned: a reader
refuses a version it does not know rather than misreading it.

Where it lives: ``<stem>.json`` beside ``<stem>.ncu-rep[.xz]`` (``manifest_path``);
``manifest_beside(report)`` reads it and, since a profiled run is not timed, takes the
stage's event timing from a ``bench.json`` in the same folder.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from perfscope.errors import PerfscopeError
from perfscope.reader import report_stem
from perfscope.tensormaps import KernelMaps

log = logging.getLogger(__name__)

MANIFEST_VERSION = 1
LAYOUT = "row-major: C[M][N] = A[M][K] * B[K][N]"
# The fp8 dtype's GEMMs take B transposed, K contiguous (kernels/fp8.py), and write bf16.
FP8_LAYOUT = "row-major TN: C[M][N] = A[M][K] * Bt[N][K]^T (e4m3 A and Bt, bf16 C)"
# Any other GEMM given B transposed, K contiguous (the external set's int8 TN workload).
TN_LAYOUT = "row-major TN: C[M][N] = A[M][K] * Bt[N][K]^T"


def layout_for(dtype: str) -> str:
    """The layout perfscope's own stages and references of an element type run in."""
    return FP8_LAYOUT if dtype == "fp8" else LAYOUT

# Verdicts. Only OK (and UNVERIFIED, a program's kernel) may carry a speed.
OK = "ok"
WRONG = "WRONG"
REFUSED = "refused"
ERROR = "error"
# A kernel of someone else's program (`perfscope profile -- COMMAND`): perfscope did not
# compute its inputs, so it cannot check its output; not a failure, not a pass.
UNVERIFIED = "unverified"
# Stage and family of a program capture's manifest, and the layout it cannot know.
PROGRAM = "program"
UNKNOWN_LAYOUT = "unknown (a program's own)"


@dataclass(frozen=True)
class Spread:
    """min / median / max of one quantity."""

    min: float
    median: float
    max: float

    @classmethod
    def of(cls, values: list[float] | tuple[float, ...]) -> Spread:
        """The spread of some values; ValueError for none."""
        if not values:
            raise ValueError("a spread of no values")
        s = sorted(values)
        n = len(s)
        mid = s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])
        return cls(min=s[0], median=mid, max=s[-1])


@dataclass(frozen=True)
class Verification:
    """The check of a run's output against a float64 reference: the verdict and the errors behind it."""

    verdict: str
    # ||C - ref||_F / ||ref||_F against a float64 reference; None when nothing ran.
    rel_fro_error: float | None = None
    tolerance: float | None = None
    # max over elements of |C - ref| / bound; > 1 fails the elementwise check.
    max_bound_ratio: float | None = None
    bad_elements: int | None = None
    nan_elements: int | None = None
    detail: str = ""


@dataclass(frozen=True)
class Timing:
    """CUDA-event timing of the stage and, when it is not itself a reference, its ref."""

    runs_per_round: int
    rounds: int
    warmup: int
    l2_flush_bytes: int
    time_ms: Spread
    tflops: Spread
    reference: str | None = None
    reference_time_ms: Spread | None = None
    reference_tflops: Spread | None = None
    # One ratio (stage TFLOP/s over reference TFLOP/s, from round medians) per round.
    ratio_to_reference: Spread | None = None
    round_ratios: tuple[float, ...] = ()
    sm_clock_mhz: Spread | None = None
    reference_sm_clock_mhz: Spread | None = None
    # How the L2 was emptied before each launch (perfscope.timing.L2_FLUSHES), or "none"
    # where no flush ran (ncu's own durations, dry runs). Files written before the field
    # existed all flushed by writing.
    l2_flush: str = "write"
    # The parent stage timed in the same rounds (bench, when the run holds both as declared
    # for the shape and they compute the same epilogue): the parent's time over the stage's,
    # one per round, so above 1 the stage is faster. Absent in files written before.
    parent: str | None = None
    ratio_to_parent: Spread | None = None
    parent_round_ratios: tuple[float, ...] = ()
    # bench --until: the half-width (a fraction of the median) the ratios' interval had to
    # reach before the rounds stopped, at most max_rounds of them (None: a fixed count).
    until: float | None = None
    max_rounds: int | None = None

    def step_ratio(self, parent: str) -> Spread | None:
        """The parent's time over the stage's, one per round, when ``parent`` was timed in
        this stage's own rounds (None otherwise)."""
        return self.ratio_to_parent if self.parent == parent else None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Timing:
        """A Timing from its asdict() form (the Spreads and round ratios rebuilt)."""
        t = dict(data)
        for key in ("time_ms", "tflops", "reference_time_ms", "reference_tflops",
                    "ratio_to_reference", "sm_clock_mhz", "reference_sm_clock_mhz",
                    "ratio_to_parent"):
            if t.get(key) is not None:
                t[key] = Spread(**t[key])
        t["round_ratios"] = tuple(t.get("round_ratios", ()))
        t["parent_round_ratios"] = tuple(t.get("parent_round_ratios", ()))
        return cls(**t)


@dataclass(frozen=True)
class CompileInfo:
    """How the kernel was compiled: source and its hash, options, NVRTC, and what ptxas said it uses."""

    arch: str
    name_expression: str
    mangled: str
    source: str
    source_hash: str
    options: tuple[str, ...]
    resources: dict[str, int]
    nvrtc: str
    dynamic_smem: int = 0
    block: tuple[int, int, int] = (0, 0, 0)
    grid: tuple[int, int, int] = (0, 0, 0)


@dataclass(frozen=True)
class Environment:
    """The versions of everything that could change the numbers: GPU, driver, CUDA, libraries, Python."""

    gpu: str
    compute_capability: str
    sm_count: int
    driver: str
    cuda_driver: str
    cuda_runtime: str
    nvrtc: str
    cupy: str
    cublas: str
    cuda_bindings: str
    ml_dtypes: str
    python: str
    extra: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Capture:
    """How a program's kernels were captured (``perfscope profile -- COMMAND``).

    ``untrusted_launches`` are the launch indices (``FILE#ID``) of this report whose
    counters must not be believed: the program faulted while ncu was replaying them.
    ``fault`` says in one sentence which kernel faulted and how; None when none did.
    """

    command: tuple[str, ...]
    kernel_regex: str | None = None
    launch_skip: int = 0
    launch_count: int | None = None
    nvtx: tuple[str, ...] = ()
    replay_mode: str = "kernel"
    launches: int = 0
    fault: str | None = None
    untrusted_launches: tuple[int, ...] = ()
    # How the timing beside this capture was made (--time), in one sentence.
    timing_method: str = ""

    def trusts(self, launch_index: int) -> bool:
        """Whether the counters of this launch may be believed (the program did not fault under it)."""
        return launch_index not in self.untrusted_launches


@dataclass(frozen=True)
class RunManifest:
    """One run of one stage at one dtype and shape: what its .ncu-rep cannot hold."""

    stage: str
    family: str
    dtype: str
    m: int
    n: int
    k: int
    params: dict[str, int]
    verification: Verification
    timing: Timing | None = None
    compile: CompileInfo | None = None
    environment: Environment | None = None
    parent: str | None = None
    variant: bool = False
    layout: str = LAYOUT
    created: str = ""
    version: int = MANIFEST_VERSION
    # Set for a program's capture: its command, launch selection and faults.
    capture: Capture | None = None
    # ncu's --clock-control for the report beside it ("none": clocks as found; "base":
    # locked by ncu), None where the manifest did not record it (made before it did).
    clock_control: str | None = None
    # The tensor maps the run's kernels were passed by value, as `profile --tensor-maps`
    # recorded them (a program's kernels, or a stage's: cuBLAS's own), and in one sentence
    # what the recording found ("" where it was not asked for).
    tensor_maps: tuple[KernelMaps, ...] = ()
    tensor_maps_note: str = ""
    # How many MxNxK products the launch ran (a strided batched GEMM); 1 for one GEMM.
    batch: int = 1

    def __post_init__(self) -> None:
        if self.timing is not None and self.verification.verdict not in (OK, UNVERIFIED):
            raise ValueError(f"{self.stage}: a {self.verification.verdict} run carries no speed")

    @property
    def shape(self) -> str:
        """The problem shape as MxNxK, or BxMxNxK for a batch of B."""
        one = f"{self.m}x{self.n}x{self.k}"
        return f"{self.batch}x{one}" if self.batch > 1 else one

    @property
    def flops(self) -> int:
        """2·B·M·N·K: the work of the product(s) the manifest describes (0 when unknown)."""
        return 2 * self.batch * self.m * self.n * self.k

    @property
    def shape_known(self) -> bool:
        """False for a program captured without --shape (its manifest says 0x0x0)."""
        return self.m > 0 and self.n > 0 and self.k > 0

    def to_dict(self) -> dict[str, Any]:
        """The manifest as plain JSON-ready values (a single GEMM's without "batch": every
        manifest written before batches existed reads the same, and reads back as one GEMM)."""
        d = asdict(self)
        if self.batch == 1:
            del d["batch"]
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunManifest:
        """A manifest back from its JSON; PerfscopeError for a version this perfscope does not read."""
        version = data.get("version")
        if version != MANIFEST_VERSION:
            raise PerfscopeError(
                f"run manifest version {version!r} is not one this perfscope reads "
                f"(it reads {MANIFEST_VERSION})")
        d = dict(data)
        d["verification"] = Verification(**d["verification"])
        if d.get("timing") is not None:
            d["timing"] = Timing.from_dict(d["timing"])
        if d.get("compile") is not None:
            c = dict(d["compile"])
            for key in ("options", "block", "grid"):
                c[key] = tuple(c[key])
            d["compile"] = CompileInfo(**c)
        if d.get("environment") is not None:
            d["environment"] = Environment(**d["environment"])
        d["tensor_maps"] = tuple(KernelMaps.from_dict(k) for k in d.get("tensor_maps", ()))
        if d.get("capture") is not None:
            c = dict(d["capture"])
            for key in ("command", "nvtx", "untrusted_launches"):
                c[key] = tuple(c.get(key, ()))
            d["capture"] = Capture(**c)
        return cls(**d)


@dataclass(frozen=True)
class BenchFile:
    """What ``bench --json`` writes: the environment once, and one manifest per run."""

    manifests: tuple[RunManifest, ...]
    environment: Environment | None = None
    command: str = ""
    created: str = ""
    version: int = MANIFEST_VERSION
    kind: str = "perfscope.bench"

    def to_json(self) -> str:
        """The bench file as JSON text (NaN refused)."""
        d = asdict(self)
        d["manifests"] = [m.to_dict() for m in self.manifests]
        return json.dumps(d, indent=1, sort_keys=False, allow_nan=False) + "\n"

    def write(self, path: Path) -> None:
        """Write the bench file through a temporary beside it, so a reader never sees half of one."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(self.to_json())
        tmp.replace(path)

    @classmethod
    def read(cls, path: Path) -> BenchFile:
        """A bench file from disk; PerfscopeError when it is unreadable or not one this perfscope reads."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise PerfscopeError(f"cannot read bench file {path}: {exc}") from exc
        if data.get("kind") != "perfscope.bench" or data.get("version") != MANIFEST_VERSION:
            raise PerfscopeError(f"{path} is not a version {MANIFEST_VERSION} perfscope bench file")
        env = data.get("environment")
        return cls(manifests=tuple(RunManifest.from_dict(m) for m in data["manifests"]),
                   environment=Environment(**env) if env else None,
                   command=data.get("command", ""), created=data.get("created", ""))


# ------------------------------------------------------------------ beside a report

BENCH_NAME = "bench.json"


def manifest_path(report: str | Path) -> Path:
    """Where a report's run manifest lives: ``<stem>.json`` beside ``<stem>.ncu-rep[.xz]``."""
    p = Path(report)
    return p.with_name(report_stem(p) + ".json")


def read_manifest(path: str | Path) -> RunManifest:
    """A RunManifest from JSON: one manifest, or a bench file holding exactly one."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise PerfscopeError(f"cannot read run manifest {path}: {exc}") from None
    if isinstance(data, dict) and isinstance(data.get("manifests"), list) and len(data["manifests"]) == 1:
        data = data["manifests"][0]
    try:
        return RunManifest.from_dict(data)
    except PerfscopeError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise PerfscopeError(f"{path} is not a perfscope run manifest ({exc}).") from None


def manifest_beside(report: str | Path) -> RunManifest | None:
    """The report's run manifest when one lies beside it; a broken one is logged, not fatal:
    the report alone still answers most rules.

    A profiled run is not timed (ncu's replays would distort it), so when a ``bench.json``
    lies in the same folder, the event timing of the same stage, dtype, shape and
    parameters is taken from it: the rules that estimate from the ratio to cuBLAS need it.
    """
    path = manifest_path(report)
    if not path.is_file():
        return None
    try:
        manifest = read_manifest(path)
    except PerfscopeError as exc:
        log.warning("%s; rules that need it are not evaluated", exc)
        return None
    if manifest.timing is None and manifest.verification.verdict == OK:
        timing = _bench_timing(path.parent / BENCH_NAME, manifest)
        if timing is not None:
            manifest = dataclasses.replace(manifest, timing=timing)
    return manifest


def run_key(m: RunManifest) -> tuple:
    """What identifies one run: stage, dtype, shape and parameters."""
    return (m.stage, m.dtype, m.m, m.n, m.k, tuple(sorted(m.params.items())), m.batch)


def _bench_timing(bench: Path, manifest: RunManifest) -> Timing | None:
    if not bench.is_file():
        return None
    try:
        runs = _bench_runs(bench, bench.stat().st_mtime_ns)
    except PerfscopeError as exc:
        log.warning("%s; estimates that need timing are not made", exc)
        return None
    return runs.get(run_key(manifest))


@functools.lru_cache(maxsize=8)
def _bench_runs(bench: Path, _mtime: int) -> dict[tuple, Timing]:
    return {run_key(m): m.timing for m in BenchFile.read(bench).manifests if m.timing is not None}
