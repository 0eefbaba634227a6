"""The terminal: rich tables and panels rendered to text (ANSI colour only on a terminal).

diagnose prints one panel per kernel (perfscope's findings, then Nsight Compute's own
below them, marked as Nsight Compute's), or one row per kernel; diff a side-by-side table
and its verdict; the rule table, bench and profile results, and the static SASS audit
each their table.

A table never cuts the cells that say which row is which (stage, dtype, shape, launch):
those columns do not wrap, and where the table cannot fit beside them (under
``LIST_BELOW`` columns, as on an 80-column terminal) each row becomes a short block of
"column: value" lines instead. Piped output is laid out for 120 columns unless COLUMNS
says otherwise.
"""

from __future__ import annotations

import io
import shutil
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from perfscope.families import FAMILY_BY_KEY
from perfscope.render import tune
from perfscope.render.diff import table_rows, verdict_heading, verdict_lines
from perfscope.render.summary import (
    SUMMARY_COLUMNS,
    evidence_value,
    finding_texts,
    headroom_text,
    ncu_remark,
    not_evaluated_text,
    sections,
    summary_row,
)

if TYPE_CHECKING:
    from perfscope.diff import DiffDocument
    from perfscope.documents import AuditDocument, BenchSummary, KernelsTable, ProfileSummary
    from perfscope.hotloop import HotListing
    from perfscope.manifest import Spread
    from perfscope.profile import KernelProfile
    from perfscope.record import DiagnoseDocument
    from perfscope.rules import Evaluation, RuleTable
    from perfscope.stage import OperandRead

_RULE_STYLE = {"warning": "yellow", "error": "red", "optimization": "cyan", "ok": "green",
               "info": "dim"}
# Narrower than this, a table that does not fit is printed as one block per row.
LIST_BELOW = 100
# The least a wrapping column keeps beside the key columns before the list layout wins.
MIN_COLUMN = 8


def _text(parts: Iterable[RenderableType], color: bool = False, width: int | None = None) -> str:
    """What rich would print, as a string: colour only when asked (a terminal)."""
    buf = io.StringIO()
    console = Console(file=buf, width=width or shutil.get_terminal_size((120, 24)).columns,
                      force_terminal=color, color_system="standard" if color else None,
                      no_color=not color, highlight=False, soft_wrap=False)
    for part in parts:
        console.print(part)
    return buf.getvalue()


def _width(width: int | None) -> int:
    return width or shutil.get_terminal_size((120, 24)).columns


def _table(columns: tuple[str, ...], rows: Iterable[tuple[str, ...]], width: int, keys: int = 1,
           title: str | None = None) -> list[RenderableType]:
    """A table whose first `keys` columns are never cut, or, where it cannot fit, a list.

    The key columns name the row (stage, dtype, shape); a cut "hgemm… fp16 4096x…" makes
    two rows look alike, so they keep their full width and only the others wrap.
    """
    rows = list(rows)
    widths = [max([len(c), *(len(r[i]) for r in rows)]) for i, c in enumerate(columns)]
    frame = 3 * len(columns) + 1            # rich's borders and one space of padding a side
    key_width = sum(widths[:keys]) + frame + MIN_COLUMN * (len(columns) - keys)
    if sum(widths) + frame > width and (width < LIST_BELOW or key_width > width):
        return _as_list(columns, rows, keys, title)
    table = Table(title=title, title_justify="left")
    for i, c in enumerate(columns):
        if i < keys:
            table.add_column(c, no_wrap=True, min_width=widths[i])
        else:
            table.add_column(c, overflow="fold")
    for r in rows:
        table.add_row(*(Text(cell) for cell in r))
    return [table]


def _as_list(columns: tuple[str, ...], rows: list[tuple[str, ...]], keys: int,
             title: str | None) -> list[RenderableType]:
    parts: list[RenderableType] = [Text(title, style="bold")] if title else []
    for r in rows:
        parts.append(Text(" · ".join(cell for cell in r[:keys] if cell), style="bold"))
        parts += [Text(f"  {c}: {cell}") for c, cell in zip(columns[keys:], r[keys:], strict=True)
                  if cell]
    return parts


# ------------------------------------------------------------------------ diagnose


def _findings(evaluation: Evaluation) -> list[RenderableType]:
    parts: list[RenderableType] = [Text("perfscope findings", style="bold magenta")]
    if (room := headroom_text(evaluation)) is not None:
        parts.append(Text(f"  {room}", style="dim"))
    parts += [Text(f"  {note}", style="dim") for note in getattr(evaluation, "notes", ())]
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


def kernel_panel(kp: KernelProfile, evaluation: Evaluation | None = None,
                 untrusted: str | None = None, reads: Sequence[OperandRead] | None = None) -> Panel:
    """One kernel's panel: its summary sections, findings and Nsight Compute's findings
    (untrusted: why its counters must not be believed, shown first; reads: the run's TMA
    boxes, where its stage is known)."""
    table = Table(show_header=False, box=None, pad_edge=False, expand=True)
    table.add_column(style="bold", no_wrap=True, min_width=24)
    table.add_column(overflow="fold")
    for sec in sections(kp, reads=reads):
        table.add_row(Text(sec.title, style="bold magenta"), "")
        for label, value in sec.rows:
            table.add_row(f"  {label}", Text(value, style="dim" if value == "not collected" else ""))
    parts: list[RenderableType] = [table]
    if untrusted:
        parts.insert(0, Text(f"NOT TRUSTWORTHY: {untrusted}", style="bold red"))
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
            remark = ncu_remark(kp, r.identifier, r.title)
            if remark:
                parts.append(Text(f"      {remark}"))
    ident = kp.identity
    # FILE#ID: the name diff and the summary rows use for this launch.
    title = f"{kp.name}  [{ident.source}#{ident.launch_index}]"
    return Panel(Group(*parts), title=Text(title, style="bold"), title_align="left")


def _diagnose(doc: DiagnoseDocument, color: bool = False, width: int | None = None) -> str:
    if doc.full:
        parts: list[RenderableType] = [kernel_panel(r.profile, r.evaluation, r.untrusted, r.reads)
                                       for r in doc.records]
    else:
        title = (f"{len(doc.records)} kernel launches (perfscope diagnose --full for the panels, "
                 "or name one launch as FILE#ID)")
        parts = _table(SUMMARY_COLUMNS, (summary_row(r) for r in doc.records), _width(width),
                       keys=2, title=title)
    parts += [Text.assemble(("warning: ", "yellow"), w) for w in doc.warnings]
    parts += [Text(f"machine setting: {m}.") for m in doc.machine]
    return _text(parts, color, width)


# ---------------------------------------------------------------------------- diff


def _diff(doc: DiffDocument, color: bool = False, width: int | None = None) -> str:
    diff = doc.diff
    # The labels stand above the table, whole: as column headers they would wrap or be cut.
    t = Table("", "A", "B", "A/B", title="perfscope diff", title_justify="left")
    for q, a, b, r in table_rows(diff):
        # Text, not markup: "[time]" would read as a rich style tag.
        t.add_row(Text(q), Text(a), Text(b), Text(r),
                  style="bold magenta" if q.startswith("[") else None)
    parts: list[RenderableType] = [Text(f"A: {diff.a.label}"), Text(f"B: {diff.b.label}"), t]
    parts += [Text.assemble(("warning: ", "yellow"), w) for w in diff.warnings]
    if diff.only_a or diff.only_b:
        parts.append(Text("instruction families only in A: " + (", ".join(diff.only_a) or "none")
                          + "; only in B: " + (", ".join(diff.only_b) or "none")))
    parts.append(Text(verdict_heading(diff), style="bold"))
    parts += [Text(f"  {line}") for line in verdict_lines(diff)]
    if diff.clock:
        parts.append(Text(diff.clock))
    return _text(parts, color, width)


# --------------------------------------------------------------------------- tables


def _rules(doc: RuleTable, color: bool = False, width: int | None = None) -> str:
    rows = ((r.code, r.tag, r.severity, r.title,
             ", ".join(f"{name}={value:g}" for name, value in r.thresholds) or "-", r.reference)
            for r in doc.rules)
    return _text(_table(("code", "tag", "severity", "title", "thresholds", "source"), rows,
                        _width(width), keys=2), color, width)


BENCH_COLUMNS = ("stage", "dtype", "shape", "verdict", "rel err", "TFLOP/s median (min-max)",
                 "vs cuBLAS median (min-max)", "vs parent, same rounds", "NVML MHz", "regs")


def _spread_text(s: Spread | None, fmt: str = "{:.1f}") -> str:
    if s is None:
        return "-"
    return f"{fmt.format(s.median)} ({fmt.format(s.min)}-{fmt.format(s.max)})"


def bench_rows(doc: BenchSummary) -> list[tuple[str, ...]]:
    """Plain-text cells for a results table: a WRONG or refused row never shows a speed."""
    rows = []
    for label, m in zip(doc.labels, doc.manifests, strict=True):
        v, t = m.verification, m.timing
        err = f"{v.rel_fro_error:.1e}" if v.rel_fro_error is not None else "-"
        res = m.compile.resources if m.compile else {}
        regs = (f"{res['registers']}r" + (f" spill {res['spill_stores']}B"
                                          if res.get("spill_stores") else "")) if res else "-"
        verdict = v.verdict if v.verdict == "ok" else f"{v.verdict}: {v.detail}"
        clock = f"{t.sm_clock_mhz.median:.0f}" if t and t.sm_clock_mhz else "-"
        # The parent's time over the stage's in the stage's own rounds (bench times a ladder
        # step so when the run holds both at their defaults).
        step = (f"{_spread_text(t.ratio_to_parent, '{:.2f}')} {t.parent}"
                if t and t.ratio_to_parent else "-")
        rows.append((label, m.dtype, m.shape, verdict, err, _spread_text(t.tflops) if t else "-",
                     _spread_text(t.ratio_to_reference, "{:.2f}") if t else "-", step, clock,
                     regs))
    return rows


def _bench(doc: BenchSummary, color: bool = False, width: int | None = None) -> str:
    return _text(_table(BENCH_COLUMNS, bench_rows(doc), _width(width), keys=3, title=doc.title),
                 color, width)


def _profile(doc: ProfileSummary, color: bool = False, width: int | None = None) -> str:
    rows = ((r.stem, r.verdict, r.report.name if r.report else "-", r.detail) for r in doc.results)
    return _text(_table(("stage", "verdict", "report", "detail"), rows, _width(width),
                        title=f"perfscope profile -> {doc.out_dir}"), color, width)


def _kernels(doc: KernelsTable, color: bool = False, width: int | None = None) -> str:
    rows = ((row.name + (" (variant)" if row.variant else ""), row.parent or "-",
             ", ".join(row.archs), row.ratio_text, row.change) for row in doc.rows)
    return _text(_table(("stage", "parent", "arch", "vs reference", "what it changes"), rows,
                        _width(width)), color, width)


# ------------------------------------------------------------------------ sass audit


def _resources_line(a: Any) -> str:
    r = a.resources
    if r is not None:
        parts = [f"{r.registers} registers", f"{r.static_smem} B static shared"]
        if a.dynamic_smem:
            parts.append(f"{a.dynamic_smem} B dynamic shared (KernelSpec)")
        parts += [f"{r.stack_frame} B stack", f"{r.spill_stores} B spill stores",
                  f"{r.spill_loads} B spill loads"]
        return "resources  " + ", ".join(parts) + " (ptxas -v)"
    s = a.sass
    return (f"resources  {s.registers} registers, {s.shared_bytes} B shared, {s.stack_bytes} B stack, "
            f"{s.local_bytes} B local, spills unknown (cuobjdump -res-usage)")


def _audit(doc: AuditDocument, color: bool = False, width: int | None = None) -> str:
    """The static audit: one block per kernel (plain text; it reads well in CI logs)."""
    out: list[str] = []
    for a in doc.audits:
        title = f"{a.target}" + (f" ({a.dtype}, {a.arch})" if a.dtype else f" ({a.arch})")
        if a.label:
            title += f" - {a.label}"
        out += [title, f"kernel     {a.kernel}"]
        if a.change:
            out.append(f"change     {a.change}")
        out += [f"compiler   {a.compiler}", f"disasm     {a.tool.name} ({a.tool.origin})",
                _resources_line(a), ""]
        total = sum(a.sass.opcodes.values())
        out.append(f"opcode families (static instruction counts, {total} instructions)")
        for key, ops in a.families.items():
            label = FAMILY_BY_KEY[key].label if key in FAMILY_BY_KEY else "not in a family"
            shown = ", ".join(f"{op} {n}" for op, n in list(ops.items())[:6])
            more = f", +{len(ops) - 6} more" if len(ops) > 6 else ""
            out.append(f"  {key:<10} {label:<30} {sum(ops.values()):>6}  {shown}{more}")
        out.append("")
        if a.fingerprint:
            verdict = "PASS" if a.fingerprint_ok else "FAIL"
            out.append(f"fingerprint {verdict} (declared: {', '.join(c.name for c in a.fingerprint)})")
            for c in a.fingerprint:
                ops = ", ".join(c.opcodes) if c.opcodes else "none in the SASS"
                out.append(f"  {'pass' if c.ok else 'FAIL':<5} {c.name:<10} {c.count:>6}  {ops}")
        else:
            out.append("fingerprint: none declared (not a registry stage)")
        out.append("")
        out.append("rules without counters (static SASS + compiler resource usage)")
        for f in a.evaluation.findings:
            out.append(f"  {f.code} {f.severity}: {f.title}")
            for e in f.evidence:
                out.append(f"      {e.metric} = {evidence_value(e.value)} ({e.threshold})")
            out.append(f"      fix: {f.fix}")
        for n in a.evaluation.not_evaluated:
            out.append(f"  {n.code} not evaluated: {n.reason}")
        if a.evaluation.silent:
            out.append(f"  silent: {', '.join(a.evaluation.silent)}")
        for note in a.notes:
            out.append(f"note: {note}")
        if a.listing is not None:
            out += ["", *_listing(a.listing)]
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def _listing(listing: HotListing) -> list[str]:
    """The hot loop, one instruction a line: offset, executions, samples, stalls, SASS."""
    if not listing.rows:
        return [f"hot loop: no listing ({listing.note})"]
    share = listing.samples / listing.total_samples if listing.total_samples else 0.0
    which = (f"hot loop: {len(listing.rows):,} instructions executed at least "
             f"{listing.hot_share:.0%} as often as the most executed" if listing.hot_share > 0
             else f"every instruction that ran: {len(listing.rows):,}")
    out = [f"{which}; {listing.samples:,} of the kernel's {listing.total_samples:,} warp "
           f"samples ({share:.0%})"]
    fd = listing.ffma_dispatch
    if fd is not None:
        out.append(f"FFMAs held at dispatch: {fd.share:.3f} of the samples; {fd.stalling:,} of "
                   f"the loop's {fd.ffmas:,} FFMAs on about every execution")
    out.append(f"  {'offset':>8} {'executed':>12} {'samples':>8}  {'top stalls':<34} instruction")
    for r in listing.rows:
        stalls = ", ".join(f"{k} {v}" for k, v in r.reasons)
        out.append(f"  {r.address:#8x} {r.executed:>12,} {r.samples:>8,}  {stalls:<34} {r.sass}")
    return out


RENDERERS: dict[str, Callable[..., str]] = {
    "diagnose": _diagnose, "diff": _diff, "rules": _rules, "bench": _bench,
    "profile": _profile, "kernels": _kernels, "audit": _audit, "tune": tune.render_console,
}
