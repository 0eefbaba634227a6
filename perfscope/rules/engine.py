"""Evaluate the rule table on one KernelProfile: pure, inputs in, an Evaluation out."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from perfscope.manifest import RunManifest
from perfscope.profile import KernelProfile
from perfscope.rules.facts import MIN_GAIN, MINOR_GAIN
from perfscope.rules.model import (
    Context,
    Evaluation,
    Finding,
    Inputs,
    NotCollected,
    NotEvaluated,
    Rule,
    severity_rank,
)
from perfscope.rules.registry import REGISTRY

log = logging.getLogger(__name__)

# An estimate is a share of the kernel's time; no single fix removes all of it.
MAX_GAIN = 0.95


def _ncu_match(profile: KernelProfile, patterns: Sequence[str]) -> tuple[str | None, float | None]:
    """Nsight Compute's own result for the same symptom, with its speedup estimate.

    Patterns are in order of preference; within one, the largest estimate wins (CPIStall
    and MemoryCacheAccessPattern repeat under one identifier).
    """
    for pat in patterns:
        ident, _, words = pat.partition("/")
        hits = [r for r in profile.ncu_rules if r.identifier == ident and r.type != "ok"
                and words.lower() in r.title.lower()]
        if hits:
            best = max(hits, key=lambda r: r.speedup_pct or 0.0)
            return f"{best.identifier}: {best.title}", best.speedup_pct
    return None, None


def evaluate(profile: KernelProfile, manifest: RunManifest | None = None,
             context: Context | None = None, rules: Sequence[Rule] = REGISTRY) -> Evaluation:
    """Every rule on one kernel: its findings, and the rules that could not be evaluated."""
    context = context or Context()
    inputs = Inputs(profile, manifest, context)
    findings: list[Finding] = []
    skipped: list[NotEvaluated] = []
    silent: list[str] = []
    for rule in rules:
        try:
            hit = rule.check(inputs)
        except NotCollected as exc:
            skipped.append(NotEvaluated(rule.code, rule.title, f"not collected: {exc.what}"))
            continue
        if hit is None:
            silent.append(rule.code)
            continue
        gain = hit.estimated_gain
        if gain is not None:
            gain = round(min(MAX_GAIN, max(0.0, gain)), 4)
            if gain < MIN_GAIN:
                silent.append(rule.code)
                continue
        severity = rule.severity
        # A measurable symptom with a tiny estimated cost is shown, not sounded.
        if gain is not None and gain < MINOR_GAIN and severity_rank(severity) < severity_rank("error"):
            severity = "info"
        ncu_rule, ncu_speedup = _ncu_match(profile, rule.ncu)
        findings.append(Finding(code=rule.code, tag=rule.tag, title=rule.title, severity=severity,
                                estimated_gain=gain, evidence=hit.evidence, fix=rule.fix_text(hit),
                                reference=rule.reference, ncu_rule=ncu_rule,
                                ncu_speedup_pct=ncu_speedup))
    findings.sort(key=lambda f: (-severity_rank(f.severity), -(f.estimated_gain or 0.0), f.code))
    return Evaluation(findings=tuple(findings), not_evaluated=tuple(skipped), silent=tuple(silent))
