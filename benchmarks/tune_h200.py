"""The H200 tuning sweep of issue 18: hgemm_tma_wgmma_persistent, bf16 and fp16, 8 shapes.

    PYTHONPATH=. python3 benchmarks/tune_h200.py [--out reports/reference/h200/tune]
    PERFSCOPE_CACHE=build/tune-cache PYTHONPATH=. python3 benchmarks/tune_h200.py   # precompiled

One run, under 9 minutes of wall time (373 s on 2026-12-02) on one H200 with 16 cores (``--budget-s``, 510 by
default, is enforced: the search stops dispatching at its deadline and says so, and
``--resume`` finishes a stopped sweep):

1. compile speed: the same configurations compiled into two empty caches, one after
   another in this process and then in a pool of one process per core (``--compile-sample``
   of them; both wall times and the speed-up go into results.json);
2. the sweep: the configurations of the stage's declared space that survive pruning, with
   BN held at 256 (``--param``, repeatable; the first sweep, over both BN, found BN=128 the
   worst configuration at all 16 shape/dtype pairs and the best at none): 240 per dtype on
   the H200 (stages, C staging boxes, group, stream-K off, on or as the tail split, and
   the store between tiles or deferred into the next one's k loop),
   all of them at every shape (``--budget`` fewer: the tuner's bayes search), compiled in parallel into
   the real cubin cache (free when ``benchmarks/tune_precompile.py`` filled it), verified
   at every shape against the float64 reference (computed once per shape) and timed
   against cuBLAS in alternating rounds with L2 flushed, on one worker per visible GPU;
   then the best 3 per shape and the default timed again at length;
3. why the winner wins: best against worst under ncu at every bf16 shape, diffed
   (``--no-profile`` skips it; it runs only when the deadline leaves room);
4. into ``--out``: tune.sqlite.xz (the store, xz-compressed; ``--resume`` unpacks it),
   tune-store.json.xz (its export, xz-compressed), results.json.xz (the document, schema
   perfscope.tune/1, with the compile measurements, the phase wall times and the
   environment), tune.md and tune.html (the tuning section on its own page).

It prints the table per shape (best configuration, ratio to cuBLAS with its spread, the
default's ratio) and the geometric mean of the best ratios per dtype.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import lzma
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from perfscope.cache import CACHE_ENV, cache_root
from perfscope.kernels import get_spec, parse_shape
from perfscope.kernels.spec import parse_params
from perfscope.tune import workflow
from perfscope.tune.compiling import CompileJob, CompilePool
from perfscope.tune.executors import ExecutorChoice, make_executor, visible_devices
from perfscope.tune.space import configurations, limits_for, static_prune
from perfscope.tune.store import Store

log = logging.getLogger("tune_h200")

STAGE = "hgemm_tma_wgmma_persistent"
DTYPES = ("bf16", "fp16")
SHAPES = ("4096x4096x4096", "8192x8192x8192", "6144x6144x6144", "4096x4096x7168",
          "4096x14336x4096", "8192x2048x8192", "2048x8192x8192", "1024x8192x8192")
ARCH = "sm_90a"
PINS = ("BN=256",)
STORE_XZ = "tune.sqlite.xz"
OUT = Path("reports/reference/h200/tune")
# Seconds kept back from the search for the ncu profiles and for writing the results.
PROFILE_RESERVE_S = 150.0
WRITE_RESERVE_S = 20.0
# A trial takes well under 2 s here; one that hangs (a deadlocked ring) is killed at this.
TASK_TIMEOUT_S = 45.0


def exhaustive_budget(jobs: list[CompileJob]) -> int:
    """Configurations per shape that make the sweep exhaustive: the most legal ones of a dtype
    (the tuner is exhaustive when every configuration fits its budget)."""
    return max(Counter(j.dtype for j in jobs).values(), default=1)


def sweep_jobs(stage: str = STAGE, dtypes: tuple[str, ...] = DTYPES,
               pins: dict[str, int] | None = None) -> list[CompileJob]:
    """The compile jobs of the sweep: every configuration static pruning leaves, per dtype."""
    spec = get_spec(stage)
    limits = limits_for(ARCH)
    return [CompileJob(stage, dtype, ARCH, c) for dtype in dtypes
            for c in configurations(spec, pins)
            if static_prune(spec, c, dtype, limits) is None]


def compile_speed(jobs: list[CompileJob], processes: int) -> dict:
    """Serial against parallel on the same jobs, each into its own empty cache."""
    saved = os.environ.get(CACHE_ENV)
    out: dict = {"configurations": len(jobs), "processes": processes}
    try:
        for label, n in (("serial", 1), ("parallel", processes)):
            with tempfile.TemporaryDirectory(prefix=f"tune-{label}-") as cache:
                os.environ[CACHE_ENV] = cache
                start = time.monotonic()
                with CompilePool(n) as pool:
                    outcomes = list(pool.run(jobs))
                out[f"{label}_s"] = round(time.monotonic() - start, 2)
                assert not any(o.from_cache for o in outcomes), "a cold cache served a cubin"
    finally:
        if saved is None:
            os.environ.pop(CACHE_ENV, None)
        else:
            os.environ[CACHE_ENV] = saved
    out["speedup"] = round(out["serial_s"] / out["parallel_s"], 2) if out["parallel_s"] else None
    return out


def cache_state() -> dict:
    """Where the cubin cache is and how many cubins it holds before the sweep."""
    root = cache_root() / "cubin"
    return {"cache": str(root), "cubins_before": len(list(root.glob("*.cubin"))) if root.is_dir() else 0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--stage", default=STAGE)
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES))
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES))
    parser.add_argument("--param", action="append", default=None, metavar="NAME=VALUE",
                        help=f"hold a parameter (repeat; default {' '.join(PINS)})")
    parser.add_argument("--budget-s", type=float, default=510.0,
                        help="wall-time budget for the whole run (default 510 s)")
    parser.add_argument("--budget", type=int, default=None,
                        help="configurations per shape (default: every legal one, exhaustive; "
                             "fewer: the tuner's bayes search)")
    parser.add_argument("--compile-sample", type=int, default=32,
                        help="configurations compiled serially and in parallel (0: skip)")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--confirm", type=int, default=3)
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--resume", action="store_true", help="continue the store in --out")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--dry", action="store_true",
                        help="a rehearsal on a machine with no GPU: compile, synthetic timings")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s", stream=sys.stderr)
    started = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    store_path = args.out / "tune.sqlite"
    packed = args.out / STORE_XZ
    if not args.resume:
        # A fresh reference run: the committed store is replaced, not added to.
        for p in args.out.glob("tune.sqlite*"):
            p.unlink()
    elif packed.exists() and not store_path.exists():
        # The folder keeps the store compressed; a resumed sweep continues it unpacked.
        with lzma.open(packed) as src, open(store_path, "wb") as dst:
            shutil.copyfileobj(src, dst)

    pins = parse_params(args.param if args.param is not None else list(PINS))
    jobs = sweep_jobs(args.stage, tuple(args.dtypes), pins)
    timings: dict = {"budget_s": args.budget_s, "gpus": list(visible_devices())}
    timings.update(cache_state())
    if args.compile_sample > 0:
        # Half of each dtype's configurations, so both dtypes' templates are in the sample.
        sample = [j for d in args.dtypes for j in [x for x in jobs if x.dtype == d]
                  [: args.compile_sample // len(args.dtypes)]]
        timings["compile_speed"] = compile_speed(sample, args.jobs)
        print(f"compile speed on {len(sample)} configurations: serial "
              f"{timings['compile_speed']['serial_s']:.1f} s, {args.jobs} processes "
              f"{timings['compile_speed']['parallel_s']:.1f} s "
              f"({timings['compile_speed']['speedup']}x)", flush=True)

    profile = not args.no_profile
    elapsed = time.monotonic() - started
    search_deadline = args.budget_s - elapsed - WRITE_RESERVE_S - (PROFILE_RESERVE_S if profile else 0)
    shapes = tuple(parse_shape(s) for s in args.shapes)
    request = workflow.TuneRequest(
        stages=(args.stage,), shapes=shapes, dtypes=tuple(args.dtypes), store=store_path, pins=pins,
        budget=args.budget if args.budget is not None else exhaustive_budget(jobs),
        screen=workflow.TimingPlan(args.runs, args.rounds, 2), confirm=args.confirm,
        confirm_timing=workflow.TimingPlan(20, 5, 3), resume=args.resume,
        deadline_s=max(search_deadline, 30.0), command="PYTHONPATH=. python3 " + " ".join(sys.argv))
    choice = ExecutorChoice("local", dry=args.dry, compile_jobs=args.jobs, task_timeout=TASK_TIMEOUT_S)
    doc = workflow.run(request, make_executor(choice))
    sweep_stats = doc.stats
    timings["sweep_wall_s"] = round(sweep_stats.wall_s, 1)

    remaining = args.budget_s - (time.monotonic() - started) - WRITE_RESERVE_S
    if profile and not sweep_stats.stopped and remaining > 60:
        # The same sweep resumed (nothing is measured twice) with best against worst
        # profiled under ncu at every shape of the first dtype, in one ncu process.
        with tempfile.TemporaryDirectory(prefix="tune-profiles-") as profiles:
            again = dataclasses.replace(request, resume=True, confirm=0, deadline_s=None,
                                        profile_best=1, profile_dtypes=(args.dtypes[0],),
                                        profile_out=Path(profiles), profile_timeout=remaining - 30)
            doc = workflow.run(again, make_executor(choice))
        timings["profile_wall_s"] = round(doc.stats.profile_wall_s, 1)
        timings["profile_notes"] = list(doc.notes)
        # The table keeps the sweep's own costs (the resumed run compiled and timed nothing).
        doc = dataclasses.replace(doc, stats=dataclasses.replace(
            sweep_stats, profile_wall_s=doc.stats.profile_wall_s))
    elif profile:
        timings["profile_skipped"] = sweep_stats.stopped or "no time left before the budget"

    write(args.out, doc, timings, started)
    return 0 if not doc.stats.stopped else 1


def write_document(out: Path, doc, run: dict | None) -> None:
    """The document's three files in out: results.json.xz (with the run's phase times under
    "run" when given), tune.md and tune.html (benchmarks/tune_rerank.py rewrites them too)."""
    # The renderers load Nsight Compute's report reader: only once no worker runs.
    from perfscope.render import render
    from perfscope.render.jsondoc import tune_document
    from perfscope.render.tune import html_page

    results = {**tune_document(doc), **({"run": run} if run is not None else {})}
    (out / "results.json.xz").write_bytes(
        lzma.compress((json.dumps(results, indent=1, allow_nan=False) + "\n").encode()))
    (out / "tune.md").write_text(render(doc, "markdown"))
    (out / "tune.html").write_text(html_page(doc, "perfscope tune: hgemm_tma_wgmma_persistent on H200"))


def write(out: Path, doc, timings: dict, started: float) -> None:
    # The renderers load Nsight Compute's report reader: only now, once no worker runs.
    from perfscope.render import render

    timings["wall_s"] = round(time.monotonic() - started, 1)
    timings["sweep_stats"] = dataclasses.asdict(doc.stats)
    store = Path(doc.store)
    # What is committed names the store beside it, not the folder it was written in.
    doc = dataclasses.replace(doc, store=f"{STORE_XZ} (beside this file; unxz it to query it)")
    with Store.open(store) as s:
        export = s.export()
        s.backup(out / "tune.sqlite.tmp")
    # The store itself, xz-compressed (1.9 MB of SQLite for 1,024 trials is ~10x smaller);
    # --resume unpacks it again.
    with open(out / "tune.sqlite.tmp", "rb") as src, lzma.open(out / STORE_XZ, "wb", preset=9) as dst:
        shutil.copyfileobj(src, dst)
    (out / "tune.sqlite.tmp").unlink()
    if store.resolve() == (out / "tune.sqlite").resolve():
        store.unlink()
    text = json.dumps(export, indent=1, allow_nan=False, default=str) + "\n"
    # Compressed: 1.2 MB of JSON for 560 trials is ~10x smaller as xz, and git diffs of it
    # are no review aid (the table is tune.md).
    with lzma.open(out / "tune-store.json.xz", "wt", preset=9) as f:
        f.write(text)
    write_document(out, doc, timings)
    print(render(doc, "console", width=200))
    speed = timings.get("compile_speed")
    if speed:
        print(f"compiling {speed['configurations']} configurations: serial {speed['serial_s']} s, "
              f"{speed['processes']} processes {speed['parallel_s']} s, {speed['speedup']}x")
    s = doc.stats
    print(f"sweep: compile {s.compile_wall_s:.1f} s ({s.compiled_cached} of {s.compiled} from the "
          f"cache), verify {s.verify_s:.1f} s, time {s.time_s:.1f} s (worker time); search "
          f"{s.search_wall_s:.1f} s, confirm {s.confirm_wall_s:.1f} s; whole run {timings['wall_s']} s "
          f"of a {timings['budget_s']:.0f} s budget")
    for stage, dtype, g, n, at in doc.geomeans():
        print(f"{stage} {dtype}: geometric mean {g:.3f} over {n} shapes, {at} at >= 1.00")
    print(f"wrote {out}/{STORE_XZ}, tune-store.json.xz, results.json.xz, tune.md, tune.html")


if __name__ == "__main__":
    sys.exit(main())
