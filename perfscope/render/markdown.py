"""Markdown for a pull-request comment: diagnose panels, a diff, and the review summary.

GitHub refuses comments over 65,536 characters; the review summary folds each kernel into
a ``<details>`` block and, past ``LIMIT``, leaves the last kernels' blocks out and says so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from perfscope.render.diff import ratio_text, table_rows, verdict_heading, verdict_lines
from perfscope.render.summary import duration, finding_texts, md_cell, not_evaluated_text, pct, sections

if TYPE_CHECKING:
    from perfscope.diff import DiffDocument
    from perfscope.profile import KernelProfile
    from perfscope.record import DiagnoseDocument
    from perfscope.review import Entry, Review
    from perfscope.rules import Evaluation

LIMIT = 60_000


# ------------------------------------------------------------------------ diagnose


def _findings(evaluation: Evaluation) -> list[str]:
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


def kernel_markdown(kp: KernelProfile, evaluation: Evaluation | None = None) -> str:
    """One kernel: its findings, then its summary sections as tables."""
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


def _diagnose(doc: DiagnoseDocument) -> str:
    return "\n".join(kernel_markdown(r.profile, r.evaluation) for r in doc.records) + "\n"


# ---------------------------------------------------------------------------- diff


def _diff(doc: DiffDocument) -> str:
    diff = doc.diff
    lines = [f"### perfscope diff: `{md_cell(diff.a.profile.name)}` vs `{md_cell(diff.b.profile.name)}`",
             ""]
    ct = next((r for r in diff.time if r.name == "cycles"), None)
    dt = next((r for r in diff.time if r.name == "duration ns"), None)
    if ct and dt:
        lines += [f"A takes **{ratio_text(ct) or '?'}** B's cycles and {ratio_text(dt) or '?'} its time.",
                  ""]
    lines += [f"**{verdict_heading(diff)}**", "", *verdict_lines(diff), ""]
    for w in diff.warnings:
        lines.append(f"> warning: {md_cell(w)}")
    for g in doc.gate_failures:
        lines.append(f"> **gate failed:** {md_cell(g)}")
    lines += ["", "<details><summary>Side by side</summary>", "", "| | A | B | A/B |",
              "|---|---|---|---|"]
    lines += [f"| {md_cell(q)} | {md_cell(a)} | {md_cell(b)} | {r} |" for q, a, b, r in table_rows(diff)]
    lines += ["", "</details>", ""]
    return "\n".join(lines) + "\n"


# -------------------------------------------------------------------------- review


def _ladder(review: Review) -> list[str]:
    if not review.ladders:
        return []
    lines = [f"**Ladder** (TFLOP/s from {md_cell(review.timing_source or '')})", "",
             "| dtype | stage | TFLOP/s | of cuBLAS | of peak | verdict |", "|---|---|--:|--:|--:|---|"]
    for ld in review.ladders:
        for p in ld.points:
            ok = p.verdict == "ok" and p.tflops is not None
            lines.append(
                f"| {ld.dtype} | {md_cell(p.label)}{' (variant)' if p.variant else ''} | "
                f"{f'{p.tflops.median:,.1f}' if ok else '-'} | "
                f"{f'{p.ratio_to_reference:.1%}' if ok and p.ratio_to_reference is not None else '-'} | "
                f"{f'{p.tflops.median / ld.peak_tflops:.1%}' if ok and ld.peak_tflops else '-'} | "
                f"{'ok' if p.verdict == 'ok' else f'**{md_cell(p.verdict)}**'} |")
        if ld.reference_tflops is not None:
            peak = "-" if not ld.peak_tflops else f"{ld.reference_tflops.median / ld.peak_tflops:.1%}"
            lines.append(f"| {ld.dtype} | **{md_cell(ld.reference or '')}** | "
                         f"**{ld.reference_tflops.median:,.1f}** | 100% | {peak} | |")
    return [*lines, ""]


def _kernel_row(e: Entry) -> str:
    kp = e.profile
    top = kp.stalls.top(1)
    stall = top[0].reason if top else "-"
    f = e.evaluation.findings
    worst = f"{len(f)} ({f[0].severity}: {f[0].code} {md_cell(f[0].title)})" if f else "none"
    return (f"| {md_cell(e.label)} | {duration(kp.sol.duration_ns)} | {pct(kp.sol.sm_pct)} | "
            f"{pct(kp.sol.memory_pct)} | {stall} | {worst} |")


def _details(review: Review, e: Entry) -> list[str]:
    lines = [f"<details><summary>{md_cell(e.label)}: <code>{md_cell(e.profile.name)}</code></summary>", ""]
    texts = finding_texts(e.evaluation)
    for f in texts:
        lines.append(f"- **{f.severity}** {f.code} `{f.tag}`: {md_cell(f.title)} ({md_cell(f.estimate)})")
        lines += [f"  - {md_cell(ev)}" for ev in f.evidence]
        lines.append(f"  - fix: {md_cell(f.fix)}")
    if not texts:
        lines.append("- no perfscope finding")
    for c in review.comparisons_of(e):
        cyc = next((r for r in c.diff.time if r.name == "cycles"), None)
        ratio = "" if cyc is None or cyc.ratio is None else f": {cyc.ratio:.2f}x its cycles"
        lines += ["", f"Against its {c.kind} **{md_cell(c.b.label)}**{ratio}", ""]
        reasons = c.diff.verdict
        lines += [f"{i}. {md_cell(r.sentence)} Fix: {md_cell(r.fix)}" for i, r in enumerate(reasons, 1)]
        if not reasons:
            lines.append("No finding explains a difference.")
    return [*lines, "", "</details>", ""]


def _review(review: Review, html_name: str | None = None) -> str:
    """The PR comment; html_name names the full HTML report it summarises."""
    head = [f"### {md_cell(review.title)}", ""]
    if html_name:
        head += [f"Full report: `{md_cell(html_name)}` (self-contained HTML).", ""]
    head += _ladder(review)
    head += [f"**Kernels** ({len(review.entries)})", "",
             "| kernel | duration (ncu) | SM % | memory % | top stall | findings |",
             "|---|--:|--:|--:|---|---|", *(_kernel_row(e) for e in review.entries), ""]
    head += [f"> {md_cell(w)}" for w in review.warnings]
    text = "\n".join(head)
    blocks = ["\n".join(_details(review, e)) for e in review.entries]
    kept = 0
    for block in blocks:
        if len(text) + len(block) + 200 > LIMIT:
            break
        text += "\n" + block
        kept += 1
    if kept < len(blocks):
        text += (f"\n_{len(blocks) - kept} kernel(s) left out to fit a PR comment; "
                 "the HTML report has them all._\n")
    return text + "\n"


RENDERERS: dict[str, Callable[..., str]] = {"diagnose": _diagnose, "diff": _diff, "review": _review}
