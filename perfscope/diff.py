"""ProfileDiff: why kernel A is slower than kernel B, with the evidence.

Two Diagnosed records (each a profile with its run manifest and rule evaluation) become
one value: time and cycle ratios (clocks differ from kernel to kernel when left as
found, so cycles are the fairer gate), speed of light side by side, the shift in the stall
mix, excess shared wavefronts and global sectors, launch resources, opcode families per
unit of work with the instruction families one kernel uses and the other lacks, hotspots,
the findings A has and B has not, launch structure side by side (perfscope.structure:
grid and persistence, tile, clusters and multicast, warp specialisation, epilogue), and a
verdict: the top reasons, each one sentence with its numbers and the fix.

The verdict spreads the cycle gap (1 - cycles of the faster / cycles of the slower) over
its reasons and never claims more: findings bring the rules' estimates (one overlap group
counts once), a structural difference brings the findings it explains and what the
counters model of it (a multi-wave grid's idle last wave), and the rest of the gap goes
in equal parts to the differences no counter measures. When A takes fewer cycles the
verdict says what A improved over B (B's findings A lost, the instruction path A moved
to, its structure; shares of B's time), and ``remaining`` what A still has.
"""

from __future__ import annotations

import logging
import math
import operator
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import PurePath

from perfscope.errors import PerfscopeError
from perfscope.families import FAMILY_BY_KEY, family_of
from perfscope.hardware import SMEM_BYTES_PER_SM_CLOCK
from perfscope.metrics import M_DRAM_READ, M_DRAM_WRITE
from perfscope.profile import Hotspot, KernelProfile
from perfscope.record import Diagnosed
from perfscope.rules import Finding
from perfscope.structure import (
    BOXES,
    CLUSTER,
    CONSUMERS,
    EPILOGUE,
    GRID,
    PIPELINE,
    SPECIALISATION,
    TILE,
    Aspect,
    LaunchShape,
    compare_structure,
    launch_shape,
    mma_fragment,
    modelled_share,
    slow_side_has_it,
    warpgroup_mmas,
)

log = logging.getLogger(__name__)

VERDICT_REASONS = 5
# Families that mark the Hopper/Blackwell fast path, called out when only one side has them
# (setmaxnreg is not among them: it is warp specialisation, a structural aspect).
FAST_PATH = ("gmma", "tma", "utcmma", "tmem")
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
        """a / b, None when either is missing or b is zero."""
        return self.a / self.b if self.a is not None and self.b else None


@dataclass(frozen=True)
class StallShift:
    """One stall reason's share of all stall cycles in A and in B, and its cycles per issued
    instruction, the parked warps' waits left out (KernelProfile.working_stall_cycles)."""

    reason: str
    share_a: float | None
    share_b: float | None
    cycles_a: float | None
    cycles_b: float | None

    @property
    def delta(self) -> float:
        """How much more of A's stalls this reason takes than of B's (shares, missing as 0)."""
        return (self.share_a or 0.0) - (self.share_b or 0.0)


@dataclass(frozen=True)
class FamilyRow:
    """One instruction family per unit of work in A and in B, and the opcodes each side executes."""

    family: str
    a: float | None               # per unit (see ProfileDiff.unit)
    b: float | None
    opcodes_a: tuple[str, ...]    # base opcodes of the family each side executes
    opcodes_b: tuple[str, ...]


@dataclass(frozen=True)
class Reason:
    """One reason in a verdict: a sentence with its numbers, the finding behind it (if any),
    its share of the gap and the fix.

    estimated_gain is the share of the slower kernel's time the reason accounts for, after
    the gap is spread (perfscope.diff: the claims of one verdict never add up to more than
    the cycle gap); kind says what the reason is: a finding, the instruction path, a
    structural aspect (its name), or a stall shift.
    """

    sentence: str
    code: str | None
    estimated_gain: float | None
    fix: str
    kind: str = "finding"


@dataclass(frozen=True)
class ProfileDiff:
    """Why A is slower (or faster) than B: the compared rows, the findings gained and lost, the verdict."""

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
    # Where the two SM clocks differ (clocks as found): how much of the time ratio is the
    # clock rather than the cycles, in one sentence (clock_note).
    clock: str | None = None
    # Launch structure side by side (perfscope.structure), differing or not.
    structure: tuple[Aspect, ...] = ()
    # True when A takes fewer cycles than B: the verdict then says what A improved (its
    # claims are shares of B's time) and `remaining` what is left in A.
    improved: bool = False
    remaining: tuple[Reason, ...] = ()
    # The cycle gap the verdict spreads: 1 - cycles(faster) / cycles(slower).
    gap: float | None = None
    # The main loops side by side (KernelProfile.hot_loop: instructions, and of each opcode
    # family); empty unless both reports have per-instruction execution counts.
    loop: tuple[Row, ...] = ()

    def rows_by_key(self) -> dict[str, Row]:
        """Every compared row by its field stem ("cycles", "shared_excess", ...)."""
        return {field_key(row.name): row
                for group in (self.time, self.sol, self.memory, self.launch, self.loop)
                for row in group}

    def fields(self) -> dict[str, float | None]:
        """Every gateable number, by name (the names --fail-if accepts)."""
        out: dict[str, float | None] = {}
        for key, row in self.rows_by_key().items():
            out[f"{key}_a"], out[f"{key}_b"] = row.a, row.b
            out[f"{key}_ratio"] = row.ratio
        out["duration_ratio"] = out.get("duration_ns_ratio")
        out["cycles_ratio"] = out.get("cycles_ratio")
        out["new_findings"] = float(len(self.new_findings))
        out["new_warnings"] = float(sum(f.severity in ("warning", "error") for f in self.new_findings))
        return out


def field_key(name: str) -> str:
    """A row's name as a field stem: "shared excess %" -> "shared_excess"."""
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


# ------------------------------------------------------------------------ comparing


def _rows(pairs: Sequence[tuple[str, float | None, float | None]]) -> tuple[Row, ...]:
    return tuple(Row(n, a, b) for n, a, b in pairs)


LOOP_PREFIX = "main loop "


def loop_rows(pa: KernelProfile, pb: KernelProfile) -> tuple[Row, ...]:
    """The two main loops (the most executed instructions) side by side: how many
    instructions, and how many of each opcode family, most first; none unless both are known.
    Two loops doing the same work per pass show what each pass costs in other instructions
    (cuBLAS's FP32 loop: 1,154 instructions for 1,024 FFMA; a BK 16 loop: 2,250 for 2,048)."""
    la, lb = pa.hot_loop, pb.hot_loop
    if la is None or lb is None:
        return ()
    fams = sorted(set(la.families) | set(lb.families),
                  key=lambda f: (-max(la.families.get(f, 0), lb.families.get(f, 0)), f))
    return _rows([(f"{LOOP_PREFIX}instructions", float(la.instructions), float(lb.instructions)),
                  *((f"{LOOP_PREFIX}{FAMILY_BY_KEY[f].label}", float(la.families.get(f, 0)),
                     float(lb.families.get(f, 0))) for f in fams)])


def _opcodes_of(kp: KernelProfile, family: str) -> tuple[str, ...]:
    return tuple(op for op, n in kp.opcodes.executed.items() if n and family_of(op) == family)


def _named(opcodes: Sequence[str]) -> str:
    return " and ".join(f"{op} ({OPCODE_ROLE[op]})" if op in OPCODE_ROLE else op for op in opcodes)


def _principal(opcodes: Sequence[str], limit: int = 3) -> list[str]:
    """The opcodes a reader knows by name (HGMMA, UTMALDG...), not their helpers (DEPBAR)."""
    named = [op for op in opcodes if op in OPCODE_ROLE]
    return (named or list(opcodes))[:limit]


def _instruction_sentence(slow: KernelProfile, fast: KernelProfile, only_fast: Sequence[str],
                          names: tuple[str, str] = ("A", "B")) -> str | None:
    """"B uses HGMMA (wgmma) ...; A uses HMMA (mma.sync) ...": the fast path only the
    faster side (names[1]) executes, and what the slower side (names[0]) runs instead."""
    fams = [f for f in FAST_PATH if f in only_fast]
    if not fams:
        return None
    fast_ops = _principal([op for f in fams for op in _opcodes_of(fast, f)])
    slow_ops = _principal([op for f in ("hmma", "ldgsts", "ldsm", "ffma") if slow.opcodes.has(f)
                           for op in _opcodes_of(slow, f)])
    text = f"{names[1]} uses {_named(fast_ops)}"
    return text + (f"; {names[0]} uses {_named(slow_ops)}" if slow_ops
                   else f"; {names[0]} uses none of them")


def _duration(r: Diagnosed) -> float | None:
    return r.profile.sol.duration_ns


def _cycles(r: Diagnosed) -> float | None:
    return r.profile.identity.cycles


def _dram(r: Diagnosed) -> float | None:
    read, write = r.profile.metric(M_DRAM_READ), r.profile.metric(M_DRAM_WRITE)
    return read + write if read is not None and write is not None else None


def _total(r: Diagnosed, get) -> float | None:
    """The sum over a record's launches (one, or a group's), None if any is unknown."""
    values = [get(x) for x in r.launches]
    return None if any(v is None for v in values) else float(sum(values))


# Clocks left as found differ from kernel to kernel; from this far apart the time ratio and
# the cycle ratio part visibly, and the diff says how much of the time is the clock. On the
# H200 the bf16 and fp16 runs of one tensor GEMM differ by 2.4-2.9% (1589 against 1544 MHz,
# the persistent stage), kernels of one dtype by 0.5-1.5%. Where both ran at the power cap
# (PS171) the clock is what each kernel's energy a cycle let it reach, the change's own
# effect rather than the clocks as found, so the note comes from half as far apart: a
# 192-row tile against the 128-row one (probes/, H100) took 1.024x the cycles at a 1.7%
# higher clock, 1.006x the time.
CLOCK_NOTE_MIN = 0.02
CLOCK_NOTE_CAP_MIN = 0.01


def clock_note(a: Diagnosed, b: Diagnosed) -> str | None:
    """One sentence when A and B ran at SM clocks CLOCK_NOTE_MIN or more apart: their time
    ratio against their cycle ratio, and whether either was at the power cap (PS171)."""
    ca, cb = a.profile.identity.sm_clock_hz, b.profile.identity.sm_clock_hz
    ta, tb = _total(a, _duration), _total(b, _duration)
    ya, yb = _total(a, _cycles), _total(b, _cycles)
    if not (ca and cb and ta and tb and ya and yb):
        return None
    held = [s for s, r in (("A", a), ("B", b)) if "PS171" in {f.code for f in r.evaluation.findings}]
    if abs(ca / cb - 1) < (CLOCK_NOTE_CAP_MIN if len(held) == 2 else CLOCK_NOTE_MIN):
        return None
    cap = f"; {_and(held)} at the power cap (PS171)" if held else ""
    slower = "A" if ca < cb else "B"
    return (f"A ran at {ca / 1e6:.0f} MHz and B at {cb / 1e6:.0f} MHz ({slower}'s clock "
            f"{1 - min(ca, cb) / max(ca, cb):.1%} lower): A takes {ta / tb:.2f}x B's time and "
            f"{ya / yb:.2f}x its cycles{cap}.")


def _and(words) -> str:
    words = list(words)
    return ", ".join(words[:-1]) + (" and " if len(words) > 1 else "") + words[-1] if words else ""


def _evidence_text(f: Finding, limit: int = 2) -> str:
    parts = []
    for e in f.evidence[:limit]:
        value = f"{e.value:,.3g}" if isinstance(e.value, float) else str(e.value)
        parts.append(f"{e.metric} = {value}")
    return "; ".join(parts)


def _group(f: Finding) -> str:
    # Findings of one overlap group remove the same time (perfscope.rules.model.OVERLAP).
    return getattr(f, "group", None) or f.tag


def _compose(findings: Sequence[Finding]) -> float | None:
    """What several findings save together: the largest per overlap group, the groups as
    independent savings (1 - prod(1 - g)); None when none has an estimate."""
    best: dict[str, float] = {}
    for f in findings:
        if f.estimated_gain is not None:
            best[_group(f)] = max(best.get(_group(f), 0.0), f.estimated_gain)
    if not best:
        return None
    keep = 1.0
    for g in best.values():
        keep *= 1 - g
    return 1 - keep


@dataclass(frozen=True)
class _Claim:
    """A reason being built: its modelled share, whether the unexplained rest of the gap may
    go to it (open), the overlap group it shares time with, and the findings it cites."""

    lead: str
    detail: str
    code: str | None
    fix: str
    kind: str
    modelled: float | None
    open: bool
    group: str
    cited: tuple[Finding, ...] = ()


def _spread(claims: Sequence[_Claim], gap: float | None) -> tuple[list[float | None], float | None]:
    """Each claim's share of the gap, so that they add up to no more than the gap, and the
    part of the gap left unexplained.

    Within an overlap group the members share the largest member's estimate; if the
    modelled claims exceed the gap they are scaled down to it; what the gap leaves after
    them goes in equal parts to the open claims (differences no counter measures: a
    structural aspect, the instruction path).
    """
    shares: list[float | None] = [None] * len(claims)
    groups: dict[str, list[int]] = {}
    for i, c in enumerate(claims):
        if c.modelled is not None:
            groups.setdefault(c.group, []).append(i)
    for members in groups.values():
        total = sum(claims[i].modelled or 0.0 for i in members)
        top = max(claims[i].modelled or 0.0 for i in members)
        for i in members:
            shares[i] = (claims[i].modelled or 0.0) * (top / total if total else 0.0)
    if gap is None:
        return shares, None
    gap = max(0.0, gap)
    modelled = sum(s or 0.0 for s in shares)
    scale = gap / modelled if modelled > gap else 1.0
    rest = max(0.0, gap - modelled)
    opened = [i for i, c in enumerate(claims) if c.open]
    out: list[float | None] = []
    for i, s in enumerate(shares):
        share = None if s is None else s * scale
        if i in opened:
            share = (share or 0.0) + rest / len(opened)
        out.append(None if share is None else round(share, 4))
    return out, (0.0 if opened else rest)


@dataclass(frozen=True)
class _Direction:
    """Which side is slower, how sentences name the two, and their launch shapes."""

    slow: Diagnosed
    fast: Diagnosed
    names: tuple[str, str]                 # (slower, faster): ("A", "B"), ("B", "A") if A improved
    shapes: tuple[LaunchShape, LaunchShape]

    @property
    def improved(self) -> bool:
        return self.names[1] == "A"


def _path_claim(d: _Direction, only_fast: Sequence[str], findings: list[Finding],
                aspects: list[Aspect]) -> _Claim | None:
    """One reason for the instruction path only the faster side takes, with the path
    findings and the path's structural aspects folded into it (removed from the lists)."""
    sentence = _instruction_sentence(d.slow.profile, d.fast.profile, only_fast, d.names)
    if sentence is None:
        return None
    mine = [f for f in findings if f.tag in PATH_TAGS]
    parts = [a for a in aspects if a.on_path]
    for a in parts:
        mine += [f for f in findings if f.tag in a.absorbs and f not in mine]
    for f in mine:
        findings.remove(f)
    for a in parts:
        aspects.remove(a)
    detail = (f"with it {d.names[1]}'s {_and(a.name for a in parts)} differ "
              "(see the launch structure)") if parts else ""
    first = mine[0] if mine else None
    lead = first.title if first is not None and first.tag in PATH_TAGS else ""
    return _Claim(f"{lead}: {sentence}" if lead else sentence, detail,
                  first.code if first else None,
                  first.fix if first else "Move the main loop to the instructions "
                  f"{d.names[1]} uses (compile for sm_90a).", "path", _compose(mine), True,
                  "instruction path", tuple(mine))


UNFUSED_FIX = ("Fuse the epilogue: apply the bias, the activation and the residual to the fp32 "
               "accumulators before C is stored, so C is written once and the extra launch "
               "disappears (hgemm_fused_bias_act does it in its TMA-store epilogue).")


def _epilogue_pass(side: Diagnosed, name: str) -> tuple[str, float]:
    """How a group's epilogue launches read in a sentence, and their share of its cycles."""
    extra = side.group
    whole, part = _total(side, _cycles), sum(x.profile.identity.cycles or 0 for x in extra)
    moved = [b for b in (_dram(x) for x in extra) if b is not None]
    took = sum(x.profile.sol.duration_ns or 0 for x in extra)
    names = _and(sorted({x.profile.name.split("<")[0].split("(")[0].removeprefix("void ")
                         for x in extra}))
    traffic = f"{sum(moved) / 1e6:,.1f} MB of DRAM traffic and " if moved else ""
    text = (f"{name} runs it as {len(extra)} more launch{'es' if len(extra) > 1 else ''} after "
            f"its GEMM ({names}) that re-read{'' if len(extra) > 1 else 's'} C and write"
            f"{'' if len(extra) > 1 else 's'} it again: {traffic}{took / 1e3:,.1f} us")
    return text, (part / whole if whole else 0.0)


def _group_claim(d: _Direction) -> _Claim | None:
    """The slower side runs its epilogue as separate launches that the faster side fuses:
    their share of its cycles, their DRAM bytes (C re-read and written again) and time."""
    if not d.slow.group or d.fast.group:
        return None
    text, share = _epilogue_pass(d.slow, d.names[0])
    return _Claim(f"Unfused epilogue: {text} that {d.names[1]}'s fused epilogue does not spend",
                  "", None, UNFUSED_FIX, "unfused-epilogue", share, False, "epilogue pass")


def _group_note(d: _Direction) -> Reason | None:
    """The faster side is the group: its separate epilogue pass still costs it time, which
    the slower side's fused epilogue saves; the gap lies elsewhere (not counted in it)."""
    if not d.fast.group or d.slow.group:
        return None
    text, share = _epilogue_pass(d.fast, d.names[1])
    return Reason(f"Unfused epilogue in {d.names[1]}: {text} ({share:.0%} of its time), which "
                  f"{d.names[0]}'s fused epilogue saves; {d.names[1]} is faster anyway, so the gap "
                  f"lies in {d.names[0]}'s GEMM.", None, None, UNFUSED_FIX, "unfused-epilogue")


def _aspect_claims(d: _Direction, findings: list[Finding], aspects: list[Aspect],
                   grown: list[_Claim]) -> list[_Claim]:
    """One claim per differing aspect, with the slower side's findings it explains (taken
    out of ``findings``) and the growth of the shared findings it explains (taken out of
    ``grown``): a finding and the structure behind it are one reason, not two."""
    out = []
    for a in aspects:
        mine = [f for f in findings if f.tag in a.absorbs]
        for f in mine:
            findings.remove(f)
        grew = [g for g in grown if g.cited and g.cited[0].tag in a.absorbs]
        for g in grew:
            grown.remove(g)
        model = modelled_share(a, *d.shapes)
        composed = _compose(mine)
        growth = sum(g.modelled or 0.0 for g in grew) if grew else None
        parts = [v for v in (model, composed, growth) if v is not None]
        modelled = sum(parts) if parts else None
        mine += [g.cited[0] for g in grew]
        # A finding's own fix would add what the slower side already has; an aspect that
        # causes the findings it absorbs gives its own fix.
        fix = (_without_fix(a.name, d) if slow_side_has_it(a.name, *d.shapes) else
               mine[0].fix if mine and a.name not in CAUSE_ASPECTS else STRUCTURE_FIX[a.name])
        out.append(_Claim(f"{a.name}: A {a.a}; B {a.b}", "", mine[0].code if mine else None,
                          fix, a.name, modelled,
                          # The tail model covers only the idle last wave: the rest of what
                          # persistence saves (overlapped prologues and epilogues) is open.
                          composed is None or a.name == GRID, a.name, tuple(mine)))
    return out


# Aspects that are the cause of the findings they absorb (a serialized wgmma pipeline is
# why the tensor pipe idles), so their fix, not the findings', is the reason's.
CAUSE_ASPECTS = (PIPELINE,)

STRUCTURE_FIX = {
    GRID: "Launch one CTA per SM (or per SM slot) and let each walk the tiles in a loop "
          "(persistent), so one tile's epilogue overlaps the next tile's loads and no wave is "
          "left part-empty.",
    TILE: "Take the larger tile: more outputs per CTA reuse each loaded A/B byte more often "
          "(bytes per FLOP fall as 1/BM + 1/BN).",
    CLUSTER: "Launch 2-CTA clusters and multicast the shared operand tile (TMA "
             ".multicast::cluster), so L2 sends it once for both CTAs.",
    SPECIALISATION: "Split the CTA into a producer warpgroup (TMA, setmaxnreg.dec) and consumer "
                    "warpgroups (wgmma, setmaxnreg.inc) that meet on full/empty mbarriers.",
    EPILOGUE: "Stage C in shared memory and write it with TMA stores (cp.async.bulk.tensor), "
              "which the next tile's main loop can overlap.",
    BOXES: "Store the streamed operand so each TMA box is one contiguous piece: a weight packed "
           "once, when it is loaded, into strips one box wide (hgemm_small_m_packed).",
    PIPELINE: "Keep several wgmmas in flight: fence, issue a k tile's wgmmas, commit them as one "
              "group and wait for all but the newest group. A pipeline that waits on every "
              "wgmma is what ptxas falls back to when it cannot keep the accumulators to the "
              "wgmmas (its C7515 info; `perfscope sass` PS144 names the reason): keep them "
              "untouched between fence and wait and the values held across the k loop out of "
              "their registers.",
}


# When the slower kernel already has what STRUCTURE_FIX would add and the faster one does
# without it, the advice is the other way round: what the feature costs here, and what to
# check before dropping it.
WITHOUT_FIX = {
    GRID: "{fast} launches one tile per CTA and is faster: {slow}'s persistent loop does not "
          "pay for itself here; check its tile order (L2 hit rate) and its SMs' unequal shares "
          "(sm__cycles_active max against avg), or launch one CTA per tile.",
    TILE: "{fast}'s smaller tile is faster: more CTAs or a fuller last wave outweigh the "
          "reuse; check {slow}'s waves and occupancy, or take the smaller tile.",
    CLUSTER: "{fast} runs without multicast and is faster: {slow}'s clustered CTAs wait on "
             "each other (a multicast slot is free again only when every CTA of the cluster "
             "has read it, and the cluster must be co-resident); drop the multicast (or the "
             "clusters), or decouple the CTAs (a deeper ring, so one CTA's stall does not "
             "stall its partner).",
    SPECIALISATION: "{fast} is faster without producer/consumer warpgroups: check {slow}'s "
                    "mbarrier waits (the consumers' full-barrier stalls) and its register "
                    "split (setmaxnreg) before keeping them.",
    CONSUMERS: "{fast}'s consumer warpgroups share each tile and it is faster: {slow}'s "
               "consumers own their tiles, so each tile has fewer rows (more A + B bytes per "
               "FLOP from L2, 1/BM + 1/BN) and only one warpgroup's wgmmas keep the tensor "
               "pipe busy at a time: a wait for operands idles it. Check {slow}'s full-barrier "
               "waits (its hotspots) and L2 throughput; feed it (a deeper ring, 2-CTA "
               "multicast of the shared operand), or keep the cooperative tile.",
    EPILOGUE: "{fast} stores C from registers and is faster: {slow}'s shared-memory staging "
              "and TMA store cost more than they overlap here; check the staging's bank "
              "conflicts and the store wait before the next tile.",
    BOXES: "{fast} reads its operand in short pieces and is faster: {slow}'s contiguous boxes "
           "are not what it lacks; look at its stream's depth, grid, ramp and tail.",
    PIPELINE: "{fast} waits on each wgmma and is still faster: {slow}'s time is not in its "
              "wgmma issue; look at its operand waits (the full barrier) and its epilogue.",
}


# The larger tile is slower on as many CTAs in as many waves (one tile each), or on as
# many persistent CTAs that each walk a whole number of tiles (no short last round on
# either side; elsewhere the tile sets how many tiles each walks and its last round): the
# grid is not what it costs, so the advice names what a larger tile costs each CTA instead.
SAME_WAVES = 0.05
TILE_SAME_GRID_FIX = (
    "{fast}'s smaller tile is faster on as many CTAs ({ctas:,}, {grid}), so it "
    "is not the grid; look at what {slow}'s larger tile costs each CTA: {split}{feed}. Take "
    "the smaller tile only once {those} ruled out.")
SPLIT_NOTE = ("if it splits K to keep the CTAs as many, the split (partial sums out by STG, "
              "{stg:,.0f} executed beside {tma:,.0f} TMA stores of C, and one part waiting "
              "for another's before its epilogue); ")
WGMMA_FEED = ("its wider wgmma's operand feed (shared memory at {smem} B per SM clock; the "
              "full-barrier and wgmma waits among its hotspots)")
# A larger tile issued as narrower wgmmas (ptxas's register cap, or a split by hand) reads
# each A fragment once per narrower N: more shared-memory operand bytes per FLOP.
NARROW_FEED = ("its narrower wgmma ({slow} against {fast}: {ratio:.2f}x the shared-memory "
               "operand bytes per FLOP, at {smem} B per SM clock; the full-barrier and wgmma "
               "waits among its hotspots)")
OTHER_FEED = "its operand feed per CTA (the loads' waits among its hotspots)"


def _feed(slow: LaunchShape, fast: LaunchShape) -> str:
    """What a CTA's larger tile costs it in operand feed, by the two sides' MMA shapes."""
    mine, theirs = mma_fragment(slow.mma), mma_fragment(fast.mma)
    if mine is None:
        return OTHER_FEED
    if theirs is not None and mine[0] == theirs[0] and mine[1] < theirs[1]:
        # A wgmma m x n x k reads m*k + n*k operand elements for m*n*k MACs.
        ratio = (1 / mine[1] + 1 / mine[0]) / (1 / theirs[1] + 1 / theirs[0])
        return NARROW_FEED.format(slow=f"{mine[0]}x{mine[1]}", fast=f"{theirs[0]}x{theirs[1]}",
                                  ratio=ratio, smem=SMEM_BYTES_PER_SM_CLOCK)
    return WGMMA_FEED.format(smem=SMEM_BYTES_PER_SM_CLOCK)


def _same_grid(slow: LaunchShape, fast: LaunchShape) -> str | None:
    """How the two grids read when the grid cannot be why the larger tile is slower: as
    many CTAs in as many waves of one tile each, or as many persistent CTAs each walking a
    whole number of tiles; None otherwise."""
    if slow.ctas is None or slow.ctas != fast.ctas:
        return None
    if slow.whole_rounds and fast.whole_rounds:
        return (f"each walking {slow.tiles // slow.ctas} and {fast.tiles // fast.ctas} "
                "tiles, no short last round")
    if (not slow.persistent and not fast.persistent and slow.waves is not None
            and fast.waves is not None and abs(slow.waves - fast.waves) <= SAME_WAVES):
        return f"{slow.waves:.2f} waves"
    return None


def _without_fix(name: str, d: _Direction) -> str:
    """The advice when the slower side has what the aspect's usual fix would add."""
    slow, fast = d.shapes
    grid = _same_grid(slow, fast) if name == TILE else None
    if grid is None:
        return WITHOUT_FIX[name].format(fast=d.names[1], slow=d.names[0])
    split = (SPLIT_NOTE.format(stg=slow.stg_stores, tma=slow.tma_stores)
             if slow.tma_stores and slow.stg_stores and not fast.stg_stores else "")
    return TILE_SAME_GRID_FIX.format(fast=d.names[1], slow=d.names[0], ctas=slow.ctas,
                                     grid=grid, split=split, feed=_feed(slow, fast),
                                     those="both are" if split else "it is")


def _cost(claim: float | None, whose: str) -> str:
    if claim is None:
        return ""
    if claim >= 0.005:
        return f" (about {claim:.0%} of {whose}'s time)"
    if claim > 0:
        return f" (under 1% of {whose}'s time)"
    return " (none of the gap is left for it after the reasons above)"


def _sentence(c: _Claim, claim: float | None, d: _Direction) -> str:
    """The reason in words: why the slower side is slower, or, when A improved, what A
    gained over B."""
    cost = _cost(claim, d.names[0])
    cited = ", ".join(f"{f.code} {f.title}" for f in c.cited
                      if f.code != c.code or c.kind not in ("finding", "grown"))
    if c.kind == "finding":
        f = c.cited[0]
        lead = f"Gone from A: {f.code} {f.title}" if d.improved else c.lead
        tail = ("B: " if d.improved else "") + c.detail
    elif c.kind == "path":
        lead = f"A moved to the fast path: {c.lead.split(': ', 1)[-1]}" if d.improved else c.lead
        codes = ", ".join(f.code for f in c.cited)
        tail = "; ".join(p for p in (c.detail, (f"gone: {cited}" if d.improved else f"findings {codes}")
                                     if c.cited else "") if p)
    elif c.kind == "grown":
        lead = c.lead
        tail = c.detail
    else:
        lead = c.lead
        tail = (f"gone: {cited}" if d.improved else cited) if cited else ""
    return f"{lead}{cost}" + (f"; {tail}" if tail else "") + "."


def _reasons(d: _Direction, findings: Sequence[Finding], only_fast: Sequence[str],
             aspects: Sequence[Aspect], gap: float | None) -> list[Reason]:
    """Why the slower side takes more cycles than the faster, ranked by each reason's share
    of the gap; findings: the slower side's that the faster lacks."""
    # A finding the faster side has just under the line (its estimate too small to be one)
    # is compared as one both have: what it adds is the difference of the two shares.
    quiet = dict(d.fast.evaluation.quiet)
    left = [f for f in findings if f.code not in quiet]
    differing = [a for a in aspects if a.differs]
    claims = []
    path = _path_claim(d, only_fast, left, differing)
    if path is not None:
        claims.append(path)
    unfused = _group_claim(d)
    if unfused is not None:
        claims.append(unfused)
    grown = _grown_claims(d)
    claims += _aspect_claims(d, left, differing, grown)
    for f in left:
        # What the symptom costs the slower side: its cost where the rule gives one apart
        # from what its fix would save.
        claims.append(_Claim(f.title, _evidence_text(f), f.code, f.fix, "finding",
                             f.estimated_gain if f.cost is None else f.cost, False, _group(f),
                             (f,)))
    claims += grown
    shares, _ = _spread(claims, gap)
    order = sorted(range(len(claims)), key=lambda i: (-_rank_share(shares[i]), i))
    out = [Reason(_sentence(claims[i], shares[i], d), claims[i].code, shares[i], claims[i].fix,
                  claims[i].kind) for i in order]
    note = _group_note(d)
    return [note, *out] if note is not None else out


def _rank_share(share: float | None) -> float:
    """A reason's share as it is ranked: in whole percent, the precision the sentences print,
    so two reasons equal at that precision keep the order they are built in (path, group,
    aspects, findings, grown) instead of swapping with a profile's noise; no share ranks last."""
    return -1.0 if share is None else round(share * 100)


# A finding both sides have counts as a reason when its estimate, as a share of each side's
# own time, is this much larger on the slower side. Shares, not cycles: a kernel that got
# faster for another reason shrinks every finding's cycles with it, not their shares.
GROWN_MIN = 0.02


def _bounded_share(f: Finding) -> float | None:
    """What a finding's symptom costs its kernel, as a share of its time: its cost where the
    rule gives one apart from its fix's saving (PS153), else the estimate under the work's
    roofline alone (each side's gap to its own timed reference says nothing about the other
    side)."""
    if f.cost is not None:
        return f.cost
    return f.bounded_gain if f.bounded_gain is not None else f.estimated_gain


def _grown_claims(d: _Direction) -> list[_Claim]:
    """Findings both sides have that take a larger share of the slower side's time: the
    difference of the two shares (each bounded by its work's roofline, not by its gap to
    cuBLAS) is what they add to the gap."""
    fast = {f.code: _bounded_share(f) for f in d.fast.evaluation.findings
            if _bounded_share(f) is not None}
    quiet = {code: gain for code, gain in d.fast.evaluation.quiet if code not in fast}
    out = []
    for f in d.slow.evaluation.findings:
        theirs = fast.get(f.code, quiet.get(f.code))
        mine = _bounded_share(f)
        if theirs is None or mine is None:
            continue
        growth = mine - theirs
        if growth < GROWN_MIN:
            continue
        slow, quick = d.names
        where = "in both" if f.code in fast else f"in {quick} too, under a finding's size,"
        lead = (f"{f.code} {f.title}, {where} but larger in {slow} ({mine:.0%} of its "
                f"time against {theirs:.0%} of {quick}'s)")
        out.append(_Claim(lead, _evidence_text(f), f.code, f.fix, "grown", growth, False,
                          _group(f), (f,)))
    return out


# A stall reason whose share of the stall time moved this much is a reason of its own.
STALL_SHIFT_MIN = 0.10


def _stall_shift_text(s: StallShift) -> str:
    return (f"A's warps stall on {s.reason} {(s.share_a or 0):.0%} of their stall time against "
            f"{(s.share_b or 0):.0%} in B ({s.cycles_a or 0:.1f} vs {s.cycles_b or 0:.1f} "
            "cycles per issued instruction)")


# Hotspots named as where a stall reason sits, at most.
STALL_CARRIERS = 3


def _carriers(reason: str, hotspots: Sequence[Hotspot]) -> str:
    """The hottest instructions whose top stall reasons include `reason`, most samples of it
    first ("0x2640 BRA at hopper.cuh:251 (3,888 samples)"), or "" when none does."""
    held = sorted(((n, h) for h in hotspots for r, n in h.reasons if r == reason),
                  key=lambda item: -item[0])[:STALL_CARRIERS]
    return ", ".join(f"0x{h.address:x} {h.opcode}"
                     + (f" at {PurePath(h.file).name}:{h.line}" if h.file and h.line else "")
                     + f" ({n:,} samples)" for n, h in held)


def _working_hotspots(kp: KernelProfile) -> tuple[Hotspot, ...]:
    """The hotspots less the instructions where warps are parked: not where a wait of the
    work sits."""
    parked = {a for p in kp.parked for a in p.addresses}
    return tuple(h for h in kp.hotspots if h.address not in parked)


def _stall_claims(stalls: Sequence[StallShift], hotspots: Sequence[Hotspot], cut: bool
                  ) -> list[Reason]:
    """The stall reasons whose share moved by STALL_SHIFT_MIN: grown in A (cut False; the fix
    points at A's instructions that carry the wait, e.g. the branch of an mbarrier wait loop
    where a TMA ring's consumers wait for their operands), or cut by A (cut True; B's
    instructions that carried it). `hotspots` are the slower side's."""
    out = []
    for s in stalls:
        if (-s.delta if cut else s.delta) < STALL_SHIFT_MIN:
            continue
        where = _carriers(s.reason, hotspots)
        if cut:
            out.append(Reason(f"{_stall_shift_text(s)}: a wait A cut.", None, None,
                              f"B's instructions that carried it: {where}." if where else "",
                              "stalls"))
        else:
            out.append(Reason(f"{_stall_shift_text(s)}.", None, None,
                              f"Look at A's instructions that carry it: {where}." if where else
                              "See the hotspots: the instructions that carry these stalls.",
                              "stalls"))
    return out


# Per-thread values moved into uniform registers (R2UR) per warpgroup MMA from which a
# kernel builds its MMA descriptors (or TMA coordinates) per thread: the persistent stage
# did 2.0 per HGMMA before its descriptors were built uniform, cuBLAS's nvjet 0.007.
R2UR_PER_MMA_MIN = 1.0
# ... and how many times the other side's rate it must be to count as a difference.
R2UR_RATIO_MIN = 4.0


def _r2ur_per_mma(kp: KernelProfile) -> float | None:
    """R2UR per warpgroup MMA instruction; None without such MMAs (or opcode counters)."""
    mmas = warpgroup_mmas(kp)
    return kp.opcodes.families.get("r2ur", 0.0) / mmas if mmas else None


def _descriptor_reason(mine_side: Diagnosed, other: Diagnosed, cut: bool,
                       improved: bool = False) -> list[Reason]:
    """One side builds its MMA descriptors per thread and the other does not, as their R2UR
    per MMA say (no share of the gap: the instructions cost issue slots and latency, not a
    countable share). cut: the per-thread side is B, the slower, and A the faster cut it;
    else the per-thread side is A (slower, or, improved, faster for other reasons: then the
    cost is one A still carries among what it improved, and says so)."""
    mine, theirs = _r2ur_per_mma(mine_side.profile), _r2ur_per_mma(other.profile)
    if mine is None or theirs is None or mine < R2UR_PER_MMA_MIN \
            or mine < R2UR_RATIO_MIN * max(theirs, 1e-9):
        return []
    who, against = ("B", "A") if cut else ("A", "B")
    text = (f"{who} moves {mine:.2f} per-thread values into uniform registers (R2UR) per "
            f"warpgroup MMA against {theirs:.2f} in {against}: its MMA descriptors are built in "
            "per-thread registers")
    if cut:
        return [Reason(f"{text}; A builds them uniform, a cost A cut.", None, None, "",
                       "descriptors")]
    kept = "; a cost A still carries, faster for the reasons above" if improved else ""
    return [Reason(f"{text}{kept}.", None, None,
                   "Build each k step's descriptors as a warp-uniform base plus constants: the "
                   "consumer's warpgroup index by a lane-0 shuffle (threadIdx.x / 128 is "
                   "per-thread to the compiler), the slot's address >> 4 added to the "
                   "descriptor's address field.", "descriptors")]


def _remaining(a: Diagnosed) -> tuple[Reason, ...]:
    """What A still has, by its own findings (shares of A's time, each fix alone)."""
    out = []
    for f in a.evaluation.findings[:VERDICT_REASONS]:
        cost = "" if f.estimated_gain is None else f" (about {f.estimated_gain:.0%} of A's time)"
        out.append(Reason(f"{f.title}{cost}; {_evidence_text(f)}.", f.code, f.estimated_gain,
                          f.fix))
    return tuple(out)


def _verdict(draft: ProfileDiff, shapes: tuple[LaunchShape, LaunchShape]
             ) -> tuple[tuple[Reason, ...], bool, float | None]:
    """(reasons, improved, gap) of a diff without its verdict: why A is slower than B, or,
    when A takes fewer cycles, what A improved over B (B's findings A no longer has, the
    path A moved to, its launch structure)."""
    a, b = draft.a, draft.b
    cycles_ratio = next((r.ratio for r in draft.time if r.name == "cycles"), None)
    if cycles_ratio is not None and cycles_ratio < 1:
        gap = 1 - cycles_ratio
        d = _Direction(b, a, ("B", "A"), (shapes[1], shapes[0]))
        reasons = _reasons(d, draft.gone_findings, draft.only_a, draft.structure, gap)
        reasons += (_descriptor_reason(b, a, cut=True)
                    or _descriptor_reason(a, b, cut=False, improved=True))
        reasons += _stall_claims(draft.stalls, _working_hotspots(b.profile), cut=True)[
            : max(0, VERDICT_REASONS - len(reasons))]
        return tuple(reasons[:VERDICT_REASONS]), True, gap
    gap = 1 - 1 / cycles_ratio if cycles_ratio else None
    d = _Direction(a, b, ("A", "B"), shapes)
    reasons = _reasons(d, draft.new_findings, draft.only_b, draft.structure, gap)
    reasons += _descriptor_reason(a, b, cut=False)
    reasons += _stall_claims(draft.stalls, _working_hotspots(a.profile), cut=False)[
        : max(0, VERDICT_REASONS - len(reasons))]
    return tuple(reasons[:VERDICT_REASONS]), False, gap


def shape_flops(a: Diagnosed, b: Diagnosed, shape: tuple[int, ...]) -> int:
    """The FLOPs of --shape MxNxK (BxMxNxK) for both sides, refused when a run manifest says
    otherwise (a shape 8x off makes every per-MFLOP row 8x off, silently)."""
    given = "x".join(map(str, shape))
    for side, record in (("A", a), ("B", b)):
        if record.shape is not None and record.shape != tuple(shape):
            raise PerfscopeError(f"--shape {given} contradicts {side}'s run manifest, which says "
                                 f"{'x'.join(map(str, record.shape))} ({record.path}); leave --shape "
                                 "out to use the manifests' shapes.")
    return 2 * math.prod(shape)


def compare(a: Diagnosed, b: Diagnosed, flops: int | None = None) -> ProfileDiff:
    """The ProfileDiff of A against B. flops overrides the manifests' shape (--shape, checked
    against them by shape_flops)."""
    pa, pb = a.profile, b.profile
    warnings = list(dict.fromkeys(w for w in (pa.identity.incomplete, pb.identity.incomplete) if w))
    warnings += [f"{side}'s counters are not trustworthy: {r.untrusted}"
                 for side, r in (("A", a), ("B", b)) if r.untrusted]
    fa, fb = (flops, flops) if flops else (a.flops, b.flops)
    if a.shape and b.shape and a.shape != b.shape and not flops:
        warnings.append(f"A and B solve different GEMM shapes ({'x'.join(map(str, a.shape))} vs "
                        f"{'x'.join(map(str, b.shape))}): opcode families are per instruction.")
        fa = fb = None
    if fa and fb:
        unit, da, db = "MFLOP", fa / 1e6, fb / 1e6
    else:
        if not any("different GEMM shapes" in w for w in warnings):
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
    # The warps' waits at work: a clustered kernel's parked warps (KernelProfile.parked)
    # would otherwise make its exit barrier the largest stall it has over the other.
    cyc_a, cyc_b = pa.working_stall_cycles(), pb.working_stall_cycles()
    stalls = sorted((StallShift(r, pa.working_stall_share(r), pb.working_stall_share(r),
                                cyc_a.get(r), cyc_b.get(r)) for r in reasons),
                    key=lambda s: -abs(s.delta))
    # A group of launches (cuBLAS, then its epilogue pass) counts every launch's time.
    time_rows = _rows([("duration ns", _total(a, _duration), _total(b, _duration)),
                       ("cycles", _total(a, _cycles), _total(b, _cycles)),
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
                    ("L2 hit %", ma.l2_hit_rate_pct, mb.l2_hit_rate_pct),
                    ("DRAM bytes", _total(a, _dram), _total(b, _dram)),
                    ("launches", float(len(a.launches)), float(len(b.launches)))])
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
    shapes = launch_shape(pa, a.manifest, a.reads), launch_shape(pb, b.manifest, b.reads)
    draft = ProfileDiff(a, b, time_rows, sol, tuple(stalls), memory, launch, unit, families, only_a,
                        only_b, new, gone, (), tuple(warnings), structure=compare_structure(*shapes),
                        loop=loop_rows(pa, pb))
    verdict, improved, gap = _verdict(draft, shapes)
    return replace(draft, verdict=verdict, improved=improved, gap=gap,
                   remaining=_remaining(a) if improved else (), clock=clock_note(a, b))


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
    rows = diff.rows_by_key()
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
        row = rows.get(name.removesuffix("_ratio")) if name.endswith("_ratio") else None
        if value is None and row is not None and row.a is not None and row.b == 0:
            violated.append(f"{name} is undefined because B's {row.name} is 0 (A's is "
                            f"{row.a:.4g}), so '{expr}' cannot be checked; gate on A's own value "
                            f"instead: --fail-if '{name.removesuffix('_ratio')}_a>N'")
        elif value is None:
            violated.append(f"{name} is not collected in both reports, so '{expr}' cannot pass")
        elif _OPS[op](value, number):
            violated.append(f"{name} = {value:.4g} violates '{expr}'")
    if fail_on_new_findings and values["new_findings"]:
        violated.append("A has findings B has not: "
                        + ", ".join(f"{f.code} {f.title}" for f in diff.new_findings))
    return violated

