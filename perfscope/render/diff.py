"""Rendering of a ProfileDiff: a rich side-by-side table, and Markdown for a PR comment."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from perfscope.diff import ProfileDiff, Row
from perfscope.render.summary import NOT_COLLECTED, md_cell
from perfscope.sass.families import FAMILY_BY_KEY


def _num(v: float | None) -> str:
    if v is None:
        return NOT_COLLECTED
    if abs(v) >= 1e5:
        return f"{v:,.0f}"
    return f"{v:,.3g}" if abs(v) < 100 else f"{v:,.1f}"


def _ratio(r: Row) -> str:
    return "" if r.ratio is None else f"{r.ratio:.2f}x"


def table_rows(diff: ProfileDiff) -> list[tuple[str, str, str, str]]:
    """(quantity, A, B, A/B) for every compared row, grouped, shared by both renderers."""
    out: list[tuple[str, str, str, str]] = []
    for title, rows in (("time", diff.time), ("speed of light", diff.sol), ("memory", diff.memory),
                        ("launch", diff.launch)):
        out.append((f"[{title}]", "", "", ""))
        out += [(r.name, _num(r.a), _num(r.b), _ratio(r)) for r in rows]
    out.append(("[stall share]", "", "", ""))
    for s in diff.stalls[:6]:
        out.append((s.reason, "" if s.share_a is None else f"{s.share_a:.0%}",
                    "" if s.share_b is None else f"{s.share_b:.0%}", f"{s.delta:+.0%}"))
    out.append((f"[opcode families per {diff.unit}]", "", "", ""))
    for f in sorted(diff.families, key=lambda f: -max(f.a or 0, f.b or 0)):
        ratio = "" if not f.a or not f.b else f"{f.a / f.b:.2f}x"
        out.append((FAMILY_BY_KEY[f.family].label, _num(f.a), _num(f.b), ratio))
    return out


def verdict_lines(diff: ProfileDiff) -> list[str]:
    lines = [f"{i}. {r.sentence} Fix: {r.fix}" for i, r in enumerate(diff.verdict, 1)]
    return lines or ["No finding explains a difference: compare the tables above."]


def render_console(diff: ProfileDiff, console: Console | None = None) -> None:
    console = console or Console()
    t = Table("", f"A: {diff.a.label}", f"B: {diff.b.label}", "A/B",
              title="perfscope diff", title_justify="left")
    for q, a, b, r in table_rows(diff):
        # Text, not markup: "[time]" would read as a rich style tag.
        t.add_row(Text(q), Text(a), Text(b), Text(r),
                  style="bold magenta" if q.startswith("[") else None)
    console.print(t)
    for w in diff.warnings:
        console.print(f"[yellow]warning:[/] {w}")
    if diff.only_a or diff.only_b:
        console.print("instruction families only in A: " + (", ".join(diff.only_a) or "none")
                      + "; only in B: " + (", ".join(diff.only_b) or "none"))
    console.print("[bold]Why A is slower than B[/]")
    for line in verdict_lines(diff):
        console.print(f"  {line}", highlight=False)


def render_markdown(diff: ProfileDiff, gate_failures: Sequence[str] = ()) -> str:
    lines = [f"### perfscope diff: `{md_cell(diff.a.profile.name)}` vs `{md_cell(diff.b.profile.name)}`",
             ""]
    ct = next((r for r in diff.time if r.name == "cycles"), None)
    dt = next((r for r in diff.time if r.name == "duration ns"), None)
    if ct and dt:
        lines += [f"A takes **{_ratio(ct) or '?'}** B's cycles and {_ratio(dt) or '?'} its time.", ""]
    lines += ["**Why A is slower than B**", "", *verdict_lines(diff), ""]
    for w in diff.warnings:
        lines.append(f"> warning: {md_cell(w)}")
    for g in gate_failures:
        lines.append(f"> **gate failed:** {md_cell(g)}")
    lines += ["", "<details><summary>Side by side</summary>", "", "| | A | B | A/B |",
              "|---|---|---|---|"]
    lines += [f"| {md_cell(q)} | {md_cell(a)} | {md_cell(b)} | {r} |" for q, a, b, r in table_rows(diff)]
    lines += ["", "</details>", ""]
    return "\n".join(lines)
