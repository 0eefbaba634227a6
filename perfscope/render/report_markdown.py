"""The report as Markdown for a pull-request comment: the HTML page's summary, compact.

The ladder table, one line per kernel, and per kernel a folded block with its findings
and its diffs against the parent stage and cuBLAS. GitHub refuses comments over 65,536
characters; past ``LIMIT`` the folded blocks of the last kernels are left out, and the
comment says how many.
"""

from __future__ import annotations

from perfscope.render.report import Entry, Report
from perfscope.render.summary import duration, finding_texts, md_cell, pct

LIMIT = 60_000


def _ladder(report: Report) -> list[str]:
    if not report.ladders:
        return []
    lines = [f"**Ladder** (TFLOP/s from {md_cell(report.timing_source or '')})", "",
             "| dtype | stage | TFLOP/s | of cuBLAS | of peak | verdict |", "|---|---|--:|--:|--:|---|"]
    for ld in report.ladders:
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


def _details(report: Report, e: Entry) -> list[str]:
    lines = [f"<details><summary>{md_cell(e.label)}: <code>{md_cell(e.profile.name)}</code></summary>", ""]
    texts = finding_texts(e.evaluation)
    for f in texts:
        lines.append(f"- **{f.severity}** {f.code} `{f.tag}`: {md_cell(f.title)} ({md_cell(f.estimate)})")
        lines += [f"  - {md_cell(ev)}" for ev in f.evidence]
        lines.append(f"  - fix: {md_cell(f.fix)}")
    if not texts:
        lines.append("- no perfscope finding")
    for c in report.comparisons_of(e):
        cyc = next((r for r in c.diff.time if r.name == "cycles"), None)
        ratio = "" if cyc is None or cyc.ratio is None else f": {cyc.ratio:.2f}x its cycles"
        lines += ["", f"Against its {c.kind} **{md_cell(c.b.label)}**{ratio}", ""]
        reasons = c.diff.verdict
        lines += [f"{i}. {md_cell(r.sentence)} Fix: {md_cell(r.fix)}" for i, r in enumerate(reasons, 1)]
        if not reasons:
            lines.append("No finding explains a difference.")
    return [*lines, "", "</details>", ""]


def render(report: Report, html_name: str | None = None) -> str:
    """The Markdown comment; html_name names the full HTML report it summarises."""
    head = [f"### {md_cell(report.title)}", ""]
    if html_name:
        head += [f"Full report: `{md_cell(html_name)}` (self-contained HTML).", ""]
    head += _ladder(report)
    head += [f"**Kernels** ({len(report.entries)})", "",
             "| kernel | duration (ncu) | SM % | memory % | top stall | findings |",
             "|---|--:|--:|--:|---|---|", *(_kernel_row(e) for e in report.entries), ""]
    head += [f"> {md_cell(w)}" for w in report.warnings]
    text = "\n".join(head)
    blocks = ["\n".join(_details(report, e)) for e in report.entries]
    kept = 0
    for block in blocks:
        if len(text) + len(block) + 200 > LIMIT:
            break
        text += "\n" + block
        kept += 1
    if kept < len(blocks):
        text += (f"\n_{len(blocks) - kept} kernel(s) left out to fit a PR comment; "
                 "the HTML report has them all._\n")
    return text
