"""The HTML diagnosis report: one self-contained file a reviewer opens from a pull request.

    from perfscope.render.html import build_report
    Path("index.html").write_text(build_report(["reports/reference/h200"]))

``render_html(review)`` is the renderer (a Review in, the page out); ``build_report`` is
the convenience that collects the review first.

Jinja2 with autoescaping on renders the template in ``templates/``; every name (C++
kernel names carry ``<``, ``>`` and quotes) reaches the page escaped. The ladder charts
are matplotlib's inline SVG (``perfscope.render.plots``); the per-kernel bars are plain
SVG the template draws from the numbers laid out here; styles are inline, and there is no
script and no external resource: the file works opened from disk with the network off.
Kernel cards are native ``<details>`` (the first OPEN_CARDS open) and the filter by
finding is CSS (``:target``), so nothing needs a script. The same input gives
byte-identical output, so the committed reference page can be checked by regenerating it.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from collections.abc import Iterable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from perfscope.bandwidth import TARGET_SHARE, UNFUSED, BandwidthPanel
from perfscope.calibration import SIGNIFICANT_SAVING, Step
from perfscope.documents import TUNE_RESULT_FILES
from perfscope.errors import PerfscopeError
from perfscope.families import FAMILY_BY_KEY
from perfscope.metrics import M_MEM_CLOCK_MAX, M_REPLAY_PASSES, M_SM_CLOCK_MAX
from perfscope.reader import REPORT_SUFFIXES, reader_label
from perfscope.render import plots, tune
from perfscope.render.diff import (
    REMAINING_HEADING,
    gap_line,
    structure_rows,
    table_rows,
    verdict_heading,
    verdict_lines,
)
from perfscope.render.summary import (
    NOT_COLLECTED,
    PARKED_MARK,
    Section,
    above_floor_text,
    clock,
    duration,
    finding_texts,
    headroom_note,
    ncu_remark,
    not_evaluated_text,
    num,
    sections,
)
from perfscope.review import Entry, Ladder, Review, collect, folder_reports
from perfscope.rules import SEVERITIES
from perfscope.source import MIN_LINE_SHARE
from perfscope.version import __version__, installed_version

log = logging.getLogger(__name__)

TEMPLATE = "report.html.j2"
TOP_STALLS = 6
TOP_FAMILIES = 6
TOP_TRAFFIC = 8
# Kernel cards open on arrival; the rest are closed (<details>) and open on a click.
OPEN_CARDS = 3


@cache
def _environment() -> jinja2.Environment:
    # autoescape=True for every template, whatever its suffix: nothing is ever inserted raw
    # unless it is a Markup value built here (the SVGs).
    return jinja2.Environment(loader=jinja2.PackageLoader("perfscope.render", "templates"),
                              autoescape=True, undefined=jinja2.StrictUndefined,
                              trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)


def generator() -> str:
    """What made the page: the versions its bytes depend on (matplotlib draws the SVGs; the
    report reader writes the SASS text, and 2026.3 writes it otherwise than 2025.3)."""
    return (f"perfscope {__version__}; matplotlib {installed_version('matplotlib') or 'not installed'}; "
            f"ncu-report {reader_label() or 'not installed'}")


# --------------------------------------------------------------------------- views


def _tflops(s) -> str:
    return NOT_COLLECTED if s is None else f"{s.median:,.1f}"


def _ladder_view(ladder: Ladder, index: int) -> dict[str, Any]:
    ref = ladder.reference_tflops
    # cuBLAS, or the group of launches fused stages are timed against (cublas+gelu).
    word = ladder.reference if ladder.reference and "+" in ladder.reference else "cuBLAS"
    bars, rows = [], []
    for p in ladder.points:
        ok = p.verdict == "ok" and p.tflops is not None
        if p.verdict != "ok":
            # A wrong answer is reported as wrong, never as fast: no bar.
            note = p.verdict
        elif p.tflops is None:
            note = "not timed"
        else:
            # The ratio measured round by round in the bench run, as the table shows it.
            ratio = p.ratio_to_reference if p.ratio_to_reference is not None else (
                p.tflops.median / ref.median if ref else None)
            note = f"{p.tflops.median:,.1f}" + ("" if ratio is None else f" ({ratio:.0%} of {word})")
            if p.beats:
                note += ", beats its default"
        bars.append(plots.Bar(p.label, p.tflops.median if ok else None,
                              p.tflops.min if ok else None, p.tflops.max if ok else None,
                              note, muted=p.variant))
        rows.append({
            "label": p.label + (" (variant)" if p.variant else ""), "verdict": p.verdict,
            "beats": p.beats,
            "tflops": f"{p.tflops.median:,.1f}" if ok else "-",
            "spread": f"{p.tflops.min:,.1f} – {p.tflops.max:,.1f}" if ok else "",
            "vs_ref": f"{p.ratio_to_reference:.1%}" if ok and p.ratio_to_reference is not None else "-",
            "vs_peak": f"{p.tflops.median / ladder.peak_tflops:.1%}" if ok and ladder.peak_tflops else "-",
            "clock": "-" if p.sm_clock_mhz is None else f"{p.sm_clock_mhz:.0f} MHz",
        })
    lines = []
    if ref is not None:
        lines.append(plots.Line(f"{word} {ref.median:,.0f}", ref.median, plots.REFERENCE))
    if ladder.peak_tflops is not None:
        lines.append(plots.Line(f"peak {ladder.peak_tflops:,.0f}", ladder.peak_tflops, plots.PEAK,
                                dashed=True))
    svg = plots.ladder(f"ladder{index}", f"{ladder.title}: TFLOP/s per stage", "TFLOP/s", bars, lines)
    return {"dtype": ladder.title, "svg": svg, "rows": rows, "ref_word": word,
            "wins": [w.sentence() for w in ladder.wins],
            "reference": ladder.reference, "reference_tflops": _tflops(ref),
            "reference_spread": "" if ref is None else f"{ref.min:,.1f} – {ref.max:,.1f}",
            "peak": "-" if ladder.peak_tflops is None else f"{ladder.peak_tflops:,.0f}",
            "peak_note": ladder.peak_note}


def _bandwidth_views(panels: Sequence[BandwidthPanel]) -> list[dict[str, Any]]:
    """Per dtype: perfscope's best candidate per small-M shape in GB/s of compulsory bytes,
    against the copy bandwidth and its TARGET_SHARE, and every candidate in a table. The
    bars hold the stages that read B as the references do; a stage that takes B packed
    (a changed input contract) gets a lighter bar of its own under its shape's, and is marked
    in the table."""
    views = []
    for dtype in dict.fromkeys(p.dtype for p in panels):
        mine = [p for p in panels if p.dtype == dtype]
        bars, rows = [], []
        for p in mine:
            best = p.best_fused
            rivals = [c for c in p.points if c.kind != "fused" and c.gbps is not None]
            rival = max(rivals, key=lambda c: c.gbps) if rivals else None
            # Short notes: longer ones push the axes to nothing under the constrained layout;
            # the rest (every candidate, the best other, the read-rate bound) is in the table.
            bars.append(plots.Bar(f"{p.m}x{p.n}x{p.k}", best.gbps if best else None,
                                  note=_bandwidth_note(best) if best else "no fused stage right and timed"))
            if (packed := p.best_packed) is not None:
                # A bar of its own, drawn as a variant: B packed once is another input contract.
                bars.append(plots.Bar(f"{p.m}x{p.n}x{p.k} B packed", packed.gbps,
                                      note=_bandwidth_note(packed), muted=True))
            bound = p.stream_bound()
            for c in p.points:
                rows.append({"shape": f"{p.m}x{p.n}x{p.k}", "epilogue": p.epilogue,
                             "label": c.label + (" (B packed once)" if c.packed else ""),
                             "kind": c.kind, "verdict": c.verdict,
                             "gbps": "-" if c.gbps is None else f"{c.gbps:,.0f}",
                             "share": "-" if c.share_of_copy is None else f"{c.share_of_copy:.0%}",
                             "stream": "-" if c.share_of_stream is None else f"{c.share_of_stream:.0%}",
                             "best": best is not None and c is best,
                             "other": rival is not None and c is rival,
                             "bound": f"{bound:.2f}x" if bound is not None and c.label == UNFUSED else ""})
        copy = mine[0].copy_gbps
        lines = [plots.Line(f"copy {copy:,.0f}", copy, plots.REFERENCE),
                 plots.Line(f"{TARGET_SHARE:.0%}", TARGET_SHARE * copy, plots.PEAK, dashed=True)]
        views.append({"dtype": dtype, "copy_gbps": f"{copy:,.0f}", "rows": rows,
                      "svg": plots.ladder(f"bandwidth-{dtype}",
                                          f"{dtype}: small-M shapes, compulsory bytes per second",
                                          "GB/s", bars, lines)})
    return views


def _bandwidth_note(p) -> str:
    """'3,648 GB/s, 85% of copy, hgemm_small_m'."""
    share = "" if p.share_of_copy is None else f", {p.share_of_copy:.0%} of copy"
    return f"{p.gbps:,.0f}{share}, {p.label}"


def _duration_view(entries: Sequence[Entry]) -> dict[str, Any]:
    """Without timings, the overview falls back to ncu's kernel durations."""
    bars = [plots.Bar(e.label, e.profile.sol.duration_ns / 1e3,
                      note=duration(e.profile.sol.duration_ns))
            if e.profile.sol.duration_ns is not None
            else plots.Bar(e.label, None, note=NOT_COLLECTED) for e in entries]
    return {"svg": plots.ladder("durations", "Kernel duration under Nsight Compute", "µs", bars, [])}


def _traffic_rows(kind: str, unit: str, traffic) -> list[dict[str, str]]:
    # Only the opcodes that move more than their ideal: the rest are at it.
    rows = [o for o in traffic.by_opcode if o.excess > 0]
    return [{"memory": kind, "opcode": o.opcode, "kind": o.kind, "instructions": f"{o.instructions:,}",
             "actual": num(o.actual), "ideal": num(o.ideal), "excess": num(o.excess),
             "unit": unit, "ratio": "-" if o.ratio is None else f"{o.ratio:.2f}x"}
            for o in rows[:TOP_TRAFFIC]]


def _manifest_rows(m) -> list[tuple[str, str]]:
    v = m.verification
    dims = "M x N x K" if m.batch == 1 else f"B x M x N x K, a batch of {m.batch}"
    rows = [(f"shape ({dims})", m.shape), ("dtype", m.dtype),
            ("parameters", ", ".join(f"{k}={v}" for k, v in m.params.items()) or "none"),
            ("verification", v.verdict + ("" if v.rel_fro_error is None else
                                          f" (relative error {v.rel_fro_error:.2e}, tolerance "
                                          f"{v.tolerance:.0e})") + (f": {v.detail}" if v.detail else ""))]
    t = m.timing
    if t is not None:
        rows.append(("event-timed", f"{t.tflops.median:,.1f} TFLOP/s (min {t.tflops.min:,.1f}, max "
                                    f"{t.tflops.max:,.1f}), {t.time_ms.median:.3f} ms"))
        if t.ratio_to_reference is not None:
            rows.append((f"against {t.reference}", f"{t.ratio_to_reference.median:.1%} of its TFLOP/s"))
        if t.sm_clock_mhz is not None:
            rows.append(("SM clock while timing (NVML, between launches)",
                         f"{t.sm_clock_mhz.median:.0f} MHz"))
    c = m.compile
    if c is not None:
        res = ", ".join(f"{k} {v}" for k, v in c.resources.items())
        rows += [("compiled", f"{c.name_expression} for {c.arch} (NVRTC {c.nvrtc})"),
                 ("compiler resources", res or NOT_COLLECTED)]
    return rows


def _stall_shares(kp) -> list[tuple[str, float]]:
    out = []
    for s in kp.stalls.reasons:
        share = kp.stalls.share(s.reason)
        if share:
            out.append((s.reason, share))
    return out[:TOP_STALLS]


def _family_shares(kp) -> list[tuple[str, float]]:
    total = kp.opcodes.total
    if not total:
        return []
    fams = sorted(kp.opcodes.families.items(), key=lambda kv: (-kv[1], kv[0]))
    return [(FAMILY_BY_KEY[k].label, v / total) for k, v in fams if v > 0][:TOP_FAMILIES]


# The per-kernel bar panels are drawn by the template as plain SVG from these numbers
# (matplotlib took most of the page's build time for 27 cards of three panels each).
PANEL_WIDTH = 330
LABEL_WIDTH = 118
BAR_WIDTH = 160
ROW_HEIGHT = 16
LABEL_CHARS = 20
# Bar colours, as classes of the page's style sheet.
SOL_COLOUR, MEMORY_COLOUR, STALL_COLOUR, FAMILY_COLOUR = "sol", "mem", "stall", "fam"


def _short(label: str, chars: int = LABEL_CHARS) -> str:
    return label if len(label) <= chars else label[: chars - 1] + "\u2026"


def _bar(y: int, width: float) -> str:
    """One bar as an SVG path segment (a panel's bars of one colour are one path)."""
    return f"M{LABEL_WIDTH} {y + 1}h{width:.4g}v12H{LABEL_WIDTH}z"


def _panel(title: str, rows: Sequence[tuple[str, float | None, str]]) -> dict[str, Any]:
    """One bar panel: (label, percent or None, colour) rows, laid out for the template."""
    out, paths = [], {}
    for i, (label, pct, colour) in enumerate(rows):
        y = i * ROW_HEIGHT
        if pct is not None:
            paths.setdefault(colour, []).append(_bar(y, BAR_WIDTH * max(0.0, min(pct, 100.0)) / 100))
        out.append({"y": y, "short": _short(label),
                    "text": NOT_COLLECTED if pct is None else f"{pct:.0f}%"})
    return {"title": title, "rows": out if paths else [], "height": len(out) * ROW_HEIGHT,
            "paths": [(colour, "".join(d)) for colour, d in paths.items()]}


def _panels(kp) -> list[dict[str, Any]]:
    sol = [("compute (SM)", kp.sol.sm_pct, SOL_COLOUR), ("memory", kp.sol.memory_pct, MEMORY_COLOUR),
           ("DRAM", kp.sol.dram_pct, MEMORY_COLOUR), ("L1/TEX", kp.sol.l1tex_pct, MEMORY_COLOUR),
           ("L2", kp.sol.l2_pct, MEMORY_COLOUR)]
    return [_panel("Speed of light (% of peak)", sol),
            _panel("Warp stalls (share of stall cycles)",
                   [(k, 100 * v, STALL_COLOUR) for k, v in _stall_shares(kp)]),
            _panel("Executed opcode families (share)",
                   [(k, 100 * v, FAMILY_COLOUR) for k, v in _family_shares(kp)])]


# What the card's facts leave out because another part of the card shows it: the panels
# (speed of light, opcode mix), the source view (hotspots), the card's title line (the name)
# and the memory-traffic table (excess per opcode, the indented rows).
_SHOWN_ELSEWHERE = ("Hotspots", "Speed of light", "Opcode families", "Top stalls")


def _facts(kp, reads=None) -> list[Section]:
    out = []
    for sec in sections(kp, reads=reads):
        if sec.title in _SHOWN_ELSEWHERE:
            continue
        rows = tuple(r for r in sec.rows if r[0] != "name" and not r[0].startswith("  "))
        out.append(Section(sec.title, rows))
    return out


# The side-by-side table keeps the rows where A and B differ: by this factor, or one side
# only; the time rows always.
SBS_DIFFERS = 1.10


def _differing_rows(rows: Sequence[tuple[str, str, str, str]]) -> list[tuple[str, str, str, str]]:
    """The side-by-side rows worth a reader's eye (SBS_DIFFERS), with their group headings."""
    out: list[tuple[str, str, str, str]] = []
    group = ""
    for q, a, b, r in rows:
        if q.startswith("["):
            group = q
            out.append((q, a, b, r))
            continue
        if group == "[time]" or (a != b and (not r or _far(r))):
            out.append((q, a, b, r))
    # A group whose rows all matched is dropped with its heading.
    return [row for i, row in enumerate(out)
            if not row[0].startswith("[") or (i + 1 < len(out) and not out[i + 1][0].startswith("["))]


def _far(ratio: str) -> bool:
    """Whether a ratio cell ("1.40x", "+12%") says the two sides differ enough to show."""
    try:
        if ratio.endswith("x"):
            v = float(ratio[:-1].replace(",", ""))
            return v >= SBS_DIFFERS or v <= 1 / SBS_DIFFERS
        if ratio.endswith("%"):
            return abs(float(ratio[:-1])) >= 100 * (SBS_DIFFERS - 1)
    except ValueError:
        return True
    return True


def _hotspot_rows(kp) -> list[dict[str, str]]:
    total = kp.stalls.total_samples
    parked = {a for p in kp.parked for a in p.addresses}
    return [{"address": f"0x{h.address:04x}", "sass": h.sass or h.opcode,
             "samples": f"{h.samples:,}",
             "share": "" if not total else f"{100 * h.samples / total:.1f}%",
             "reasons": ", ".join(f"{r} {n:,}" for r, n in h.reasons)
             + (f" ({PARKED_MARK})" if h.address in parked else ""),
             "source": f"{h.file.rsplit('/', 1)[-1]}:{h.line}" if h.file and h.line else ""}
            for h in kp.hotspots]


def _reasons_text(reasons) -> str:
    return ", ".join(f"{r} {n:,}" for r, n in reasons)


def _source_view(e: Entry) -> dict[str, Any]:
    """The hottest source lines with their SASS, as the template shows them side by side."""
    view = e.source
    lines = []
    for ln in view.lines:
        lines.append({
            "where": f"{ln.file.rsplit('/', 1)[-1]}:{ln.line}", "text": ln.text,
            "context": list(ln.context),
            "samples": f"{ln.samples:,}", "share": "" if ln.share is None else f"{ln.share:.1%}",
            "reasons": _reasons_text(ln.reasons),
            "sass": [{"address": f"0x{s.address:04x}", "sass": s.sass, "samples": f"{s.samples:,}",
                      "reasons": _reasons_text(s.reasons)} for s in ln.sass],
            "more": "" if not ln.other_sass else
            f"+{ln.other_sass} more instruction{'s' if ln.other_sass != 1 else ''} of this line, "
            f"{ln.other_samples:,} samples",
        })
    cover = view.coverage
    return {"lines": lines, "note": view.note,
            "files": [{"origin": f.origin, "note": f.note, "text": f.has_text} for f in view.files],
            "coverage": "" if cover is None or not lines else
            f"{view.line_samples:,} of {view.total_samples:,} samples ({cover:.0%}) sit on source "
            f"lines; the {len(lines)} hottest are shown (those with {MIN_LINE_SHARE:.0%} of the "
            "samples or more)"}


def _change_line(c, parent_shown: bool) -> str:
    """What the comparison holds against what: the stages' own one-sentence intents (A's
    only once per card: the parent comparison says it, the cuBLAS one then names B)."""
    a, b = c.a.record.stage, c.b.record.stage
    if a is None:
        return ""
    if c.kind == "parent stage":
        return f"What A changes against B: {a.change}"
    text = "" if parent_shown else f"A: {a.change}"
    if b is not None and b.change:
        text += (" " if text else "") + f"B: {b.change}"
    return text


def _comparison_view(c, parent_shown: bool = False) -> dict[str, Any]:
    diff = c.diff
    cyc = next((r for r in diff.time if r.name == "cycles"), None)
    dur = next((r for r in diff.time if r.name == "duration ns"), None)
    parts = []
    if cyc is not None and cyc.ratio is not None:
        saved = f" ({1 - cyc.ratio:.0%} fewer)" if cyc.ratio < 1 else ""
        parts.append(f"{cyc.ratio:.2f}x B's cycles{saved}")
    if dur is not None and dur.ratio is not None:
        parts.append(f"{dur.ratio:.2f}x its time under ncu")
    return {"kind": c.kind, "a": c.a.label, "b": c.b.label, "b_key": c.b.key,
            "change": _change_line(c, parent_shown), "improved": diff.improved,
            "headline": "A takes " + " and ".join(parts) if parts else "",
            "sections": _verdict_sections(c),
            "gap": " ".join(x for x in (gap_line(diff), diff.clock) if x) or None,
            # Aspects that read the same on both sides are named in one line, not a row each.
            "structure": [r for r in structure_rows(diff) if r[1] != r[2]]
            if any(x.differs for x in diff.structure) else [],
            "same_structure": "; ".join(f"{x.name} ({x.a})" for x in diff.structure if x.a == x.b),
            "warnings": list(diff.warnings),
            "rows": _differing_rows(table_rows(diff))}


_CLASS_SAFE = re.compile(r"[^A-Za-z0-9_-]")


def _verdict_sections(c) -> list[tuple[str, list[str]]]:
    """The verdict under its heading, then (when A improved) what remains in A.

    The card shows A's findings with their evidence and fixes just above, so a reason that
    is one of them points there instead of repeating its fix, and what remains is named
    by code and estimate only."""
    diff = c.diff
    shown = {f.code for f in c.a.evaluation.findings}
    lines = []
    for r in diff.verdict:
        fix = "" if diff.improved or not r.fix else (
            " (fix above)" if r.code in shown else f" Fix: {r.fix}")
        lines.append(r.sentence + fix)
    if not lines:
        lines = [_NUMBERED.sub("", x) for x in verdict_lines(diff)]
    out = [(verdict_heading(diff), lines)]
    if diff.improved:
        remaining = [f"{f.code} {f.title}" + ("" if f.estimated_gain is None else
                                               f" (est. {f.estimated_gain:.0%} of A's time)")
                     for f in c.a.evaluation.findings]
        out.append((REMAINING_HEADING, remaining or ["No perfscope finding is left in A."]))
    return out


# The shared text lines carry "1. " for plain text; the page numbers reasons with <ol>.
_NUMBERED = re.compile(r"^\d+\. ")


def _code_class(code: str) -> str:
    """A finding code as a CSS class and id part (codes are PS1xx; anything else is made safe)."""
    return _CLASS_SAFE.sub("_", code)


def _bounds(evaluation) -> str:
    """The rules' bounds on this kernel's estimates, in one line (when the rules give them)."""
    room = getattr(evaluation, "headroom", None)
    fraction = getattr(room, "fraction", None)
    combined = getattr(evaluation, "combined_gain", getattr(evaluation, "combined", None))
    parts = []
    if fraction is not None:
        parts.append(f"headroom {fraction:.0%} of its time (1 - t_min/t at the roofline)")
    if (above := above_floor_text(evaluation)) is not None:
        parts.append(above)
    if combined is not None:
        parts.append(f"its findings together est. {combined:.0%} (overlapping fixes counted once)")
    if (note := headroom_note(evaluation)) is not None:
        parts.append(note)
    return "; ".join(parts)


def _entry_view(report: Review, e: Entry, index: int) -> dict[str, Any]:
    kp = e.profile
    secs = _facts(kp, e.record.reads)
    mem = kp.memory
    spill = []
    if mem.spill_instructions is not None:
        spill.append(("spilling instructions executed", num(mem.spill_instructions)))
    rules = [r for r in kp.ncu_rules if r.type != "ok"]
    codes = sorted({f.code for f in e.evaluation.findings})
    stage = e.record.stage
    return {
        "key": e.key, "label": e.label, "name": kp.identity.demangled or kp.name, "file": e.file,
        "stage": e.stage, "change": stage.change if stage is not None else "",
        "open": index < OPEN_CARDS,
        "classes": " ".join(f"f-{_code_class(c)}" for c in codes),
        "duration": duration(kp.sol.duration_ns), "cycles": num(kp.identity.cycles),
        "clock": clock(kp.identity.sm_clock_hz), "device": kp.identity.device or NOT_COLLECTED,
        "findings_count": len(e.evaluation.findings),
        "worst": e.evaluation.findings[0].severity if e.evaluation.findings else "none",
        "panels": _panels(kp),
        "sections": secs,
        "traffic": _traffic_rows("shared", "wavefronts", mem.shared)
        + _traffic_rows("global", "sectors", mem.global_),
        "spill": spill,
        "hotspots": _hotspot_rows(kp),
        "source": _source_view(e),
        "findings": finding_texts(e.evaluation),
        "bounds": _bounds(e.evaluation),
        "not_evaluated": not_evaluated_text(e.evaluation),
        "ncu_rules": [{"type": r.type, "id": r.identifier, "title": r.title,
                       "message": _abridged(r.message),
                       # A reference Nsight Compute's text names, as a link (to its docs:
                       # a link is followed by the reader, nothing is fetched by the page).
                       "links": [(label, url) for label, url in r.links
                                 if label in _abridged(r.message)],
                       "remark": ncu_remark(kp, r.identifier, r.title) or "",
                       "speedup": "" if r.speedup_pct is None else
                       f"est. {r.speedup_pct:.1f}% {r.speedup_type or ''}".rstrip()} for r in rules],
        "manifest": _manifest_rows(e.manifest) if e.manifest is not None else [],
        "comparisons": _comparisons(report, e),
    }


NCU_MESSAGE_CHARS = 120


def _abridged(message: str, limit: int = NCU_MESSAGE_CHARS) -> str:
    """Nsight Compute's message up to the last sentence that fits in limit characters."""
    if len(message) <= limit:
        return message
    cut = message[:limit]
    end = cut.rfind(". ")
    return (cut[: end + 1] if end > limit // 3 else cut.rstrip()) + " \u2026"


def _comparisons(report: Review, e: Entry) -> list[dict[str, Any]]:
    out, parent = [], False
    for c in report.comparisons_of(e):
        out.append(_comparison_view(c, parent))
        parent = parent or c.kind == "parent stage"
    return out


def _finding_index(report: Review) -> list[dict[str, Any]]:
    """Every finding code on the page, with the kernels it fires on: the filter by finding."""
    by_code: dict[str, dict[str, Any]] = {}
    for e in report.entries:
        for f in e.evaluation.findings:
            row = by_code.setdefault(f.code, {"code": f.code, "id": _code_class(f.code),
                                              "title": f.title, "kernels": [], "worst": f.severity})
            if all(k["key"] != e.key for k in row["kernels"]):
                row["kernels"].append({"key": e.key, "label": e.label})
            if SEVERITIES.index(f.severity) > SEVERITIES.index(row["worst"]):
                row["worst"] = f.severity
    return [by_code[c] for c in sorted(by_code)]


def _tuning_section(report: Review) -> Markup | None:
    """The "Tuning" section: perfscope.render.tune's fragment (a whole <section> of its own)
    for the review's tune results; None, and nothing on the page, while it has none."""
    return None if report.tune is None else tune.html_section(report.tune, per_shape=False)


def _metric(kp, name: str) -> float | None:
    return kp.metric(name)


def _explained_cell(s: Step) -> str:
    """A slower step's loss (a share of the child's time) and what the diff of its two
    reports gives a share of it; '-' where the child was not slower or not profiled."""
    if s.explained is None or s.loss is None:
        return "-"
    named = ", ".join(f"{label} {share:.0%}" for label, share in s.explained) or "nothing"
    return f"lost {s.loss:.0%}: {named}"


def _calibration_view(report: Review) -> dict[str, Any] | None:
    """The calibration table: each ladder step's predicted saving against the measured one."""
    cal = report.calibration
    if cal is None:
        return None
    rows = [{"step": f"{s.parent} → {s.child}" + (f" (through {s.through})" if s.through else ""),
             "partial": s.partial, "dtype": s.dtype, "shape": s.shape or "-",
             "estimates": ", ".join(f"{c} {g:.0%}" for c, g in s.estimates) or "none fired",
             "addresses": ", ".join(s.codes) or "-", "predicted": f"{s.predicted:.0%}",
             "measured": "-" if s.pending else f"{s.measured:.0%}",
             "error": "-" if s.error is None else f"{s.error:.2f}", "variant": s.variant,
             "acts": s.acts, "missed": s.missed, "pending": s.pending,
             "explained": _explained_cell(s), "unexplained": s.unexplained} for s in cal.steps]
    median = cal.median_abs_error
    return {"rows": rows, "source": cal.source, "counted": len(cal.counted),
            "median": "-" if median is None else f"{median:.3f}",
            "missed": [f"{s.parent} → {s.child} ({s.dtype})" for s in cal.missed],
            "unexplained": [f"{s.parent} → {s.child} ({s.dtype}, {s.shape})"
                            for s in cal.unexplained],
            "per_rule": [(code, f"{err:.3f}") for code, err in cal.per_rule().items()],
            "significant": f"{SIGNIFICANT_SAVING:.0%}"}


def _conditions(report: Review) -> dict[str, Any]:
    gpus: dict[tuple, dict[str, str]] = {}
    kernels = []
    for e in report.entries:
        kp, i = e.profile, e.profile.identity
        max_khz = _metric(kp, M_SM_CLOCK_MAX)
        mem_khz = _metric(kp, M_MEM_CLOCK_MAX)
        gpus.setdefault((i.device, i.compute_capability, i.sm_count), {
            "device": i.device or NOT_COLLECTED,
            "cc": i.compute_capability or NOT_COLLECTED,
            "sms": num(i.sm_count), "max_clock": clock(max_khz * 1e3 if max_khz else None),
            "max_mem_clock": clock(mem_khz * 1e3 if mem_khz else None)})
        passes = _metric(kp, M_REPLAY_PASSES)
        kernels.append({"key": e.key, "label": e.label, "file": e.file,
                        "clock": clock(i.sm_clock_hz), "mem_clock": clock(i.mem_clock_hz),
                        "cycles": num(i.cycles), "duration": duration(kp.sol.duration_ns),
                        "passes": num(passes), "reader": i.reader_version or NOT_COLLECTED})
    bench = report.bench
    env_rows: list[tuple[str, str]] = []
    timing_rows: list[tuple[str, str]] = []
    if bench is not None and bench.environment is not None:
        env = bench.environment
        env_rows = [("GPU", f"{env.gpu} (compute capability {env.compute_capability}, {env.sm_count} SMs)"),
                    ("driver", f"{env.driver} (CUDA {env.cuda_driver})"),
                    ("CUDA runtime / NVRTC", f"{env.cuda_runtime} / {env.nvrtc}"),
                    ("cuBLAS", env.cublas), ("CuPy", env.cupy), ("cuda-bindings", env.cuda_bindings),
                    ("ml_dtypes", env.ml_dtypes), ("Python", env.python)]
        env_rows += sorted(env.extra.items())
    if bench is not None:
        timings = [m.timing for m in bench.manifests if m.timing is not None]
        timed = timings[0] if timings else None
        if timed is not None:
            low, high = min(t.rounds for t in timings), max(t.rounds for t in timings)
            rounds = f"{low}" if low == high else f"{low}-{high}"
            if timed.until is not None:
                rounds += (f" (until each ratio's interval was within +-{timed.until:.1%} of it, "
                           f"at most {timed.max_rounds})")
            timing_rows.append(("timing method", f"CUDA events, {timed.runs_per_round} runs x "
                                f"{rounds} rounds after {timed.warmup} warm-up runs, L2 flushed "
                                f"by {'reading' if timed.l2_flush == 'read' else 'writing'} "
                                f"{timed.l2_flush_bytes / 2**20:.0f} MiB between runs"))
        timing_rows += [("bench command", bench.command or NOT_COLLECTED),
                        ("bench created", bench.created or NOT_COLLECTED)]
    return {"gpus": list(gpus.values()), "kernels": kernels, "environment": env_rows,
            "timing": timing_rows, "command": report.command, "generator": generator(),
            "machine": list(report.machine)}


def render_html(report: Review) -> str:
    """The page for a Review."""
    ladders = [_ladder_view(ld, i) for i, ld in enumerate(report.ladders)]
    context = {
        "bandwidth": _bandwidth_views(report.bandwidth),
        "bandwidth_source": report.bandwidth_source,
        "title": report.title,
        "generator": generator(),
        "ladders": ladders,
        "variant_wins": [w.sentence() for w in report.variant_wins],
        "timing_source": report.timing_source,
        "durations": None if ladders else _duration_view(report.entries),
        "entries": [_entry_view(report, e, i) for i, e in enumerate(report.entries)],
        "finding_index": _finding_index(report),
        "tuning": _tuning_section(report),
        "calibration": _calibration_view(report),
        "conditions": _conditions(report),
        "warnings": list(report.warnings),
        "comparison_count": len(report.comparisons),
        "open_cards": OPEN_CARDS,
        "panel": {"width": PANEL_WIDTH, "label": LABEL_WIDTH, "bar": BAR_WIDTH, "row": ROW_HEIGHT},
    }
    return _environment().get_template(TEMPLATE).render(**context)


def build_report(paths: Iterable[str | os.PathLike[str]], *, bench: str | os.PathLike[str] | None = None,
                 kernel: str | None = None, title: str | None = None, command: str | None = None,
                 tune: str | os.PathLike[str] | None = None) -> str:
    """The HTML report of every kernel in the reports under paths (files or folders), with the
    Tuning section when tune results are given or lie in the first folder (review.collect)."""
    return render_html(collect(paths, bench=bench, kernel=kernel, title=title, command=command,
                               tune=tune))


def write_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write text to path so that a failure leaves what was there intact.

    A missing or regular file is replaced atomically (a temporary file renamed over it); a
    symbolic link is followed and its target replaced the same way, so the link survives;
    anything else (a terminal, /dev/stdout, a FIFO) is written through, never replaced.
    """
    out = Path(path)
    if out.is_dir():
        raise PerfscopeError(f"{path} is a folder; name the HTML file to write.")
    # /dev/stdout links through /proc/self/fd to a pipe ("pipe:[123]", no real path) or to
    # the file the shell redirected into, whose open descriptor a rename would orphan:
    # whatever sits under /dev or /proc is written through, as is any non-regular file.
    special = str(out.absolute()).startswith(("/dev/", "/proc/")) or (
        out.exists() and not Path(os.path.realpath(out)).is_file())
    if special:
        with open(out, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        return out
    if out.is_symlink():
        out = Path(os.path.realpath(out))
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        # mkstemp makes the file private; a report is meant to be read by others.
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    log.info("wrote %s (%d bytes)", out, len(text.encode()))
    return out


def check_output(path: Path, inputs: Iterable[str | os.PathLike[str]]) -> None:
    """Refuse to write the page over a report: a shell glob that put the page's name among
    the inputs, or a report's own name, would overwrite a capture with HTML."""
    if path.name.endswith(REPORT_SUFFIXES):
        raise PerfscopeError(f"{path} is a report file name; the HTML page needs another name "
                             "(e.g. --html index.html).")
    target = path.resolve()
    for given in map(Path, inputs):
        if given.resolve() == target:
            raise PerfscopeError(f"{path} is one of the inputs; the HTML page needs another name "
                                 "(was a shell glob expanded after --html?).")


def write_page(path: str | os.PathLike[str], review: Review,
               inputs: Iterable[str | os.PathLike[str]] = ()) -> Path:
    """Render review and write it to path (never over an input or a report)."""
    out = Path(path)
    check_output(out, inputs)
    try:
        return write_atomic(out, render_html(review))
    except OSError as exc:
        raise PerfscopeError(f"cannot write {path}: {exc.strerror or exc}.") from None


RENDERERS = {"review": render_html}

REFERENCE_TITLE = "perfscope reference run: the GEMM ladders on NVIDIA H200"
# What regenerates the reference folder (and this page at its end).
REFERENCE_COMMAND = "PYTHONPATH=. python3 benchmarks/reference_run.py"


FUSED_DIR = "fused"
FUSED_TITLE = "perfscope fused epilogues on NVIDIA H200: against cuBLAS + an elementwise pass"
FUSED_COMMAND = ("PYTHONPATH=. python3 benchmarks/bench_fused.py; perfscope profile "
                 "hgemm_small_m cublas+gelu --dtype bf16 --shape 64x8192x8192")


FP8_DIR = "fp8"
FP8_TITLE = "perfscope FP8 inputs on NVIDIA H200: hgemm_fp8 against cuBLASLt's fp8 matmul"
FP8_COMMAND = ("perfscope profile hgemm_fp8 cublaslt_fp8gemm cublaslt_fp8gemm_precise --dtype fp8; "
               "perfscope bench hgemm_fp8 --dtype fp8 --shape 4096x4096x4096 --rounds 5")
# The bench file whose ratios the fp8 page shows: the shape its reports were profiled at.
FP8_BENCH = "bench-fp8-4096x4096x4096.json"


def reference_page(folder: str | os.PathLike[str]) -> str:
    """The committed reference run's index.html, from the ladder's reports (the folder's
    own, not its subfolders': fused/ has a page of its own) and the bench.json in folder."""
    root = Path(folder)
    bench = root / "bench.json"
    tune = next((root / name for name in TUNE_RESULT_FILES if (root / name).is_file()), None)
    return build_report(folder_reports(root), bench=bench if bench.is_file() else None,
                        tune=tune, title=REFERENCE_TITLE,
                        command=REFERENCE_COMMAND)


def fused_page(folder: str | os.PathLike[str]) -> str:
    """fused/index.html of the reference run: the fused stages' and their groups' reports,
    with bench-fused.json (each fused stage against cublas+gelu) as the overview and the
    fused check beside them (fused_check.json.xz) as the small-M shapes by bandwidth."""
    root = Path(folder)
    bench = root / "bench-fused.json"
    return build_report([root], bench=bench if bench.is_file() else None, title=FUSED_TITLE,
                        command=FUSED_COMMAND)


def fp8_page(folder: str | os.PathLike[str]) -> str:
    """fp8/index.html of the reference run: hgemm_fp8's and cuBLASLt's two fp8 builds'
    reports, with the 4096^3 bench file (hgemm_fp8 against cuBLASLt's fast accumulation)."""
    root = Path(folder)
    bench = root / FP8_BENCH
    return build_report([root], bench=bench if bench.is_file() else None, title=FP8_TITLE,
                        command=FP8_COMMAND)
