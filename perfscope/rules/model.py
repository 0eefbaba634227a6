"""The rule table's data types: Rule, Finding, Evidence, and what a predicate returns.

A rule is data plus one small pure predicate. The predicate reads a KernelProfile (and,
when given, the run manifest and what the registry says of the stage, a StageInfo) and
returns a ``Hit`` with its evidence, or None. An input it needs that the report or the caller lacks raises
``NotCollected``: the rule is then "not evaluated", never silently passed and never fired.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from perfscope.manifest import RunManifest
from perfscope.profile import KernelProfile
from perfscope.stage import ResourceUsage, StageInfo

# The fixed symptom vocabulary (issue 5). A rule carries exactly one.
TAGS: tuple[str, ...] = (
    "uncoalesced-global", "no-data-reuse", "smem-bandwidth", "bank-conflicts",
    "uncoalesced-shared", "latency-exposed", "register-spills", "occupancy-limited",
    "no-tensor-cores", "legacy-mma", "no-tma", "tail-effect", "l2-locality",
    "store-inefficiency", "incorrect-result",
)

# Least to most severe. "warning" and "error" condemn a kernel; the cuBLAS references
# must never get one.
SEVERITIES: tuple[str, ...] = ("info", "optimization", "warning", "error")

DOC_SECTIONS: tuple[str, ...] = ("Symptom", "Why", "Fix", "Estimate", "Source")
_CODE = re.compile(r"^PS1\d\d$")


def severity_rank(severity: str) -> int:
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


@dataclass(frozen=True)
class Context:
    """What a report cannot tell and the caller may: the stage (from the registry), the
    element type, and (for the static audit) what the compiler said about registers and
    spills."""

    stage: StageInfo | None = None
    dtype: str | None = None
    resources: ResourceUsage | None = None


@dataclass(frozen=True)
class Inputs:
    """Everything a predicate may read."""

    profile: KernelProfile
    manifest: RunManifest | None = None
    context: Context = field(default_factory=Context)

    @property
    def stage(self) -> StageInfo | None:
        return self.context.stage

    @property
    def dtype(self) -> str | None:
        if self.manifest is not None and self.manifest.dtype:
            return self.manifest.dtype
        if self.context.dtype:
            return self.context.dtype
        stage = self.context.stage
        if stage is not None and len(stage.dtypes) == 1:
            return stage.dtypes[0]
        return None

    def need_manifest(self) -> RunManifest:
        return need(self.manifest, "the run manifest (<report stem>.json beside the report)")


Predicate = Callable[[Inputs], "Hit | None"]


@dataclass(frozen=True)
class Rule:
    """One row of the rule table. The predicate's docstring says Symptom / Why / Fix /
    Estimate / Source; ``fix`` is the text users see, formatted with the hit's fix_args."""

    code: str
    tag: str
    title: str
    severity: str
    metrics: tuple[str, ...]
    check: Predicate = field(repr=False, compare=False)
    fix: str
    reference: str
    # Nsight Compute rule results that judge the same symptom: "Identifier" or
    # "Identifier/words of its title" when one identifier covers several symptoms.
    ncu: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not _CODE.match(self.code):
            raise ValueError(f"{self.code}: rule codes are PS1xx")
        if self.tag not in TAGS:
            raise ValueError(f"{self.code}: tag {self.tag!r} is not in the vocabulary")
        if self.severity not in SEVERITIES:
            raise ValueError(f"{self.code}: severity {self.severity!r} is not one of {SEVERITIES}")

    @property
    def doc(self) -> str:
        return inspect.getdoc(self.check) or ""

    def fix_text(self, hit: Hit) -> str:
        return self.fix.format(**dict(hit.fix_args)) if hit.fix_args else self.fix


@dataclass(frozen=True)
class Finding:
    code: str
    tag: str
    title: str
    severity: str
    estimated_gain: float | None          # fraction of the kernel's time, or None
    evidence: tuple[Evidence, ...]
    fix: str
    reference: str
    ncu_rule: str | None = None           # the matching Nsight Compute result, if any
    ncu_speedup_pct: float | None = None  # and its own estimate


@dataclass(frozen=True)
class NotEvaluated:
    code: str
    title: str
    reason: str


@dataclass(frozen=True)
class Evaluation:
    """The verdict of every rule on one kernel."""

    findings: tuple[Finding, ...]          # most severe first, then largest estimate
    not_evaluated: tuple[NotEvaluated, ...]
    silent: tuple[str, ...]                # codes evaluated that found nothing

    @property
    def tags(self) -> frozenset[str]:
        return frozenset(f.tag for f in self.findings)

    def at_least(self, severity: str) -> tuple[Finding, ...]:
        rank = severity_rank(severity)
        return tuple(f for f in self.findings if severity_rank(f.severity) >= rank)
