"""Energy per launch: what a GEMM costs the card where the power cap, not the work, sets the clock.

    PYTHONPATH=. python3 benchmarks/energy_per_launch.py --out FILE [--seconds 0.5] [--rounds 4]
        [--settle 0] [--shape MxNxK ...] [--dtype bf16|fp16 ...]

bench times each launch after an L2 flush, in batches of 20, and at 4096^3 the card is
already held by its 700 W cap there (power_probe.json: 1.63 GHz inside the kernel on random
inputs, 1.80 on zeros, with NVML saying 1980 between batches). Two kernels that take the
same cycles then differ in time only as far as they differ in energy. This script measures
that energy: each case (a stage, its pinned parameters, a dtype and a shape) is verified
against float64, then launched back to back with no flush (the steady state of a training
or prefill loop) for about --seconds per segment, and NVML's total-energy counter, read
before and after each segment, gives the card's energy per launch (all of it: the idle
draw is in every case alike). CUDA events give the time per launch and NVML's SM clock is
sampled while the segment runs. The cases of one shape alternate in --rounds rounds,
reversed every other round, so the card's temperature drifts over all of them alike; each
row has the medians over the rounds and each case's ratios to the shape's first case.
--settle S launches each case back to back for about S seconds before its segment's energy
and time are read: the card's power limiting answers over a fraction of a second, so without
it a segment begins at the clock the previous case left (on an H100 at 0.5 s segments the
cases drew 673-750 W against a 700 W limit, and energy did not follow time).
Each --dtype (bf16 unless given) runs every case of every shape again in that dtype, cuBLAS's
GEMM being that dtype's (cublas_hgemm for fp16); a case whose stage lacks the dtype is left
out with a log line.
(benchmarks/sustained_clock.py runs one kernel at a time for 2 s and samples the clock,
power and throttle reasons; this script alternates the cases and counts energy.)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import statistics
import sys
import time
from pathlib import Path

from perfscope.errors import PerfscopeError
from perfscope.kernels import Shape, get_spec
from perfscope.kernels.registry import REFERENCE_FOR_DTYPE
from perfscope.kernels.spec import parse_shape

log = logging.getLogger("energy_per_launch")

# (label, stage, pinned parameters): the first case of each shape is the one the others
# are held against. "tuned" is the tune store's best configuration for that shape
# (reports/reference/h200/tune/tune.md and fused/tune/tune-fused.md, bf16).
_PERSISTENT_TUNED = {"STAGES": 4, "GROUP": 16, "BOXES": 1, "DEFER": 1}
CASES: dict[tuple[int, int, int], tuple[tuple[str, str, dict[str, int]], ...]] = {
    (4096, 4096, 4096): (
        ("cublas", "cublas_bgemm", {}),
        ("persistent", "hgemm_tma_wgmma_persistent", {}),
        ("persistent tuned", "hgemm_tma_wgmma_persistent", _PERSISTENT_TUNED),
        ("balanced", "hgemm_tma_wgmma_balanced", {}),
        ("cluster", "hgemm_tma_wgmma_cluster", {}),
    ),
    (4096, 4096, 14336): (
        ("cublas+gelu", "cublas+gelu", {}),
        ("cublas", "cublas_bgemm", {}),
        ("fused_bias_act", "hgemm_fused_bias_act", {}),
        ("fused_bias_act tuned", "hgemm_fused_bias_act",
         {"STAGES": 3, "GROUP": 16, "BOXES": 2, "STREAMK": 3, "DEFER": 0}),
        ("persistent tuned", "hgemm_tma_wgmma_persistent", _PERSISTENT_TUNED),
    ),
    (8192, 8192, 8192): (
        ("cublas", "cublas_bgemm", {}),
        ("persistent tuned", "hgemm_tma_wgmma_persistent", _PERSISTENT_TUNED),
        ("balanced", "hgemm_tma_wgmma_balanced", {}),
        ("streamk", "hgemm_tma_wgmma_streamk", {}),
        ("cluster", "hgemm_tma_wgmma_cluster", {}),
    ),
}
DTYPES = ("bf16", "fp16")
SEED = 7


def stage_for(stage: str, dtype: str) -> str:
    """The stage a case runs in dtype: cuBLAS's GEMM is one stage per dtype, the rest take
    the dtype themselves."""
    if stage in REFERENCE_FOR_DTYPE.values():
        return REFERENCE_FOR_DTYPE[dtype]
    return stage


def settle_launches(launches: int, seconds: float, settle: float) -> int:
    """Untimed launches before a segment of `launches` that fill about `seconds`: enough for
    about `settle` seconds, and never fewer than 3 (the caches and the clock out of idle)."""
    return max(3, round(launches * settle / seconds))


@dataclasses.dataclass(frozen=True)
class Segment:
    """One stretch of back-to-back launches: how many, their time and the card's energy."""

    launches: int
    ms: float
    energy_mj: int | None
    mhz: tuple[float, ...]


class Case:
    """A verified, prepared stage with its own inputs and output."""

    def __init__(self, cp, case: tuple[str, str, dict[str, int]], dtype: str, shape: Shape):
        from perfscope import verify
        from perfscope.kernels.launch import prepare

        label, stage, params = case
        spec = get_spec(stage)
        self.label, self.cp = label, cp
        self.prep = prepare(spec.with_params(**params) if params else spec, dtype, shape)
        v = verify.verify(self.prep, SEED)
        self.verdict = v.verdict
        ops = verify.launch_operands(cp, self.prep, SEED, scaled=self.prep.epilogue is not None)
        self.a, self.b, self.c, self.extra = ops.a, ops.b, ops.c, ops.extra

    def launch(self) -> None:
        self.prep.launch(self.a, self.b, self.c, self.extra)

    def launches_for(self, seconds: float) -> int:
        """How many launches fill about `seconds`, from a timed batch of 10."""
        cp = self.cp
        for _ in range(3):
            self.launch()
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(10):
            self.launch()
        end.record()
        end.synchronize()
        per = cp.cuda.get_elapsed_time(start, end) / 10 / 1e3
        return max(20, int(seconds / per))

    def segment(self, launches: int, clock, settle: int = 3) -> Segment:
        """`launches` timed back to back after `settle` untimed ones (the card settling to
        this case's power)."""
        cp = self.cp
        for _ in range(settle):
            self.launch()
        cp.cuda.get_current_stream().synchronize()
        start, end = cp.cuda.Event(), cp.cuda.Event()
        e0 = clock.energy_mj()
        start.record()
        for _ in range(launches):
            self.launch()
        end.record()
        mhz = []
        while not end.done:
            v = clock.sm_mhz()
            if v is not None:
                mhz.append(v)
            time.sleep(0.01)
        end.synchronize()
        e1 = clock.energy_mj()
        return Segment(launches, cp.cuda.get_elapsed_time(start, end),
                       None if e0 is None or e1 is None else e1 - e0, tuple(mhz))


def run_shape(cp, shape: Shape, dtype: str, clock, opts) -> list[dict]:
    """Every case of one shape in one dtype, alternating in rounds; a row per case."""
    ready = []
    for label, stage, params in CASES[(shape.m, shape.n, shape.k)]:
        stage = stage_for(stage, dtype)
        if dtype not in get_spec(stage).dtypes:
            log.info("%s %s: %s has no %s; not measured", shape, label, stage, dtype)
            continue
        case = Case(cp, (label, stage, params), dtype, shape)
        if case.verdict != "ok":
            log.warning("%s %s %s: verification %s; not measured", shape, dtype, label,
                        case.verdict)
            continue
        n = case.launches_for(opts.seconds)
        settle = settle_launches(n, opts.seconds, opts.settle)
        ready.append((case, n, settle))
    got: dict[str, list[Segment]] = {c.label: [] for c, _, _ in ready}
    for rnd in range(opts.rounds):
        for case, n, settle in (ready if rnd % 2 == 0 else ready[::-1]):
            got[case.label].append(case.segment(n, clock, settle))
    rows = []
    for case, _, settle in ready:
        segs = got[case.label]
        us = statistics.median(s.ms * 1e3 / s.launches for s in segs)
        mj = [s.energy_mj / s.launches for s in segs if s.energy_mj is not None]
        watts = [s.energy_mj / s.ms for s in segs if s.energy_mj is not None]
        mhz = [m for s in segs for m in s.mhz]
        params = case.prep.spec.param_dict
        rows.append({"shape": str(shape), "dtype": dtype, "case": case.label,
                     "stage": case.prep.spec.name, "params": params,
                     "launches_per_segment": segs[0].launches, "segments": len(segs),
                     "settle_launches": settle,
                     "us_per_launch": round(us, 2),
                     "tflops": round(shape.flops / (us * 1e-6) / 1e12, 1),
                     "mj_per_launch": round(statistics.median(mj), 3) if mj else None,
                     "watts": round(statistics.median(watts), 1) if watts else None,
                     "nvml_mhz_median": statistics.median(mhz) if mhz else None})
    base = rows[0] if rows else None
    for r in rows:
        r["against"] = base["case"]   # the first case that verified
        r["time_vs_first"] = round(r["us_per_launch"] / base["us_per_launch"], 4)
        if r["mj_per_launch"] is not None and base["mj_per_launch"]:
            r["energy_vs_first"] = round(r["mj_per_launch"] / base["mj_per_launch"], 4)
        log.info("%s %s %-22s %8.1f us %6.1f TFLOP/s %8s mJ %6s W %6s MHz  time %.3f energy %s",
                 shape, dtype, r["case"], r["us_per_launch"], r["tflops"], r["mj_per_launch"],
                 r["watts"], r["nvml_mhz_median"], r["time_vs_first"], r.get("energy_vs_first"))
    return rows


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seconds", type=float, default=0.5, help="per segment")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--settle", type=float, default=0.0,
                    help="seconds of untimed launches before each segment (default 0: 3 launches)")
    ap.add_argument("--shape", action="append", default=[],
                    help="MxNxK, one of the built-in shapes (repeatable; default all)")
    ap.add_argument("--dtype", action="append", default=[],
                    help=f"one of {', '.join(DTYPES)} (repeatable; default bf16)")
    args = ap.parse_args(argv)
    if args.seconds <= 0 or args.rounds < 1 or args.settle < 0:
        print("energy_per_launch: --seconds must be positive, --settle not negative and "
              "--rounds at least 1", file=sys.stderr)
        return 2
    dtypes = list(dict.fromkeys(args.dtype)) or ["bf16"]
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        print(f"energy_per_launch: --dtype {bad[0]!r} is not one of {', '.join(DTYPES)}",
              file=sys.stderr)
        return 2
    try:
        wanted = [(sh.m, sh.n, sh.k) for sh in map(parse_shape, args.shape)] or list(CASES)
    except PerfscopeError as exc:
        print(f"energy_per_launch: {exc}", file=sys.stderr)
        return 2
    unknown = [s for s in wanted if s not in CASES]
    if unknown:
        print(f"energy_per_launch: no cases for {unknown[0]}; built in: "
              + ", ".join("x".join(map(str, s)) for s in CASES), file=sys.stderr)
        return 2
    try:
        import cupy as cp
    except ImportError:
        print("energy_per_launch: needs CuPy and an NVIDIA GPU, and this machine has no CuPy",
              file=sys.stderr)
        return 2

    from perfscope.environment import ClockReader, collect_environment

    clock = ClockReader()
    if clock.energy_mj() is None:
        print("energy_per_launch: NVML's energy counter is not readable here", file=sys.stderr)
        return 2
    rows = []
    for dtype in dtypes:
        for m, n, k in wanted:
            rows += run_shape(cp, Shape(m, n, k), dtype, clock, args)
    doc = {"schema": "perfscope.energy-per-launch/1",
           "environment": dataclasses.asdict(collect_environment(cp)), "rows": rows,
           "seconds": args.seconds, "settle_seconds": args.settle, "rounds": args.rounds,
           "command": "PYTHONPATH=. python3 benchmarks/energy_per_launch.py "
           + " ".join(argv if argv is not None else sys.argv[1:]),
           "time": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    log.info("wrote %s", args.out)
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
