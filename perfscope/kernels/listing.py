"""`perfscope kernels`: every stage, its parent, what it changes, and its best measured ratio.

The ratio is the best median ratio to cuBLAS (over the dtypes the stage takes) that a bench
file recorded at the stage's default parameters: by default the committed H200 reference
run's ``bench.json``. A stage without a timed row says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from perfscope.documents import KernelRow, KernelsTable
from perfscope.errors import PerfscopeError
from perfscope.kernels.registry import COMPILED_ONLY, EPILOGUE_STAGES, REGISTRY
from perfscope.manifest import BENCH_NAME, BenchFile
from perfscope.stage import at_defaults


def kernels_table(bench: Path | None) -> KernelsTable:
    """The listing, with ratios from bench (a bench.json, or a folder holding one)."""
    if bench is not None and bench.is_dir():
        bench = bench / BENCH_NAME
    best: dict[str, tuple[float, str]] = {}
    if bench is not None and bench.is_file():
        try:
            manifests: Sequence = BenchFile.read(bench).manifests
        except PerfscopeError:
            manifests = ()
        defaults = {s.name: s.param_dict for s in REGISTRY + EPILOGUE_STAGES}
        for m in manifests:
            t = m.timing
            if (t is None or t.ratio_to_reference is None or m.stage not in defaults
                    or not at_defaults(m.params, defaults[m.stage])):
                continue
            r = t.ratio_to_reference.median
            if m.stage not in best or r > best[m.stage][0]:
                best[m.stage] = (r, m.dtype)
    rows = []
    # The fused stages (timed against their groups, in fused/bench-fused.json) list too.
    for spec in REGISTRY + EPILOGUE_STAGES + COMPILED_ONLY:
        ratio, dtype = best.get(spec.name, (None, None))
        rows.append(KernelRow(spec.name, spec.family, spec.parent, spec.archs if spec.source else (),
                              spec.change, spec.variant, spec.label, ratio, dtype,
                              str(bench) if ratio is not None else None))
    return KernelsTable(tuple(rows), str(bench) if bench is not None and bench.is_file() else None)
