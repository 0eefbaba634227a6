"""hgemm_fused_bias_act's tuned best at the K-heavy M = 4096 shapes (the tail split,
STREAMK=3, with DEFER=0: the bests of the 2026-12-03 22:06 UTC sweep, which pruned every
configuration ptxas spills) against the same configuration with DEFER=1, which ptxas
spills (4-52 B). One process, 7 rounds x 20 launches, each against cublas+gelu.

    PYTHONPATH=. python3 reports/reference/h200/fused/variants/defer_streamk.py OUT.json
"""
import sys
from pathlib import Path

from perfscope import bench
from perfscope.kernels import Shape

BN256 = {"BM": 128, "BN": 256, "BK": 64, "ACT": 1, "RESIDUAL": 0, "STREAMK": 3}
BESTS = {   # (shape, dtype): STAGES, GROUP, BOXES
    (Shape(4096, 4096, 14336), "bf16"): (3, 16, 2),
    (Shape(4096, 4096, 14336), "fp16"): (3, 4, 4),
    (Shape(4096, 8192, 8192), "bf16"): (4, 8, 1),
    (Shape(4096, 8192, 8192), "fp16"): (3, 16, 1),
}

out = Path(sys.argv[1])
jobs = []
for (shape, dtype), (stages, group, boxes) in BESTS.items():
    for defer in (0, 1):
        params = {**BN256, "STAGES": stages, "GROUP": group, "BOXES": boxes, "DEFER": defer}
        jobs += bench.plan(["hgemm_fused_bias_act"], [dtype], shape, params)
done = list(bench.run_jobs(jobs, bench.BenchOptions(runs=20, rounds=7)))
bench.write_bench_json(out, done, "PYTHONPATH=. python3 " + " ".join(sys.argv))
for m in done:
    r = m.timing.ratio_to_reference
    print(m.dtype, m.shape, {k: m.params[k] for k in ("STAGES", "GROUP", "BOXES", "STREAMK", "DEFER")},
          f"{r.median:.3f} ({r.min:.3f}-{r.max:.3f})")
