"""ProfileDiff: why kernel A is slower than kernel B, with the evidence.

Two KernelProfiles (each with its run manifest and rule evaluation when there is one)
become one value: time and cycle ratios (clocks differ from kernel to kernel when left as
found, so cycles are the fairer gate), speed of light side by side, the shift in the stall
mix, excess shared wavefronts and global sectors, launch resources, opcode families per
unit of work with the instruction families one kernel uses and the other lacks, hotspots,
the findings A has and B has not, and a verdict: the top reasons ranked by the rules'
estimated cost, each one sentence with its numbers and the fix.
"""

from __future__ import annotations

import dataclasses
import glob
import logging
import operator
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfscope.errors import PerfscopeError
from perfscope.profile import REPORT_SUFFIXES, KernelProfile, load
from perfscope.rules import Evaluation, Finding, evaluate, manifest_beside
from perfscope.sass.families import FAMILY_BY_KEY, family_of

log = logging.getLogger(__name__)

LOCAL_ROOT = Path("reports") / "local"
REFERENCE_ROOT = Path("reports") / "reference"
VERDICT_REASONS = 3
# Families that mark the Hopper/Blackwell fast path, called out when only one side has them.
FAST_PATH = ("gmma", "tma", "utcmma", "tmem", "setmaxreg")
# Findings that say "A is on the slow instruction path" (their cost is the path's).
PATH_TAGS = ("legacy-mma", "no-tma", "no-tensor-cores")
OPCODE_ROLE = {"HGMMA": "wgmma", "UTMALDG": "TMA", "UTMASTG": "TMA store", "HMMA": "mma.sync",
               "LDGSTS": "cp.async", "LDSM": "ldmatrix", "UTCHMMA": "tcgen05.mma",
               "USETMAXREG": "setmaxnreg", "FFMA": "fp32 FMA"}


@dataclass(frozen=True)
class Side:
    """One kernel of the comparison, with what perfscope knows about it."""

    label: str
    path: Path
    profile: KernelProfile
    manifest: Any | None          # RunManifest, when one lies beside the report
    evaluation: Evaluation

    @property
    def flops(self) -> int | None:
        m = self.manifest
        return 2 * m.m * m.n * m.k if m is not None else None

    @property
    def shape(self) -> tuple[int, int, int] | None:
        m = self.manifest
        return (m.m, m.n, m.k) if m is not None else None


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
    a: Side
    b: Side
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


# ------------------------------------------------------------------------ resolving


def _stage_names() -> list[str]:
    try:
        from perfscope.kernels import names

        return list(names())
    except ImportError:
        return []


def _report_files(root: Path, stage: str) -> list[Path]:
    found = []
    for suffix in REPORT_SUFFIXES:
        found += [Path(p) for p in glob.glob(str(root / "**" / f"{stage}-*{suffix}"), recursive=True)]
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)


def _side_from_file(path: Path, regex: str | None, label: str) -> Side:
    profiles = load(path, regex)
    if not profiles:
        raise PerfscopeError(f"no kernel matches {regex!r} in {path}.")
    if len(profiles) > 1:
        names = ", ".join(sorted({p.name for p in profiles}))
        if regex is not None:
            raise PerfscopeError(f"{regex!r} matches {len(profiles)} kernel launches in {path} "
                                 f"({names}); make the regex narrower.")
        raise PerfscopeError(f"{path} holds {len(profiles)} kernel launches ({names}); pick one with "
                             f"{path}:REGEX.")
    manifest = manifest_beside(path)
    return Side(label, path, profiles[0], manifest, evaluate(profiles[0], manifest))


def resolve(arg: str, *, reference: bool = False, like: Side | None = None,
            dtype: str | None = None) -> Side:
    """A report file, FILE:REGEX, a stage name (its latest report), or 'cublas' (as B)."""
    path = Path(arg)
    if path.is_file():
        return _side_from_file(path, None, arg)
    if ":" in arg:
        head, _, regex = arg.rpartition(":")
        if Path(head).is_file():
            return _side_from_file(Path(head), regex, arg)
    stage = arg
    shape = None
    if arg == "cublas":
        if like is None or like.manifest is None:
            raise PerfscopeError("'cublas' needs A's run manifest to know its dtype and shape; "
                                 "name the reference (cublas_sgemm, cublas_hgemm, cublas_bgemm).")
        from perfscope.kernels import REFERENCE_FOR_DTYPE

        stage = REFERENCE_FOR_DTYPE[like.manifest.dtype]
        dtype, shape = like.manifest.dtype, like.manifest.shape
    known = _stage_names()
    if stage not in known:
        raise PerfscopeError(f"{arg!r} is neither a report file nor a stage; stages: {', '.join(known)}.")
    root = REFERENCE_ROOT if reference else LOCAL_ROOT
    files = _report_files(root, stage)
    if not dtype and files:
        # A stage reported in several dtypes means its first one unless --dtype says.
        from perfscope.kernels import get_spec

        first = get_spec(stage).dtypes[0]
        if any(f"-{first}-" in f.name for f in files):
            dtype = first
    if dtype:
        files = [f for f in files if f"-{dtype}-" in f.name]
    if shape:
        files = [f for f in files if f"-{shape}." in f.name]
    if not files:
        where = f"{root}" + ("" if reference else " (add --reference for the committed H200 run)")
        have = sorted({Path(p).name.split("-")[0] for p in glob.glob(str(root / "**" / "*.ncu-rep*"),
                                                                        recursive=True)})
        raise PerfscopeError(f"no report of {stage}" + (f" in {dtype}" if dtype else "")
                             + f" under {where}; stages with reports there: {', '.join(have) or 'none'}.")
    return _side_from_file(files[0], None, f"{stage} ({files[0].name})")


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


def _verdict(a: Side, b: Side, new: Sequence[Finding], only_b: Sequence[str],
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


def compare(a: Side, b: Side, flops: int | None = None) -> ProfileDiff:
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


# ----------------------------------------------------------------------------- gates


_GATE = re.compile(r"^\s*([a-z0-9_]+)\s*(>=|<=|==|!=|>|<)\s*(-?[0-9.]+(?:e-?\d+)?)\s*$")
_OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le,
        "==": operator.eq, "!=": operator.ne}


def check_gates(diff: ProfileDiff, expressions: Sequence[str]) -> list[str]:
    """The gates that the diff violates, each as one sentence; bad expressions raise."""
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
    return violated


def to_dict(diff: ProfileDiff) -> dict[str, Any]:
    """The diff as JSON-ready data (schema perfscope.diff/1)."""
    def side(s: Side) -> dict[str, Any]:
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
