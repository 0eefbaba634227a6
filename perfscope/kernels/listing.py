"""`perfscope kernels`: every stage, its parent, what it changes, and its measured ratios.

The ratios are median ratios to the stage's reference that bench files recorded at the
stage's default parameters (for hgemm_small_m and its variant, the tile the host picks for
each shape): by default those of the committed H200 reference run (REFERENCE_BENCHES: the
ladder at 4096^3, the fused stages against their cuBLAS-plus-pass groups over issue 19's
shapes, hgemm_fp8 against cuBLASLt). A stage timed at one shape shows its best ratio over
the dtypes; one timed at several, the range of its per-shape best. A stage without a timed
row says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from perfscope.documents import KernelRow, KernelsTable
from perfscope.errors import PerfscopeError
from perfscope.kernels.registry import (
    COMPILED_ONLY,
    EPILOGUE_STAGES,
    FP8_STAGES,
    REGISTRY,
    declared_params,
)
from perfscope.kernels.spec import Shape
from perfscope.manifest import BENCH_NAME, BenchFile, RunManifest
from perfscope.stage import at_defaults

# The bench files of a reference run's folder that the listing reads, where present (fp8/:
# hgemm_fp8 against cuBLASLt with fast accumulation; its -precise files hold it against
# the other build and stay out, so that one row has one reference).
REFERENCE_BENCHES = (BENCH_NAME, "fused/bench-fused.json",
                     *(f"fp8/bench-fp8-{s}.json" for s in ("2048x2048x2048", "4096x4096x4096",
                                                           "8192x8192x2048", "8192x8192x8192")))


def bench_files(bench: Path) -> tuple[Path, ...]:
    """The bench files a --bench argument names: the file itself, or a folder's
    REFERENCE_BENCHES that exist."""
    if bench.is_dir():
        return tuple(bench / name for name in REFERENCE_BENCHES if (bench / name).is_file())
    return (bench,) if bench.is_file() else ()


def _timed(manifests: Sequence[RunManifest], source: str,
           best: dict[str, dict[Shape, tuple[float, str, str, str]]]) -> None:
    """Each default-parameter row's ratio into best[stage][shape], the best over dtypes."""
    for m in manifests:
        t = m.timing
        if t is None or t.ratio_to_reference is None:
            continue
        shape = Shape(m.m, m.n, m.k, m.batch)
        defaults = declared_params(m.stage, shape)
        if defaults is None or not at_defaults(m.params, defaults):
            continue
        r = t.ratio_to_reference.median
        per_shape = best.setdefault(m.stage, {})
        if shape not in per_shape or r > per_shape[shape][0]:
            per_shape[shape] = (r, m.dtype, t.reference or "", source)


def kernels_table(bench: Path | None) -> KernelsTable:
    """The listing, with ratios from bench (a bench file, or a reference run's folder)."""
    files = bench_files(bench) if bench is not None else ()
    best: dict[str, dict[Shape, tuple[float, str, str, str]]] = {}
    for path in files:
        try:
            manifests: Sequence[RunManifest] = BenchFile.read(path).manifests
        except PerfscopeError:
            continue
        _timed(manifests, str(path), best)
    rows = []
    # The fused stages (timed against their groups) and hgemm_fp8 list too.
    for spec in REGISTRY + EPILOGUE_STAGES + FP8_STAGES + COMPILED_ONLY:
        per_shape = best.get(spec.name, {})
        ratios = sorted(per_shape.values())
        top = ratios[-1] if ratios else None
        references = sorted({r[2] for r in ratios})
        rows.append(KernelRow(spec.name, spec.family, spec.parent, spec.archs if spec.source else (),
                              spec.change, spec.variant, spec.label,
                              top[0] if top else None, top[1] if top else None,
                              ", ".join(sorted({r[3] for r in ratios})) or None,
                              ratio_low=ratios[0][0] if ratios else None, shapes=len(ratios),
                              reference="/".join(references) or None))
    return KernelsTable(tuple(rows), ", ".join(str(f) for f in files) or None)
