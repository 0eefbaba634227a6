"""The documents the GPU-side commands produce, as plain values the renderers print.

bench, profile, sass and kernels run compilers, kernels or ncu; what they hand to the
renderers lives here, below them, so rendering never imports the profiler, the compiler
or the kernel registry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from perfscope.families import FAMILIES, family_of
from perfscope.manifest import RunManifest
from perfscope.sass.disasm import KernelSass, Tool
from perfscope.stage import ResourceUsage

if TYPE_CHECKING:
    # Typing only: importing the rules loads the report reader, which a process that runs
    # kernels with CuPy must never do.
    from perfscope.rules import Evaluation


@dataclass(frozen=True)
class BenchSummary:
    """What `perfscope bench` shows: the runs and how each stage is named."""

    manifests: tuple[RunManifest, ...]
    labels: tuple[str, ...]
    title: str | None = None
    kind: str = "bench"


@dataclass(frozen=True)
class StageResult:
    stem: str
    verdict: str                        # ok / WRONG / refused / error / skipped
    report: Path | None = None
    manifest: Path | None = None
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.verdict not in ("ok", "skipped") or (self.verdict == "ok" and self.report is None)


@dataclass(frozen=True)
class ProfileSummary:
    """What `perfscope profile` shows: where the reports went and each stage's outcome."""

    out_dir: Path
    results: tuple[StageResult, ...]
    kind: str = "profile"

    @property
    def failed(self) -> tuple[str, ...]:
        return tuple(r.stem for r in self.results if r.failed)


@dataclass(frozen=True)
class KernelRow:
    name: str
    family: str
    parent: str | None
    archs: tuple[str, ...]
    change: str
    variant: bool
    label: str                     # "compiled, never run" or ""
    best_ratio: float | None       # median ratio to cuBLAS, best over dtypes
    best_dtype: str | None
    measured_in: str | None        # the bench file the ratio comes from

    @property
    def ratio_text(self) -> str:
        if self.label:
            return self.label
        if self.best_ratio is None:
            return "not timed" if self.family != "cublas" else "reference"
        return f"{self.best_ratio:.2f} ({self.best_dtype})"


@dataclass(frozen=True)
class KernelsTable:
    rows: tuple[KernelRow, ...]
    bench: str | None
    kind: str = "kernels"


@dataclass(frozen=True)
class FingerprintCheck:
    family: str
    label: str
    count: int           # static instructions of the family in the kernel
    opcodes: tuple[str, ...]
    # A family the stage must not use (the slower path it replaces): ok when absent.
    forbidden: bool = False

    @property
    def ok(self) -> bool:
        return self.count == 0 if self.forbidden else self.count > 0

    @property
    def name(self) -> str:
        return f"no {self.family}" if self.forbidden else self.family


@dataclass(frozen=True)
class SassAudit:
    """The static audit of one kernel."""

    target: str                     # the stage name or the file the user named
    kind: str                       # stage / cu / cubin
    arch: str
    kernel: str                     # mangled name
    dtype: str | None
    label: str                      # "compiled, never run" or ""
    tool: Tool
    compiler: str                   # what compiled it, with its flags
    resources: ResourceUsage | None  # ptxas -v (None for a .cubin)
    sass: KernelSass
    fingerprint: tuple[FingerprintCheck, ...]
    evaluation: Evaluation
    dynamic_smem: int | None = None  # from the KernelSpec, for a stage
    notes: tuple[str, ...] = field(default_factory=tuple)
    change: str = ""                # what the stage changes against its parent

    @property
    def opcodes(self) -> dict[str, int]:
        return dict(sorted(self.sass.opcodes.items(), key=lambda kv: (-kv[1], kv[0])))

    @property
    def families(self) -> dict[str, dict[str, int]]:
        """family key (or "other") -> {opcode with modifiers: static count}."""
        out: dict[str, dict[str, int]] = {}
        for op, n in self.opcodes.items():
            out.setdefault(family_of(op) or "other", {})[op] = n
        order = [f.key for f in FAMILIES] + ["other"]
        return {k: out[k] for k in order if k in out}

    @property
    def fingerprint_ok(self) -> bool:
        return all(c.ok for c in self.fingerprint)


@dataclass(frozen=True)
class AuditDocument:
    """What `perfscope sass` shows: one audit per kernel."""

    audits: tuple[SassAudit, ...]
    kind: str = "audit"

    @property
    def ok(self) -> bool:
        return all(a.fingerprint_ok for a in self.audits)
