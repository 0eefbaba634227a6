"""Markdown for a pull-request comment: diagnose panels, a diff, and the review summary.

GitHub refuses comments over 65,536 characters; the review summary folds each kernel into
a ``<details>`` block and, past ``LIMIT``, leaves the last kernels' blocks out and says so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from perfscope.render import tune
from perfscope.render.diff import (
    REMAINING_HEADING,
    gap_line,
    ratio_text,
    structure_rows,
    table_rows,
    verdict_heading,
    verdict_lines,
    verdict_sections,
)
from perfscope.render.summary import (
    SUMMARY_COLUMNS,
    duration,
    evidence_value,
    finding_texts,
    gain,
    headroom_text,
    md_cell,
    ncu_remark,
    not_evaluated_text,
    pct,
    sections,
    summary_row,
)

if TYPE_CHECKING:
    from perfscope.diff import DiffDocument
    from perfscope.profile import KernelProfile
    from perfscope.record import DiagnoseDocument
    from perfscope.review import Comparison, Entry, Review
    from perfscope.rules import Evaluation
    from perfscope.stage import OperandRead

LIMIT = 60_000


# ------------------------------------------------------------------------ diagnose


def _findings(evaluation: Evaluation) -> list[str]:
    lines = ["**perfscope findings**", ""]
    if (room := headroom_text(evaluation)) is not None:
        lines += [f"<sub>{md_cell(room)}</sub>", ""]
    lines += [f"<sub>{md_cell(note)}</sub>" for note in getattr(evaluation, "notes", ())]
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


def kernel_markdown(kp: KernelProfile, evaluation: Evaluation | None = None,
                    reads: Sequence[OperandRead] | None = None) -> str:
    """One kernel: its findings, then its summary sections as tables (reads: the run's TMA
    boxes, where its stage is known)."""
    lines = [f"### `{kp.name}`", ""]
    if evaluation is not None:
        lines += _findings(evaluation)
    for sec in sections(kp, reads=reads):
        lines += [f"**{sec.title}**", "", "| | |", "|---|---|"]
        lines += [f"| {md_cell(label.strip())} | {md_cell(value)} |" for label, value in sec.rows]
        lines.append("")
    rules = [r for r in kp.ncu_rules if r.type != "ok"]
    if rules:
        lines += ["<details><summary>Nsight Compute's own findings</summary>", ""]
        for r in rules:
            sp = "" if r.speedup_pct is None else f" (est. {r.speedup_pct:.1f}% {r.speedup_type})"
            remark = ncu_remark(kp, r.identifier, r.title)
            lines.append(f"- **{r.type}** {md_cell(r.identifier)}: {md_cell(r.title)}{sp}: "
                         f"{md_cell(r.message)}" + (f" *{md_cell(remark)}*" if remark else ""))
        lines += ["", "</details>", ""]
    return "\n".join(lines)


def diagnose_table(doc: DiagnoseDocument) -> list[str]:
    """One row per launch: what `diagnose` shows of several kernels unless --full."""
    lines = ["| " + " | ".join(SUMMARY_COLUMNS) + " |", "|" + "---|" * len(SUMMARY_COLUMNS)]
    lines += ["| " + " | ".join(md_cell(c) for c in summary_row(r)) + " |" for r in doc.records]
    return [*lines, ""]


def _diagnose(doc: DiagnoseDocument) -> str:
    head = [f"> warning: {md_cell(w)}" for w in doc.warnings]
    head += [f"> **not trustworthy:** {md_cell(r.launch_id)}: {md_cell(r.untrusted)}"
             for r in doc.records if r.untrusted]
    head += [f"> **failed:** {md_cell(x)}" for x in doc.failures]
    if head:
        head.append("")
    tail = [f"_Machine setting: {md_cell(m)}._" for m in doc.machine]
    if not doc.full:
        return "\n".join([*head, f"**perfscope diagnose**: {len(doc.records)} kernel launches", "",
                          *diagnose_table(doc), *tail]) + "\n"
    return "\n".join([*head, *(kernel_markdown(r.profile, r.evaluation, r.reads) for r in doc.records),
                      *tail]) + "\n"


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
    for heading, body in verdict_sections(diff):
        lines += [f"**{md_cell(heading)}**", "", *(md_cell(x) for x in body), ""]
    if (gap := gap_line(diff)) is not None:
        lines += [md_cell(gap), ""]
    if diff.clock:
        lines += [md_cell(diff.clock), ""]
    structure = structure_rows(diff)
    if structure:
        lines += ["| launch structure | A | B | |", "|---|---|---|---|"]
        lines += [f"| {md_cell(n)} | {md_cell(a)} | {md_cell(b)} | {d} |" for n, a, b, d in structure]
        lines.append("")
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
            flag = " **(beats its default)**" if p.beats else ""
            lines.append(
                f"| {ld.title} | {md_cell(p.label)}{' (variant)' if p.variant else ''}{flag} | "
                f"{f'{p.tflops.median:,.1f}' if ok else '-'} | "
                f"{f'{p.ratio_to_reference:.1%}' if ok and p.ratio_to_reference is not None else '-'} | "
                f"{f'{p.tflops.median / ld.peak_tflops:.1%}' if ok and ld.peak_tflops else '-'} | "
                f"{'ok' if p.verdict == 'ok' else f'**{md_cell(p.verdict)}**'} |")
        if ld.reference_tflops is not None:
            peak = "-" if not ld.peak_tflops else f"{ld.reference_tflops.median / ld.peak_tflops:.1%}"
            lines.append(f"| {ld.title} | **{md_cell(ld.reference or '')}** | "
                         f"**{ld.reference_tflops.median:,.1f}** | 100% | {peak} | |")
    lines.append("")
    lines += [f"> **variant:** {md_cell(w.sentence())}" for w in review.variant_wins]
    if review.variant_wins:
        lines.append("")
    cal = review.calibration
    if cal is not None and cal.median_abs_error is not None:
        missed = ", ".join(f"{s.parent} -> {s.child}" for s in cal.missed) or "none"
        lost = ", ".join(f"{s.parent} -> {s.child}" for s in cal.unexplained) or "none"
        lines += [f"**Calibration**: the addressed findings' estimates miss the measured saving of "
                  f"{len(cal.counted)} ladder steps by a median {cal.median_abs_error:.3f} of kernel "
                  f"time; steps that saved 10% or more unpredicted: {md_cell(missed)}; slower "
                  f"steps that lost 10% or more with no reason in their diff: {md_cell(lost)}.", ""]
    return lines


def _kernel_row(e: Entry) -> str:
    kp = e.profile
    top = kp.stalls.top(1)
    stall = top[0].reason if top else "-"
    f = e.evaluation.findings
    worst = f"{len(f)} ({f[0].severity}: {f[0].code} {md_cell(f[0].title)})" if f else "none"
    return (f"| {md_cell(e.label)} | {duration(kp.sol.duration_ns)} | {pct(kp.sol.sm_pct)} | "
            f"{pct(kp.sol.memory_pct)} | {stall} | {worst} |")


# What each kernel's block shows of its source view and evidence, to fit the ladder's
# kernels in one comment (GitHub's limit is 65,536 characters): the hottest source lines are
# cut to fewer for every kernel; then the cuBLAS comparisons go from the stages a later
# stage of the comment builds on (the step against the parent tells their story; the ladder's
# ends keep theirs, as does a stage with no parent here), then each comparison is cut to
# fewer reasons (its first, largest shares of the gap); at each level a line comes back for
# as many kernels as still fit (those with findings first), before a kernel is left out.
MD_SOURCE_LINES = 3
MD_SOURCE_FALLBACK = (1, 0)
MD_REASONS_FALLBACK = (2, 1)
# Characters kept free under LIMIT for the notes the comment ends with (at most four lines:
# source lines, cuBLAS comparisons, reasons, kernels left out).
MD_MARGIN = 600
MD_EVIDENCE = 1
MD_REASONS = 3
MD_TEXT = 90

# Findings that state a condition of the machine rather than of one kernel (PS171: the clock
# held by the power cap), or name a ceiling without an estimate (PS115: the shared-memory
# roof, on every cuBLAS GEMM at 4096^3), are said once under the kernel table, not in every
# kernel's block: the comment's room goes to what has a cost.
MD_SAID_ONCE = ("PS171", "PS115")


@dataclass(frozen=True)
class Detail:
    """How much of each comparison a kernel's block shows: its first `reasons` reasons, and
    the cuBLAS comparison only of the entries in `reference_of` (None: of every entry)."""

    reasons: int = MD_REASONS
    reference_of: frozenset[str] | None = None

    def shows(self, c: Comparison) -> bool:
        """Whether the block of c's stage shows comparison c."""
        return c.kind != "cuBLAS" or self.reference_of is None or c.a.key in self.reference_of


def ladder_ends(review: Review) -> frozenset[str]:
    """The entries that keep their cuBLAS comparison at the trimmed levels: those no other
    entry of the same dtype and shape names as its parent, and those held against no parent
    here."""
    built_on = {c.b.key for c in review.comparisons if c.kind == "parent stage"}
    with_parent = {c.a.key for c in review.comparisons if c.kind == "parent stage"}
    return frozenset(e.key for e in review.entries
                     if e.key not in built_on or e.key not in with_parent)


def detail_levels(review: Review) -> tuple[Detail, ...]:
    """The levels tried in turn, most detailed first."""
    ends = ladder_ends(review)
    return (Detail(), Detail(MD_REASONS, ends),
            *(Detail(n, ends) for n in MD_REASONS_FALLBACK))


def _said_once(review: Review) -> list[str]:
    """One line per said-once finding: how many kernels it holds, and the range of its first
    evidence (the clock)."""
    out = []
    for code in MD_SAID_ONCE:
        hits = [f for e in review.entries for f in e.evaluation.findings if f.code == code]
        if not hits:
            continue
        values = sorted(ev.value for f in hits for ev in f.evidence[:1]
                        if isinstance(ev.value, (int, float)))
        span = (f"; {md_cell(hits[0].evidence[0].metric)} {values[0]:g}-{values[-1]:g}"
                if values else "")
        out.append(f"> **{hits[0].severity}** {code} `{hits[0].tag}`: {md_cell(hits[0].title)}, "
                   f"on {len(hits)} of {len(review.entries)} kernels{span} (fix: {code})")
    return out


def _source_lines(e: Entry, count: int = MD_SOURCE_LINES) -> list[str]:
    view = e.source
    if not view.lines or count <= 0:
        return []
    out = ["", "Hottest source lines:" if count > 1 else "Hottest source line:"]
    for ln in view.lines[:count]:
        reasons = ", ".join(f"{r} {n:,}" for r, n in ln.reasons[:2])
        code = ln.text if ln.text is None or len(ln.text) <= MD_TEXT else ln.text[: MD_TEXT - 1] + "\u2026"
        text = f": `{md_cell(code)}`" if code is not None else " (source text not available)"
        out.append(f"- `{md_cell(ln.file.rsplit('/', 1)[-1])}:{ln.line}` "
                   f"{ln.share or 0:.0%} of samples ({reasons}){text}")
    return out


def _comparison_lines(c, fixes: dict[tuple[str, str], None], top: int = MD_REASONS) -> list[str]:
    diff = c.diff
    cyc = next((r for r in diff.time if r.name == "cycles"), None)
    ratio = "" if cyc is None or cyc.ratio is None else f": {cyc.ratio:.2f}x its cycles"
    heading = md_cell(verdict_heading(diff))
    out = ["", f"Against its {c.kind} **{md_cell(c.b.label)}**{ratio}. *{heading}*", ""]
    shown = {f.code: f for f in c.a.evaluation.findings}
    # The reasons with a share of the gap (stall shifts have none; the HTML has them).
    reasons = [r for r in diff.verdict if r.estimated_gain is not None][:top]
    for i, r in enumerate(reasons, 1):
        if r.kind == "finding" and r.code in shown and not diff.improved:
            # The finding's line above has its evidence: name it, with its share of the gap.
            share = f" (about {r.estimated_gain:.0%} of A's time)" if r.estimated_gain else ""
            out.append(f"{i}. {r.code} {md_cell(shown[r.code].title)}{share}")
            continue
        fix = ""
        if not diff.improved and r.fix:
            key = r.code if r.code in shown else r.kind
            fix = f" (fix: {key})"
            if key not in shown:
                fixes.setdefault((key, r.fix), None)
        out.append(f"{i}. {md_cell(r.sentence)}{fix}")
    if not reasons:
        out.append(verdict_lines(diff)[0] if not diff.verdict else
                   "No reason with a share of the gap; the HTML report shows the stall shifts.")
    if diff.improved:
        left = ", ".join(f.code for f in c.a.evaluation.findings) or "no perfscope finding"
        out += ["", f"{REMAINING_HEADING}: {left}."]
    return out


def _details(review: Review, e: Entry, fixes: dict[tuple[str, str], None],
             source_lines: int = MD_SOURCE_LINES, detail: Detail = Detail()) -> list[str]:
    """One kernel folded into <details>: findings (fixes collected once at the end), the
    comparisons, and its hottest source lines."""
    f = e.evaluation.findings
    count = f"{len(f)} finding{'s' if len(f) != 1 else ''}" if f else "no finding"
    lines = [f"<details><summary>{md_cell(e.label)}: {count}</summary>", ""]
    for finding, t in zip(f, finding_texts(e.evaluation), strict=True):
        if finding.code in MD_SAID_ONCE:
            continue
        evidence = "; ".join(f"{md_cell(ev.metric)} = {md_cell(evidence_value(ev.value))}"
                             for ev in finding.evidence[:MD_EVIDENCE])
        est = gain(finding.estimated_gain)
        lines.append(f"- **{t.severity}** {t.code} `{t.tag}`: {md_cell(t.title)} ({est}); "
                     f"{evidence} (fix: {t.code})")
        fixes.setdefault((t.code, t.fix), None)
    for c in review.comparisons_of(e):
        if detail.shows(c):
            lines += _comparison_lines(c, fixes, detail.reasons)
    lines += _source_lines(e, source_lines)
    return [*lines, "", "</details>", ""]


def _fixes(fixes: dict[tuple[str, str], None]) -> str:
    """Every fix the blocks above name, once each, by finding code or structural aspect."""
    if not fixes:
        return ""
    lines = ["<details><summary>Fixes</summary>", ""]
    lines += [f"- **{md_cell(key)}**: {md_cell(text)}" for key, text in sorted(fixes)]
    return "\n".join([*lines, "", "</details>", ""])


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
    said = _said_once(review)
    head += [*said, ""] if said else []
    start = "\n".join(head)
    n = len(review.entries)
    for detail in detail_levels(review):
        for source_lines in (MD_SOURCE_LINES, *MD_SOURCE_FALLBACK):
            plan = (source_lines,) * n
            text, kept = _kernel_blocks(review, start, plan, detail)
            if kept == n:
                break
        if kept == n:
            break
    if kept == n and source_lines == 0 and MD_SOURCE_FALLBACK[0] > 0:
        # `text` is the comment with no source line at all: what room is left decides.
        mixed = _one_line_where_it_fits(review, LIMIT - MD_MARGIN - len(text), MD_SOURCE_FALLBACK[0])
        more, more_kept = _kernel_blocks(review, start, mixed, detail)
        if more_kept == n and any(mixed):
            text, plan = more, mixed
    if min(plan, default=MD_SOURCE_LINES) < MD_SOURCE_LINES and _view_lines(review):
        text += f"\n_{_cut_note(plan)} to fit a PR comment; the HTML report has them._\n"
    text += _trim_note(review, detail)
    if kept < len(review.entries):
        text += (f"\n_{len(review.entries) - kept} kernel(s) left out to fit a PR comment; "
                 "the HTML report has them all._\n")
    return text + "\n"


def _trim_note(review: Review, detail: Detail) -> str:
    """What the comment left out of the comparisons, in a line each (nothing if nothing)."""
    text = ""
    refs = [c for c in review.comparisons if c.kind == "cuBLAS"]
    shown = sum(detail.shows(c) for c in refs)
    if shown < len(refs):
        text += (f"\n_cuBLAS comparisons kept for the {shown} of {len(refs)} stages no later "
                 "stage here builds on, to fit a PR comment; the HTML report has them all._\n")
    if detail.reasons < MD_REASONS and review.comparisons:
        text += (f"\n_Each comparison cut to its first {detail.reasons} "
                 f"reason{'s' if detail.reasons > 1 else ''} to fit a PR comment; the HTML "
                 "report has them all._\n")
    return text


def _cut_note(plan: tuple[int, ...]) -> str:
    """What the comment left out of the kernels' hottest source lines."""
    if len(set(plan)) == 1:
        return f"Hottest source lines cut to {plan[0] or 'none'} per kernel"
    top = max(plan)
    return (f"Hottest source lines cut to {top} for {sum(n == top for n in plan)} of "
            f"{len(plan)} kernels (those with findings first) and none for the others")


def _one_line_where_it_fits(review: Review, room: int, lines: int) -> tuple[int, ...]:
    """Per kernel, `lines` hottest source lines or none: kernels with findings first, then
    in order, as long as they add no more than `room` characters to the comment."""
    n = len(review.entries)
    # Kernels with findings first; those with no source view (cuBLAS) take no place.
    order = sorted((i for i in range(n) if review.entries[i].source.lines),
                   key=lambda i: not review.entries[i].evaluation.findings)
    plan = [0] * n
    for i in order:
        extra = len("\n".join(_source_lines(review.entries[i], lines)))
        if extra + 1 <= room:
            plan[i], room = lines, room - extra - 1
    return tuple(plan)


def _view_lines(review: Review) -> bool:
    """Whether any kernel of the review has source lines to show."""
    return any(e.source.lines for e in review.entries)


def _kernel_blocks(review: Review, text: str, plan: tuple[int, ...],
                   detail: Detail = Detail()) -> tuple[str, int]:
    """text, then as many kernels' blocks as fit under LIMIT with the fixes they name (each
    with the number of hottest source lines its place in `plan` says, its comparisons as
    `detail` trims them), and how many did."""
    # A said-once finding's fix, from its first kernel (the others differ in their numbers).
    fixes: dict[tuple[str, str], None] = {}
    for code in MD_SAID_ONCE:
        first = next(((e, f) for e in review.entries for f in e.evaluation.findings
                      if f.code == code), None)
        if first is not None:
            (t,) = [t for t in finding_texts(first[0].evaluation) if t.code == code]
            fixes[(code, t.fix)] = None
    kept = 0
    for e, source_lines in zip(review.entries, plan, strict=True):
        mine: dict[tuple[str, str], None] = dict(fixes)
        block = "\n".join(_details(review, e, mine, source_lines, detail))
        if len(text) + len(block) + len(_fixes(mine)) + MD_MARGIN > LIMIT:
            break
        text += "\n" + block
        fixes = mine
        kept += 1
    return text + "\n" + _fixes(fixes), kept


RENDERERS: dict[str, Callable[..., str]] = {"diagnose": _diagnose, "diff": _diff, "review": _review,
                                           "tune": tune.render_markdown}
