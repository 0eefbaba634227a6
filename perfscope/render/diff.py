"""A ProfileDiff as text rows, shared by the console, Markdown and HTML renderers."""

from __future__ import annotations

from perfscope.diff import LOOP_PREFIX, ProfileDiff, Row
from perfscope.families import FAMILY_BY_KEY
from perfscope.render.summary import NOT_COLLECTED, clock

# Cycle ratios this close to 1 are "the same": clocks and sampling move them by that much.
SAME_CYCLES = 0.02
# Rows whose numbers are counts (printed as integers) or a clock (printed in GHz); their
# names stay the field names --fail-if reads.
COUNT_ROWS = ("duration ns", "cycles", "registers", "shared bytes per block", "cluster size", "local bytes",
              "shared excess wavefronts", "global excess sectors")
CLOCK_ROWS = {"SM clock Hz": "SM clock"}
# The stall shares leave out the waits of warps parked until the kernel ends; this row
# gives the share of the samples they held.
PARKED_ROW = "parked warps (left out)"


def _num(v: float | None) -> str:
    if v is None:
        return NOT_COLLECTED
    if abs(v) >= 1e5:
        return f"{v:,.0f}"
    return f"{v:,.3g}" if abs(v) < 100 else f"{v:,.1f}"


def ratio_text(r: Row) -> str:
    """A row's ratio as "1.23x", empty when there is none."""
    return "" if r.ratio is None else f"{r.ratio:.2f}x"


def row_text(r: Row) -> tuple[str, str, str]:
    """(quantity, A, B) of one row as printed: counts as integers, clocks in GHz."""
    if r.name in CLOCK_ROWS:
        return CLOCK_ROWS[r.name], clock(r.a), clock(r.b)
    if r.name in COUNT_ROWS or r.name.startswith(LOOP_PREFIX):
        return r.name, *(NOT_COLLECTED if v is None else f"{v:,.0f}" for v in (r.a, r.b))
    if r.name.endswith("%"):
        return r.name, *(NOT_COLLECTED if v is None else f"{v:,.1f}" for v in (r.a, r.b))
    return r.name, _num(r.a), _num(r.b)


def table_rows(diff: ProfileDiff) -> list[tuple[str, str, str, str]]:
    """(quantity, A, B, A/B) for every compared row, grouped, shared by both renderers."""
    out: list[tuple[str, str, str, str]] = []
    for title, rows in (("time", diff.time), ("speed of light", diff.sol), ("memory", diff.memory),
                        ("launch", diff.launch)):
        out.append((f"[{title}]", "", "", ""))
        out += [(*row_text(r), ratio_text(r)) for r in rows]
    if diff.loop:
        out.append(("[main loop]", "", "", ""))
        # As in the family table: a family one loop lacks has no ratio.
        out += [(*row_text(r), ratio_text(r) if r.a and r.b else "") for r in diff.loop]
    out.append(("[stall share]", "", "", ""))
    for s in diff.stalls[:6]:
        out.append((s.reason, "" if s.share_a is None else f"{s.share_a:.0%}",
                    "" if s.share_b is None else f"{s.share_b:.0%}", f"{s.delta:+.0%}"))
    pa, pb = diff.a.profile, diff.b.profile
    if pa.parked or pb.parked:
        out.append((PARKED_ROW, *("" if p.parked_share is None else f"{p.parked_share:.0%}"
                                  for p in (pa, pb)), ""))
    out.append((f"[opcode families per {diff.unit}]", "", "", ""))
    for f in sorted(diff.families, key=lambda f: -max(f.a or 0, f.b or 0)):
        ratio = "" if not f.a or not f.b else f"{f.a / f.b:.2f}x"
        out.append((FAMILY_BY_KEY[f.family].label, _num(f.a), _num(f.b), ratio))
    return out


def _cycles(diff: ProfileDiff) -> float | None:
    return next((r.ratio for r in diff.time if r.name == "cycles"), None)


def _same_cycles(cycles: float | None) -> bool:
    return cycles is not None and abs(cycles - 1) <= SAME_CYCLES


def verdict_heading(diff: ProfileDiff) -> str:
    """The verdict's heading, from the cycle ratio (durations mix in the clocks)."""
    cycles = _cycles(diff)
    if cycles is None:
        return "What differs between A and B"
    if _same_cycles(cycles):
        return f"A and B take the same cycles ({cycles:.2f}x); what differs"
    if cycles > 1:
        return f"Why A is slower than B ({cycles:.2f}x B's cycles)"
    # The verdict then lists what A improved (ProfileDiff.improved), and what remains after.
    return f"What A improved over B ({cycles:.2f}x B's cycles)"


def _numbered(reasons, fixes: bool) -> list[str]:
    return [f"{i}. {r.sentence}" + (f" Fix: {r.fix}" if fixes and r.fix else "")
            for i, r in enumerate(reasons, 1)]


# With no reason to give, the stall shares that moved at least this much (and less than the
# STALL_SHIFT_MIN a reason needs) are named as where to look, the largest first, at most
# LEAD_SHIFTS of them: no claim, a lead.
LEAD_SHIFT_MIN = 0.05
LEAD_SHIFTS = 2


def _leads(diff: ProfileDiff) -> str:
    """"; the stall shares that moved most: R X% of A's stall time against Y% in B, ..." or ""."""
    moved = sorted((s for s in diff.stalls if abs(s.delta) >= LEAD_SHIFT_MIN),
                   key=lambda s: -abs(s.delta))[:LEAD_SHIFTS]
    if not moved:
        return ""
    return "; the stall shares that moved most: " + ", ".join(
        f"{s.reason} {(s.share_a or 0):.0%} of A's stall time against {(s.share_b or 0):.0%} in B"
        for s in moved)


def verdict_lines(diff: ProfileDiff) -> list[str]:
    """The verdict under verdict_heading: why A is slower, or what A improved (no fixes:
    A made them), each with its share of the cycle gap."""
    lines = _numbered(diff.verdict, fixes=not diff.improved)
    if lines:
        return lines
    if diff.improved:
        # Under "the same cycles" (a ratio within SAME_CYCLES of 1) there is no improvement
        # to account for, only a difference.
        what = "a difference" if _same_cycles(_cycles(diff)) else "the improvement"
        return [f"No finding, instruction path or launch structure accounts for {what}"
                + _leads(diff) + ": compare the tables."]
    return ["No finding explains a difference" + _leads(diff) + ": compare the tables above."]


REMAINING_HEADING = "What remains in A"


def remaining_lines(diff: ProfileDiff) -> list[str]:
    """When A improved on B: A's own findings, with their fixes (empty otherwise)."""
    if not diff.improved:
        return []
    return _numbered(diff.remaining, fixes=True) or ["No perfscope finding is left in A."]


def verdict_sections(diff: ProfileDiff) -> list[tuple[str, list[str]]]:
    """(heading, lines) in reading order: the verdict first, then what remains in A."""
    out = [(verdict_heading(diff), verdict_lines(diff))]
    if diff.improved:
        out.append((REMAINING_HEADING, remaining_lines(diff)))
    return out


def gap_line(diff: ProfileDiff) -> str | None:
    """How much of the cycle gap the verdict's reasons account for, in one sentence."""
    if diff.gap is None or diff.gap <= 0:
        return None
    claimed = min(diff.gap, sum(r.estimated_gain or 0.0 for r in diff.verdict))
    if diff.improved:
        return (f"A saves {diff.gap:.0%} of B's cycles; the reasons above account for "
                f"{claimed:.0%} of B's time.")
    return (f"B needs {diff.gap:.0%} fewer cycles than A; the reasons above account for "
            f"{claimed:.0%} of A's time.")


def structure_rows(diff: ProfileDiff) -> list[tuple[str, str, str, str]]:
    """(aspect, A, B, "differs" or "") for the launch-structure table."""
    return [(x.name, x.a, x.b, "differs" if x.differs else "") for x in diff.structure]
