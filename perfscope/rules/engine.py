"""Evaluate the rule table on one KernelProfile: pure, inputs in, an Evaluation out.

Every rule's own estimate is bounded the same way (perfscope.rules.bounds): never above
the kernel's headroom, never above the gap to its timed reference plus a margin, never
more than its time beyond an empty launch's (a kernel of any work lasts that long), and for
memory-bound work never above its gap to its floor (a launch's fixed time plus its bytes at
the practical DRAM rate; only a fix that removes the fixed time itself, PS173's, saves
beyond either floor); a fix that changes the layout the reference runs too (PS107, PS108)
is held neither to the gap to the reference nor by being near it. The
severity follows from the bounded estimate, up to the rule's declared one: a finding
with no estimate is never a warning (correctness aside), and a kernel within
NEAR_REFERENCE of its reference, or with a math pipe at PIPE_SATURATED of its peak, gets
no warning at all. The kernel's combined estimate composes its findings: within an
overlap group only the largest counts, groups combine as independent savings
(1 - prod(1 - g)), and the result is capped like every estimate.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

from perfscope.manifest import RunManifest
from perfscope.metrics import M_FMA_PIPE, M_TENSOR_PIPE
from perfscope.profile import KernelProfile
from perfscope.rules.bounds import (
    REFERENCE_MARGIN,
    headroom,
    launch_floor_fraction,
    reference_cap,
)
from perfscope.rules.model import (
    ENVELOPE_GROUPS,
    OUTSIDE_ENVELOPE,
    OVERLAP,
    REFERENCE_BLIND,
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

# Severity from the bounded estimate (fractions of the kernel's time).
WARNING_GAIN = 0.10
OPTIMIZATION_GAIN = 0.03
MIN_GAIN = 0.01
# A kernel this close to its timed reference, or with a math pipe this busy, is not
# condemned: what is left is an optimization at most.
NEAR_REFERENCE = 0.95
PIPE_SATURATED = 90.0
CORRECTNESS_TAG = "incorrect-result"
# The cap's name on a finding it holds (Finding.capped_by).
FLOOR_CAP = "gap to the floor"
LAUNCH_CAP = "empty launch's time"


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


def _cap(rank_max: int, severity: str) -> str:
    return severity if severity_rank(severity) <= rank_max else "optimization"


def severity_for(rule: Rule, gain: float | None) -> str | None:
    """The severity a bounded estimate earns (None: too small to be a finding)."""
    if rule.tag == CORRECTNESS_TAG:
        return rule.severity
    if gain is None:
        return _cap(severity_rank("optimization"), rule.severity)
    if gain < MIN_GAIN:
        return None
    if gain < OPTIMIZATION_GAIN:
        return "info"
    if gain < WARNING_GAIN:
        return _cap(severity_rank("optimization"), rule.severity)
    return rule.severity


def _no_warning_reason(profile: KernelProfile, ref_cap: float | None) -> str | None:
    if ref_cap is not None and ref_cap - REFERENCE_MARGIN <= 1 - NEAR_REFERENCE:
        return (f"within {1 - NEAR_REFERENCE:.0%} of its timed reference: what is left is an "
                "optimization at most")
    for name, metric in (("tensor", M_TENSOR_PIPE), ("FMA", M_FMA_PIPE)):
        busy = profile.metric(metric)
        if busy is not None and busy >= PIPE_SATURATED:
            return (f"its {name} pipe is busy {busy:.0f}% of the time (>= {PIPE_SATURATED:.0f}%): "
                    "what is left is an optimization at most")
    return None


def combine(gains: Sequence[tuple[str, float]], inside_cap: float | None = None) -> float | None:
    """Compose (group, gain) pairs: the largest per group, groups as independent savings,
    an envelope group (a whole roofline gap) as the larger of it and the causes inside it,
    and a group outside every envelope as a saving independent of both. inside_cap bounds
    what the envelope's causes save together (memory-bound work's gap to its floor, and an
    empty launch's time)."""
    best: dict[str, float] = {}
    for group, g in gains:
        best[group] = max(best.get(group, 0.0), g)
    if not best:
        return None
    keep = outside = 1.0
    for group, g in best.items():
        if group in OUTSIDE_ENVELOPE:
            outside *= 1 - g
        elif group not in ENVELOPE_GROUPS:
            keep *= 1 - g
    inside = max([1 - keep, *(g for group, g in best.items() if group in ENVELOPE_GROUPS)])
    if inside_cap is not None:
        inside = min(inside, inside_cap)
    return 1 - (1 - inside) * outside


def evaluate(profile: KernelProfile, manifest: RunManifest | None = None,
             context: Context | None = None, rules: Sequence[Rule] = REGISTRY) -> Evaluation:
    """Every rule on one kernel: its findings, and the rules that could not be evaluated."""
    context = context or Context()
    inputs = Inputs(profile, manifest, context)
    room = headroom(inputs)
    ref_cap, _ = reference_cap(inputs)
    caps = [(c, name) for c, name in ((room.fraction if room else None, "headroom"),
                                      (ref_cap, "reference gap")) if c is not None]

    floor = room.floor_fraction if room is not None else None
    # Known even where the roofline is not (a kernel of no FLOPs and no bytes).
    launch = launch_floor_fraction(profile)

    def caps_for(tag: str) -> list[tuple[float, str]]:
        inside = OVERLAP.get(tag) not in OUTSIDE_ENVELOPE
        # A fix that changes the reference's own problem (its layout) is not held to it.
        out = [(c, name) for c, name in caps
               if not (name == "reference gap" and OVERLAP.get(tag) in REFERENCE_BLIND)]
        # A finding that keeps the kernel's instruction is bounded by that instruction's roof.
        if room is not None:
            out = [room.cap_for(tag) if name == "headroom" else (c, name) for c, name in out]
        # No fix inside the kernel takes it below an empty launch.
        if launch is not None and inside:
            out.append((launch, LAUNCH_CAP))
        # Memory-bound work: no fix inside the floor's envelope saves more than the gap to it.
        if floor is not None and inside:
            out.append((floor, FLOOR_CAP))
        return out

    no_warning = _no_warning_reason(profile, ref_cap)
    findings: list[Finding] = []
    skipped: list[NotEvaluated] = []
    silent: list[str] = []
    quiet: list[tuple[str, float]] = []
    for rule in rules:
        try:
            hit = rule.check(inputs)
        except NotCollected as exc:
            skipped.append(NotEvaluated(rule.code, rule.title, f"not collected: {exc.what}"))
            continue
        if hit is None:
            silent.append(rule.code)
            continue
        raw = hit.estimated_gain
        gain, capped_by, bounded = raw, None, raw
        if raw is not None:
            gain = bounded = max(0.0, raw)
            for cap, name in caps_for(rule.tag):
                if gain > cap:
                    gain, capped_by = cap, name
                if name != "reference gap" and bounded > cap:
                    bounded = cap
            # Rounded down when capped, so the stored estimate never exceeds its bound.
            gain = math.floor(gain * 1e4) / 1e4 if capped_by else round(gain, 4)
            bounded = math.floor(bounded * 1e4) / 1e4 if bounded < raw else round(bounded, 4)
        cost = None
        if hit.cost is not None:
            cost = max(0.0, hit.cost)
            if room is not None:
                cost = min(cost, room.fraction)
            cost = round(cost, 4)
        severity = severity_for(rule, gain)
        if severity is None:
            silent.append(rule.code)
            if cost is not None or bounded is not None:
                quiet.append((rule.code, cost if cost is not None else bounded))
            continue
        if no_warning and rule.tag != CORRECTNESS_TAG and OVERLAP.get(rule.tag) not in REFERENCE_BLIND \
                and severity_rank(severity) >= severity_rank("warning"):
            severity = "optimization"
        ncu_rule, ncu_speedup = _ncu_match(profile, rule.ncu)
        findings.append(Finding(code=rule.code, tag=rule.tag, title=rule.title, severity=severity,
                                estimated_gain=gain, evidence=hit.evidence, fix=rule.fix_text(hit),
                                reference=rule.reference, ncu_rule=ncu_rule,
                                ncu_speedup_pct=ncu_speedup,
                                raw_gain=round(raw, 4) if raw is not None else None,
                                capped_by=capped_by, bounded_gain=bounded, cost=cost))
    findings.sort(key=lambda f: (-severity_rank(f.severity), -(f.estimated_gain or 0.0), f.code))
    # What the causes inside the envelope save together: the floor's gap and the launch's.
    inside_caps = [c for c in (floor, launch) if c is not None]
    combined = combine([(f.group, f.estimated_gain) for f in findings
                        if f.estimated_gain is not None and f.tag != CORRECTNESS_TAG],
                       min(inside_caps, default=None))
    # A layout finding (always estimated) frees the combined estimate and the page's note
    # from the reference the layout is shared with.
    blind = any(f.group in REFERENCE_BLIND for f in findings if f.estimated_gain)
    if combined is not None:
        # Rounded down when a cap holds it, as the findings are: never above the cap (the
        # floor's too, unless a saving outside its envelope adds to it).
        outside = any(f.group in OUTSIDE_ENVELOPE for f in findings if f.estimated_gain)
        held = [c for c, name in caps if not (blind and name == "reference gap")] + (
            inside_caps if not outside else [])
        cap = min(held, default=None)
        combined = (math.floor(cap * 1e4) / 1e4 if cap is not None and cap <= combined
                    else round(combined, 4))
    notes = (no_warning,) if no_warning and findings and not blind else ()
    return Evaluation(findings=tuple(findings), not_evaluated=tuple(skipped), silent=tuple(silent),
                      headroom=room, combined_gain=combined, reference_cap=ref_cap, notes=notes,
                      quiet=tuple(quiet))
