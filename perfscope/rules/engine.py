"""Evaluate the rule table on KernelProfiles, with the run manifest when there is one."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from perfscope.errors import PerfscopeError
from perfscope.profile import REPORT_SUFFIXES, KernelProfile
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

if TYPE_CHECKING:
    from perfscope.manifest import RunManifest

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


def _spec_for(manifest: RunManifest | None):
    if manifest is None:
        return None
    try:
        from perfscope.kernels import get_spec

        return get_spec(manifest.stage)
    except (PerfscopeError, ImportError):
        return None


def evaluate(profile: KernelProfile, manifest: RunManifest | None = None,
             context: Context | None = None, rules: Sequence[Rule] = REGISTRY) -> Evaluation:
    """Every rule on one kernel: its findings, and the rules that could not be evaluated."""
    context = context or Context()
    if context.spec is None and (spec := _spec_for(manifest)) is not None:
        context = Context(spec=spec, dtype=context.dtype)
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


def manifest_path(report: str | Path) -> Path:
    """Where a report's run manifest lives: ``<stem>.json`` beside ``<stem>.ncu-rep[.xz]``."""
    p = Path(report)
    name = p.name
    for suffix in sorted(REPORT_SUFFIXES, key=len, reverse=True):
        if name.endswith(suffix):
            return p.with_name(name[: -len(suffix)] + ".json")
    return p.with_suffix(".json")


def read_manifest(path: str | Path) -> RunManifest:
    """A RunManifest from JSON: one manifest, or a bench file holding exactly one."""
    from perfscope.manifest import RunManifest

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
    except (KeyError, TypeError, ValueError) as exc:
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
    if manifest.timing is None and manifest.verification.verdict == "ok":
        timing = _bench_timing(path.parent / "bench.json", manifest)
        if timing is not None:
            manifest = dataclasses.replace(manifest, timing=timing)
    return manifest


def _bench_timing(bench: Path, manifest: RunManifest):
    if not bench.is_file():
        return None
    try:
        runs = _bench_runs(bench, bench.stat().st_mtime_ns)
    except PerfscopeError as exc:
        log.warning("%s; estimates that need timing are not made", exc)
        return None
    key = (manifest.stage, manifest.dtype, manifest.m, manifest.n, manifest.k,
           tuple(sorted(manifest.params.items())))
    return runs.get(key)


@functools.lru_cache(maxsize=8)
def _bench_runs(bench: Path, _mtime: int) -> dict:
    from perfscope.manifest import BenchFile

    return {(m.stage, m.dtype, m.m, m.n, m.k, tuple(sorted(m.params.items()))): m.timing
            for m in BenchFile.read(bench).manifests if m.timing is not None}


def evaluate_all(profiles: Sequence[KernelProfile]) -> list[Evaluation]:
    """Evaluate every profile, each with the run manifest found beside its report."""
    manifests: dict[str, RunManifest | None] = {}
    out = []
    for kp in profiles:
        src = kp.identity.source
        if src not in manifests:
            manifests[src] = manifest_beside(src)
        out.append(evaluate(kp, manifests[src]))
    return out
