"""hgemm_small_m's tile shape at M = 128 and 256, measured, before small_m_for's choice changes.

    PYTHONPATH=. python3 benchmarks/small_m_tiles.py [--out reports/reference/h200/fused/small-m-tiles.json]

Not yet run (branch next-gpu, 2026-12-01: no GPU was lent that session). The question it
answers: at M = 256 the host takes BM 256 x BN 128 (four m64n128 fragments per CTA, so
wgmma reads B from shared memory four times per k step) and measures 0.95-0.98 of
cublas+gelu; BM 128 x BN 256 (the persistent stage's m64n256 per consumer, split-K 2 over
128 CTAs at N = 8192) reads each B byte twice per k step and A half as often. Each
configuration is verified against float64 and timed against cublas+gelu in alternating
rounds in this one process (bench's path), bf16, bias + GELU.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from perfscope import bench
from perfscope.kernels import Shape

log = logging.getLogger("small_m_tiles")
# None: the host's own choice (fused_specs.small_m_for).
CONFIGS = (None, {"BM": 128, "BN": 256}, {"BM": 128, "BN": 128}, {"BM": 256, "BN": 128},
           {"BM": 128, "BN": 64})
SHAPES = ((256, 8192, 8192), (256, 4096, 14336), (256, 14336, 4096), (256, 4096, 4096),
          (128, 8192, 8192), (128, 4096, 14336))


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path,
                    default=Path("reports/reference/h200/fused/small-m-tiles.json"))
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    jobs = []
    for m, n, k in SHAPES:
        for cfg in CONFIGS:
            jobs += bench.plan(["hgemm_small_m"], ["bf16"], Shape(m, n, k), cfg)
    done = []
    try:
        for man in bench.run_jobs(jobs, bench.BenchOptions(runs=args.runs, rounds=args.rounds)):
            done.append(man)
            t = man.timing
            ratio = t.ratio_to_reference.median if t and t.ratio_to_reference else None
            log.info("%dx%dx%d BM=%s BN=%s STAGES=%s %s ratio to %s: %s", man.m, man.n, man.k,
                     man.params.get("BM"), man.params.get("BN"), man.params.get("STAGES"),
                     man.verification.verdict, t.reference if t else None,
                     f"{ratio:.3f}" if ratio is not None else "-")
    finally:
        if done:
            bench.write_bench_json(args.out, done, "PYTHONPATH=. python3 " + " ".join(sys.argv))
    return 1 if bench.failed(done) else 0


if __name__ == "__main__":
    sys.exit(main())
