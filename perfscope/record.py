"""Diagnosed: the one record every consumer of a profiled launch reads.

    Diagnosed(label, path, profile, manifest, evaluation, stage, dtype)

The loader (:mod:`perfscope.diagnosis`) builds it; diff, review, the exports and the
renderers read it. Nothing here touches a report file, the registry or the GPU.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from perfscope.errors import PerfscopeError
from perfscope.families import family_of
from perfscope.manifest import RunManifest
from perfscope.metrics import M_PERSISTING
from perfscope.profile import KernelProfile
from perfscope.rules import BY_CODE, SEVERITIES, Evaluation, Finding
from perfscope.rules.bounds import sass_flops
from perfscope.stage import OperandRead, StageInfo

# The opcode families each symptom sits on: a finding points at the hottest of these
# instructions that has a source line (the evidence's own opcodes come first).
TAG_FAMILIES: Mapping[str, tuple[str, ...]] = {
    "uncoalesced-global": ("ldg", "stg", "ldgsts"), "no-data-reuse": ("ldg",),
    "smem-bandwidth": ("shared", "ldsm", "stsm"), "bank-conflicts": ("shared", "ldsm", "stsm"),
    "uncoalesced-shared": ("ldgsts", "shared"), "register-spills": ("local",),
    "no-tensor-cores": ("ffma",), "legacy-mma": ("hmma",), "no-tma": ("ldgsts", "ldg"),
    "store-inefficiency": ("stg", "shared", "stsm"), "l2-locality": ("ldg", "tma"),
}
_OPCODE_WORD = re.compile(r"\b[A-Z][A-Z0-9]{2,}(?:\.[A-Z0-9_]+)*\b")


@dataclass(frozen=True)
class Diagnosed:
    """One profiled launch: its profile, run manifest, stage, and the rules' evaluation."""

    label: str
    path: Path
    profile: KernelProfile
    manifest: RunManifest | None
    evaluation: Evaluation
    stage: StageInfo | None = None
    dtype: str | None = None
    # For a group of launches (a GEMM, then its epilogue as separate kernels): the launches
    # after this one, the group's principal (its GEMM). Empty for a single kernel.
    group: tuple[Diagnosed, ...] = ()
    # How the run read A and B by TMA, planned from its run manifest's stage (None: unknown,
    # as for a program's kernel or cuBLAS; an ncu report holds no tensor map).
    reads: tuple[OperandRead, ...] | None = None

    @property
    def launches(self) -> tuple[Diagnosed, ...]:
        """This launch and the rest of its group, in launch order of the principal first."""
        return (self, *self.group)

    @property
    def flops(self) -> int | None:
        """The GEMM's 2*B*M*N*K floating-point operations, None when the shape is not known."""
        m = self.manifest
        return m.flops if m is not None and m.shape_known else None

    @property
    def shape(self) -> tuple[int, ...] | None:
        """(M, N, K) from the run manifest, (B, M, N, K) for a batch of B; None when the
        shape is not known."""
        m = self.manifest
        if m is None or not m.shape_known:
            return None
        return (m.m, m.n, m.k) if m.batch == 1 else (m.batch, m.m, m.n, m.k)

    @property
    def launch_id(self) -> str:
        """``FILE#ID``: how a user names exactly this launch again."""
        return f"{self.path}#{self.profile.identity.launch_index}"

    @property
    def untrusted(self) -> str | None:
        """Why this launch's counters must not be believed (its program faulted while ncu
        replayed it), or None."""
        capture = getattr(self.manifest, "capture", None) if self.manifest is not None else None
        if capture is None or capture.trusts(self.profile.identity.launch_index):
            return None
        return capture.fault or "the program faulted while this launch was profiled"


def as_group(launches: Sequence[Diagnosed]) -> Diagnosed:
    """One record for the launches of a group report (a GEMM, then its epilogue passes): the
    launch with the most math as the principal, the others, in order, as its group."""
    principal = max(launches, key=lambda r: (sass_flops(r.profile) or 0.0,
                                             r.profile.sol.duration_ns or 0.0))
    return replace(principal, group=tuple(r for r in launches if r is not principal))


@dataclass(frozen=True)
class Catalogue:
    """The stages a report can come from, by name (the registry's, as plain values)."""

    stages: Mapping[str, StageInfo]

    def get(self, name: str | None) -> StageInfo | None:
        """The stage of this name, None for no name or one the catalogue lacks."""
        return self.stages.get(name) if name else None

    def names_longest_first(self) -> tuple[str, ...]:
        """The stage names, longest first, so a name wins over its own prefix."""
        # "sgemm_reg8x8_capped" must win over its prefix "sgemm_reg8x8".
        return tuple(sorted(self.stages, key=len, reverse=True))


@dataclass(frozen=True)
class DiagnoseDocument:
    """What `perfscope diagnose` shows: the records, one panel each or one row each."""

    records: tuple[Diagnosed, ...]
    full: bool = True              # panels (True) or one summary row per kernel
    failures: tuple[str, ...] = ()  # what --fail-on found, one sentence per kernel
    kind: str = "diagnose"

    @property
    def warnings(self) -> tuple[str, ...]:
        """One warning per report file cut short."""
        return incomplete_reports(self.records)

    @property
    def machine(self) -> tuple[str, ...]:
        """The machine's settings shared by every launch, one sentence each."""
        return machine_notes(self.records)


# Launch attributes a machine may set for every launch: (metric, what it is, what sets it).
# One value on every launch of one GPU model judged together is the machine's setting,
# reported once (machine_notes), and never a kernel's finding. Each model counts apart: the
# driver's default carve-out is the H200's 11.25 MiB and the H100's 9.375 MiB, so captures
# of both judged together would otherwise make each look like a kernel's choice.
MACHINE_ATTRIBUTES = (
    (M_PERSISTING, "persisting L2 carve-out", "cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize)"),
)


def machine_settings(profiles: Iterable[KernelProfile]) -> dict[str, float]:
    """The launch attributes that have one value on every launch given: the machine's
    settings (e.g. a device-wide persisting L2 carve-out), not any kernel's choice."""
    seen: dict[str, set[float | None]] = {name: set() for name, _, _ in MACHINE_ATTRIBUTES}
    for kp in profiles:
        for name in seen:
            seen[name].add(kp.metric(name))
    return {name: next(iter(v)) for name, v in seen.items() if len(v) == 1 and None not in v}


def _by_device(profiles: Iterable[KernelProfile]) -> dict[str | None, list[KernelProfile]]:
    """The launches of each GPU model, by the device name ncu recorded, in their order."""
    groups: dict[str | None, list[KernelProfile]] = {}
    for kp in profiles:
        groups.setdefault(kp.identity.device, []).append(kp)
    return groups


def machine_settings_by_device(profiles: Iterable[KernelProfile]) -> dict[str | None, dict[str, float]]:
    """machine_settings of each GPU model's launches."""
    return {device: machine_settings(group) for device, group in _by_device(profiles).items()}


def machine_notes(records: Sequence[Diagnosed]) -> tuple[str, ...]:
    """One sentence per non-zero machine setting of each GPU model's launches judged
    together (two or more: one launch cannot show that a value is not its own)."""
    groups = _by_device(r.profile for r in records)
    notes = []
    for device, group in groups.items():
        if len(group) < 2:
            continue
        settings = machine_settings(group)
        where = f"{device} launches here" if len(groups) > 1 and device else "launches here"
        for name, what, setter in MACHINE_ATTRIBUTES:
            value = settings.get(name)
            if value:
                mib = value / 2**20
                notes.append(f"{what} {mib:.4g} MiB on all {len(group)} {where}: set for the "
                             f"whole device ({setter} or the driver's default), not by a "
                             "kernel, so no kernel is judged for it")
    return tuple(notes)


def incomplete_reports(records: Iterable[Diagnosed]) -> tuple[str, ...]:
    """One sentence per report file that is cut short, in the order the files come."""
    seen: dict[str, None] = {}
    for r in records:
        if r.profile.identity.incomplete:
            seen.setdefault(r.profile.identity.incomplete, None)
    return tuple(seen)


def source_line(record: Diagnosed, finding: Finding | None = None) -> tuple[str, int] | None:
    """The source line a finding points at: the hottest instruction of the finding's own
    opcodes (named in its evidence, else those of its symptom) that carries a line, else
    the kernel's hottest line; None when the report has no source lines (no -lineinfo)."""
    located = [h for h in record.profile.hotspots if h.file and h.line]
    if not located:
        return None
    if finding is not None:
        named = {family_of(w) for e in finding.evidence for w in _OPCODE_WORD.findall(e.metric)}
        named.discard(None)
        for families in (named, set(TAG_FAMILIES.get(finding.tag, ()))):
            hit = next((h for h in located if family_of(h.opcode) in families), None)
            if hit is not None:
                return hit.file, hit.line
    return located[0].file, located[0].line


def failing_findings(records: Iterable[Diagnosed], selectors: Sequence[str]) -> list[str]:
    """What `diagnose --fail-on` fails on, one sentence per kernel: its findings at or
    above a severity, or of a rule code, among selectors. A bad selector is refused."""
    levels: list[int] = []
    codes: set[str] = set()
    for sel in selectors:
        if sel.lower() in SEVERITIES:
            levels.append(SEVERITIES.index(sel.lower()))
        elif sel.upper() in BY_CODE:
            codes.add(sel.upper())
        else:
            raise PerfscopeError(f"--fail-on {sel!r} is neither a severity ({', '.join(SEVERITIES)}) nor "
                                 "a rule code (perfscope rules lists them).")
    floor = min(levels) if levels else len(SEVERITIES)
    out = []
    for r in records:
        hits = [f for f in r.evaluation.findings
                if f.code in codes or SEVERITIES.index(f.severity) >= floor]
        if hits:
            out.append(f"{r.launch_id} ({r.profile.name}) has "
                       + ", ".join(f"{f.code} {f.title} ({f.severity})" for f in hits))
    return out
