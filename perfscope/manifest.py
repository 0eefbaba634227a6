"""RunManifest: what a `.ncu-rep` cannot hold about one run of one stage.

Stage, parameters, dtype, shape and layout; the verification error and verdict; the
event-timed speed with its spread and the ratio to cuBLAS measured in the same process;
the SM clock while timing; how the kernel was compiled and what the compiler said about
it; and the versions of everything that could change the numbers. ``bench`` writes it;
``profile`` writes the same record beside each report. The JSON is versioned: a reader
refuses a version it does not know rather than misreading it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from perfscope.errors import PerfscopeError

MANIFEST_VERSION = 1
LAYOUT = "row-major: C[M][N] = A[M][K] * B[K][N]"

# Verdicts. Only OK may carry a speed.
OK = "ok"
WRONG = "WRONG"
REFUSED = "refused"
ERROR = "error"


@dataclass(frozen=True)
class Spread:
    """min / median / max of one quantity."""

    min: float
    median: float
    max: float

    @classmethod
    def of(cls, values: list[float] | tuple[float, ...]) -> Spread:
        if not values:
            raise ValueError("a spread of no values")
        s = sorted(values)
        n = len(s)
        mid = s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])
        return cls(min=s[0], median=mid, max=s[-1])


@dataclass(frozen=True)
class Verification:
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


@dataclass(frozen=True)
class CompileInfo:
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
class RunManifest:
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

    def __post_init__(self) -> None:
        if self.timing is not None and self.verification.verdict != OK:
            raise ValueError(f"{self.stage}: a {self.verification.verdict} run carries no speed")

    @property
    def shape(self) -> str:
        return f"{self.m}x{self.n}x{self.k}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunManifest:
        version = data.get("version")
        if version != MANIFEST_VERSION:
            raise PerfscopeError(
                f"run manifest version {version!r} is not one this perfscope reads "
                f"(it reads {MANIFEST_VERSION})")
        d = dict(data)
        d["verification"] = Verification(**d["verification"])
        if d.get("timing") is not None:
            t = dict(d["timing"])
            for key in ("time_ms", "tflops", "reference_time_ms", "reference_tflops",
                        "ratio_to_reference", "sm_clock_mhz", "reference_sm_clock_mhz"):
                if t.get(key) is not None:
                    t[key] = Spread(**t[key])
            t["round_ratios"] = tuple(t.get("round_ratios", ()))
            d["timing"] = Timing(**t)
        if d.get("compile") is not None:
            c = dict(d["compile"])
            for key in ("options", "block", "grid"):
                c[key] = tuple(c[key])
            d["compile"] = CompileInfo(**c)
        if d.get("environment") is not None:
            d["environment"] = Environment(**d["environment"])
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
        return json.dumps(asdict(self), indent=1, sort_keys=False, allow_nan=False) + "\n"

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(self.to_json())
        tmp.replace(path)

    @classmethod
    def read(cls, path: Path) -> BenchFile:
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
