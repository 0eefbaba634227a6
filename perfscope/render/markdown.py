"""Markdown rendering of diagnose, sized for a pull-request comment."""

from __future__ import annotations

from collections.abc import Sequence

from perfscope.profile import KernelProfile
from perfscope.render.summary import finding_texts, md_cell, not_evaluated_text, sections


def _findings(evaluation) -> list[str]:
    lines = ["**perfscope findings**", ""]
    texts = finding_texts(evaluation)
    if not texts:
        lines.append("none")
    for f in texts:
        lines.append(f"- **{f.severity}** {f.code} `{f.tag}`: {md_cell(f.title)} ({md_cell(f.estimate)})")
        lines += [f"  - {md_cell(e)}" for e in f.evidence]
        lines.append(f"  - fix: {md_cell(f.fix)}")
        lines.append(f"  - source: {md_cell(f.reference)}")
    skipped = not_evaluated_text(evaluation)
    if skipped:
        lines += ["", f"<sub>{md_cell(skipped)}</sub>"]
    return [*lines, ""]


def kernel_markdown(kp: KernelProfile, evaluation=None) -> str:
    lines = [f"### `{kp.name}`", ""]
    if evaluation is not None:
        lines += _findings(evaluation)
    for sec in sections(kp):
        lines += [f"**{sec.title}**", "", "| | |", "|---|---|"]
        lines += [f"| {md_cell(label.strip())} | {md_cell(value)} |" for label, value in sec.rows]
        lines.append("")
    rules = [r for r in kp.ncu_rules if r.type != "ok"]
    if rules:
        lines += ["<details><summary>Nsight Compute's own findings</summary>", ""]
        for r in rules:
            sp = "" if r.speedup_pct is None else f" (est. {r.speedup_pct:.1f}% {r.speedup_type})"
            lines.append(f"- **{r.type}** {md_cell(r.identifier)}: {md_cell(r.title)}{sp}: "
                         f"{md_cell(r.message)}")
        lines += ["", "</details>", ""]
    return "\n".join(lines)


def render(profiles: Sequence[KernelProfile], evaluations: Sequence | None = None) -> str:
    """evaluations (perfscope.rules Evaluations) align with profiles when given."""
    return "\n".join(kernel_markdown(kp, evaluations[i] if evaluations is not None else None)
                     for i, kp in enumerate(profiles))
