"""The HTML diagnosis report: one self-contained file a reviewer opens from a pull request.

    from perfscope.render.html import build_report
    Path("index.html").write_text(build_report(["reports/reference/h200"]))

``render_html(review)`` is the renderer (a Review in, the page out); ``build_report`` is
the convenience that collects the review first.

Jinja2 with autoescaping on renders the template in ``templates/``; every name (C++
kernel names carry ``<``, ``>`` and quotes) reaches the page escaped. Plots are inline
SVG (``perfscope.render.plots``), styles are inline, and there is no script and no
external resource: the file works opened from disk with the network off. The same input
gives byte-identical output, so the committed reference page can be checked by
regenerating it.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Iterable, Sequence
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

import jinja2

from perfscope.errors import PerfscopeError
from perfscope.families import FAMILY_BY_KEY
from perfscope.reader import REPORT_SUFFIXES
from perfscope.render import plots
from perfscope.render.diff import table_rows
from perfscope.render.summary import (
    NOT_COLLECTED,
    clock,
    duration,
    finding_texts,
    not_evaluated_text,
    num,
    sections,
)
from perfscope.review import Entry, Ladder, Review, collect
from perfscope.version import __version__

log = logging.getLogger(__name__)

TEMPLATE = "report.html.j2"
TOP_STALLS = 8
TOP_FAMILIES = 8
TOP_TRAFFIC = 8


@cache
def _environment() -> jinja2.Environment:
    # autoescape=True for every template, whatever its suffix: nothing is ever inserted raw
    # unless it is a Markup value built here (the SVGs).
    return jinja2.Environment(loader=jinja2.PackageLoader("perfscope.render", "templates"),
                              autoescape=True, undefined=jinja2.StrictUndefined,
                              trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def generator() -> str:
    """What made the page: the versions its bytes depend on (matplotlib draws the SVGs)."""
    return f"perfscope {__version__}; matplotlib {_version('matplotlib')}"


# --------------------------------------------------------------------------- views


def _tflops(s) -> str:
    return NOT_COLLECTED if s is None else f"{s.median:,.1f}"


def _ladder_view(ladder: Ladder, index: int) -> dict[str, Any]:
    ref = ladder.reference_tflops
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
            note = f"{p.tflops.median:,.1f}" + ("" if ratio is None else f" ({ratio:.0%} of cuBLAS)")
        bars.append(plots.Bar(p.label, p.tflops.median if ok else None,
                              p.tflops.min if ok else None, p.tflops.max if ok else None,
                              note, muted=p.variant))
        rows.append({
            "label": p.label + (" (variant)" if p.variant else ""), "verdict": p.verdict,
            "tflops": f"{p.tflops.median:,.1f}" if ok else "-",
            "spread": f"{p.tflops.min:,.1f} – {p.tflops.max:,.1f}" if ok else "",
            "vs_ref": f"{p.ratio_to_reference:.1%}" if ok and p.ratio_to_reference is not None else "-",
            "vs_peak": f"{p.tflops.median / ladder.peak_tflops:.1%}" if ok and ladder.peak_tflops else "-",
            "clock": "-" if p.sm_clock_mhz is None else f"{p.sm_clock_mhz:.0f} MHz",
        })
    lines = []
    if ref is not None:
        lines.append(plots.Line(f"cuBLAS {ref.median:,.0f}", ref.median, plots.REFERENCE))
    if ladder.peak_tflops is not None:
        lines.append(plots.Line(f"peak {ladder.peak_tflops:,.0f}", ladder.peak_tflops, plots.PEAK,
                                dashed=True))
    svg = plots.ladder(f"ladder{index}", f"{ladder.dtype}: TFLOP/s per stage", "TFLOP/s", bars, lines)
    return {"dtype": ladder.dtype, "svg": svg, "rows": rows,
            "reference": ladder.reference, "reference_tflops": _tflops(ref),
            "reference_spread": "" if ref is None else f"{ref.min:,.1f} – {ref.max:,.1f}",
            "peak": "-" if ladder.peak_tflops is None else f"{ladder.peak_tflops:,.0f}",
            "peak_note": ladder.peak_note}


def _duration_view(entries: Sequence[Entry]) -> dict[str, Any]:
    """Without timings, the overview falls back to ncu's kernel durations."""
    bars = [plots.Bar(e.label, e.profile.sol.duration_ns / 1e3,
                      note=duration(e.profile.sol.duration_ns))
            if e.profile.sol.duration_ns is not None
            else plots.Bar(e.label, None, note=NOT_COLLECTED) for e in entries]
    return {"svg": plots.ladder("durations", "Kernel duration under Nsight Compute", "µs", bars, [])}


def _traffic_rows(kind: str, unit: str, traffic) -> list[dict[str, str]]:
    rows = [o for o in traffic.by_opcode if o.excess > 0] or list(traffic.by_opcode[:3])
    return [{"memory": kind, "opcode": o.opcode, "kind": o.kind, "instructions": f"{o.instructions:,}",
             "actual": num(o.actual), "ideal": num(o.ideal), "excess": num(o.excess),
             "unit": unit, "ratio": "-" if o.ratio is None else f"{o.ratio:.2f}x"}
            for o in rows[:TOP_TRAFFIC]]


def _manifest_rows(m) -> list[tuple[str, str]]:
    v = m.verification
    rows = [("shape (M x N x K)", m.shape), ("dtype", m.dtype),
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
            rows.append(("SM clock while timing", f"{t.sm_clock_mhz.median:.0f} MHz"))
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


def _hotspot_rows(kp) -> list[dict[str, str]]:
    total = kp.stalls.total_samples
    return [{"address": f"0x{h.address:04x}", "sass": h.sass or h.opcode,
             "samples": f"{h.samples:,}",
             "share": "" if not total else f"{100 * h.samples / total:.1f}%",
             "reasons": ", ".join(f"{r} {n:,}" for r, n in h.reasons),
             "source": f"{h.file.rsplit('/', 1)[-1]}:{h.line}" if h.file and h.line else ""}
            for h in kp.hotspots]


def _comparison_view(c) -> dict[str, Any]:
    diff = c.diff
    cyc = next((r for r in diff.time if r.name == "cycles"), None)
    dur = next((r for r in diff.time if r.name == "duration ns"), None)
    parts = []
    if cyc is not None and cyc.ratio is not None:
        parts.append(f"{cyc.ratio:.2f}x B's cycles")
    if dur is not None and dur.ratio is not None:
        parts.append(f"{dur.ratio:.2f}x its time under ncu")
    return {"kind": c.kind, "a": c.a.label, "b": c.b.label, "b_key": c.b.key,
            "headline": "A takes " + " and ".join(parts) if parts else "",
            "verdict": [f"{r.sentence} Fix: {r.fix}" for r in diff.verdict]
            or ["No finding explains a difference: compare the side-by-side table."],
            "warnings": list(diff.warnings),
            "only_a": ", ".join(FAMILY_BY_KEY[f].label for f in diff.only_a),
            "only_b": ", ".join(FAMILY_BY_KEY[f].label for f in diff.only_b),
            "rows": table_rows(diff)}


def _entry_view(report: Review, e: Entry) -> dict[str, Any]:
    kp = e.profile
    sol = [("compute (SM)", kp.sol.sm_pct), ("memory", kp.sol.memory_pct), ("DRAM", kp.sol.dram_pct),
           ("L1/TEX", kp.sol.l1tex_pct), ("L2", kp.sol.l2_pct)]
    secs = [s for s in sections(kp) if s.title not in ("Hotspots",)]
    mem = kp.memory
    spill = []
    if mem.spill_instructions is not None:
        spill.append(("spilling instructions executed", num(mem.spill_instructions)))
    rules = [r for r in kp.ncu_rules if r.type != "ok"]
    return {
        "key": e.key, "label": e.label, "name": kp.identity.demangled or kp.name, "file": e.file,
        "stage": e.stage, "duration": duration(kp.sol.duration_ns), "cycles": num(kp.identity.cycles),
        "clock": clock(kp.identity.sm_clock_hz), "device": kp.identity.device or NOT_COLLECTED,
        "findings_count": len(e.evaluation.findings),
        "worst": e.evaluation.findings[0].severity if e.evaluation.findings else "none",
        "panels": plots.kernel_panels(e.key, sol, _stall_shares(kp), _family_shares(kp)),
        "sections": secs,
        "traffic": _traffic_rows("shared", "wavefronts", mem.shared)
        + _traffic_rows("global", "sectors", mem.global_),
        "spill": spill,
        "hotspots": _hotspot_rows(kp),
        "findings": finding_texts(e.evaluation),
        "not_evaluated": not_evaluated_text(e.evaluation),
        "ncu_rules": [{"type": r.type, "id": r.identifier, "title": r.title, "message": r.message,
                       "speedup": "" if r.speedup_pct is None else
                       f"est. {r.speedup_pct:.1f}% {r.speedup_type or ''}".rstrip()} for r in rules],
        "manifest": _manifest_rows(e.manifest) if e.manifest is not None else [],
        "comparisons": [_comparison_view(c) for c in report.comparisons_of(e)],
    }


def _metric(kp, name: str) -> float | None:
    return kp.metric(name)


def _conditions(report: Review) -> dict[str, Any]:
    gpus: dict[tuple, dict[str, str]] = {}
    kernels = []
    for e in report.entries:
        kp, i = e.profile, e.profile.identity
        max_khz = _metric(kp, "device__attribute_max_gpu_frequency_khz")
        mem_khz = _metric(kp, "device__attribute_max_mem_frequency_khz")
        gpus.setdefault((i.device, i.compute_capability, i.sm_count), {
            "device": i.device or NOT_COLLECTED,
            "cc": i.compute_capability or NOT_COLLECTED,
            "sms": num(i.sm_count), "max_clock": clock(max_khz * 1e3 if max_khz else None),
            "max_mem_clock": clock(mem_khz * 1e3 if mem_khz else None)})
        passes = _metric(kp, "profiler__replayer_passes")
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
        timed = next((m.timing for m in bench.manifests if m.timing is not None), None)
        if timed is not None:
            timing_rows.append(("timing method", f"CUDA events, {timed.runs_per_round} runs x "
                                f"{timed.rounds} rounds after {timed.warmup} warm-up runs, L2 flushed "
                                f"with {timed.l2_flush_bytes / 2**20:.0f} MiB between runs"))
        timing_rows += [("bench command", bench.command or NOT_COLLECTED),
                        ("bench created", bench.created or NOT_COLLECTED)]
    return {"gpus": list(gpus.values()), "kernels": kernels, "environment": env_rows,
            "timing": timing_rows, "command": report.command, "generator": generator()}


def render_html(report: Review) -> str:
    """The page for a Review."""
    ladders = [_ladder_view(ld, i) for i, ld in enumerate(report.ladders)]
    context = {
        "title": report.title,
        "generator": generator(),
        "ladders": ladders,
        "timing_source": report.timing_source,
        "durations": None if ladders else _duration_view(report.entries),
        "entries": [_entry_view(report, e) for e in report.entries],
        "conditions": _conditions(report),
        "warnings": list(report.warnings),
        "comparison_count": len(report.comparisons),
    }
    return _environment().get_template(TEMPLATE).render(**context)


def build_report(paths: Iterable[str | os.PathLike[str]], *, bench: str | os.PathLike[str] | None = None,
                 kernel: str | None = None, title: str | None = None, command: str | None = None) -> str:
    """The HTML report of every kernel in the reports under paths (files or folders)."""
    return render_html(collect(paths, bench=bench, kernel=kernel, title=title, command=command))


def write_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write text to path so that a failure leaves what was there intact.

    A missing or regular file is replaced atomically (a temporary file renamed over it); a
    symbolic link is followed and its target replaced the same way, so the link survives;
    anything else (a terminal, /dev/stdout, a FIFO) is written through, never replaced.
    """
    out = Path(path)
    if out.is_symlink():
        out = out.resolve()
    if out.exists() and not out.is_file():
        if out.is_dir():
            raise PerfscopeError(f"{path} is a folder; name the HTML file to write.")
        with open(out, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        return out
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


def reference_page(folder: str | os.PathLike[str]) -> str:
    """The committed reference run's index.html, from the reports and bench.json in folder."""
    return build_report([folder], title=REFERENCE_TITLE, command=REFERENCE_COMMAND)
