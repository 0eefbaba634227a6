"""ProfileDiff: why kernel A is slower than kernel B, with the evidence.

Two Diagnosed records (each a profile with its run manifest and rule evaluation) become
one value: time and cycle ratios (clocks differ from kernel to kernel when left as
found, so cycles are the fairer gate), speed of light side by side, the shift in the stall
mix, excess shared wavefronts and global sectors, launch resources, opcode families per
unit of work with the instruction families one kernel uses and the other lacks, hotspots,
the findings A has and B has not, and a verdict: the top reasons ranked by the rules'
estimated cost, each one sentence with its numbers and the fix.
"""

from __future__ import annotations

import dataclasses
import logging
import operator
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from perfscope.errors import PerfscopeError
from perfscope.families import FAMILY_BY_KEY, family_of
from perfscope.profile import KernelProfile
from perfscope.record import Diagnosed
from perfscope.rules import Finding

log = logging.getLogger(__name__)

VERDICT_REASONS = 3
# Families that mark the Hopper/Blackwell fast path, called out when only one side has them.
FAST_PATH = ("gmma", "tma", "utcmma", "tmem", "setmaxreg")
# Findings that say "A is on the slow instruction path" (their cost is the path's).
PATH_TAGS = ("legacy-mma", "no-tma", "no-tensor-cores")
OPCODE_ROLE = {"HGMMA": "wgmma", "UTMALDG": "TMA", "UTMASTG": "TMA store", "HMMA": "mma.sync",
               "LDGSTS": "cp.async", "LDSM": "ldmatrix", "UTCHMMA": "tcgen05.mma",
               "USETMAXREG": "setmaxnreg", "FFMA": "fp32 FMA"}


@dataclass(frozen=True)
class Row:
    """One compared quantity; ratio is a / b where both exist and b is not zero."""

    name: str
    a: float | None
    b: float | None

    @property
    def ratio(self) -> float | None:
        return self.a / self.b if self.a is not None and self.b else None


@dataclass(frozen=True)
class StallShift:
    reason: str
    share_a: float | None
    share_b: float | None
    cycles_a: float | None
    cycles_b: float | None

    @property
    def delta(self) -> float:
        return (self.share_a or 0.0) - (self.share_b or 0.0)


@dataclass(frozen=True)
class FamilyRow:
    family: str
    a: float | None               # per unit (see ProfileDiff.unit)
    b: float | None
    opcodes_a: tuple[str, ...]    # base opcodes of the family each side executes
    opcodes_b: tuple[str, ...]


@dataclass(frozen=True)
class Reason:
    sentence: str
    code: str | None
    estimated_gain: float | None
    fix: str


@dataclass(frozen=True)
class ProfileDiff:
    a: Diagnosed
    b: Diagnosed
    time: tuple[Row, ...]
    sol: tuple[Row, ...]
    stalls: tuple[StallShift, ...]
    memory: tuple[Row, ...]
    launch: tuple[Row, ...]
    unit: str                                  # "MFLOP" or "1k instructions"
    families: tuple[FamilyRow, ...]
    only_a: tuple[str, ...]                    # families A executes and B does not
    only_b: tuple[str, ...]
    new_findings: tuple[Finding, ...]          # in A, not in B (by code)
    gone_findings: tuple[Finding, ...]         # in B, not in A
    verdict: tuple[Reason, ...]
    warnings: tuple[str, ...] = field(default=())

    def fields(self) -> dict[str, float | None]:
        """Every gateable number, by name (the names --fail-if accepts)."""
        out: dict[str, float | None] = {}
        for group in (self.time, self.sol, self.memory, self.launch):
            for row in group:
                key = re.sub(r"[^a-z0-9]+", "_", row.name.lower()).strip("_")
                out[f"{key}_a"], out[f"{key}_b"] = row.a, row.b
                out[f"{key}_ratio"] = row.ratio
        out["duration_ratio"] = out.get("duration_ns_ratio")
        out["cycles_ratio"] = out.get("cycles_ratio")
        out["new_findings"] = float(len(self.new_findings))
        out["new_warnings"] = float(sum(f.severity in ("warning", "error") for f in self.new_findings))
        return out


# ------------------------------------------------------------------------ comparing


def _rows(pairs: Sequence[tuple[str, float | None, float | None]]) -> tuple[Row, ...]:
    return tuple(Row(n, a, b) for n, a, b in pairs)


def _opcodes_of(kp: KernelProfile, family: str) -> tuple[str, ...]:
    return tuple(op for op, n in kp.opcodes.executed.items() if n and family_of(op) == family)


def _named(opcodes: Sequence[str]) -> str:
    return " and ".join(f"{op} ({OPCODE_ROLE[op]})" if op in OPCODE_ROLE else op for op in opcodes)


def _principal(opcodes: Sequence[str], limit: int = 3) -> list[str]:
    """The opcodes a reader knows by name (HGMMA, UTMALDG...), not their helpers (DEPBAR)."""
    named = [op for op in opcodes if op in OPCODE_ROLE]
    return (named or list(opcodes))[:limit]


def _instruction_sentence(a: KernelProfile, b: KernelProfile, only_b: Sequence[str]) -> str | None:
    fast = [f for f in FAST_PATH if f in only_b]
    if not fast:
        return None
    b_ops = _principal([op for f in fast for op in _opcodes_of(b, f)])
    a_ops = _principal([op for f in ("hmma", "ldgsts", "ldsm", "ffma") if a.opcodes.has(f)
                        for op in _opcodes_of(a, f)])
    text = f"B uses {_named(b_ops)}"
    return text + (f"; A uses {_named(a_ops)}" if a_ops else "; A uses none of them")


def _evidence_text(f: Finding, limit: int = 2) -> str:
    parts = []
    for e in f.evidence[:limit]:
        value = f"{e.value:,.3g}" if isinstance(e.value, float) else str(e.value)
        parts.append(f"{e.metric} = {value}")
    return "; ".join(parts)


def _verdict(a: Diagnosed, b: Diagnosed, new: Sequence[Finding], only_b: Sequence[str],
             stalls: Sequence[StallShift], cycles_ratio: float | None) -> tuple[Reason, ...]:
    reasons: list[Reason] = []
    path_sentence = _instruction_sentence(a.profile, b.profile, only_b)
    # When B runs the fast path A lacks, the whole cycle gap is what changing path is
    # worth: the rules cannot estimate it from A alone without a timed manifest.
    path_gain = 1 - 1 / cycles_ratio if path_sentence and cycles_ratio and cycles_ratio > 1 else None

    def gain_of(f: Finding) -> float | None:
        if f.estimated_gain is None and f.tag in PATH_TAGS:
            return path_gain
        return f.estimated_gain

    ranked = sorted(new, key=lambda f: -(g if (g := gain_of(f)) is not None else -1.0))
    for f in ranked:
        gain = gain_of(f)
        cost = "" if gain is None else f" (about {gain:.0%} of A's time)"
        lead = f.title
        if path_sentence and f.tag in PATH_TAGS:
            lead = f"{f.title}: {path_sentence}"
            path_sentence = None
        reasons.append(Reason(f"{lead}{cost}; {_evidence_text(f)}.", f.code, gain, f.fix))
    if path_sentence:
        reasons.append(Reason(f"{path_sentence}.", None, path_gain,
                              "Move the main loop to the instructions B uses (compile for sm_90a)."))
    for s in stalls:
        if len(reasons) >= VERDICT_REASONS:
            break
        if s.delta >= 0.10:
            reasons.append(Reason(
                f"A's warps stall on {s.reason} {s.share_a:.0%} of their stall time against "
                f"{(s.share_b or 0):.0%} in B ({s.cycles_a or 0:.1f} vs {s.cycles_b or 0:.1f} "
                "cycles per issued instruction).", None, None,
                "See the hotspots: the instructions that carry these stalls."))
    return tuple(reasons[:VERDICT_REASONS])


def compare(a: Diagnosed, b: Diagnosed, flops: int | None = None) -> ProfileDiff:
    """The ProfileDiff of A against B. flops overrides the manifests' shape (--shape)."""
    pa, pb = a.profile, b.profile
    warnings = []
    fa, fb = (flops, flops) if flops else (a.flops, b.flops)
    if a.shape and b.shape and a.shape != b.shape and not flops:
        warnings.append(f"A and B solve different GEMM shapes ({'x'.join(map(str, a.shape))} vs "
                        f"{'x'.join(map(str, b.shape))}): opcode families are per instruction.")
        fa = fb = None
    if fa and fb:
        unit, da, db = "MFLOP", fa / 1e6, fb / 1e6
    else:
        if not warnings:
            warnings.append("the GEMM shape is unknown (no run manifests; --shape sets it): "
                            "opcode families are per executed instruction.")
        unit, da, db = "1k instructions", (pa.opcodes.total or 0) / 1e3, (pb.opcodes.total or 0) / 1e3
    fams = sorted(set(pa.opcodes.families) | set(pb.opcodes.families))
    families = tuple(FamilyRow(
        f, pa.opcodes.families.get(f, 0.0) / da if da else None,
        pb.opcodes.families.get(f, 0.0) / db if db else None,
        _opcodes_of(pa, f), _opcodes_of(pb, f)) for f in fams)
    only_a = tuple(f for f in fams if pa.opcodes.has(f) and not pb.opcodes.has(f))
    only_b = tuple(f for f in fams if pb.opcodes.has(f) and not pa.opcodes.has(f))
    reasons = sorted({s.reason for s in pa.stalls.reasons} | {s.reason for s in pb.stalls.reasons})
    by_a = {s.reason: s for s in pa.stalls.reasons}
    by_b = {s.reason: s for s in pb.stalls.reasons}
    stalls = sorted((StallShift(r, pa.stalls.share(r), pb.stalls.share(r),
                                getattr(by_a.get(r), "cycles_per_issue", None),
                                getattr(by_b.get(r), "cycles_per_issue", None)) for r in reasons),
                    key=lambda s: -abs(s.delta))
    time_rows = _rows([("duration ns", pa.sol.duration_ns, pb.sol.duration_ns),
                       ("cycles", pa.identity.cycles, pb.identity.cycles),
                       ("SM clock Hz", pa.identity.sm_clock_hz, pb.identity.sm_clock_hz)])
    sol = _rows([(name, getattr(pa.sol, key), getattr(pb.sol, key)) for name, key in (
        ("SM %", "sm_pct"), ("memory %", "memory_pct"), ("DRAM %", "dram_pct"),
        ("L1/TEX %", "l1tex_pct"), ("L2 %", "l2_pct"))])
    ma, mb = pa.memory, pb.memory
    memory = _rows([("shared excess wavefronts", ma.shared.excess, mb.shared.excess),
                    ("shared excess %", ma.shared.excess_pct, mb.shared.excess_pct),
                    ("global excess sectors", ma.global_.excess, mb.global_.excess),
                    ("global excess %", ma.global_.excess_pct, mb.global_.excess_pct),
                    ("local bytes", ma.local_bytes, mb.local_bytes),
                    ("L2 hit %", ma.l2_hit_rate_pct, mb.l2_hit_rate_pct)])
    la, lb = pa.launch, pb.launch

    def smem(x) -> float | None:
        parts = [v for v in (x.shared_static_bytes, x.shared_dynamic_bytes) if v is not None]
        return float(sum(parts)) if parts else None

    launch = _rows([("registers", la.registers_per_thread, lb.registers_per_thread),
                    ("shared bytes per block", smem(la), smem(lb)),
                    ("achieved occupancy %", la.achieved_occupancy_pct, lb.achieved_occupancy_pct),
                    ("waves per SM", la.waves_per_sm, lb.waves_per_sm),
                    ("cluster size", float(la.cluster_size or 1), float(lb.cluster_size or 1))])
    codes_b = {f.code for f in b.evaluation.findings}
    codes_a = {f.code for f in a.evaluation.findings}
    new = tuple(f for f in a.evaluation.findings if f.code not in codes_b)
    gone = tuple(f for f in b.evaluation.findings if f.code not in codes_a)
    cycles_ratio = time_rows[1].ratio
    verdict = _verdict(a, b, new, only_b, stalls, cycles_ratio)
    return ProfileDiff(a, b, time_rows, sol, tuple(stalls), memory, launch, unit, families, only_a,
                       only_b, new, gone, verdict, tuple(warnings))


@dataclass(frozen=True)
class DiffDocument:
    """What `perfscope diff` shows: the diff and the CI gates it violates."""

    diff: ProfileDiff
    gate_failures: tuple[str, ...] = ()
    kind: str = "diff"


# ----------------------------------------------------------------------------- gates


_GATE = re.compile(r"^\s*([a-z0-9_]+)\s*(>=|<=|==|!=|>|<)\s*(-?[0-9.]+(?:e-?\d+)?)\s*$")
_OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le,
        "==": operator.eq, "!=": operator.ne}


def check_gates(diff: ProfileDiff, expressions: Sequence[str],
                fail_on_new_findings: bool = False) -> list[str]:
    """The gates that the diff violates, each as one sentence; bad expressions raise.

    fail_on_new_findings is the gate ``new_findings > 0``, worded with the findings.
    """
    values: Mapping[str, float | None] = diff.fields()
    violated = []
    for expr in expressions:
        m = _GATE.match(expr)
        if m is None:
            raise PerfscopeError(f"--fail-if {expr!r} is not of the form FIELD>NUMBER "
                                 "(operators > >= < <= == !=).")
        name, op, number = m.group(1), m.group(2), float(m.group(3))
        if name not in values:
            raise PerfscopeError(f"--fail-if names unknown field {name!r}; fields: "
                                 f"{', '.join(sorted(values))}.")
        value = values[name]
        if value is None:
            violated.append(f"{name} is not collected in both reports, so '{expr}' cannot pass")
        elif _OPS[op](value, number):
            violated.append(f"{name} = {value:.4g} violates '{expr}'")
    if fail_on_new_findings and values["new_findings"]:
        violated.append("A has findings B has not: "
                        + ", ".join(f"{f.code} {f.title}" for f in diff.new_findings))
    return violated


def to_dict(diff: ProfileDiff) -> dict[str, Any]:
    """The diff as JSON-ready data (schema perfscope.diff/1)."""
    def side(s: Diagnosed) -> dict[str, Any]:
        return {"label": s.label, "report": str(s.path), "name": s.profile.name,
                "demangled": s.profile.identity.demangled,
                "manifest": None if s.manifest is None else {"stage": s.manifest.stage,
                                                             "dtype": s.manifest.dtype,
                                                             "shape": s.manifest.shape},
                "hotspots": [dataclasses.asdict(h) for h in s.profile.hotspots[:5]]}

    def rows(rs: Sequence[Row]) -> list[dict[str, Any]]:
        return [{"name": r.name, "a": r.a, "b": r.b, "ratio": r.ratio} for r in rs]

    return {
        "schema": "perfscope.diff/1", "a": side(diff.a), "b": side(diff.b),
        "fields": diff.fields(), "time": rows(diff.time), "sol": rows(diff.sol),
        "memory": rows(diff.memory), "launch": rows(diff.launch),
        "stalls": [dataclasses.asdict(s) | {"delta": s.delta} for s in diff.stalls],
        "unit": diff.unit, "families": [dataclasses.asdict(f) for f in diff.families],
        "only_a": list(diff.only_a), "only_b": list(diff.only_b),
        "new_findings": [f.to_dict() for f in diff.new_findings],
        "gone_findings": [f.to_dict() for f in diff.gone_findings],
        "verdict": [dataclasses.asdict(r) for r in diff.verdict],
        "warnings": list(diff.warnings),
        "family_labels": {k: FAMILY_BY_KEY[k].label for k in FAMILY_BY_KEY},
    }
