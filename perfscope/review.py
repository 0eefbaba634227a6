"""The review of a set of kernels: one value that the HTML page and the PR comment render.

``build(records, ...)`` is pure: over Diagnosed records it finds each stage's parent
stage and cuBLAS reference in the same set and diffs against them, and builds the ladder
overview from the run manifests (or a ``bench.json``). ``collect(paths)`` is the loader
around it: it diagnoses the reports under paths and reads the bench file beside them, and
the tune results (``tune/results.json``) for the page's Tuning section.
Rendering reads the Review only, so the HTML page and the PR comment say the same thing.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from perfscope.bandwidth import FUSED_CHECK, BandwidthPanel, read_panels
from perfscope.calibration import Calibration, calibrate
from perfscope.diagnosis import default_catalogue, diagnose
from perfscope.diff import ProfileDiff, compare
from perfscope.documents import TUNE_RESULT_FILES, TuneDocument
from perfscope.errors import PerfscopeError
from perfscope.hardware import math_kind, peak_flops
from perfscope.manifest import BENCH_NAME, BenchFile, Environment, RunManifest, Spread, run_key
from perfscope.profile import KernelProfile
from perfscope.reader import REPORT_SUFFIXES
from perfscope.record import Catalogue, Diagnosed, as_group, incomplete_reports, machine_notes
from perfscope.rules import Evaluation
from perfscope.source import SourceView, source_view

log = logging.getLogger(__name__)

DTYPE_ORDER = ("fp32", "fp16", "bf16", "fp8")

@dataclass(frozen=True)
class Entry:
    """One kernel of the review: its record, the page anchor and the path as shown."""

    key: str                      # HTML anchor: k0, k1, ...
    file: str                     # report path as shown (relative to what was given)
    record: Diagnosed
    with_shape: bool = False      # the page holds several GEMM shapes: name this one's

    @property
    def label(self) -> str:
        """The record's label, with its GEMM shape where the page holds several."""
        m = self.record.manifest
        if self.with_shape and m is not None and m.shape_known:
            return f"{self.record.label} · {m.shape}"
        return self.record.label

    @property
    def stage(self) -> str | None:
        """The registry stage's name, None for a kernel that is no stage."""
        return self.record.stage.name if self.record.stage is not None else None

    @property
    def dtype(self) -> str | None:
        """The record's element type, when known."""
        return self.record.dtype

    @property
    def profile(self) -> KernelProfile:
        """The record's kernel profile."""
        return self.record.profile

    @property
    def manifest(self) -> RunManifest | None:
        """The record's run manifest, None when there is none beside the report."""
        return self.record.manifest

    @property
    def evaluation(self) -> Evaluation:
        """The rules' verdict on the record's kernel."""
        return self.record.evaluation

    @cached_property
    def source(self) -> SourceView:
        """The kernel's hottest source lines, read from its report when first asked for
        (only a page needs them; diagnose and diff never pay for the read)."""
        m = self.record.manifest
        return source_view(self.record.profile, m.compile if m is not None else None)


@dataclass(frozen=True)
class LadderPoint:
    """One stage on a dtype's ladder: its event-timed TFLOP/s, verdict and ratio to the reference."""

    label: str
    stage: str
    tflops: Spread | None         # None: not timed, or not a correct result
    verdict: str
    variant: bool
    sm_clock_mhz: float | None
    ratio_to_reference: float | None
    params_note: str = ""         # parameters that differ from the stage's defaults
    beats: str | None = None      # the label of the default it beats (see VariantWin)


@dataclass(frozen=True)
class VariantWin:
    """A variant, or a row with non-default parameters, faster than its stage's default."""

    dtype: str
    label: str
    default: str                  # the row it beats: the stage at its defaults, or its parent
    tflops: Spread
    default_tflops: Spread
    against_parent: bool          # a declared variant, held against the stage it varies
    default_note: str = ""        # the defaults of the parameters the variant changes
    kept: str = ""                # why the stage keeps its defaults (StageInfo.kept_default)

    @property
    def ratio(self) -> float:
        """How many times faster the variant is than the row it beats (medians)."""
        return self.tflops.median / self.default_tflops.median

    def sentence(self) -> str:
        """The win as the page says it, with what to do about it."""
        what = "the stage it varies" if self.against_parent else "its stage's default"
        default = self.default + (f" ({self.default_note})" if self.default_note else "")
        ask = (f"the default stays because {self.kept}." if self.kept
               else "make it the default, or say why not.")
        return (f"{self.label} ({self.dtype}) beats {what}, {default}: "
                f"{self.tflops.median:,.1f} against {self.default_tflops.median:,.1f} TFLOP/s "
                f"({self.ratio:.2f}x, spreads apart); {ask}")


@dataclass(frozen=True)
class Ladder:
    """One dtype's ladder: event-timed TFLOP/s per stage against cuBLAS and the peak."""

    dtype: str
    points: tuple[LadderPoint, ...]
    reference: str | None
    reference_tflops: Spread | None
    peak_tflops: float | None
    peak_note: str
    wins: tuple[VariantWin, ...] = ()
    # Set when the runs span several GEMM shapes: one ladder per (dtype, shape) then, since
    # stages are only comparable on the same problem.
    shape: str | None = None

    @property
    def title(self) -> str:
        """``fp16``, or ``fp16 64x8192x8192`` for one shape of several."""
        return self.dtype + (f" {self.shape}" if self.shape else "")


@dataclass(frozen=True)
class Comparison:
    """A stage held against its parent stage or its cuBLAS reference."""

    kind: str                     # "parent stage" or "cuBLAS"
    a: Entry
    b: Entry
    diff: ProfileDiff


@dataclass(frozen=True)
class Review:
    """The review the HTML page and the PR comment render: every kernel, the ladders, the comparisons."""

    title: str
    entries: tuple[Entry, ...]
    ladders: tuple[Ladder, ...]
    timing_source: str | None     # where the overview's TFLOP/s come from
    comparisons: tuple[Comparison, ...]
    bench: BenchFile | None
    command: str | None
    warnings: tuple[str, ...]
    kind: str = "review"
    # `perfscope tune` results to show in the page's Tuning section (None: no section).
    tune: TuneDocument | None = None
    machine: tuple[str, ...] = ()  # the machine's settings shared by every launch (record.machine_notes)
    # Every ladder step's predicted saving against the one bench measured (None: no bench
    # file, or no step with both stages timed).
    calibration: Calibration | None = None
    # The small-M shapes by bandwidth, from a fused check beside the reports (none: no file).
    bandwidth: tuple[BandwidthPanel, ...] = ()
    bandwidth_source: str | None = None

    def comparisons_of(self, entry: Entry) -> tuple[Comparison, ...]:
        """The comparisons that hold this entry against another."""
        return tuple(c for c in self.comparisons if c.a.key == entry.key)

    @property
    def variant_wins(self) -> tuple[VariantWin, ...]:
        """Every variant faster than its stage's default, ladder by ladder."""
        return tuple(w for ld in self.ladders for w in ld.wins)


def _display_path(path: Path, roots: Sequence[Path]) -> str:
    # Relative to the folder the user named, so the page does not depend on where the
    # checkout lives (the committed example must be byte-identical on every machine).
    for root in roots:
        try:
            return path.resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            continue
    return path.name


# ------------------------------------------------------------------------ building


def _order(entry: Entry, catalogue: Catalogue) -> tuple:
    info = entry.record.stage
    if info is None:
        return (len(DTYPE_ORDER) + 1, 0, 0, entry.file)
    dt = DTYPE_ORDER.index(entry.dtype) if entry.dtype in DTYPE_ORDER else len(DTYPE_ORDER)
    return (dt, info.is_reference, info.order, entry.file)


def _entries(records: Sequence[Diagnosed], roots: Sequence[Path], catalogue: Catalogue) -> list[Entry]:
    staged = [Entry("", _display_path(r.path, roots), r) for r in records]
    staged.sort(key=lambda e: _order(e, catalogue))
    shapes = {r.manifest.shape for r in records if r.manifest is not None and r.manifest.shape_known}
    return [Entry(f"k{i}", e.file, e.record, len(shapes) > 1) for i, e in enumerate(staged)]


def _shape_of(e: Entry) -> str | None:
    return e.manifest.shape if e.manifest is not None and e.manifest.shape_known else None


def _comparisons(entries: Sequence[Entry]) -> list[Comparison]:
    """Each stage against its parent stage and its cuBLAS reference (for a fused stage, the
    group of launches that computes its epilogue unfused), where those are here, on the
    same GEMM shape."""
    # One kernel per (stage, dtype, shape): a stage profiled twice (or with several
    # launches) is compared by its first entry, and the page says so.
    by_stage: dict[tuple[str, str | None, str | None], Entry] = {}
    by_file: dict[str, list[Entry]] = {}
    for e in entries:
        if e.stage is not None:
            by_stage.setdefault((e.stage, e.dtype, _shape_of(e)), e)
        by_file.setdefault(e.file, []).append(e)
    out = []
    for e in entries:
        info = e.record.stage
        shape = _shape_of(e)
        if info is None or by_stage.get((info.name, e.dtype, shape)) is not e:
            continue
        targets = []
        if info.parent is not None:
            targets.append(("parent stage", by_stage.get((info.parent, e.dtype, shape))))
        ref = info.reference_for(e.dtype)
        if ref is not None:
            targets.append(("cuBLAS", by_stage.get((ref, e.dtype, shape))))
        for kind, other in targets:
            if other is not None:
                out.append(Comparison(kind, e, other, compare(e.record, _as_group(other, by_file))))
    return out


def _as_group(e: Entry, by_file: dict[str, list[Entry]]) -> Diagnosed:
    """A group reference's record with the other launches of its report as its group
    (record.as_group); any other entry's record as it is."""
    info = e.record.stage
    members = by_file.get(e.file, [e])
    if info is None or not info.is_group or len(members) < 2:
        return e.record
    return as_group([x.record for x in members])


def _find_beside(paths: Sequence[Path], name: str | Path) -> Path | None:
    for p in paths:
        candidate = p / name if p.is_dir() else p.parent / name
        if candidate.is_file():
            return candidate
    return None


def _find_bench(paths: Sequence[Path]) -> Path | None:
    return _find_beside(paths, BENCH_NAME)


def _find_tune(paths: Sequence[Path]) -> Path | None:
    return next((f for name in TUNE_RESULT_FILES if (f := _find_beside(paths, name))), None)


def _peak(env: Environment | None, dtype: str, clock_mhz: float | None,
          kernel_mhz: float | None = None) -> tuple[float | None, str]:
    """The dense peak line: at the SM clock ncu measured during the ladder's kernels where
    their reports are here (median), else at the clock sampled while timing. The two differ:
    NVML, sampled while the timed launches queue, reads the clock between them (1980 MHz on
    the H200), while a GEMM at the power cap runs near 1.6 GHz, as ncu and an in-kernel probe
    both measure (reports/reference/h200/bench_clock.json)."""
    if env is None:
        return None, "peak unknown: no GPU environment recorded"
    clock = kernel_mhz if kernel_mhz is not None else clock_mhz
    peak = peak_flops(env.compute_capability, math_kind(dtype), env.sm_count,
                      clock * 1e6 if clock is not None else None)
    if peak is None:
        return None, f"peak unknown for compute capability {env.compute_capability}"
    if kernel_mhz is not None:
        timed = f"; NVML read {clock_mhz:.0f} MHz while timing" if clock_mhz is not None else ""
        return peak / 1e12, (f"{env.gpu} peak at the SM clock ncu measured during the kernels, "
                             f"median {kernel_mhz:.0f} MHz ({env.sm_count} SMs{timed})")
    return peak / 1e12, (f"{env.gpu} peak at the SM clock NVML read between the timed launches, "
                         f"{clock_mhz:.0f} MHz ({env.sm_count} SMs): no report here measured the "
                         "clock during them, which at the power cap runs lower")


def _params_note(catalogue: Catalogue, m: RunManifest) -> str:
    info = catalogue.get(m.stage)
    return info.params_note(m.params) if info is not None else ""


def _reference_name(catalogue: Catalogue, dtype: str) -> str | None:
    for info in catalogue.stages.values():
        if (ref := info.reference_for(dtype)) is not None:
            return ref
    return None


def _ladders(manifests: Sequence[RunManifest], env: Environment | None,
             catalogue: Catalogue, kernel_clocks: Mapping[tuple[str, str, str], float] | None = None
             ) -> list[Ladder]:
    out = []
    for dtype in DTYPE_ORDER:
        # A ladder holds stages; program captures and external workloads are no rung.
        runs = [m for m in manifests if m.dtype == dtype and m.family not in ("program", "external")]
        shapes = list(dict.fromkeys(m.shape for m in runs))
        for shape in shapes:
            mine = [m for m in runs if m.shape == shape] if len(shapes) > 1 else runs
            out.append(_ladder(dtype, mine, env, catalogue, shape if len(shapes) > 1 else None,
                               kernel_clocks or {}))
    return out


def kernel_clocks_of(entries: Sequence[Entry]) -> dict[tuple[str, str, str], float]:
    """(stage, dtype, shape) -> the SM clock ncu measured during that stage's report, MHz
    (a group's launches: the first)."""
    out: dict[tuple[str, str, str], float] = {}
    for e in entries:
        m, hz = e.manifest, e.record.profile.identity.sm_clock_hz
        if m is not None and hz:
            out.setdefault((m.stage, m.dtype, m.shape), hz / 1e6)
    return out


def _ladder(dtype: str, runs: Sequence[RunManifest], env: Environment | None,
            catalogue: Catalogue, shape: str | None,
            kernel_clocks: Mapping[tuple[str, str, str], float]) -> Ladder:
    """One ladder: the stages of one dtype (and shape) against the reference they were
    timed against (cuBLAS, or a group such as cublas+gelu for fused stages)."""
    order = list(catalogue.stages)
    timed_against = Counter(m.timing.reference for m in runs if m.timing and m.timing.reference)
    ref_name = (timed_against.most_common(1)[0][0] if timed_against
                else _reference_name(catalogue, dtype))
    ref_run = next((m for m in runs if m.stage == ref_name and m.timing), None)
    ref_tflops = ref_run.timing.tflops if ref_run else next(
        (m.timing.reference_tflops for m in runs if m.timing and m.timing.reference_tflops), None)
    points = []
    stages = [m for m in runs if m.stage != ref_name]
    stages.sort(key=lambda m: (order.index(m.stage) if m.stage in order else len(order),
                               sorted(m.params.items())))
    for m in stages:
        note = _params_note(catalogue, m)
        t = m.timing
        points.append(LadderPoint(
            label=m.stage + (f" ({note})" if note else ""), stage=m.stage,
            tflops=t.tflops if t else None, verdict=m.verification.verdict, variant=m.variant,
            sm_clock_mhz=t.sm_clock_mhz.median if t and t.sm_clock_mhz else None,
            ratio_to_reference=t.ratio_to_reference.median if t and t.ratio_to_reference else None,
            params_note=note))
    wins = _variant_wins(dtype, points, catalogue)
    beaten = {w.label: w.default for w in wins}
    points = [dataclasses.replace(p, beats=beaten.get(p.label)) for p in points]
    clocks = sorted(p.sm_clock_mhz for p in points if p.sm_clock_mhz is not None)
    clock = clocks[len(clocks) // 2] if clocks else None
    measured = sorted(mhz for m in stages
                      if (mhz := kernel_clocks.get((m.stage, m.dtype, m.shape))) is not None)
    kernel_mhz = measured[len(measured) // 2] if measured else None
    peak, peak_note = _peak(env or next((m.environment for m in runs if m.environment), None),
                            dtype, clock, kernel_mhz)
    return Ladder(dtype, tuple(points), ref_name if ref_tflops else None, ref_tflops,
                  peak, peak_note, tuple(wins), shape)


# A variant "beats" its default when its median is this much faster and the two spreads
# (min to max over the bench rounds) do not overlap: timing noise is not a win.
VARIANT_MARGIN = 0.02


def _timed(p: LadderPoint) -> bool:
    return p.verdict == "ok" and p.tflops is not None


def _variant_wins(dtype: str, points: Sequence[LadderPoint], catalogue: Catalogue
                  ) -> list[VariantWin]:
    """Rows with non-default parameters, and declared variant stages, that are faster than
    the stage at its defaults (for a declared variant: the stage it varies, its parent)."""
    defaults = {p.stage: p for p in points if not p.params_note and _timed(p)}
    out = []
    for p in points:
        info = catalogue.get(p.stage)
        if not _timed(p) or info is None:
            continue
        note = ""
        if p.params_note:
            base, parent = defaults.get(p.stage), False
            changed = [kv.split("=", 1)[0] for kv in p.params_note.split(", ")]
            note = ", ".join(f"{k}={info.defaults[k]}" for k in changed if k in info.defaults)
        elif p.variant and info.parent is not None:
            base, parent = defaults.get(info.parent), True
        else:
            continue
        if base is None or base is p:
            continue
        fast, slow = p.tflops, base.tflops
        if fast.median > slow.median * (1 + VARIANT_MARGIN) and fast.min > slow.max:
            out.append(VariantWin(dtype, p.label, base.label, fast, slow, parent, note,
                                  "" if parent else info.kept_default))
    return out


def _calibration(records: Sequence[Diagnosed], bench: BenchFile | None, catalogue: Catalogue,
                 shown: str | None) -> Calibration | None:
    if bench is None:
        return None
    table = calibrate(records, bench, catalogue, source=shown or "the bench file")
    return table if table.steps else None


@dataclass(frozen=True)
class PageInputs:
    """What a review shows beside its reports: the bench file for the ladder overview
    (bench_shown: its path as the page shows it; the records' own run manifests add the
    stages it lacks), the tune results for the Tuning section (None: no section), and the
    page's title and the command that made it."""

    bench: BenchFile | None = None
    bench_shown: str | None = None
    tune: TuneDocument | None = None
    title: str | None = None
    command: str | None = None


def build(records: Sequence[Diagnosed], *, catalogue: Catalogue, roots: Sequence[Path] = (),
          page: PageInputs = PageInputs()) -> Review:
    """The review of records (pure): entries in ladder order, comparisons, ladders; page:
    what it shows beside them."""
    bench, bench_shown = page.bench, page.bench_shown
    if not records:
        raise PerfscopeError("no kernel launch to review.")
    entries = _entries(records, roots, catalogue)
    warnings: list[str] = list(incomplete_reports(records))
    manifests: list[RunManifest] = list(bench.manifests) if bench else []
    timed = {run_key(m)[:2] + run_key(m)[5:] for m in manifests}
    for e in entries:
        m = e.manifest
        if m is not None and (key := run_key(m)[:2] + run_key(m)[5:]) not in timed:
            manifests.append(m)
            timed.add(key)
    env = bench.environment if bench else None
    ladders = _ladders(manifests, env, catalogue, kernel_clocks_of(entries))
    if bench_shown is not None:
        source = f"{bench_shown} (event-timed, outside ncu)"
    elif ladders:
        source = "the run manifests beside the reports (event-timed, outside ncu)"
    else:
        source = None
    seen: dict[tuple[str, str | None, str | None], str] = {}
    for e in entries:
        if e.stage is None:
            continue
        key = (e.stage, e.dtype, e.manifest.shape if e.manifest is not None else None)
        # The launches of one group report share its stage: that is no repeat.
        if key in seen and seen[key] != e.file:
            warnings.append(f"{e.label} appears more than once; diffs use the first ({e.file} is "
                            "shown but not diffed).")
        seen.setdefault(key, e.file)
    return Review(title=page.title or "perfscope diagnosis report", entries=tuple(entries),
                  ladders=tuple(ladders), timing_source=source,
                  comparisons=tuple(_comparisons(entries)), bench=bench, command=page.command,
                  warnings=tuple(warnings), tune=page.tune, machine=machine_notes(records),
                  calibration=_calibration(records, bench, catalogue, bench_shown))


def folder_reports(folder: str | os.PathLike[str]) -> list[Path]:
    """The reports directly in folder, not in its subfolders (a reference run keeps pages
    of their own there: fused/), in a stable order; [folder] itself when it holds none."""
    root = Path(folder)
    tops = sorted(p for p in root.iterdir() if p.is_file() and p.name.endswith(REPORT_SUFFIXES)) \
        if root.is_dir() else []
    return tops or [root]


def collect(paths: Iterable[str | os.PathLike[str]], *, bench: str | os.PathLike[str] | None = None,
            kernel: str | None = None, title: str | None = None, command: str | None = None,
            tune: str | os.PathLike[str] | None = None) -> Review:
    """Diagnose the reports under paths (files or folders) and review them.

    bench: a ``bench.json`` for the ladder overview; by default the one in (or beside)
    the first folder given, if any. tune: a tune document (``tune --json``) for the Tuning
    section; by default ``tune/results.json`` in (or beside) the first folder given, if any.
    A fused check (``fused_check.json.xz``) in or beside them adds the small-M bandwidth
    panels.
    """
    given = [Path(p) for p in paths]
    if not given:
        raise PerfscopeError("give at least one report or folder of reports.")
    catalogue = default_catalogue()
    records = diagnose(given, kernel, catalogue, pages=True)
    roots = [p if p.is_dir() else p.parent for p in given]
    bench_path = Path(bench) if bench is not None else _find_bench(given)
    bench_file = BenchFile.read(bench_path) if bench_path is not None else None
    tune_path = Path(tune) if tune is not None else _find_tune(given)
    tune_doc = TuneDocument.read(tune_path) if tune_path is not None else None
    shown = _display_path(bench_path, roots) if bench_path is not None else None
    review = build(records, catalogue=catalogue, roots=roots,
                   page=PageInputs(bench=bench_file, bench_shown=shown, tune=tune_doc,
                                   title=title, command=command))
    check = _find_beside(given, FUSED_CHECK)
    if check is None:
        return review
    return dataclasses.replace(review, bandwidth=read_panels(check),
                               bandwidth_source=_display_path(check, roots))
