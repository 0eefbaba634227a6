"""Issue 19 through `perfscope bench`'s own path: the fused stages against their groups.

    PYTHONPATH=. python3 benchmarks/bench_fused.py [--out reports/reference/h200/fused/bench-fused.json]

Shapes M in {16, 64, 256, 4096} x (N, K) in {(4096, 4096), (8192, 8192), (14336, 4096),
(4096, 14336)}, fp16 and bf16, bias + GELU: hgemm_small_m (M <= 256), its child
hgemm_small_m_packed (the same kernel reading B from 64-column strips, packed once outside
the timing; timed head to head with hgemm_small_m too), its stream-K
variant hgemm_small_m_streamk (M <= 64) and
hgemm_fused_bias_act (every M), each verified against float64 and then timed in
alternating rounds against ``cublas+gelu`` (cuBLAS, then the elementwise bias+GELU pass:
two launches between one pair of events) in this one process; at M = 4096 also
hgemm_fused_quant (fp8 and int8 outputs) against ``cublas+gelu+fp8`` / ``+int8``. It prints the table and the
ratio of the best fused stage per shape. benchmarks/fused_check.py holds the same shapes
against torch and cuBLASLt as well; this file is what `perfscope bench` itself measures.

    PYTHONPATH=. python3 benchmarks/bench_fused.py --tuned TUNE.sqlite --m 4096 --out F.json

adds, at each shape and dtype the tune store holds hgemm_fused_bias_act for, the store's
best configuration (what `perfscope bench --config best` runs) beside the default, both in
the same process and each against ``cublas+gelu``; ``--m`` keeps the listed M values only.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from perfscope import bench
from perfscope.kernels import Shape
from perfscope.kernels.fused_specs import QUANTS, STREAMK_MAX_M

log = logging.getLogger("bench_fused")
M_VALUES = (16, 64, 256, 4096)
NK = ((4096, 4096), (8192, 8192), (14336, 4096), (4096, 14336))
DTYPES = ("fp16", "bf16")
FUSED = "hgemm_fused_bias_act"


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path,
                    default=Path("reports/reference/h200/fused/bench-fused.json"))
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--until", type=float, default=None,
                    help="bench --until: add rounds until each ratio's interval is within "
                         "+-UNTIL of its median (up to --max-rounds)")
    ap.add_argument("--max-rounds", type=int, default=15)
    ap.add_argument("--tuned", type=Path, default=None,
                    help="a tune store: also time hgemm_fused_bias_act's best configuration")
    ap.add_argument("--m", type=int, action="append", default=None,
                    help="only these M values (repeat; default all)")
    args = ap.parse_args()
    opts = bench.BenchOptions(runs=args.runs, rounds=args.rounds, until=args.until,
                              max_rounds=args.max_rounds)
    jobs = plan_jobs(args.m or M_VALUES, args.tuned)
    done = []
    try:
        for man in bench.run_jobs(jobs, opts):
            done.append(man)
    finally:
        if done:
            bench.write_bench_json(args.out, done, "PYTHONPATH=. python3 " + " ".join(sys.argv))
    # The best stage per shape and reference (a quantising stage has its own group).
    best: dict[tuple[str, str, str], tuple[float, str]] = {}
    for man in done:
        t = man.timing
        if t is None or t.ratio_to_reference is None or t.reference is None:
            continue
        key = (man.dtype, man.shape, t.reference)
        if t.ratio_to_reference.median > best.get(key, (0.0, ""))[0]:
            best[key] = (t.ratio_to_reference.median, man.stage)
    for (dtype, shape, reference), (ratio, stage) in sorted(best.items()):
        print(f"{dtype} {shape:>16} {stage:22s} {ratio:.3f}x {reference}")
    return 1 if bench.failed(done) else 0


def plan_jobs(m_values: Sequence[int], tuned: Path | None) -> list:
    """Every job of the run, in order (bench.plan refuses bad input before anything runs)."""
    jobs = []
    for m in m_values:
        for n, k in NK:
            stages = ["hgemm_fused_bias_act"] + (["hgemm_small_m", "hgemm_small_m_packed"]
                                                 if m <= 256 else ["hgemm_fused_pingpong"])
            if m <= STREAMK_MAX_M:
                stages.append("hgemm_small_m_streamk")
            jobs += bench.plan(stages, list(DTYPES), Shape(m, n, k))
            if tuned is not None:
                jobs += tuned_jobs(tuned, Shape(m, n, k))
            if m > 256:
                # The quantising stage is the persistent one's epilogue: large M only.
                for quant in QUANTS.values():
                    jobs += bench.plan(["hgemm_fused_quant"], list(DTYPES), Shape(m, n, k),
                                       {"QUANT": quant})
    return jobs


def tuned_jobs(store: Path, shape: Shape) -> list:
    """hgemm_fused_bias_act at the store's best configuration for each dtype it was tuned at
    this shape; none where it was not."""
    from perfscope.errors import PerfscopeError
    from perfscope.tune.store import best_trial

    jobs = []
    for dtype in DTYPES:
        try:
            best = best_trial(store, FUSED, dtype, shape)
        except PerfscopeError as exc:
            log.info("%s %s %s: %s", FUSED, dtype, shape, exc)
            continue
        jobs += bench.plan([FUSED], [dtype], shape, best.params)
    return jobs


if __name__ == "__main__":
    sys.exit(main())
