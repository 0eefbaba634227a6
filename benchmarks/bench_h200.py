"""Reproduce reports/reference/h200/bench.json: every stage and its cuBLAS reference at 4096^3.

    PYTHONPATH=. python3 benchmarks/bench_h200.py                       # on the GPU machine
    PYTHONPATH=. python3 benchmarks/bench_h200.py --sweep check.json    # + correctness sweep

Every ladder stage runs in each dtype it takes (fp32, fp16, bf16), sgemm_pipe with 2, 3
and 4 stages and hgemm_tma_wgmma with 3 and 4, each verified against float64 first and
then timed against the cuBLAS reference of its dtype in alternating rounds in this one
process (ratios printed as median and min-max over rounds). The Hopper stages and their
parent are timed again at 8192^3 into ``bench-8192.json`` beside ``--out`` (issue 8
holds them to both sizes). ``--sweep`` first checks every stage on every shape of issue 3
and writes those verdicts (no timing) to a second file. The clocks are measured as
found; nothing here changes them.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from perfscope import bench
from perfscope.kernels import get_spec, parse_shape
from perfscope.verify import CHECK_SHAPES

log = logging.getLogger("bench_h200")
DTYPES = ("fp32", "fp16", "bf16")
# Ring depths timed as rows of their own: seed 002 §4 compares sgemm_pipe at 2, 3 and 4;
# hgemm_tma_wgmma at 3 fits two CTAs in a multiprocessor's shared memory, at 4 one.
DEPTHS = {"sgemm_pipe": (2, 3, 4), "hgemm_tma_wgmma": (4, 3)}
HOPPER = ("hgemm_bcf_dbf_rw", "hgemm_ring", "hgemm_tma_wgmma", "hgemm_tma_wgmma_ws",
          "hgemm_tma_wgmma_persistent", "hgemm_tma_wgmma_streamk", "hgemm_tma_wgmma_tuned",
          "hgemm_tma_wgmma_balanced", "hgemm_tma_wgmma_cluster")
LARGE_SHAPE = "8192x8192x8192"
# Rounds at LARGE_SHAPE: the card sits at its power cap there (1.1-1.98 GHz while timing),
# and a 2% ladder step timed head to head over 5 rounds came out at 0.995 (bf16 stream-K
# against the persistent stage, 2026-12-04 18:11) where 15 rounds gave 1.020
# (reports/reference/h200/probes/streamk-8192.jsonl).
LARGE_ROUNDS = 15
# Issue 20 holds the best FP32 stage to 2048^3 and 8192^3 as well: it and its parent there.
FP32_STAGES = ("sgemm_tile128x256", "sgemm_stages4")
FP32_SHAPES = ("2048x2048x2048", "8192x8192x8192")


def jobs_for(shape: bench.Shape, stages: tuple[str, ...] = ("all",),
             dtypes: tuple[str, ...] = DTYPES) -> list[bench.Job]:
    jobs = []
    for job in bench.plan(list(stages), list(dtypes), shape):
        depths = DEPTHS.get(job.spec.name)
        if depths:
            for n in depths:
                spec = get_spec(job.spec.name).with_params(STAGES=n)
                # The depth the stage declares is the stage itself: a ladder step, timed head
                # to head with its parent and its children's parent.
                jobs.append(replace(job, spec=spec,
                                    declared=job.declared and spec.param_dict == job.spec.param_dict))
        else:
            jobs.append(job)
    return jobs


def show(title: str, manifests: list) -> None:
    # Deferred: the console renderer loads Nsight Compute's report reader, and CuPy must be
    # imported first (launch.require_gpu refuses the other order, which crashes).
    from perfscope.render.console import BENCH_COLUMNS, bench_rows

    table = Table(*BENCH_COLUMNS, title=title)
    for row in bench_rows(bench.summary(manifests)):
        table.add_row(*row)
    Console(width=200).print(table)


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("reports/reference/h200/bench.json"))
    ap.add_argument("--shape", default="4096x4096x4096")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sweep", type=Path, help="also check every shape; write verdicts here")
    ap.add_argument("--no-large", action="store_true",
                    help=f"skip the {LARGE_SHAPE} timing of the Hopper stages and the FP32 sizes")
    args = ap.parse_args()
    command = "PYTHONPATH=. python3 " + " ".join(sys.argv)
    env = bench.collect_environment()
    failed = False
    if args.sweep:
        checks: list = []
        opts = bench.BenchOptions(time=False, seed=7)
        for shape in CHECK_SHAPES:
            checks.extend(bench.run_jobs(jobs_for(shape), opts, env))
        bench.write_bench_json(args.sweep, checks, command)
        show("correctness sweep", checks)
        failed |= bench.failed(checks)
    opts = bench.BenchOptions(runs=args.runs, rounds=args.rounds)
    done: list = []
    try:
        for m in bench.run_jobs(jobs_for(parse_shape(args.shape)), opts, env):
            done.append(m)
            log.info("%s %s: %s", m.stage, m.dtype, m.verification.verdict)
    finally:
        if done:
            bench.write_bench_json(args.out, done, command)
            show(f"{args.shape}, {env.gpu}", done)
    large: list = []
    if done and not args.no_large:
        # The Hopper stages at the second size, with the stage they replace.
        large_opts = bench.BenchOptions(runs=args.runs, rounds=max(args.rounds, LARGE_ROUNDS))
        for m in bench.run_jobs(jobs_for(parse_shape(LARGE_SHAPE), HOPPER, ("fp16", "bf16")),
                                large_opts, env):
            large.append(m)
        if large:
            bench.write_bench_json(args.out.with_name("bench-8192.json"), large, command)
            show(f"{LARGE_SHAPE}, {env.gpu}", large)
    sizes: list = []
    if done and not args.no_large:
        for text in FP32_SHAPES:
            sizes.extend(bench.run_jobs(bench.plan(list(FP32_STAGES), ["fp32"], parse_shape(text)),
                                        opts, env))
        if sizes:
            bench.write_bench_json(args.out.with_name("bench-fp32.json"), sizes, command)
            show(f"FP32 at {', '.join(FP32_SHAPES)}, {env.gpu}", sizes)
    for step in bench.parent_steps(done):
        log.log(logging.WARNING if step.regression else logging.INFO,
                "%s %s: %.2fx its parent %s%s", step.stage, step.dtype, step.speedup,
                step.parent, " (variant)" if step.variant else "")
    return 1 if failed or any(bench.failed(x) for x in (done, large, sizes)) else 0


if __name__ == "__main__":
    sys.exit(main())
