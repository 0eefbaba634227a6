"""A ProfileDiff as text rows, shared by the console, Markdown and HTML renderers."""

from __future__ import annotations

from perfscope.diff import ProfileDiff, Row
from perfscope.families import FAMILY_BY_KEY
from perfscope.render.summary import NOT_COLLECTED


def _num(v: float | None) -> str:
    if v is None:
        return NOT_COLLECTED
    if abs(v) >= 1e5:
        return f"{v:,.0f}"
    return f"{v:,.3g}" if abs(v) < 100 else f"{v:,.1f}"


def ratio_text(r: Row) -> str:
    return "" if r.ratio is None else f"{r.ratio:.2f}x"


def table_rows(diff: ProfileDiff) -> list[tuple[str, str, str, str]]:
    """(quantity, A, B, A/B) for every compared row, grouped, shared by both renderers."""
    out: list[tuple[str, str, str, str]] = []
    for title, rows in (("time", diff.time), ("speed of light", diff.sol), ("memory", diff.memory),
                        ("launch", diff.launch)):
        out.append((f"[{title}]", "", "", ""))
        out += [(r.name, _num(r.a), _num(r.b), ratio_text(r)) for r in rows]
    out.append(("[stall share]", "", "", ""))
    for s in diff.stalls[:6]:
        out.append((s.reason, "" if s.share_a is None else f"{s.share_a:.0%}",
                    "" if s.share_b is None else f"{s.share_b:.0%}", f"{s.delta:+.0%}"))
    out.append((f"[opcode families per {diff.unit}]", "", "", ""))
    for f in sorted(diff.families, key=lambda f: -max(f.a or 0, f.b or 0)):
        ratio = "" if not f.a or not f.b else f"{f.a / f.b:.2f}x"
        out.append((FAMILY_BY_KEY[f.family].label, _num(f.a), _num(f.b), ratio))
    return out


def verdict_heading(diff: ProfileDiff) -> str:
    return "Why A is slower than B"


def verdict_lines(diff: ProfileDiff) -> list[str]:
    lines = [f"{i}. {r.sentence} Fix: {r.fix}" for i, r in enumerate(diff.verdict, 1)]
    return lines or ["No finding explains a difference: compare the tables above."]
