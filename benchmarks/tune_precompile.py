"""Fill a cubin cache with every configuration of the H200 tuning sweep, on any machine.

    PERFSCOPE_CACHE=build/tune-cache PYTHONPATH=. python3 benchmarks/tune_precompile.py [--jobs N]

NVRTC needs no GPU, and the cubin cache is keyed by the source, the flags, the name
expression and the NVRTC version (not by the machine or its include paths), so the cubins
compiled here are the ones the GPU machine would compile: carry the folder there and run
``benchmarks/tune_h200.py`` with the same PERFSCOPE_CACHE, and the sweep's compile phase
only reads the cache. It prints how many configurations it compiled, how long that took in
parallel and added up, and the cache's size.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from tune_h200 import DTYPES, STAGE, sweep_jobs

from perfscope.cache import cache_root
from perfscope.tune.compiling import CompilePool


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stage", default=STAGE)
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES))
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    jobs = sweep_jobs(args.stage, tuple(args.dtypes))
    start = time.monotonic()
    with CompilePool(args.jobs) as pool:
        outcomes = list(pool.run(jobs))
    wall = time.monotonic() - start
    failed = [o for o in outcomes if o.usage is None]
    cached = sum(o.from_cache for o in outcomes)
    root = cache_root() / "cubin"
    size = sum(p.stat().st_size for p in root.iterdir()) if root.is_dir() else 0
    print(f"{len(outcomes)} configurations of {args.stage} ({', '.join(args.dtypes)}) in {wall:.1f} s "
          f"on {args.jobs} processes ({sum(o.seconds for o in outcomes):.1f} s added up); "
          f"{cached} were cached already, {len(failed)} did not compile")
    for o in failed:
        print(f"  {o.job.dtype} {o.job.config.text}: {o.reason}")
    print(f"cache: {root} ({size / 2**20:.1f} MiB)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
