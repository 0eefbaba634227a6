"""Inline SVG plots for the HTML report, made with matplotlib's object API.

No pyplot: figures are ``matplotlib.figure.Figure`` objects drawn on the Agg-free SVG
backend, so nothing touches pyplot's global figure registry or needs a display. The
output is deterministic: the SVG hash salt is fixed, the date and creator metadata are
dropped, text is kept as text (no per-glyph paths that vary with the font cache), and
every id is prefixed with the figure's own key so that several SVGs can live inline in
one HTML page without their ids colliding.
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from dataclasses import dataclass

from markupsafe import Markup

from perfscope.reader import load_reader_first

# Nsight Compute's report reader (ncu-report 2025.3) crashes the process when matplotlib
# was loaded before it, and a page is made of reports: load the reader first.
load_reader_first()

import matplotlib  # noqa: E402
from matplotlib.backends.backend_svg import FigureCanvasSVG  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

# Colours: one accent per meaning, the same in every figure of a report.
INK = "#1f2933"
MUTED = "#8a94a0"
BAR = "#3b6ea8"
VARIANT = "#a9bcd6"
REFERENCE = "#c2410c"
PEAK = "#6b7280"
SOL_COLOUR = {"compute (SM)": "#3b6ea8", "memory": "#0f766e", "DRAM": "#0f766e",
              "L1/TEX": "#0f766e", "L2": "#0f766e"}

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


def _to_svg(fig: Figure, key: str) -> Markup:
    buf = io.StringIO()
    with matplotlib.rc_context(_RC):
        FigureCanvasSVG(fig).print_svg(buf, metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    # Inline in HTML: drop the XML prolog and DOCTYPE, and the RDF metadata block.
    text = text[text.index("<svg"):]
    text = _METADATA.sub("", text)
    text = _ID_REF.sub(lambda m: f"{m.group(1)}{key}-", text)
    # The SVG is generated here from escaped text (matplotlib escapes <, > and &), so it
    # may go into the page unescaped.
    return Markup(text.strip())


def _figure(width: float, height: float) -> Figure:
    with matplotlib.rc_context(_RC):
        return Figure(figsize=(width, height), dpi=72, layout="constrained")


def _style(ax) -> None:
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.tick_params(length=2)


def _empty(ax, title: str) -> None:
    ax.set_title(title)
    ax.text(0.5, 0.5, "not collected", ha="center", va="center", color=MUTED,
            transform=ax.transAxes)
    ax.set_axis_off()


# ------------------------------------------------------------------- ladder overview


@dataclass(frozen=True)
class Bar:
    label: str
    value: float | None          # None: no bar (not timed, or wrong)
    low: float | None = None     # spread, drawn as an error bar
    high: float | None = None
    note: str = ""               # printed at the end of the bar (or in its place)
    muted: bool = False          # a variant, drawn lighter


@dataclass(frozen=True)
class Line:
    label: str
    value: float
    colour: str
    dashed: bool = False


def ladder(key: str, title: str, unit: str, bars: Sequence[Bar], lines: Sequence[Line]) -> Markup:
    """Horizontal bars, one per stage (top to bottom in ladder order), with reference lines."""
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
        for ln in lines:
            ax.axvline(ln.value, color=ln.colour, linewidth=1.1, linestyle="--" if ln.dashed else "-")
            ax.text(ln.value, len(bars) - 0.45, f" {ln.label}", color=ln.colour, fontsize=7,
                    va="bottom", ha="right" if ln.value > 0.6 * top else "left")
        ax.set_yticks(ys, [b.label for b in bars])
        ax.set_xlim(0, top * 1.22)
        ax.set_ylim(-0.6, len(bars) + 0.2)
        ax.set_xlabel(unit)
        ax.set_title(title)
    return _to_svg(fig, key)


# ----------------------------------------------------------------------- one kernel

# Kernel panels are laid out by hand, not by constrained layout: a ladder has dozens of
# kernels, and measuring every tick label to place three small panels took most of the
# report's generation time. Widths are in points at 72 dpi, from a fixed label budget.
_CHAR_PT = 4.8              # mean advance of an 8 pt DejaVu Sans character
_ROW_PT = 15.0
_BAR_PT = 150.0
_VALUE_PT = 30.0
_LABEL_CHARS = (12, 18, 20)  # SOL, stalls, opcode families
_ROWS = 8


def _short(label: str, chars: int) -> str:
    return label if len(label) <= chars else label[: chars - 1] + "\u2026"


def kernel_panels(key: str, sol: Sequence[tuple[str, float | None]],
                  stalls: Sequence[tuple[str, float]], families: Sequence[tuple[str, float]]
                  ) -> Markup:
    """Speed of light (% of peak), stall breakdown (share of stall cycles) and opcode mix."""
    panels = (("Speed of light (% of peak)", list(sol)[:_ROWS], None),
              ("Warp stalls (share of stall cycles)", [(k, 100.0 * v) for k, v in stalls][:_ROWS], "#b45309"),
              ("Executed opcode families (share)", [(k, 100.0 * v) for k, v in families][:_ROWS], "#6d28d9"))
    labels_pt = [c * _CHAR_PT + 8 for c in _LABEL_CHARS]
    width = sum(labels_pt) + 3 * (_BAR_PT + _VALUE_PT) + 2 * 12 + 8
    plot_h = _ROWS * _ROW_PT
    height = plot_h + 30
    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=(width / 72, height / 72), dpi=72)
        x = 4.0
        for (title, rows, colour), label_pt, chars in zip(panels, labels_pt, _LABEL_CHARS, strict=True):
            ax = fig.add_axes((  # left, bottom, width, height as figure fractions
                (x + label_pt) / width, 6 / height, _BAR_PT / width, plot_h / height))
            x += label_pt + _BAR_PT + _VALUE_PT + 12
            ax.set_title(title, loc="left", x=-label_pt / _BAR_PT, pad=5)
            if not rows or all(v is None for _, v in rows):
                ax.text(0.3, 0.5, "not collected", ha="center", va="center", color=MUTED,
                        transform=ax.transAxes)
                ax.set_axis_off()
                continue
            for spine in ax.spines.values():
                spine.set_visible(False)
            ys = [_ROWS - 1 - i for i in range(len(rows))]
            for y, (label, v) in zip(ys, rows, strict=True):
                ax.barh(y, 100.0, height=0.62, color="#eef1f4")
                if v is not None:
                    ax.barh(y, v, height=0.62, color=colour or SOL_COLOUR.get(label, BAR))
                ax.text(102, y, "n/c" if v is None else f"{v:.0f}%", va="center", fontsize=7)
            ax.set_yticks(ys, [_short(label, chars) for label, _ in rows])
            ax.tick_params(axis="y", length=0, pad=3)
            ax.set_xticks([])
            ax.set_xlim(0, 100)
            ax.set_ylim(-0.6, _ROWS - 0.4)
    return _to_svg(fig, key)
