"""CUDA-event timing of a stage against its reference, in alternating rounds.

Each launch is timed with CUDA events (a group reference's two launches between one
pair of events). Before every launch a 512 MiB buffer is read, so that no run finds A or B
in the 60 MiB L2 and the L2 it starts from holds clean lines only (that read also keeps the
GPU busy while Python enqueues the launch, so host overhead stays outside the events).
Stage and reference are timed in alternating rounds in one process; each round gives one
ratio of the two medians, and the SM clock is sampled while the queued launches run.

Why a read and not a write (what Triton's do_bench and nvbench do): a written buffer leaves
the L2 full of dirty lines, and the timed kernel pays for writing them back. On the H200
(benchmarks/l2_flush.py, reports/reference/h200/l2_flush.json) that adds 2-8 us to a
kernel that streams 32-128 MiB, 7-22% of its time, and 1.2-1.7% at 4096^3; the read
leaves A and B just as surely out of the L2.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from perfscope.environment import ClockReader
from perfscope.errors import PerfscopeError
from perfscope.kernels.epilogue import DEFAULT_QUANT_SCALE, check_quant_scale
from perfscope.kernels.launch import Prepared, require_gpu
from perfscope.manifest import Spread, Timing
from perfscope.verify import launch_operands

# How the L2 is emptied before each timed launch: "read" (the default: a read-only pass,
# which leaves clean lines) or "write" (a fill, as every timing until 2026-12-01, 23:00 UTC
# was made, and as do_bench and nvbench do), kept to reproduce those figures.
L2_FLUSHES = ("read", "write")

# A read of the whole buffer that no compiler can drop: each thread XORs what it loads and
# stores it only on a value no fill produces. Plain loads, so the lines are kept in L2 and
# displace what was there.
READ_SOURCE = r"""
extern "C" __global__ void perfscope_l2_flush(const uint4* __restrict__ p, long long n,
                                              unsigned* sink) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    unsigned acc = 0;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += stride) {
        const uint4 v = p[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9E3779B9u) sink[0] = acc;
}
"""
READ_BLOCK = 512
# CTAs launched per SM. At 34 registers a thread only 3 fit at once, so the grid runs in 1.33
# waves; the read still reaches 0.92 of the DRAM peak on the H200 (a 1 GiB read:
# reports/reference/h200/probes/kernel-floor-h200*), so it is left as it was timed.
READ_BLOCKS_PER_SM = 4


def check_l2_flush(mode: str) -> None:
    """One sentence for an L2 flush mode perfscope does not know."""
    if mode not in L2_FLUSHES:
        raise PerfscopeError(f"the L2 flush is one of {', '.join(L2_FLUSHES)}, not {mode!r}")


class L2Flush:
    """The pass enqueued before each timed launch; ``mode`` is one of L2_FLUSHES."""

    def __init__(self, cp: Any, nbytes: int, mode: str = "read") -> None:
        check_l2_flush(mode)
        self.cp, self.mode = cp, mode
        # Filled once, so the read finds no value that makes it store.
        self.buffer = cp.ones(max(nbytes, 16) // 16 * 4, dtype=cp.uint32)
        if mode == "read":
            self._kernel = cp.RawKernel(READ_SOURCE, "perfscope_l2_flush")
            self._sink = cp.zeros(1, dtype=cp.uint32)
            sms = cp.cuda.Device().attributes["MultiProcessorCount"]
            self._grid = (sms * READ_BLOCKS_PER_SM,)

    def __call__(self) -> None:
        """Enqueue the pass on the current stream (it keeps the GPU busy as well)."""
        if self.mode == "write":
            self.buffer.fill(1)
            return
        self._kernel(self._grid, (READ_BLOCK,),
                     (self.buffer, np.int64(self.buffer.nbytes // 16), self._sink))


@dataclass(frozen=True)
class BenchOptions:
    """How bench runs: runs per round, rounds, warm-up launches, whether to time, seed, and
    the L2 flush (its size and mode)."""

    runs: int = 20
    rounds: int = 3
    warmup: int = 3
    time: bool = True
    seed: int | None = None
    l2_flush_bytes: int = 512 * 2**20
    l2_flush: str = "read"
    # The scale a quantising stage multiplies its outputs by (fp8: per tensor; int8: the
    # base of the per-row scales), also for its verification.
    quant_scale: float = DEFAULT_QUANT_SCALE
    # Rounds past `rounds`, up to `max_rounds`, until every ratio's interval (settled())
    # lies within +-until of its median (as nvbench stops on its noise); None: `rounds`.
    until: float | None = None
    max_rounds: int = 15

    def __post_init__(self) -> None:
        if self.runs < 1 or self.rounds < 1 or self.warmup < 0:
            raise PerfscopeError("runs and rounds must be at least 1 and warmup at least 0")
        if self.until is not None:
            if not 0 < self.until < UNTIL_MAX:
                raise PerfscopeError(f"--until is a fraction of the ratio between 0 and "
                                     f"{UNTIL_MAX} (0.005 for +-0.5%), not {self.until}")
            if self.max_rounds < self.rounds:
                raise PerfscopeError(f"--max-rounds ({self.max_rounds}) is below --rounds "
                                     f"({self.rounds})")
        check_quant_scale(self.quant_scale)
        check_l2_flush(self.l2_flush)


# --until: a half-width wider than this is no stopping rule.
UNTIL_MAX = 0.5
# The interval of a median from n round ratios: the narrowest pair of order statistics
# (the k-th smallest and the k-th largest) that holds the true median with at least this
# probability, whatever the ratios' distribution (a binomial count). Five rounds give
# [min, max] at 0.94; four rounds are too few to say (0.875).
MEDIAN_COVERAGE = 0.9


def median_interval(values: Sequence[float]) -> tuple[float, float] | None:
    """The distribution-free interval of the median of values at MEDIAN_COVERAGE: the k-th
    smallest to the k-th largest, k as large as holds the coverage; None when even
    [min, max] does not (too few values)."""
    n = len(values)
    xs = sorted(values)
    best = None
    # P(Binomial(n, 1/2) < k) on each side: the median lies outside [x_(k), x_(n-k+1)].
    below, term = 0.0, 0.5 ** n
    for k in range(1, n // 2 + 1):
        below += term                       # P(B = k - 1)
        term = term * (n - k + 1) / k       # P(B = k)
        if 1 - 2 * below < MEDIAN_COVERAGE:
            break
        best = (xs[k - 1], xs[n - k])
    return best


def settled(ratios: Sequence[Sequence[float]], until: float) -> bool:
    """Whether every series of round ratios has a median interval within +-until of its
    median (no series: nothing to settle)."""
    for series in ratios:
        got = median_interval(series)
        if got is None:
            return False
        lo, hi = got
        mid = _median(series)
        if max(mid - lo, hi - mid) > until * mid:
            return False
    return True


@dataclass(frozen=True)
class _Batch:
    times_ms: tuple[float, ...]
    clocks: tuple[float, ...]


class _Timer:
    """Event-timed launches of prepared GEMMs over shared inputs and one flush buffer."""

    def __init__(self, cp: Any, prep: Prepared, opts: BenchOptions):
        self.cp, self.opts = cp, opts
        # A quantising stage and its group both write one byte per element; a fused stage
        # and its group reference read the same bias and residual.
        ops = launch_operands(cp, prep, opts.seed, quant_scale=opts.quant_scale)
        self.a, self.b, self.c, self.extra = ops.a, ops.b, ops.c, ops.extra
        self.flush = L2Flush(cp, opts.l2_flush_bytes, opts.l2_flush)
        self.clock = ClockReader()
        # B as each side takes it (Prepared.weight), made in warm(): outside every timing.
        self.weights: dict[int, Any] = {}

    def warm(self, prep: Prepared) -> None:
        self.weights[id(prep)] = prep.weight(self.b)
        for _ in range(self.opts.warmup):
            prep.launch(self.a, self.weights[id(prep)], self.c, self.extra)
        self.cp.cuda.get_current_stream().synchronize()

    def batch(self, prep: Prepared) -> _Batch:
        cp = self.cp
        starts = [cp.cuda.Event() for _ in range(self.opts.runs)]
        ends = [cp.cuda.Event() for _ in range(self.opts.runs)]
        b = self.weights[id(prep)]
        for start, end in zip(starts, ends, strict=True):
            self.flush()
            start.record()
            prep.launch(self.a, b, self.c, self.extra)
            end.record()
        # Sample the clock while the queued launches run, not after they have finished.
        clocks = []
        while not ends[-1].done and len(clocks) < 64:
            mhz = self.clock.sm_mhz()
            if mhz is not None:
                clocks.append(mhz)
            time.sleep(0.002)
        ends[-1].synchronize()
        return _Batch(tuple(cp.cuda.get_elapsed_time(s, e) for s, e in zip(starts, ends, strict=True)),
                      tuple(clocks))


def _median(values: Sequence[float]) -> float:
    return Spread.of(list(values)).median


def time_stage(prep: Prepared, ref: Prepared | None, opts: BenchOptions,
               parent: Prepared | None = None) -> Timing:
    """Alternating rounds of the stage, its reference and (when given) its parent stage; one
    ratio per round against each. The parent is timed in the same rounds so that a ladder
    step is measured head to head: medians of separate rounds drift with the clock, and at
    the power cap they contradicted a head-to-head run (8192^3 bf16, stream-K against the
    persistent stage: 0.98 by the bench medians, 1.02 head to head)."""
    cp = require_gpu()
    for other in (ref, parent):
        if other is not None and other.epilogue != prep.epilogue:
            raise PerfscopeError(f"{prep.spec.name} and {other.spec.name} compute different "
                                 "epilogues and cannot be timed against each other")
    timer = _Timer(cp, prep, opts)
    sides = [("stage", prep)] + [(who, p) for who, p in (("ref", ref), ("parent", parent))
                                 if p is not None]
    for _, p in sides:
        timer.warm(p)
    times: dict[str, list[float]] = {who: [] for who, _ in sides}
    clocks: dict[str, list[float]] = {who: [] for who, _ in sides}
    ratios: dict[str, list[float]] = {who: [] for who, _ in sides[1:]}
    r = 0
    while r < opts.rounds or (opts.until is not None and r < opts.max_rounds
                              and not settled(list(ratios.values()), opts.until)):
        # Each round in another order: two sides alternate; three take a rotation, reversed
        # every other round, so six rounds run every order once and no side always runs
        # right after the same other one.
        if len(sides) > 2:
            k = r % len(sides)
            order = sides[k:] + sides[:k]
            order = order[::-1] if r % 2 else order
        else:
            order = sides if r % 2 == 0 else sides[::-1]
        medians = {}
        for who, p in order:
            got = timer.batch(p)
            times[who].extend(got.times_ms)
            clocks[who].extend(got.clocks)
            medians[who] = _median(got.times_ms)
        for who in ratios:
            ratios[who].append(medians[who] / medians["stage"])
        r += 1
    flops = prep.shape.flops

    def tflops(values: list[float]) -> Spread:
        return Spread.of([flops / (t * 1e-3) / 1e12 for t in values])

    def spread(values: list[float]) -> Spread | None:
        return Spread.of(values) if values else None

    ref_t, ref_ratios = times.get("ref", []), ratios.get("ref", [])
    return Timing(
        runs_per_round=opts.runs, rounds=r, warmup=opts.warmup,
        l2_flush_bytes=opts.l2_flush_bytes, l2_flush=opts.l2_flush,
        time_ms=Spread.of(times["stage"]), tflops=tflops(times["stage"]),
        reference=ref.spec.name if ref is not None else None,
        reference_time_ms=spread(ref_t),
        reference_tflops=tflops(ref_t) if ref_t else None,
        ratio_to_reference=spread(ref_ratios),
        round_ratios=tuple(ref_ratios),
        sm_clock_mhz=spread(clocks["stage"]),
        reference_sm_clock_mhz=spread(clocks.get("ref", [])),
        parent=parent.spec.name if parent is not None else None,
        ratio_to_parent=spread(ratios.get("parent", [])),
        parent_round_ratios=tuple(ratios.get("parent", [])),
        until=opts.until, max_rounds=opts.max_rounds if opts.until is not None else None)
