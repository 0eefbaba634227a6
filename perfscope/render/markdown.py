"""Markdown rendering of diagnose, sized for a pull-request comment."""

from __future__ import annotations

from collections.abc import Sequence

from perfscope.profile import KernelProfile
from perfscope.render.summary import sections


def _cell(text: str) -> str:
    # Kernel names carry '|' and '<' rarely but C++ templates often: keep tables intact.
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def kernel_markdown(kp: KernelProfile) -> str:
    lines = [f"### `{kp.name}`", ""]
    for sec in sections(kp):
        lines += [f"**{sec.title}**", "", "| | |", "|---|---|"]
        lines += [f"| {_cell(label.strip())} | {_cell(value)} |" for label, value in sec.rows]
        lines.append("")
    rules = [r for r in kp.ncu_rules if r.type != "ok"]
    if rules:
        lines += ["<details><summary>Nsight Compute's own findings</summary>", ""]
        for r in rules:
            sp = "" if r.speedup_pct is None else f" (est. {r.speedup_pct:.1f}% {r.speedup_type})"
            lines.append(f"- **{r.type}** {_cell(r.identifier)}: {_cell(r.title)}{sp}: "
                         f"{_cell(r.message)}")
        lines += ["", "</details>", ""]
    return "\n".join(lines)


def render(profiles: Sequence[KernelProfile]) -> str:
    return "\n".join(kernel_markdown(kp) for kp in profiles)
