"""Rich console rendering of diagnose: one table per kernel, perfscope's findings, then
Nsight Compute's own findings below them, marked as Nsight Compute's."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from perfscope.profile import KernelProfile
from perfscope.render.summary import finding_texts, not_evaluated_text, sections

_RULE_STYLE = {"warning": "yellow", "error": "red", "optimization": "cyan", "ok": "green",
               "info": "dim"}


def _findings(evaluation) -> list:
    parts: list = [Text("perfscope findings", style="bold magenta")]
    texts = finding_texts(evaluation)
    if not texts:
        parts.append(Text("  none", style="green"))
    for f in texts:
        line = Text("  ")
        line.append(f"{f.severity:<13} ", style=_RULE_STYLE.get(f.severity, ""))
        line.append(f"{f.code} [{f.tag}] {f.title}", style="bold")
        line.append(f"  {f.estimate}")
        parts.append(line)
        parts += [Text(f"      {e}", style="dim") for e in f.evidence]
        parts.append(Text(f"      fix: {f.fix}"))
        parts.append(Text(f"      source: {f.reference}", style="dim"))
    skipped = not_evaluated_text(evaluation)
    if skipped:
        parts.append(Text(f"  {skipped}", style="dim"))
    return parts


def kernel_panel(kp: KernelProfile, evaluation=None) -> Panel:
    table = Table(show_header=False, box=None, pad_edge=False, expand=True)
    table.add_column(style="bold", no_wrap=True, min_width=24)
    table.add_column(overflow="fold")
    for sec in sections(kp):
        table.add_row(Text(sec.title, style="bold magenta"), "")
        for label, value in sec.rows:
            table.add_row(f"  {label}", Text(value, style="dim" if value == "not collected" else ""))
    parts: list = [table]
    if evaluation is not None:
        parts += _findings(evaluation)
    rules = [r for r in kp.ncu_rules if r.type != "ok"]
    if rules:
        parts.append(Text("Nsight Compute's own findings", style="bold magenta"))
        for r in rules:
            sp = "" if r.speedup_pct is None else f"  est. {r.speedup_pct:.1f}% ({r.speedup_type})"
            line = Text("  ")
            line.append(f"{r.type:<13} ", style=_RULE_STYLE.get(r.type, ""))
            line.append(f"{r.identifier}: {r.title}{sp}")
            parts.append(line)
            parts.append(Text(f"      {r.message}", style="dim"))
    ident = kp.identity
    title = f"{kp.name}  [{ident.source}#{ident.range_index}:{ident.action_index}]"
    return Panel(Group(*parts), title=Text(title, style="bold"), title_align="left")


def render(profiles: Sequence[KernelProfile], console: Console | None = None,
           evaluations: Sequence | None = None) -> None:
    """evaluations (perfscope.rules Evaluations) align with profiles when given."""
    console = console or Console()
    for i, kp in enumerate(profiles):
        console.print(kernel_panel(kp, evaluations[i] if evaluations is not None else None))
