"""CUDA-event timing of a stage against its reference, in alternating rounds.

Each launch is timed with CUDA events (a group reference's two launches between one
pair of events); a 512 MiB buffer is rewritten before every launch so
that no run finds A or B in the 60 MiB L2 (that write also keeps the GPU busy while Python
enqueues the launch, so host overhead stays outside the events). Stage and reference are
timed in alternating rounds in one process; each round gives one ratio of the two medians,
and the SM clock is sampled while the queued launches run.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from perfscope.environment import ClockReader
from perfscope.errors import PerfscopeError
from perfscope.kernels.epilogue import DEFAULT_QUANT_SCALE, check_quant_scale
from perfscope.kernels.launch import Prepared, output_array, require_gpu
from perfscope.manifest import Spread, Timing
from perfscope.verify import make_epilogue_operands, make_inputs


@dataclass(frozen=True)
class BenchOptions:
    """How bench runs: runs per round, rounds, warm-up launches, whether to time, seed, L2 flush size."""

    runs: int = 20
    rounds: int = 3
    warmup: int = 3
    time: bool = True
    seed: int | None = None
    l2_flush_bytes: int = 512 * 2**20
    # The scale a quantising stage multiplies its outputs by (fp8: per tensor; int8: the
    # base of the per-row scales), also for its verification.
    quant_scale: float = DEFAULT_QUANT_SCALE

    def __post_init__(self) -> None:
        if self.runs < 1 or self.rounds < 1 or self.warmup < 0:
            raise PerfscopeError("runs and rounds must be at least 1 and warmup at least 0")
        check_quant_scale(self.quant_scale)


@dataclass(frozen=True)
class _Batch:
    times_ms: tuple[float, ...]
    clocks: tuple[float, ...]


class _Timer:
    """Event-timed launches of prepared GEMMs over shared inputs and one flush buffer."""

    def __init__(self, cp: Any, prep: Prepared, opts: BenchOptions):
        self.cp, self.opts = cp, opts
        shape, dtype, epilogue = prep.shape, prep.dtype, prep.epilogue
        self.a, self.b = make_inputs(cp, shape, dtype, opts.seed)
        # A quantising stage and its group both write one byte per element.
        self.c = output_array(cp, prep)
        # A fused stage and its group reference read the same bias and residual.
        self.extra = (make_epilogue_operands(cp, shape, dtype, opts.seed, epilogue,
                                             opts.quant_scale)
                      if epilogue is not None else None)
        self.flush = cp.empty(opts.l2_flush_bytes // 4, dtype=cp.float32)
        self.clock = ClockReader()

    def warm(self, prep: Prepared) -> None:
        for _ in range(self.opts.warmup):
            prep.launch(self.a, self.b, self.c, self.extra)
        self.cp.cuda.get_current_stream().synchronize()

    def batch(self, prep: Prepared) -> _Batch:
        cp = self.cp
        starts = [cp.cuda.Event() for _ in range(self.opts.runs)]
        ends = [cp.cuda.Event() for _ in range(self.opts.runs)]
        for start, end in zip(starts, ends, strict=True):
            self.flush.fill(1.0)
            start.record()
            prep.launch(self.a, self.b, self.c, self.extra)
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


def time_stage(prep: Prepared, ref: Prepared | None, opts: BenchOptions) -> Timing:
    """Alternating rounds of the stage and its reference; one ratio per round."""
    cp = require_gpu()
    if ref is not None and ref.epilogue != prep.epilogue:
        raise PerfscopeError(f"{prep.spec.name} and {ref.spec.name} compute different epilogues "
                             "and cannot be timed against each other")
    timer = _Timer(cp, prep, opts)
    timer.warm(prep)
    if ref is not None:
        timer.warm(ref)
    stage_t: list[float] = []
    ref_t: list[float] = []
    stage_clk: list[float] = []
    ref_clk: list[float] = []
    ratios: list[float] = []
    for r in range(opts.rounds):
        order = [("stage", prep), ("ref", ref)] if r % 2 == 0 else [("ref", ref), ("stage", prep)]
        medians = {}
        for who, p in order:
            if p is None:
                continue
            got = timer.batch(p)
            (stage_t if who == "stage" else ref_t).extend(got.times_ms)
            (stage_clk if who == "stage" else ref_clk).extend(got.clocks)
            medians[who] = _median(got.times_ms)
        if "ref" in medians:
            ratios.append(medians["ref"] / medians["stage"])
    flops = prep.shape.flops

    def tflops(times: list[float]) -> Spread:
        return Spread.of([flops / (t * 1e-3) / 1e12 for t in times])

    return Timing(
        runs_per_round=opts.runs, rounds=opts.rounds, warmup=opts.warmup,
        l2_flush_bytes=opts.l2_flush_bytes, time_ms=Spread.of(stage_t),
        tflops=tflops(stage_t),
        reference=ref.spec.name if ref is not None else None,
        reference_time_ms=Spread.of(ref_t) if ref_t else None,
        reference_tflops=tflops(ref_t) if ref_t else None,
        ratio_to_reference=Spread.of(ratios) if ratios else None,
        round_ratios=tuple(ratios),
        sm_clock_mhz=Spread.of(stage_clk) if stage_clk else None,
        reference_sm_clock_mhz=Spread.of(ref_clk) if ref_clk else None)
