"""The diagnosis report of a set of kernels: one value that the HTML and Markdown render.

``collect(paths)`` loads every report under paths, reads the run manifest beside each,
evaluates the rules, finds each stage's parent stage and cuBLAS reference in the same
set and diffs against them, and builds the ladder overview from the manifests (or a
``bench.json``). Rendering reads this value only, so the HTML page and the PR comment
say the same thing.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from perfscope.errors import PerfscopeError
from perfscope.manifest import BenchFile, Environment, RunManifest, Spread
from perfscope.profile import REPORT_SUFFIXES, KernelProfile, find_reports, load
from perfscope.rules import Evaluation, evaluate, manifest_beside

log = logging.getLogger(__name__)

BENCH_NAME = "bench.json"
DTYPE_ORDER = ("fp32", "fp16", "bf16")

# Dense peak FLOP per SM per clock by compute capability and dtype (fp32: FFMA lanes x 2;
# fp16/bf16: tensor cores, fp32 accumulate). The peak line of the overview is this times
# the SM count times the SM clock measured while timing, so it moves with the clock the
# numbers were taken at. sm_90: 989.4 TFLOP/s at 1.83 GHz on 132 SMs is 4096 per SM-clock.
PEAK_FLOP_PER_SM_CLOCK: Mapping[str, Mapping[str, int]] = {
    "9.0": {"fp32": 256, "fp16": 4096, "bf16": 4096},
    "8.0": {"fp32": 128, "fp16": 2048, "bf16": 2048},
}


@dataclass(frozen=True)
class Entry:
    """One profiled kernel launch in the report."""

    key: str                      # HTML anchor: k0, k1, ...
    label: str                    # stage · dtype, or the report's file name
    file: str                     # report path as shown (relative to what was given)
    stage: str | None
    dtype: str | None
    profile: KernelProfile
    manifest: RunManifest | None
    evaluation: Evaluation
    path: Path = field(repr=False, compare=False)


@dataclass(frozen=True)
class LadderPoint:
    label: str
    stage: str
    tflops: Spread | None         # None: not timed, or not a correct result
    verdict: str
    variant: bool
    sm_clock_mhz: float | None
    ratio_to_reference: float | None


@dataclass(frozen=True)
class Ladder:
    """One dtype's ladder: event-timed TFLOP/s per stage against cuBLAS and the peak."""

    dtype: str
    points: tuple[LadderPoint, ...]
    reference: str | None
    reference_tflops: Spread | None
    peak_tflops: float | None
    peak_note: str


@dataclass(frozen=True)
class Comparison:
    """A stage held against its parent stage or its cuBLAS reference."""

    kind: str                     # "parent stage" or "cuBLAS"
    a: Entry
    b: Entry
    diff: object                  # perfscope.diff.ProfileDiff


@dataclass(frozen=True)
class Report:
    title: str
    entries: tuple[Entry, ...]
    ladders: tuple[Ladder, ...]
    timing_source: str | None     # where the overview's TFLOP/s come from
    comparisons: tuple[Comparison, ...]
    bench: BenchFile | None
    command: str | None
    warnings: tuple[str, ...]

    def comparisons_of(self, entry: Entry) -> tuple[Comparison, ...]:
        return tuple(c for c in self.comparisons if c.a.key == entry.key)


# ------------------------------------------------------------------------- naming


def _stage_names() -> tuple[str, ...]:
    from perfscope.kernels import names

    # Longest first: "sgemm_reg8x8_capped" must win over its prefix "sgemm_reg8x8".
    return tuple(sorted(names(), key=len, reverse=True))


def _stem(path: Path) -> str:
    for suffix in sorted(REPORT_SUFFIXES, key=len, reverse=True):
        if path.name.endswith(suffix):
            return path.name[: -len(suffix)]
    return path.stem


def stage_of(path: Path, manifest: RunManifest | None) -> tuple[str | None, str | None]:
    """(stage, dtype) of a report: from its manifest, else from its file name.

    Reports are named ``<stage>-<dtype>-<shape>``; the fixtures ``cublas_sgemm_4096``.
    A name that starts with no stage is an arbitrary kernel: (None, None).
    """
    if manifest is not None:
        return manifest.stage, manifest.dtype
    from perfscope.kernels import DTYPES, get_spec

    stem = _stem(path)
    for name in _stage_names():
        if stem == name or stem.startswith((f"{name}-", f"{name}_")):
            rest = stem[len(name) + 1:].split("-")
            dtypes = get_spec(name).dtypes
            dtype = rest[0] if rest[0] in DTYPES else (dtypes[0] if len(dtypes) == 1 else None)
            return name, dtype
    return None, None


def _params_note(stage: str, params: Mapping[str, int]) -> str:
    """Template parameters that differ from the stage's defaults, as 'STAGES=2'."""
    from perfscope.kernels import get_spec

    try:
        defaults = get_spec(stage).param_dict
    except PerfscopeError:
        return ""
    return ", ".join(f"{k}={v}" for k, v in params.items() if defaults.get(k) != v)


def _display_path(path: Path, roots: Sequence[Path]) -> str:
    # Relative to the folder the user named, so the page does not depend on where the
    # checkout lives (the committed example must be byte-identical on every machine).
    for root in roots:
        try:
            return path.resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            continue
    return path.name


# ------------------------------------------------------------------------ collecting


def _order(entry: Entry) -> tuple:
    from perfscope.kernels import names

    order = names()
    if entry.stage is None:
        return (len(DTYPE_ORDER) + 1, 0, 0, entry.file)
    is_ref = entry.stage.startswith("cublas")
    dt = DTYPE_ORDER.index(entry.dtype) if entry.dtype in DTYPE_ORDER else len(DTYPE_ORDER)
    return (dt, is_ref, order.index(entry.stage), entry.file)


def _entries(reports: Sequence[Path], roots: Sequence[Path], kernel: str | None) -> list[Entry]:
    raw: list[tuple[Path, KernelProfile, RunManifest | None]] = []
    for path in reports:
        manifest = manifest_beside(path)
        profiles = load(path, kernel)
        raw += [(path, kp, manifest) for kp in profiles]
    if not raw:
        raise PerfscopeError("no kernel launch in the given reports"
                             + (f" matches {kernel!r}." if kernel else "."))
    per_file: dict[Path, int] = {}
    for path, _, _ in raw:
        per_file[path] = per_file.get(path, 0) + 1
    staged: list[Entry] = []
    for path, kp, manifest in raw:
        stage, dtype = stage_of(path, manifest)
        file = _display_path(path, roots)
        if stage is not None:
            label = stage + (f" · {dtype}" if dtype else "")
            if manifest is not None and (note := _params_note(stage, manifest.params)):
                label += f" ({note})"
        else:
            label = _stem(path)
        if per_file[path] > 1:
            label += f" #{kp.identity.action_index} {kp.name}"
        staged.append(Entry("", label, file, stage, dtype, kp, manifest, evaluate(kp, manifest),
                            path))
    staged.sort(key=_order)
    return [Entry(f"k{i}", e.label, e.file, e.stage, e.dtype, e.profile, e.manifest, e.evaluation,
                  e.path) for i, e in enumerate(staged)]


def _comparisons(entries: Sequence[Entry]) -> list[Comparison]:
    """Each stage against its parent stage and its cuBLAS reference, where those are here."""
    from perfscope import diff as d
    from perfscope.kernels import REFERENCE_FOR_DTYPE, get_spec

    # One kernel per (stage, dtype): a stage profiled twice (or with several launches)
    # is compared by its first entry, and the page says so.
    by_stage: dict[tuple[str, str | None], Entry] = {}
    for e in entries:
        if e.stage is not None:
            by_stage.setdefault((e.stage, e.dtype), e)

    def side(e: Entry) -> d.Side:
        return d.Side(e.label, e.path, e.profile, e.manifest, e.evaluation)

    out = []
    for e in entries:
        if e.stage is None or by_stage.get((e.stage, e.dtype)) is not e:
            continue
        spec = get_spec(e.stage)
        targets = []
        if spec.parent is not None:
            targets.append(("parent stage", by_stage.get((spec.parent, e.dtype))))
        ref = REFERENCE_FOR_DTYPE.get(e.dtype or "")
        if not spec.is_reference and ref is not None:
            targets.append(("cuBLAS", by_stage.get((ref, e.dtype))))
        for kind, other in targets:
            if other is not None:
                out.append(Comparison(kind, e, other, d.compare(side(e), side(other))))
    return out


def _find_bench(paths: Sequence[Path]) -> Path | None:
    for p in paths:
        candidate = p / BENCH_NAME if p.is_dir() else p.parent / BENCH_NAME
        if candidate.is_file():
            return candidate
    return None


def _peak(env: Environment | None, dtype: str, clock_mhz: float | None) -> tuple[float | None, str]:
    if env is None:
        return None, "peak unknown: no GPU environment recorded"
    per = PEAK_FLOP_PER_SM_CLOCK.get(env.compute_capability, {}).get(dtype)
    if per is None or clock_mhz is None:
        return None, f"peak unknown for compute capability {env.compute_capability}"
    peak = per * env.sm_count * clock_mhz * 1e6 / 1e12
    return peak, f"{env.gpu} peak at the timed SM clock {clock_mhz:.0f} MHz ({env.sm_count} SMs)"


def _ladders(manifests: Sequence[RunManifest], env: Environment | None) -> list[Ladder]:
    from perfscope.kernels import REFERENCE_FOR_DTYPE, names

    order = names()
    out = []
    for dtype in DTYPE_ORDER:
        runs = [m for m in manifests if m.dtype == dtype]
        if not runs:
            continue
        ref_name = REFERENCE_FOR_DTYPE.get(dtype)
        ref_run = next((m for m in runs if m.stage == ref_name and m.timing), None)
        ref_tflops = ref_run.timing.tflops if ref_run else next(
            (m.timing.reference_tflops for m in runs if m.timing and m.timing.reference_tflops), None)
        points = []
        stages = [m for m in runs if m.stage != ref_name]
        stages.sort(key=lambda m: (order.index(m.stage) if m.stage in order else len(order),
                                   sorted(m.params.items())))
        for m in stages:
            note = _params_note(m.stage, m.params)
            t = m.timing
            points.append(LadderPoint(
                label=m.stage + (f" ({note})" if note else ""), stage=m.stage,
                tflops=t.tflops if t else None, verdict=m.verification.verdict, variant=m.variant,
                sm_clock_mhz=t.sm_clock_mhz.median if t and t.sm_clock_mhz else None,
                ratio_to_reference=t.ratio_to_reference.median if t and t.ratio_to_reference else None))
        clocks = sorted(p.sm_clock_mhz for p in points if p.sm_clock_mhz is not None)
        clock = clocks[len(clocks) // 2] if clocks else None
        peak, peak_note = _peak(env or next((m.environment for m in runs if m.environment), None),
                                dtype, clock)
        out.append(Ladder(dtype, tuple(points), ref_name if ref_tflops else None, ref_tflops,
                          peak, peak_note))
    return out


def collect(paths: Iterable[str | os.PathLike[str]], *, bench: str | os.PathLike[str] | None = None,
            kernel: str | None = None, title: str | None = None, command: str | None = None) -> Report:
    """Everything the report shows, for the reports under paths (files or folders).

    bench: a ``bench.json`` for the ladder overview; by default the one in (or beside)
    the first folder given, if any. Manifests beside the reports add the stages it lacks.
    """
    given = [Path(p) for p in paths]
    if not given:
        raise PerfscopeError("give at least one report or folder of reports.")
    reports = find_reports(given)
    roots = [p if p.is_dir() else p.parent for p in given]
    entries = _entries(reports, roots, kernel)
    warnings: list[str] = []
    bench_path = Path(bench) if bench is not None else _find_bench(given)
    bench_file = BenchFile.read(bench_path) if bench_path is not None else None
    manifests: list[RunManifest] = list(bench_file.manifests) if bench_file else []
    timed = {(m.stage, m.dtype, tuple(sorted(m.params.items()))) for m in manifests}
    for e in entries:
        m = e.manifest
        if m is not None and (m.stage, m.dtype, tuple(sorted(m.params.items()))) not in timed:
            manifests.append(m)
            timed.add((m.stage, m.dtype, tuple(sorted(m.params.items()))))
    env = bench_file.environment if bench_file else None
    ladders = _ladders(manifests, env)
    if bench_path is not None:
        source = f"{_display_path(bench_path, roots)} (event-timed, outside ncu)"
    elif ladders:
        source = "the run manifests beside the reports (event-timed, outside ncu)"
    else:
        source = None
    staged = [e for e in entries if e.stage is not None]
    seen: set[tuple[str, str | None]] = set()
    for e in staged:
        if (e.stage, e.dtype) in seen:
            warnings.append(f"{e.label} appears more than once; diffs use the first ({e.file} is "
                            "shown but not diffed).")
        seen.add((e.stage, e.dtype))
    return Report(title=title or "perfscope diagnosis report", entries=tuple(entries),
                  ladders=tuple(ladders), timing_source=source,
                  comparisons=tuple(_comparisons(entries)), bench=bench_file, command=command,
                  warnings=tuple(warnings))
