"""The ladder charts of the HTML report: inline SVG made with matplotlib's object API.

(The per-kernel bars are simpler and many: the template draws them as plain SVG from
numbers perfscope.render.html lays out, with no matplotlib.)

No pyplot: figures are ``matplotlib.figure.Figure`` objects drawn on the Agg-free SVG
backend, so nothing touches pyplot's global figure registry or needs a display. The
output is deterministic: the SVG hash salt is fixed, the date and creator metadata are
dropped, text is kept as text (no per-glyph paths that vary with the font cache), and
every id is prefixed with the figure's own key so that several SVGs can live inline in
one HTML page without their ids colliding.

The figures are drawn in a worker process, never in the one that reads reports: Nsight
Compute's report reader 2025.3 kills the process on a string call, such as a metric's
unit, when matplotlib's C++ extensions were loaded before it (perfscope.reader), and a page
is built from reports read lazily. The worker imports matplotlib and nothing of the reader.
(The GPU machines' reference-page crash of 2026-12-05, first blamed on matplotlib, came
with numpy's extension loaded before the install's reader: perfscope.reader says so.)
"""

from __future__ import annotations

import atexit
import io
import logging
import multiprocessing
import re
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from markupsafe import Markup

log = logging.getLogger(__name__)

# Colours: one accent per meaning, the same in every figure of a report.
INK = "#1f2933"
MUTED = "#8a94a0"
BAR = "#3b6ea8"
VARIANT = "#a9bcd6"
REFERENCE = "#c2410c"
PEAK = "#6b7280"

_RC = {
    # A fixed salt makes matplotlib's generated clip-path ids the same on every run.
    "svg.hashsalt": "perfscope",
    # Text as <text>, not glyph paths: smaller, selectable, and independent of the font
    # cache's glyph outlines.
    "svg.fonttype": "none",
    "font.family": "DejaVu Sans",
    "font.size": 8.0,
    "axes.edgecolor": MUTED,
    "axes.labelcolor": INK,
    "xtick.color": INK,
    "ytick.color": INK,
    "text.color": INK,
    # Kernel and stage names contain '$' rarely but never mean TeX.
    "text.parse_math": False,
    "axes.titlesize": 8.5,
    "axes.titleweight": "bold",
    "axes.titlelocation": "left",
}

_METADATA = re.compile(r"\s*<metadata>.*?</metadata>", re.DOTALL)
_ID_REF = re.compile(r'(\bid="|url\(#|href="#)')
_REFERENCED = re.compile(r'(?:url\(#|href="#)([^)"]+)')
_GROUP_ID = re.compile(r'<g id="([^"]+)">')
# Coordinates to 1/100 of a point: matplotlib writes six digits nobody can see.
_LONG_NUMBER = re.compile(r"(\d+\.\d\d)\d+")
_INDENT = re.compile(r"\n[ \t]+")
# matplotlib breaks a path's data before every command and every element onto its own
# line: whitespace SVG does not read (no <text> holds a line break).
_PATH_BREAK = re.compile(r" ?\n(?=[MLCQSTAHVZz] |z\b)")
_BETWEEN_TAGS = re.compile(r">\n+<")
_PATH_END = re.compile(r'\s*\n"')


def _to_svg(fig: Any, key: str) -> str:
    import matplotlib
    from matplotlib.backends.backend_svg import FigureCanvasSVG

    buf = io.StringIO()
    with matplotlib.rc_context(_RC):
        FigureCanvasSVG(fig).print_svg(buf, metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    # Inline in HTML: drop the XML prolog and DOCTYPE, and the RDF metadata block.
    text = text[text.index("<svg"):]
    text = _METADATA.sub("", text)
    text = _ID_REF.sub(lambda m: f"{m.group(1)}{key}-", text)
    # A page holds several figures: drop what only inflates it (the ids of groups nothing
    # refers to, the indentation, digits below the pixel).
    used = set(_REFERENCED.findall(text))
    text = _GROUP_ID.sub(lambda m: m.group(0) if m.group(1) in used else "<g>", text)
    text = _INDENT.sub("\n", _LONG_NUMBER.sub(r"\1", text))
    text = _BETWEEN_TAGS.sub("><", _PATH_END.sub('"', _PATH_BREAK.sub(" ", text)))
    return text.strip()


def _figure(width: float, height: float) -> Any:
    import matplotlib
    from matplotlib.figure import Figure

    with matplotlib.rc_context(_RC):
        return Figure(figsize=(width, height), dpi=72, layout="constrained")


# The drawing process: one per process that asks, started on the first figure (spawned,
# so it inherits nothing of the reader) and reused for the next.
_worker: ProcessPoolExecutor | None = None


def _draw(fn: Any, *args: Any) -> Markup:
    global _worker
    try:
        if _worker is None:
            _worker = ProcessPoolExecutor(max_workers=1,
                                          mp_context=multiprocessing.get_context("spawn"))
            atexit.register(_worker.shutdown)
        svg = _worker.submit(fn, *args).result()
    except (BrokenProcessPool, OSError) as exc:
        # No second process (a sandbox that forbids it): draw here, which is safe as long
        # as no report is read after it, and say so (the next figure tries a worker again).
        log.warning("charts drawn in this process (no worker: %s)", exc)
        _worker = None
        svg = fn(*args)
    # matplotlib escapes <, > and & in the text it writes, so the SVG may go into the page
    # unescaped.
    return Markup(svg)


def _style(ax) -> None:
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.tick_params(length=2)


# ------------------------------------------------------------------- ladder overview


@dataclass(frozen=True)
class Bar:
    """One bar of a chart: its value with the spread as an error bar, and a note at its end."""

    label: str
    value: float | None          # None: no bar (not timed, or wrong)
    low: float | None = None     # spread, drawn as an error bar
    high: float | None = None
    note: str = ""               # printed at the end of the bar (or in its place)
    muted: bool = False          # a variant, drawn lighter


@dataclass(frozen=True)
class Line:
    """A horizontal line across a chart (the cuBLAS reference, the peak)."""

    label: str
    value: float
    colour: str
    dashed: bool = False


def ladder(key: str, title: str, unit: str, bars: Sequence[Bar], lines: Sequence[Line]) -> Markup:
    """Horizontal bars, one per stage (top to bottom in ladder order), with reference lines."""
    return _draw(_ladder_svg, key, title, unit, tuple(bars), tuple(lines))


def _ladder_svg(key: str, title: str, unit: str, bars: Sequence[Bar], lines: Sequence[Line]) -> str:
    import matplotlib

    with matplotlib.rc_context(_RC):
        fig = _figure(7.6, 0.9 + 0.24 * max(1, len(bars)))
        ax = fig.add_subplot()
        _style(ax)
        ys = list(range(len(bars)))[::-1]
        top = max([b.high or b.value or 0.0 for b in bars] + [ln.value for ln in lines] + [1e-9])
        for y, b in zip(ys, bars, strict=True):
            if b.value is not None:
                ax.barh(y, b.value, height=0.62, color=VARIANT if b.muted else BAR)
                if b.low is not None and b.high is not None:
                    ax.errorbar(b.value, y, xerr=[[b.value - b.low], [b.high - b.value]],
                                fmt="none", ecolor=INK, elinewidth=0.7, capsize=1.5)
            ax.text((b.value or 0.0) + top * 0.01, y, b.note, va="center", fontsize=7,
                    color=INK if b.value is not None else REFERENCE)
        highest = max((ln.value for ln in lines), default=None)
        for ln in lines:
            ax.axvline(ln.value, color=ln.colour, linewidth=1.1, linestyle="--" if ln.dashed else "-")
            # Labels sit right of their line, except a high one below the highest, which sits
            # left of it so that two lines close together do not print over each other.
            left = ln.value > 0.6 * top and ln.value != highest
            ax.text(ln.value, len(bars) - 0.45, f"{ln.label} " if left else f" {ln.label}",
                    color=ln.colour, fontsize=7, va="bottom", ha="right" if left else "left")
        ax.set_yticks(ys, [b.label for b in bars])
        ax.set_xlim(0, top * 1.22)
        ax.set_ylim(-0.6, len(bars) + 0.2)
        ax.set_xlabel(unit)
        ax.set_title(title)
    return _to_svg(fig, key)
