"""The diagnose summary of one kernel as plain rows, shared by the console and Markdown.

Each section is a title and (label, text) rows, so the two renderers show the same facts
in the same order and a missing metric reads "not collected" in both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from perfscope.families import FAMILY_BY_KEY
from perfscope.profile import KernelProfile, Traffic

if TYPE_CHECKING:
    from collections.abc import Sequence

    from perfscope.record import Diagnosed
    from perfscope.stage import OperandRead

NOT_COLLECTED = "not collected"
# Theoretical occupancy at (or rounding to) 100% has no limiter worth naming: every
# resource allows the most warps an SM can hold.
FULL_OCCUPANCY_PCT = 99.95


@dataclass(frozen=True)
class Section:
    """One titled block of the summary: (label, text) rows in the order both renderers show them."""

    title: str
    rows: tuple[tuple[str, str], ...]


def md_cell(text: str) -> str:
    """Text safe inside a Markdown table cell of a PR comment.

    C++ template names carry '<', '>' and sometimes '|': keep the tables intact, and let
    nothing in a kernel name open an HTML tag in the comment.
    """
    return (text.replace("&", "&amp;").replace("|", "\\|").replace("<", "&lt;")
            .replace(">", "&gt;").replace("`", "'"))


def num(v: float | None, digits: int = 0, unit: str = "") -> str:
    """A number with thousands separators and an optional unit, or "not collected"."""
    if v is None:
        return NOT_COLLECTED
    text = f"{v:,.{digits}f}"
    return f"{text} {unit}".rstrip()


def pct(v: float | None) -> str:
    """A percentage (0..100) with one decimal, or "not collected"."""
    return NOT_COLLECTED if v is None else f"{v:.1f}%"


def duration(ns: float | None) -> str:
    """A duration in nanoseconds as milliseconds or microseconds, or "not collected"."""
    if ns is None:
        return NOT_COLLECTED
    if ns >= 1e6:
        return f"{ns / 1e6:.3f} ms"
    return f"{ns / 1e3:.2f} us"


def clock(hz: float | None) -> str:
    """A clock in Hz as GHz, or "not collected"."""
    return NOT_COLLECTED if hz is None else f"{hz / 1e9:.3f} GHz"


def count(v: float | None) -> str:
    """A count (instructions, cycles, registers, bytes): an integer, never "121.0"."""
    return NOT_COLLECTED if v is None else f"{v:,.0f}"


def occupancy(achieved: float | None, theoretical: float | None, limiter: str | None) -> str:
    """Achieved against theoretical occupancy, and what limits it unless nothing does."""
    text = f"{pct(achieved)} achieved of {pct(theoretical)} theoretical"
    if theoretical is not None and theoretical >= FULL_OCCUPANCY_PCT:
        return text + " (the most an SM holds)"
    return f"{text}, limited by {limiter or NOT_COLLECTED}"


def dims(d: tuple[int, int, int] | None) -> str:
    """A grid, block or cluster shape as XxYxZ, or "not collected"."""
    return NOT_COLLECTED if d is None else "x".join(map(str, d))


def _traffic_rows(label: str, unit: str, t: Traffic) -> list[tuple[str, str]]:
    if t.actual is None:
        return [(label, NOT_COLLECTED)]
    if not t.actual and not t.ideal:
        return [(label, f"no {label} {unit}")]
    rows = [(label, f"{num(t.excess)} excess {unit} over ideal {num(t.ideal)} "
                    f"({pct(t.excess_pct)})")]
    for o in t.by_opcode:
        if o.excess > 0:
            ratio = "" if o.ratio is None else f", {o.ratio:.1f}x ideal"
            rows.append((f"  {o.opcode} ({o.kind})", f"{num(o.excess)} excess{ratio}"))
    return rows


# Where a kernel loads by TMA and its maps are unknown (a program's or cuBLAS's kernel).
BOXES_UNKNOWN = ("unknown: a report holds no tensor map (`perfscope profile --tensor-maps` "
                 "records those a program or cuBLAS passes)")


def read_rows(reads: Sequence[OperandRead] | None, tma: bool = False) -> tuple[tuple[str, str], ...]:
    """How the run read each operand by TMA (planned from its run manifest, or recorded as
    passed): the boxes, how far apart their rows lie, and the contiguous bytes one box reads
    in one piece; for a TMA kernel whose maps are unknown, one row that says so."""
    if reads is None:
        return (("TMA boxes", BOXES_UNKNOWN),) if tma else ()
    return tuple((f"TMA boxes of {r.operand}",
                  f"{r.box_rows} rows x {r.box_row_bytes} B, {r.row_bytes:,} B apart ({r.layout}); "
                  f"{r.run_bytes:,} B contiguous")
                 for r in reads)


def sections(kp: KernelProfile, hotspots: int = 5,
             reads: Sequence[OperandRead] | None = None) -> list[Section]:
    """The diagnose summary of one kernel: identity, speed of light, top stalls, memory, launch
    (with the run's TMA boxes where its stage is known), opcode families and its most
    sampled instructions."""
    i, s, m, la = kp.identity, kp.sol, kp.memory, kp.launch
    out = [Section("Kernel", (
        ("name", i.demangled or i.name),
        ("device", f"{i.device or NOT_COLLECTED} (sm_{(i.compute_capability or '?').replace('.', '')})"),
        ("grid / block / cluster", f"{dims(i.grid)} / {dims(i.block)} / "
                                   f"{dims(i.cluster) if i.cluster else 'none'}"),
        ("duration", duration(s.duration_ns)),
        ("SM clock (measured)", clock(i.sm_clock_hz)),
        ("cycles", num(i.cycles)),
        ("memory clock", clock(i.mem_clock_hz)),
    ))]
    out.append(Section("Speed of light", (
        ("compute (SM)", pct(s.sm_pct)), ("memory", pct(s.memory_pct)),
        ("DRAM", pct(s.dram_pct)), ("L1/TEX", pct(s.l1tex_pct)), ("L2", pct(s.l2_pct)),
    )))
    top = kp.stalls.top(3)
    stall_rows = [(st.reason, f"{num(st.cycles_per_issue, 2)} cycles/issue"
                              + ("" if kp.stalls.share(st.reason) is None
                                 else f" ({100 * kp.stalls.share(st.reason):.0f}%)")
                              + ("" if st.samples is None else f", {st.samples:,} samples"))
                  for st in top]
    out.append(Section("Top stalls", tuple(stall_rows) or (("stalls", NOT_COLLECTED),)))
    if kp.parked:
        out.append(Section("Parked warps", tuple(parked_rows(kp))))
    out.append(Section("Memory", (
        *_traffic_rows("shared", "wavefronts", m.shared),
        ("shared bank conflicts (raw ld/st)",
         f"{num(m.bank_conflicts_ld)} / {num(m.bank_conflicts_st)}"),
        *_traffic_rows("global", "sectors", m.global_),
        ("L1 / L2 hit rate", f"{pct(m.l1_hit_rate_pct)} / {pct(m.l2_hit_rate_pct)}"),
        ("local (spill) traffic",
         NOT_COLLECTED if m.local_bytes is None else
         f"{num(m.local_bytes)} bytes, {num(m.local_load_requests)} load / "
         f"{num(m.local_store_requests)} store requests"),
    )))
    out.append(Section("Launch", (
        ("registers / thread", num(la.registers_per_thread)),
        ("shared memory / block", f"{num(la.shared_static_bytes)} static, "
                                  f"{num(la.shared_dynamic_bytes)} dynamic, "
                                  f"{num(la.shared_driver_bytes)} driver (bytes)"),
        ("occupancy", occupancy(la.achieved_occupancy_pct, la.theoretical_occupancy_pct,
                                la.occupancy_limiter)),
        ("waves / SM", num(la.waves_per_sm, 2)),
        *read_rows(reads, tma=bool(kp.opcodes.families.get("tma"))),
    )))
    fams = kp.opcodes.families
    total = kp.opcodes.total
    fam_rows = tuple((FAMILY_BY_KEY[k].label, num(v) + ("" if not total else f" ({100 * v / total:.1f}%)"))
                     for k, v in sorted(fams.items(), key=lambda kv: -kv[1]))
    out.append(Section("Opcode families", fam_rows or (("opcodes", NOT_COLLECTED),)))
    parked = {a for p in kp.parked for a in p.addresses}
    hot_rows = tuple(
        (f"0x{h.address:04x} {h.opcode}",
         f"{h.samples:,} samples" + (f" [{', '.join(r for r, _ in h.reasons)}]" if h.reasons else "")
         + _where(h.file, h.line) + (f" ({PARKED_MARK})" if h.address in parked else ""))
        for h in kp.hotspots[:hotspots])
    out.append(Section("Hotspots", hot_rows or (("hotspots", NOT_COLLECTED),)))
    return out


# A hotspot where warps are parked, as the hotspot lists mark it.
PARKED_MARK = "parked warps: not a wait of the work"
# The stall reasons "stall shares without them" names: those holding at least this share of
# the parked warps' samples.
PARKED_REASON_MIN = 0.1
# perfscope answers one of Nsight Compute's stall rules when at least this share of the
# reason's samples are parked warps' (hgemm_small_m's pairs at 256 x 8192^2: 60% of its
# barrier samples, where Nsight Compute estimates 20% to gain).
NCU_REMARK_PARKED_MIN = 0.5


def _where(file: str | None, line: int | None) -> str:
    return f" at {file.rsplit('/', 1)[-1]}:{line}" if file and line else ""


def parked_rows(kp: KernelProfile) -> list[tuple[str, str]]:
    """One row per instruction where warps wait out the kernel, then what the stall shares
    become without them."""
    total = kp.stalls.total_samples
    ctas = kp.launch.grid_size or 1     # known: parked warps are counted per CTA
    rows = []
    for p in kp.parked:
        share = f"{p.samples / total:.0%} of the samples" if total else f"{p.samples:,} samples"
        top = p.reasons[0][0] if p.reasons else "stall"
        rows.append((f"0x{p.address:04x} {p.opcode}",
                     f"{share} [{top}]{_where(p.file, p.line)}: the equivalent of "
                     f"{p.warps_per_cta:.1f} warps per CTA waiting there for the whole kernel "
                     f"(outside the main loop, passed {p.passes / ctas:.0f} times per CTA). "
                     "Warps with nothing left to do (a producer warpgroup's spare warps) wait "
                     "there at no cost to the kernel, yet every stall share above counts them"))
    held = kp.parked_reasons
    # The reasons the parked warps mostly wait in; the others only move with the total.
    reasons = sorted((r for r, n in held.items() if n >= PARKED_REASON_MIN * kp.parked_samples),
                     key=lambda r: -(kp.stalls.share(r) or 0.0))
    kept = [f"{r} {kp.working_stall_share(r):.0%} (not {kp.stalls.share(r):.0%})" for r in reasons
            if kp.stalls.share(r) is not None and kp.working_stall_share(r) is not None]
    if kept:
        rows.append(("stall shares without them", ", ".join(kept) + " of the stall cycles"))
    return rows


def ncu_remark(kp: KernelProfile, identifier: str, title: str) -> str | None:
    """perfscope's word on one of Nsight Compute's stall rules (CPIStall) where the reason
    it names is mostly warps parked until the kernel ends, which it counts as lost time."""
    if identifier != "CPIStall" or not kp.parked:
        return None
    reason = title.lower().removesuffix(" stalls").strip().replace(" ", "_")
    by_reason = {s.reason: s for s in kp.stalls.reasons}
    stall = by_reason.get(reason)
    parked = kp.parked_reasons.get(reason, 0)
    if stall is None or not stall.samples or parked < NCU_REMARK_PARKED_MIN * stall.samples:
        return None
    raw, working = kp.stalls.share(reason), kp.working_stall_share(reason)
    after = (f": without them {reason} is {working:.0%} of the stall cycles, not {raw:.0%}"
             if raw is not None and working is not None else "")
    where = ", ".join(f"0x{p.address:04x} {p.opcode}" for p in kp.parked)
    return (f"perfscope: {parked / stall.samples:.0%} of these {reason} samples are warps parked "
            f"at {where}, outside the main loop, where they wait out the kernel rather than "
            f"for work{after} (see Parked warps).")


# ------------------------------------------------------------ one row per kernel

SUMMARY_COLUMNS = ("launch", "kernel", "duration", "cycles", "SM clock", "top stall", "findings")


def summary_row(r: Diagnosed) -> tuple[str, ...]:
    """One launch in a line: how to name it again (FILE#ID), its time, and its worst finding."""
    kp = r.profile
    top = kp.stalls.top(1)
    findings = r.evaluation.findings
    if findings:
        worst = findings[0]          # the evaluation ranks the most severe, costliest first
        est = "no estimate" if worst.estimated_gain is None else f"est. {worst.estimated_gain:.0%}"
        found = f"{len(findings)} (worst {worst.code} {worst.severity}, {est})"
    else:
        found = "none"
    if r.untrusted:
        found = f"NOT TRUSTWORTHY ({r.untrusted}); {found}"
    return (r.launch_id, kp.name, duration(kp.sol.duration_ns), num(kp.identity.cycles),
            clock(kp.identity.sm_clock_hz), top[0].reason if top else NOT_COLLECTED, found)


# ------------------------------------------------------------------------ findings


@dataclass(frozen=True)
class FindingText:
    """One perfscope finding as text, the same in the console and in Markdown."""

    severity: str
    code: str
    tag: str
    title: str
    estimate: str            # perfscope's estimate beside Nsight Compute's own
    evidence: tuple[str, ...]
    fix: str
    reference: str


def gain(v: float | None) -> str:
    """A finding's bounded estimate as a share of the kernel's time."""
    return "no estimate" if v is None else f"est. {100 * v:.1f}% of kernel time"


def evidence_value(v: float | str) -> str:
    """A finding's evidence value: counts as integers ("32", "1,048,576"), ratios with
    four significant digits."""
    if isinstance(v, str):
        return v
    if math.isfinite(v) and v == int(v):
        return f"{v:,.0f}"
    return f"{v:,.4g}"


def finding_texts(evaluation) -> list[FindingText]:
    """The findings of a perfscope.rules Evaluation, most severe first."""
    out = []
    for f in evaluation.findings:
        est = gain(f.estimated_gain)
        if f.capped_by is not None:
            est += f" (capped at the {f.capped_by}; the rule alone said {100 * f.raw_gain:.1f}%)"
        if f.ncu_rule is not None:
            ncu = "no estimate" if f.ncu_speedup_pct is None else f"{f.ncu_speedup_pct:.1f}%"
            est += f" (Nsight Compute {f.ncu_rule}: {ncu})"
        ev = tuple(f"{e.metric} = {evidence_value(e.value)} (threshold {e.threshold})"
                   for e in f.evidence)
        out.append(FindingText(f.severity, f.code, f.tag, f.title, est, ev, f.fix, f.reference))
    return out


def headroom_text(evaluation) -> str | None:
    """The kernel's headroom and its findings composed, in one line (None: no roofline)."""
    h = getattr(evaluation, "headroom", None)
    if h is None:
        return None
    text = (f"headroom {100 * h.fraction:.1f}% of kernel time (bound by {h.bound}: "
            f"{h.t_min_ns / 1e3:,.1f} of {h.t_ns / 1e3:,.1f} us)")
    if getattr(h, "path_fraction", None) is not None:
        text += f", {100 * h.path_fraction:.1f}% on its {h.path} path"
    if (above := above_floor_text(evaluation)) is not None:
        text += f", {above}"
    if evaluation.combined_gain is not None:
        text += f"; findings combined: est. {100 * evaluation.combined_gain:.1f}%"
    if evaluation.reference_cap is not None:
        text += f"; capped at {100 * evaluation.reference_cap:.1f}% by the gap to its reference"
        if evaluation.combined_gain is not None and evaluation.combined_gain > evaluation.reference_cap:
            # A layout finding (PS107/PS108): the reference runs the same layout.
            text += " (but for the layout, which the reference shares)"
    if (note := headroom_note(evaluation)) is not None:
        text += f"; {note}"
    return text


def above_floor_text(evaluation) -> str | None:
    """How far memory-bound work runs above its floor, which caps its findings' estimates
    ("capped at the gap to the floor"); None for other work, or where the headroom note
    already says the kernel runs at its floor."""
    h = getattr(evaluation, "headroom", None)
    floor = getattr(h, "floor_fraction", None)
    if not floor or headroom_note(evaluation) == floor_text(h):
        return None
    return (f"{100 * floor:.1f}% above its floor ({h.t_floor_ns / 1e3:,.1f} us: fixed time + "
            "bytes at the practical DRAM rate)")


def headroom_note(evaluation) -> str | None:
    """What holds a kernel whose headroom no finding estimates: a gap in the rules
    (UNEXPLAINED), its memory floor, or a roof a finding names; None where findings
    estimate part of it or the headroom is small."""
    h = getattr(evaluation, "headroom", None)
    if h is None or getattr(evaluation, "combined_gain", None) is not None:
        return None
    if h.fraction >= UNEXPLAINED_MIN and at_floor(h):
        return floor_text(h)
    roof = roof_named(evaluation)
    if roof is not None:
        return roof_text(roof)
    if h.fraction < UNEXPLAINED_MIN:
        return None
    quiet = [(code, cost) for code, cost in getattr(evaluation, "quiet", ()) if cost >= QUIET_NAMED]
    return quiet_text(quiet) if quiet else UNEXPLAINED


# A symptom under the line (Evaluation.quiet) that costs at least this share of the time
# names part of a headroom no finding estimates: its fix would not give it back, which is
# no gap in the rules (the stream-K stage at 4096^3: 3% of its time idle at the end, a split
# of its last round worth under 1%).
QUIET_NAMED = 0.01


def quiet_text(quiet) -> str:
    """What holds a kernel whose headroom only symptoms under the line name."""
    named = ", ".join(f"{code} ({cost:.0%} of its time)" for code, cost in quiet)
    return (f"no finding estimates any of it; named under the line, with no fix that gives "
            f"back 1% of the time: {named}")


def roof_text(finding) -> str:
    """What holds a kernel that a roof-naming finding accounts for."""
    return f"held at a roof: {finding.code} ({finding.title.lower()})"


def floor_text(h) -> str:
    """What sets a memory-bound kernel's time when it runs at its floor."""
    return (f"at its floor (a launch's fixed time plus its bytes at the DRAM rate a copy "
            f"reaches: {h.t_floor_ns / 1e3:,.1f} us against its {h.t_ns / 1e3:,.1f}), which no "
            "change inside the kernel lowers")


# Headroom this large with no finding estimating any of it is a gap in the rules, and the
# summary says so rather than leave "none" to read as "nothing left to gain" (sgemm_stages4:
# 29% headroom, no finding; hgemm_small_m's pairs at 256 x 8192^2 said so until PS115 named
# the shared-memory roof they run at).
UNEXPLAINED_MIN = 0.10
UNEXPLAINED = "no finding estimates any of it: no rule names what holds the kernel there"


def unexplained(evaluation) -> bool:
    """Whether the kernel's headroom is UNEXPLAINED_MIN or more and no finding estimates
    any part of it, where the kernel is not within UNEXPLAINED_MIN of its floor (a launch's
    fixed time plus its bytes at the practical DRAM rate: what no change inside it lowers)
    and no finding names the roof it runs at: headroom_note's last case."""
    return headroom_note(evaluation) == UNEXPLAINED


# Findings that name the ceiling a kernel runs at without estimating a gain: the headroom
# they account for is no gap in the rules (PS115: the roof shared memory sets for the
# kernel's wgmma and tiles, hgemm_small_m's pairs and cuBLAS's kernel at M = 256).
ROOF_NAMING = ("PS115",)


def roof_named(evaluation):
    """The finding that names the roof the kernel runs at, None if none does."""
    return next((f for f in getattr(evaluation, "findings", ()) if f.code in ROOF_NAMING), None)


def at_floor(h) -> bool:
    """Whether memory-bound work runs within UNEXPLAINED_MIN of its floor."""
    floor = getattr(h, "t_floor_ns", None)
    return floor is not None and floor >= (1 - UNEXPLAINED_MIN) * h.t_ns


def not_evaluated_text(evaluation) -> str | None:
    """One line naming the rules the report could not answer, grouped by what was missing."""
    if not evaluation.not_evaluated:
        return None
    by_reason: dict[str, list[str]] = {}
    for n in evaluation.not_evaluated:
        by_reason.setdefault(n.reason, []).append(n.code)
    return "not evaluated: " + "; ".join(f"{', '.join(codes)} ({reason})"
                                         for reason, codes in by_reason.items())
