"""The SM clock while `perfscope bench` times a GEMM, measured on the SMs themselves.

    PYTHONPATH=. python3 benchmarks/bench_clock.py [--out reports/reference/h200/bench_clock.json]

The bench files' clock column is NVML's SM clock sampled while the queued launches run; it
reads the 1980 MHz boost clock, while ncu's cycles over duration say about 1.6 GHz for the
same kernels and `sustained_clock.py` finds the card at its 700 W power cap near 1.5 GHz
when a GEMM runs back to back. Which clock did the timed launches see? This script times
each GEMM exactly as bench does (bench's 512 MiB L2 flush before each launch, CUDA events
around it) and brackets every launch with a probe kernel: one warp per SM spins for PROBE_CYCLES
of its own clock64() and reads %globaltimer (ns) at both ends, so cycles over nanoseconds
is the SM clock of that moment, without NVML and without ncu. The probe before a launch
runs after the flush; the probe after it starts as the GEMM's last CTAs finish, so it
sees the clock the GEMM ended at (the card's clock control works over milliseconds; a probe
is ~30 us). Those two see the clock between launches. A third probe runs *during* each
launch, on a second stream, beside the GEMM's CTAs (one warp with few registers fits in
what a persistent CTA leaves of an SM), and counts only where a marker before and after the
GEMM on its own stream bracket it. Per kernel and shape it prints and writes the
event-timed TFLOP/s, the three probe clocks, NVML's samples, and the share of the dense
BF16 peak (perfscope.hardware's table: 4096 FLOP per SM and clock on sm_90) at the clock
during the launches.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from perfscope.environment import ClockReader, collect_environment
from perfscope.hardware import PEAK_FLOP_PER_SM_CLOCK, math_kind, peak_flops
from perfscope.kernels import get_spec, parse_shape
from perfscope.kernels.launch import prepare, require_gpu
from perfscope.timing import BenchOptions, L2Flush
from perfscope.verify import make_inputs

log = logging.getLogger("bench_clock")

KERNELS = ("hgemm_tma_wgmma_persistent", "hgemm_tma_wgmma_streamk", "cublas_bgemm")
SHAPES = ("4096x4096x4096", "8192x8192x8192")
PROBE_CYCLES = 60_000                # ~30 us at 2 GHz: %globaltimer's steps are 32 ns or finer
FLUSH_BYTES = 512 * 2**20            # as bench (perfscope.timing.BenchOptions)

PROBE_SOURCE = r"""
extern "C" __global__ void mark(unsigned long long* out) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    *out = t;
}

// out[3 * block]: cycles spun, ns elapsed, globaltimer at the start.
extern "C" __global__ void clock_probe(long long cycles, unsigned long long* out) {
    if (threadIdx.x != 0) return;
    unsigned long long t0, t1;
    const long long c0 = clock64();
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    long long c1 = c0;
    while (c1 - c0 < cycles) c1 = clock64();
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
    out[3 * blockIdx.x] = (unsigned long long)(c1 - c0);
    out[3 * blockIdx.x + 1] = t1 - t0;
    out[3 * blockIdx.x + 2] = t0;
}
"""


class Probe:
    """One warp per SM spinning a number of its cycles; each launch's SM clock read back
    later. The warp needs few registers, so it fits beside a GEMM that leaves 1,024 of an
    SM's 65,536 (the persistent stage: 384 threads x 168) and can run during it."""

    def __init__(self, cp) -> None:
        self.cp = cp
        module = cp.RawModule(code=PROBE_SOURCE)
        self.kernel = module.get_function("clock_probe")
        self.marker = module.get_function("mark")
        self.blocks = int(cp.cuda.Device().attributes["MultiProcessorCount"])

    def launch(self, cycles: int = PROBE_CYCLES, stream=None):
        out = self.cp.zeros(3 * self.blocks, dtype=self.cp.uint64)
        self.kernel((self.blocks,), (32,), (np.int64(cycles), out), stream=stream)
        return out

    def mark(self):
        out = self.cp.zeros(1, dtype=self.cp.uint64)
        self.marker((1,), (1,), (out,))
        return out

    @staticmethod
    def mhz(out, window: tuple[int, int] | None = None) -> float | None:
        """The median over the SMs of cycles per microsecond; with a window (globaltimer
        ns), only the probes that started and ended inside it (None if none did)."""
        rows = out.get().reshape(-1, 3).astype(np.float64)
        if window is not None:
            lo, hi = window
            rows = rows[(rows[:, 2] >= lo) & (rows[:, 2] + rows[:, 1] <= hi)]
            if not len(rows):
                return None
        return float(np.median(rows[:, 0] / rows[:, 1] * 1e3))


def measure(cp, cc: str, stage: str, shape_text: str, runs: int, rounds: int) -> dict:
    """One kernel at one shape (cc: the compute capability as "9.0", for the peak)."""
    shape = parse_shape(shape_text)
    prep = prepare(get_spec(stage), "bf16", shape)
    a, b = make_inputs(cp, shape, "bf16", 0)
    c = cp.empty((shape.m, shape.n), dtype=a.dtype)
    flush = L2Flush(cp, FLUSH_BYTES, BenchOptions.l2_flush)
    probe, nvml = Probe(cp), ClockReader()
    for _ in range(3):
        prep.launch(a, b, c, None)
    cp.cuda.get_current_stream().synchronize()
    times, before, after, sampled = [], [], [], []
    for _ in range(rounds):
        starts = [cp.cuda.Event() for _ in range(runs)]
        ends = [cp.cuda.Event() for _ in range(runs)]
        outs = []
        for start, end in zip(starts, ends, strict=True):
            flush()
            pre = probe.launch()
            start.record()
            prep.launch(a, b, c, None)
            end.record()
            outs.append((pre, probe.launch()))
        while not ends[-1].done:
            mhz = nvml.sm_mhz()
            if mhz is not None:
                sampled.append(mhz)
            time.sleep(0.002)
        ends[-1].synchronize()
        cp.cuda.get_current_stream().synchronize()
        times += [cp.cuda.get_elapsed_time(s, e) for s, e in zip(starts, ends, strict=True)]
        before += [Probe.mhz(p) for p, _ in outs]
        after += [Probe.mhz(q) for _, q in outs]
    ms = statistics.median(times)
    during, during_ms = concurrent(cp, prep, (a, b, c), flush, probe, ms, runs)
    tflops = shape.flops / (ms * 1e-3) / 1e12
    clock = statistics.median(during) if during else None
    flops = peak_flops(cc, math_kind("bf16"), probe.blocks, clock * 1e6 if clock else None)
    peak = flops / 1e12 if flops else None

    def spread(v: list[float]) -> dict | None:
        return {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)} if v else None

    return {"stage": stage, "shape": shape_text, "dtype": "bf16", "launches": len(times),
            "ms_median": ms, "tflops": tflops,
            "probe_mhz_before": spread(before), "probe_mhz_after": spread(after),
            "probe_mhz_during": spread(during), "ms_median_with_probe": during_ms,
            "nvml_mhz": ({"median": statistics.median(sampled), "min": min(sampled),
                          "max": max(sampled), "samples": len(sampled)} if sampled else None),
            "peak_tflops_at_clock_during": peak,
            "share_of_peak": tflops / peak if peak else None}


def concurrent(cp, prep, abc, flush, probe: Probe, ms: float, runs: int
               ) -> tuple[list[float], float]:
    """Probes on a second stream during each launch (released by an event recorded just
    before it, spinning for about half its time); a probe counts only where it started and
    ended between markers written just before and just after the GEMM on its stream."""
    side = cp.cuda.Stream(non_blocking=True)
    cycles = int(0.5 * ms * 1e-3 * 1.98e9)
    clocks, times = [], []
    for _ in range(runs):
        flush()
        m0 = probe.mark()
        go, start, end = cp.cuda.Event(), cp.cuda.Event(), cp.cuda.Event()
        go.record()
        side.wait_event(go)
        out = probe.launch(cycles, stream=side)
        start.record()
        prep.launch(*abc, None)
        end.record()
        m1 = probe.mark()
        cp.cuda.Device().synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end))
        mhz = Probe.mhz(out, (int(m0.get()[0]), int(m1.get()[0])))
        if mhz is not None:
            clocks.append(mhz)
    return clocks, statistics.median(times)


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("reports/reference/h200/bench_clock.json"))
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    cp = require_gpu()
    env = collect_environment(cp)
    rows = []
    for shape in SHAPES:
        for stage in KERNELS:
            row = measure(cp, env.compute_capability, stage, shape, args.runs, args.rounds)
            rows.append(row)
            during = row["probe_mhz_during"]
            log.info("%-28s %s %7.1f TFLOP/s  probe before %4.0f, during %s (%s of %d), after "
                     "%4.0f MHz  NVML %s  %s of peak", stage, shape, row["tflops"],
                     row["probe_mhz_before"]["median"],
                     f"{during['median']:.0f}" if during else "-", during["n"] if during else 0,
                     args.runs, row["probe_mhz_after"]["median"],
                     f"{row['nvml_mhz']['median']:.0f}" if row["nvml_mhz"] else "-",
                     f"{row['share_of_peak']:.3f}" if row["share_of_peak"] else "-")
    doc = {"schema": "perfscope.bench_clock/1", "command": "PYTHONPATH=. python3 " + " ".join(sys.argv),
           "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "probe_cycles": PROBE_CYCLES, "flush_bytes": FLUSH_BYTES,
           "l2_flush": BenchOptions.l2_flush,
           "dense_flop_per_clock_per_sm": PEAK_FLOP_PER_SM_CLOCK.get(env.compute_capability,
                                                                     {}).get("tensor16"),
           "environment": asdict(env), "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
