"""`perfscope tune` results: a console table, Markdown, and an HTML section with a plot per shape.

One row per (stage, dtype, shape): the best configuration, its ratio to cuBLAS (median of
the rounds, with their min and max; for a fused stage to its group, ``cublas+gelu``, named
in the cell and the geometric mean), its TFLOP/s, the default configuration's ratio
beside it, and how many configurations were timed, wrong, failed or pruned. Below: the
geometric mean of the best ratios per stage and dtype, where the time went (compiling in
parallel against the same compiles one after another, verifying, timing), and for each
shape that was profiled, why the best configuration beats the worst in perfscope's own
findings. A WRONG or failed configuration never shows a speed.

The HTML section (``html_section``) is a fragment for the review page: a table and an
inline SVG per shape of the ratio of every configuration, best first, against the cuBLAS
line; it needs no script and no network, and escapes every name.
"""

from __future__ import annotations

import io
import shutil
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from markupsafe import Markup, escape
from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

from perfscope.render.summary import md_cell

if TYPE_CHECKING:
    from perfscope.documents import TuneDocument, TuneShapeResult, TuneStats, TuneTrial
    from perfscope.manifest import Spread

COLUMNS = ("stage", "dtype", "MxNxK", "best configuration", "vs cuBLAS median (min-max)",
           "TFLOP/s", "NVML MHz", "default vs cuBLAS", "timed / wrong / failed / pruned")


def _ratio(s: Spread | None) -> str:
    return "-" if s is None else f"{s.median:.3f} ({s.min:.3f}-{s.max:.3f})"


def _short_ratio(t: TuneTrial | None) -> str:
    if t is None:
        return "not measured"
    if t.ratio is None:
        return t.verdict
    return f"{t.ratio.median:.3f}"


def result_row(r: TuneShapeResult) -> tuple[str, ...]:
    """The plain-text cells of one shape's row, shared by the console and Markdown."""
    best = r.best
    counts = (f"{len(r.timed)} / {r.count('WRONG')} / {r.count('error')} / {len(r.pruned)}")
    if best is None:
        return (r.stage, r.dtype, r.shape, "none verified", "-", "-", "-", _short_ratio(r.default),
                counts)
    confirmed = " (confirmed)" if best.phase == "confirm" else ""
    against = "" if r.reference == "cuBLAS" else f" vs {r.reference}"
    spills = f" (spills {best.spill_bytes} B)" if best.spill_bytes else ""
    return (r.stage, r.dtype, r.shape, best.config + spills, _ratio(best.ratio) + confirmed + against,
            f"{best.tflops:.1f}" if best.tflops is not None else "-",
            f"{best.sm_mhz:.0f}" if best.sm_mhz is not None else "-", _short_ratio(r.default), counts)


def geomean_lines(doc: TuneDocument) -> list[str]:
    """One sentence per (stage, dtype): the geometric mean of its best ratios."""
    refs = {(r.stage, r.dtype): r.reference for r in doc.results}
    return [f"geometric mean of the best ratios to {refs.get((stage, dtype), 'cuBLAS')}, {stage} "
            f"({dtype}): {g:.3f} over {n} shape(s), {at} at 1.00 or better"
            for stage, dtype, g, n, at in doc.geomeans()]


def stats_lines(s: TuneStats) -> list[str]:
    """Where the run's time went, in plain sentences."""
    lines = []
    if s.compiled:
        # A cubin read from the cache says nothing about compiling in parallel.
        fresh = s.compiled > s.compiled_cached
        speed = (f", {s.compile_speedup:.1f}x over one after another"
                 if s.compile_speedup and fresh else "")
        lines.append(f"compile: {s.compiled} configuration(s) in {s.compile_wall_s:.1f} s on "
                     f"{s.compile_processes} process(es) ({s.compile_serial_s:.1f} s of compiles "
                     f"added up{speed}); {s.compiled_cached} from the cubin cache")
    else:
        lines.append("compile: nothing to compile (the store knew every configuration)")
    lines.append(f"pruned: {s.pruned_static} before compiling, {s.pruned_compiled} after (ptxas)")
    lines.append(f"trials: {s.trials_run} run, {s.trials_resumed} already in the store, "
                 f"{s.wrong} wrong, {s.errors} failed, {s.confirmed} confirmed at length")
    lines.append(f"time: verifying {s.verify_s:.1f} s and timing {s.time_s:.1f} s (on the workers); "
                 f"search {s.search_wall_s:.1f} s, confirm {s.confirm_wall_s:.1f} s, profiles "
                 f"{s.profile_wall_s:.1f} s; wall {s.wall_s:.1f} s on {s.workers} {s.executor} "
                 "worker(s)")
    if s.stopped:
        lines.append(f"stopped early: {s.stopped}")
    return lines


def diff_lines(r: TuneShapeResult) -> list[str]:
    """Why the best configuration beats the worst at this shape, from the ncu diff."""
    d = r.diff
    if d is None:
        return []
    head = f"{r.stage} {r.dtype} {r.shape}: best {d.best} ({_short_ratio(r.best)}) against worst " \
           f"{d.worst} ({_short_ratio(r.worst)})"
    if d.error:
        return [head, f"  not profiled: {d.error}"]
    if d.cycles_ratio is not None:
        head += f": the worst takes {d.cycles_ratio:.2f}x the cycles"
    lines = [head]
    lines += [f"  {v}" for v in d.verdict]
    if d.new_findings:
        lines.append("  only the worst: " + "; ".join(d.new_findings))
    if d.gone_findings:
        lines.append("  only the best: " + "; ".join(d.gone_findings))
    return lines


def _header(doc: TuneDocument) -> str:
    env = dict(doc.environment)
    gpu = env.get("gpu", "?")
    return f"perfscope tune on {gpu} ({env.get('gpus', '?')} worker(s)); store {doc.store}"


# --------------------------------------------------------------------------- console


def _text(parts: Iterable[RenderableType], color: bool, width: int | None) -> str:
    buf = io.StringIO()
    console = Console(file=buf, width=width or shutil.get_terminal_size((140, 24)).columns,
                      force_terminal=color, color_system="standard" if color else None,
                      no_color=not color, highlight=False, soft_wrap=False)
    for part in parts:
        console.print(part)
    return buf.getvalue()


def render_console(doc: TuneDocument, color: bool = False, width: int | None = None) -> str:
    """The table, the geometric means, the costs and the diffs, for a terminal."""
    table = Table(*COLUMNS, title=_header(doc), title_justify="left")
    for r in doc.results:
        table.add_row(*(Text(c) for c in result_row(r)))
    parts: list[RenderableType] = [table]
    parts += [Text(line, style="bold") for line in geomean_lines(doc)]
    parts += [Text(line, style="dim") for line in stats_lines(doc.stats)]
    diffs = [line for r in doc.results for line in diff_lines(r)]
    if diffs:
        parts.append(Text("why the best configuration wins (ncu, worst against best)",
                          style="bold magenta"))
        parts += [Text(line) for line in diffs]
    parts += [Text(f"note: {n}", style="yellow") for n in doc.notes]
    return _text(parts, color, width)


# -------------------------------------------------------------------------- markdown


def environment_line(doc: TuneDocument) -> str:
    """GPU, driver, toolchain and clocks in one line."""
    return "; ".join(f"{k} {v}" for k, v in doc.environment)


def render_markdown(doc: TuneDocument, **_options: Any) -> str:
    """The same as the console, for a pull-request comment."""
    lines = [f"### {md_cell(_header(doc))}", "", f"<sub>{md_cell(environment_line(doc))}</sub>", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(md_cell(c) for c in result_row(r)) + " |" for r in doc.results]
    lines.append("")
    lines += [f"**{md_cell(line)}**" for line in geomean_lines(doc)]
    lines += ["", *[f"- {md_cell(line)}" for line in stats_lines(doc.stats)], ""]
    diffs = [r for r in doc.results if r.diff is not None]
    if diffs:
        lines += ["<details><summary>Why the best configuration wins (ncu diff, worst against "
                  "best)</summary>", ""]
        for r in diffs:
            head, *rest = diff_lines(r)
            lines.append(f"- {md_cell(head)}")
            lines += [f"  - {md_cell(x.strip())}" for x in rest]
        lines += ["", "</details>", ""]
    lines += [f"> {md_cell(n)}" for n in doc.notes]
    return "\n".join(lines).rstrip() + "\n"


# ------------------------------------------------------------------------------ HTML

INK, MUTED, BEST, DOT, WRONG, REFERENCE = "#1f2933", "#8a94a0", "#0f766e", "#3b6ea8", "#b91c1c", "#c2410c"


def _frame(title: str, box: tuple[int, int, int, int], span: tuple[float, float],
           y: Callable[[float], float]) -> list[str]:
    """An SVG's opening, its ratio grid (ticks over span) and the cuBLAS line at 1.0;
    box is (width, height, left margin, right margin)."""
    width, height, left, right = box
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" font-family="DejaVu Sans, sans-serif" '
             f'font-size="9"><title>{escape(title)}</title>']
    for tick in _ticks(*span):
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" '
                     f'stroke="#e5e7eb" stroke-width="0.6"/><text x="{left - 4}" y="{y(tick) + 3:.1f}" '
                     f'text-anchor="end" fill="{INK}">{tick:.2f}</text>')
    parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y(1.0):.1f}" y2="{y(1.0):.1f}" '
                 f'stroke="{REFERENCE}" stroke-dasharray="4 3" stroke-width="1"/>'
                 f'<text x="{width - right}" y="{y(1.0) - 3:.1f}" text-anchor="end" '
                 f'fill="{REFERENCE}">cuBLAS</text>')
    return parts


def ratio_plot(r: TuneShapeResult, width: int = 420, height: int = 170) -> Markup:
    """Every configuration's ratio to cuBLAS at one shape as an inline SVG: timed ones best
    first with their round spread, the cuBLAS line at 1.0, wrong or failed ones as crosses."""
    timed = list(r.timed)
    failed = [t for t in r.trials if t.ratio is None]
    n = len(timed) + len(failed)
    left, right, top, bottom = 40, 8, 10, 22
    if n == 0:
        return Markup(f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="40" '
                      f'role="img"><text x="4" y="24" font-size="11" fill="{MUTED}">no '
                      "configuration measured</text></svg>")
    values = [v for t in timed for v in (t.ratio.min, t.ratio.max)] + [1.0]  # type: ignore[union-attr]
    lo = min(values) - 0.02
    hi = max(values) + 0.02
    plot_w, plot_h = width - left - right, height - top - bottom
    step = plot_w / n

    def x(i: int) -> float:
        return left + step * (i + 0.5)

    def y(v: float) -> float:
        return top + plot_h * (hi - v) / (hi - lo)

    title = f"{r.stage} {r.dtype} {r.shape}: ratio to cuBLAS per configuration"
    parts = _frame(title, (width, height, left, right), (lo, hi), y)
    for i, t in enumerate(timed):
        s = t.ratio
        assert s is not None
        colour = BEST if i == 0 else DOT
        tip = escape(f"{t.config}: {s.median:.3f} ({s.min:.3f}-{s.max:.3f})"
                     + (", confirmed" if t.phase == "confirm" else ""))
        parts.append(f'<g><title>{tip}</title><line x1="{x(i):.1f}" x2="{x(i):.1f}" '
                     f'y1="{y(s.min):.1f}" y2="{y(s.max):.1f}" stroke="{colour}" stroke-width="1"/>'
                     f'<circle cx="{x(i):.1f}" cy="{y(s.median):.1f}" r="{3.2 if i == 0 else 2.4}" '
                     f'fill="{colour}"/>')
        if t.label == "default":
            parts.append(f'<circle cx="{x(i):.1f}" cy="{y(s.median):.1f}" r="5" fill="none" '
                         f'stroke="{INK}" stroke-width="0.8"/>')
        parts.append("</g>")
    base = top + plot_h - 4
    for j, t in enumerate(failed):
        cx = x(len(timed) + j)
        tip = escape(f"{t.config}: {t.verdict} {t.detail}".strip())
        parts.append(f'<g><title>{tip}</title><path d="M{cx - 3:.1f},{base - 3:.1f}l6,6m0,-6l-6,6" '
                     f'stroke="{WRONG}" stroke-width="1.2"/></g>')
    parts.append(f'<text x="{left}" y="{height - 6}" fill="{MUTED}">{len(timed)} timed, best first'
                 f'{f", {len(failed)} wrong or failed" if failed else ""}; ring: the default</text>')
    parts.append("</svg>")
    return Markup("".join(parts))


def _ticks(lo: float, hi: float) -> list[float]:
    span = hi - lo
    step = next(s for s in (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0) if span / s <= 6)
    first = -(-lo // step) * step
    out = []
    v = first
    while v <= hi + 1e-9:
        out.append(round(v, 6))
        v += step
    return out


_STYLE = (".tune table{border-collapse:collapse;font-size:13px}"
          ".tune th,.tune td{border-bottom:1px solid #e5e7eb;padding:3px 8px;text-align:left}"
          ".tune figure{display:inline-block;margin:6px 12px 6px 0}"
          ".tune figcaption{font-size:12px;font-weight:bold}"
          ".tune .muted{color:#6b7280;font-size:12px}")


def overview_plot(results: list[TuneShapeResult], width: int = 560, height: int = 190) -> Markup:
    """One stage and dtype's shapes side by side as an inline SVG: every timed configuration's
    median ratio to cuBLAS as a dot (one path for all of them), the best as a larger dot with
    its configuration in the tooltip, the default ringed, the cuBLAS line at 1.0. The review
    page's compact form of ratio_plot (a few KB for the whole sweep)."""
    left, right, top, bottom = 40, 8, 10, 40
    medians = [t.ratio.median for r in results for t in r.timed]  # type: ignore[union-attr]
    if not medians:
        return Markup("")
    lo, hi = min([*medians, 1.0]) - 0.01, max([*medians, 1.0]) + 0.01
    plot_w, plot_h = width - left - right, height - top - bottom
    step = plot_w / len(results)

    def y(v: float) -> float:
        return top + plot_h * (hi - v) / (hi - lo)

    first = results[0]
    title = f"{first.stage} {first.dtype}: ratio to cuBLAS of every configuration, per shape"
    parts = _frame(title, (width, height, left, right), (lo, hi), y)
    dots, marks = [], []
    for i, r in enumerate(results):
        cx = left + step * (i + 0.5)
        # A zero-length line with round caps is a dot: one path holds them all.
        dots += [f"M{cx:.1f} {y(t.ratio.median):.1f}h0" for t in r.timed]  # type: ignore[union-attr]
        best, default = r.best, r.default
        if best is not None and best.ratio is not None:
            tip = escape(f"{r.shape}: best {best.config}, {best.ratio.median:.3f}")
            marks.append(f'<circle cx="{cx:.1f}" cy="{y(best.ratio.median):.1f}" r="3.4" '
                         f'fill="{BEST}"><title>{tip}</title></circle>')
        if default is not None and default.ratio is not None:
            marks.append(f'<circle cx="{cx:.1f}" cy="{y(default.ratio.median):.1f}" r="5" '
                         f'fill="none" stroke="{INK}" stroke-width="0.8"/>')
        m, n, k = r.shape.split("x")
        parts.append(f'<text x="{cx:.1f}" y="{height - bottom + 14}" text-anchor="middle" '
                     f'fill="{INK}">{escape(m)}x{escape(n)}</text><text x="{cx:.1f}" '
                     f'y="{height - bottom + 25}" text-anchor="middle" fill="{MUTED}">x{escape(k)}</text>')
    parts.append(f'<path d="{"".join(dots)}" stroke="{DOT}" stroke-opacity="0.55" stroke-width="4" '
                 'stroke-linecap="round"/>')
    parts += marks
    parts.append(f'<text x="{left}" y="{height - 4}" fill="{MUTED}">dots: every timed configuration; '
                 "filled: the best; ring: the default</text></svg>")
    return Markup("".join(parts))


def html_section(doc: TuneDocument, per_shape: bool = True) -> Markup:
    """The tuning section, as a fragment (it carries its own style): a plot per shape, or
    (per_shape=False, the review page's) one overview plot per stage and dtype."""
    head = "".join(f"<th>{escape(c)}</th>" for c in COLUMNS)
    rows = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in result_row(r)) + "</tr>"
                   for r in doc.results)
    env = environment_line(doc)
    if per_shape:
        figures = "".join(f"<figure><figcaption>{escape(f'{r.stage} {r.dtype} {r.shape}')}: ratio "
                          "to cuBLAS per configuration</figcaption>"
                          f"{ratio_plot(r)}</figure>" for r in doc.results)
    else:
        groups: dict[tuple[str, str], list[TuneShapeResult]] = {}
        for r in doc.results:
            groups.setdefault((r.stage, r.dtype), []).append(r)
        figures = "".join(f"<figure><figcaption>{escape(f'{stage} {dtype}')}: ratio to cuBLAS of "
                          f"every configuration, per shape</figcaption>{overview_plot(rs)}</figure>"
                          for (stage, dtype), rs in groups.items())
    parts = [f"<section class=\"tune\" id=\"tuning\"><style>{_STYLE}</style><h2>Tuning</h2>",
             f"<p class=\"muted\">{escape(env)}</p>",
             f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>",
             *[f"<p><b>{escape(line)}</b></p>" for line in geomean_lines(doc)],
             "<ul class=\"muted\">" + "".join(f"<li>{escape(x)}</li>" for x in stats_lines(doc.stats))
             + "</ul>", f"<div>{figures}</div>"]
    diffs = [r for r in doc.results if r.diff is not None]
    if diffs:
        parts.append("<h3>Why the best configuration wins (ncu diff, worst against best)</h3>")
        for r in diffs:
            head_line, *rest = diff_lines(r)
            if not per_shape:
                # The review page keeps each shape's first reason, up to its evidence; the
                # whole diff is in tune.md and on the tune page.
                rest = [rest[0].split("; ")[0]] if rest else []
            items = "".join(f"<li>{escape(x.strip())}</li>" for x in rest)
            parts.append(f"<p>{escape(head_line)}</p><ul>{items}</ul>")
    if doc.command:
        parts.append(f"<p class=\"muted\">made by <code>{escape(doc.command)}</code></p>")
    parts += [f"<p class=\"muted\">{escape(n)}</p>" for n in doc.notes]
    parts.append("</section>")
    return Markup("".join(parts))


def html_page(doc: TuneDocument, title: str = "perfscope tune") -> str:
    """The section alone on a self-contained page (no script, no network)."""
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title></head><body style=\"font-family:sans-serif;"
            f"color:{INK};margin:24px\">{html_section(doc)}</body></html>\n")
