"""The rule table's data types: Rule, Finding, Evidence, and what a predicate returns.

A rule is data plus one small pure predicate. The predicate reads a KernelProfile (and,
when given, the run manifest and what the registry says of the stage, a StageInfo) and
returns a ``Hit`` with its evidence, or None. An input it needs that the report or the caller lacks raises
``NotCollected``: the rule is then "not evaluated", never silently passed and never fired.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from perfscope.manifest import RunManifest
from perfscope.profile import KernelProfile
from perfscope.stage import OperandRead, ResourceUsage, StageInfo

if TYPE_CHECKING:
    from perfscope.rules.bounds import Headroom

# The fixed symptom vocabulary. A rule carries exactly one.
TAGS: tuple[str, ...] = (
    "uncoalesced-global", "narrow-loads", "no-data-reuse", "small-tile", "smem-bandwidth",
    "bank-conflicts", "uncoalesced-shared", "latency-exposed", "epilogue-exposed",
    "register-spills", "occupancy-limited", "no-tensor-cores", "legacy-mma", "no-tma",
    "tail-effect", "small-grid", "l2-locality", "dram-bound", "store-inefficiency",
    "incorrect-result", "issue-overhead", "clock-held", "mma-serialized", "k-loop-math",
    "producer-loop", "memory-fence", "short-runs", "misaligned-tma", "fixed-time",
    "unaligned-rows", "operand-layout", "math-gap", "register-reuse", "fragment-bursts",
    "ffma-dispatch",
)

# Tags whose fixes remove the same time: within a group only the largest estimate counts
# when a kernel's findings are composed (one gap is never counted twice).
OVERLAP: Mapping[str, str] = {
    "no-tensor-cores": "instruction path", "legacy-mma": "instruction path",
    "no-tma": "instruction path", "mma-serialized": "instruction path",
    "latency-exposed": "latency", "occupancy-limited": "latency", "epilogue-exposed": "latency",
    "k-loop-math": "latency", "producer-loop": "latency", "memory-fence": "latency",
    "misaligned-tma": "latency", "math-gap": "latency", "register-reuse": "latency",
    "fragment-bursts": "latency",
    "uncoalesced-global": "global memory", "narrow-loads": "global memory",
    "no-data-reuse": "global memory", "small-tile": "global memory", "l2-locality": "global memory",
    "store-inefficiency": "global memory", "short-runs": "global memory", "dram-bound": "roofline",
    "bank-conflicts": "shared memory", "uncoalesced-shared": "shared memory",
    "smem-bandwidth": "shared memory",
    "register-spills": "registers", "tail-effect": "launch", "small-grid": "launch",
    "incorrect-result": "correctness", "clock-held": "clock", "fixed-time": "fixed time",
    "unaligned-rows": "layout", "operand-layout": "layout",
}
# Groups that measure the whole gap to a roofline rather than one cause: composed with the
# causes as the larger of the two, never added to them.
ENVELOPE_GROUPS: tuple[str, ...] = ("roofline", "layout")
# Groups whose fix changes the problem the timed reference solves (its shape or layout):
# the reference at the same shape runs the same fallback, so neither the gap to it nor
# being near it bounds them.
REFERENCE_BLIND: tuple[str, ...] = ("layout",)
# Groups whose time lies outside every envelope (PS170's gap starts at the floor that a
# launch's fixed time is part of): composed with the envelope as independent savings.
OUTSIDE_ENVELOPE: tuple[str, ...] = ("fixed time",)

# Least to most severe. "warning" and "error" condemn a kernel; the cuBLAS references
# must never get one.
SEVERITIES: tuple[str, ...] = ("info", "optimization", "warning", "error")

DOC_SECTIONS: tuple[str, ...] = ("Symptom", "Why", "Fix", "Estimate", "Example", "Source")
_CODE = re.compile(r"^PS1\d\d$")


def severity_rank(severity: str) -> int:
    """A severity's place in SEVERITIES: higher is more severe."""
    return SEVERITIES.index(severity)


class NotCollected(Exception):
    """An input the rule needs is missing: a metric, the run manifest, the stage."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


def need(value: Any, what: str) -> Any:
    """value, or NotCollected(what) when it is None: missing never reads as zero."""
    if value is None:
        raise NotCollected(what)
    return value


class Evidence(NamedTuple):
    """One measured fact behind a finding: the metric, its value, the threshold it crossed."""

    metric: str
    value: float | str
    threshold: str


@dataclass(frozen=True)
class Hit:
    """What a predicate returns when its symptom is present."""

    evidence: tuple[Evidence, ...]
    estimated_gain: float | None
    # Values the rule's fix text is formatted with (the compile target, an opcode...).
    fix_args: tuple[tuple[str, str], ...] = ()
    # What the symptom costs now, as a share of the kernel's time, where that is not what
    # the fix saves (the estimate): PS153's idle share, of which stream-K's cut pieces give
    # some back. `diff` explains a gap by what symptoms cost; calibration holds estimates.
    cost: float | None = None


@dataclass(frozen=True)
class Context:
    """What a report cannot tell and the caller may: the stage (from the registry), the
    element type, (for the static audit) what the compiler said about registers and spills
    and the kernel's SASS in address order (its loops), and the machine's settings: launch
    attributes with the same value on every launch of the captures judged together, which
    are the machine's and not the kernel's doing."""

    stage: StageInfo | None = None
    dtype: str | None = None
    resources: ResourceUsage | None = None
    machine: Mapping[str, float] = field(default_factory=dict)
    sass: tuple[str, ...] | None = None
    # How the run read A and B by TMA (its tensor maps' boxes), None where unknown: a
    # report does not hold it, the loader plans it for perfscope's own stages.
    reads: tuple[OperandRead, ...] | None = None


@dataclass(frozen=True)
class Inputs:
    """Everything a predicate may read."""

    profile: KernelProfile
    manifest: RunManifest | None = None
    context: Context = field(default_factory=Context)

    @property
    def stage(self) -> StageInfo | None:
        """What the registry says of the stage, None when the caller did not say."""
        return self.context.stage

    @property
    def dtype(self) -> str | None:
        """The element type: from the manifest, else the caller, else the stage's only one."""
        if self.manifest is not None and self.manifest.dtype:
            return self.manifest.dtype
        if self.context.dtype:
            return self.context.dtype
        stage = self.context.stage
        if stage is not None and len(stage.dtypes) == 1:
            return stage.dtypes[0]
        return None

    def need_manifest(self) -> RunManifest:
        """The run manifest; NotCollected when there is none beside the report."""
        return need(self.manifest, "the run manifest (<report stem>.json beside the report)")


Predicate = Callable[[Inputs], "Hit | None"]


@dataclass(frozen=True)
class Rule:
    """One row of the rule table. The predicate's docstring says Symptom / Why / Fix /
    Estimate / Source; ``fix`` is the text users see, formatted with the hit's fix_args."""

    code: str
    tag: str
    title: str
    severity: str                # the most severe this rule can be; the estimate decides
    metrics: tuple[str, ...]
    check: Predicate = field(repr=False, compare=False)
    fix: str
    reference: str               # what a user can open: NCU Profiling Guide, PTX ISA, CUDA guides
    # Nsight Compute rule results that judge the same symptom: "Identifier" or
    # "Identifier/words of its title" when one identifier covers several symptoms.
    ncu: tuple[str, ...] = ()
    # The named thresholds the predicate compares against: (name, value), shown by
    # `perfscope rules`; the predicate reads the same module constants.
    thresholds: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        if not _CODE.match(self.code):
            raise ValueError(f"{self.code}: rule codes are PS1xx")
        if self.tag not in TAGS:
            raise ValueError(f"{self.code}: tag {self.tag!r} is not in the vocabulary")
        if self.severity not in SEVERITIES:
            raise ValueError(f"{self.code}: severity {self.severity!r} is not one of {SEVERITIES}")

    @property
    def doc(self) -> str:
        """The predicate's docstring: Symptom / Why / Fix / Estimate / Source."""
        return inspect.getdoc(self.check) or ""

    def fix_text(self, hit: Hit) -> str:
        """The fix as users see it, formatted with the hit's fix_args."""
        return self.fix.format(**dict(hit.fix_args)) if hit.fix_args else self.fix


@dataclass(frozen=True)
class Finding:
    """One rule that fired on a kernel: its evidence, its bounded estimate, and the fix."""

    code: str
    tag: str
    title: str
    severity: str
    # The fraction of the kernel's time the fix saves if applied alone, capped at the
    # kernel's headroom (and at the gap to its timed reference); None: no estimate.
    estimated_gain: float | None
    evidence: tuple[Evidence, ...]
    fix: str
    reference: str
    ncu_rule: str | None = None           # the matching Nsight Compute result, if any
    ncu_speedup_pct: float | None = None  # and its own estimate
    raw_gain: float | None = None         # the rule's own estimate before the caps
    capped_by: str | None = None          # "headroom" / "reference gap" / "gap to the floor" /
                                          # "empty launch's time"
    # The estimate under the work's roofline alone, before the gap to the timed reference:
    # what two kernels' findings are compared by (a kernel at cuBLAS's speed has its
    # estimates capped near zero, which says nothing about how much of it is a problem).
    bounded_gain: float | None = None
    # What the symptom costs now where it differs from the estimate (Hit.cost), bounded by
    # the kernel's headroom; None: the estimate is what it costs.
    cost: float | None = None

    @property
    def group(self) -> str:
        """The overlap group: findings of one group remove the same time."""
        return OVERLAP.get(self.tag, self.tag)


@dataclass(frozen=True)
class NotEvaluated:
    """A rule that could not judge the kernel, and the input it lacked."""

    code: str
    title: str
    reason: str


@dataclass(frozen=True)
class Evaluation:
    """The verdict of every rule on one kernel."""

    findings: tuple[Finding, ...]          # most severe first, then largest estimate
    not_evaluated: tuple[NotEvaluated, ...]
    silent: tuple[str, ...]                # codes evaluated that found nothing
    headroom: Headroom | None = None       # 1 - t_min / t, with its evidence
    # The findings composed (largest per overlap group, groups combined as independent
    # savings), capped like every estimate; None when no finding has an estimate.
    combined_gain: float | None = None
    reference_cap: float | None = None     # 1 - ratio to the timed reference + margin
    notes: tuple[str, ...] = ()            # why severities were capped, in words
    # Rules whose symptom is there but whose estimate, under the work's roofline, is too
    # small to be a finding: (code, what the symptom costs: its Hit.cost, else that estimate).
    # Silent all the same; `diff` reads them so that a finding on one side is held against
    # the same symptom just under the line on the other, not against nothing.
    quiet: tuple[tuple[str, float], ...] = ()

    @property
    def tags(self) -> frozenset[str]:
        """The tags of every finding."""
        return frozenset(f.tag for f in self.findings)

    def at_least(self, severity: str) -> tuple[Finding, ...]:
        """The findings of this severity or a more severe one."""
        rank = severity_rank(severity)
        return tuple(f for f in self.findings if severity_rank(f.severity) >= rank)
