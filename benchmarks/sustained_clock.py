"""The SM clock a GEMM really runs at on this GPU: sustained back-to-back launches, sampled.

    PYTHONPATH=. python3 benchmarks/sustained_clock.py [--out reports/reference/h200/sustained_clock.json]

``bench`` samples the clock (NVML) while its timed launches run, with a 512 MiB L2 flush
between launches; a 0.18 ms GEMM between two flushes hardly moves the sampled clock, so the
bench files read the boost clock (1980 MHz) while ncu's cycles over duration say ~1.6 GHz for
the same kernels. This script asks the question directly: each kernel runs back to back for
``--seconds`` (no flush) while a thread samples NVML's SM clock, power draw and clock-event
reasons every 10 ms; it prints and writes, per kernel and shape, the event-timed TFLOP/s, the
median / min / max clock of the last three quarters of the samples, the power and the
reasons seen (0x4 is the software power cap). The dense BF16 peak at the median clock
(132 SMs x 4096 FLOP per clock) gives the share of peak each kernel holds at that clock.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from perfscope.environment import collect_environment
from perfscope.hardware import PEAK_FLOP_PER_SM_CLOCK
from perfscope.kernels import get_spec, parse_shape
from perfscope.kernels.launch import prepare, require_gpu
from perfscope.verify import make_inputs

log = logging.getLogger("sustained_clock")

# (stage, parameters): the persistent stage, its deep-ring configuration, cuBLAS.
KERNELS = (("hgemm_tma_wgmma_persistent", {}),
           ("hgemm_tma_wgmma_persistent", {"STAGES": 4, "BOXES": 2}),
           ("cublas_bgemm", {}))
SHAPES = ("4096x4096x4096", "8192x8192x8192")
# BF16 wgmma, fp32 accumulate (989 TFLOP/s at 1.83 GHz): the project's one figure for it.
DENSE_FLOP_PER_CLOCK_PER_SM = PEAK_FLOP_PER_SM_CLOCK["9.0"]["tensor16"]
SAMPLE_S = 0.01


@dataclass(frozen=True)
class Sustained:
    """One kernel at one shape, run back to back."""

    stage: str
    params: dict
    shape: str
    launches: int
    ms: float
    tflops: float
    clock_mhz_median: float
    clock_mhz_min: float
    clock_mhz_max: float
    power_w_median: float
    power_w_max: float
    clock_event_reasons: tuple[str, ...]
    peak_tflops_at_median_clock: float
    share_of_peak: float


class _Sampler:
    """NVML samples on a thread, between start() and stop()."""

    def __init__(self, nvml, handle) -> None:
        self.nvml, self.handle = nvml, handle
        self.samples: list[tuple[float, float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n, h = self.nvml, self.handle
        while not self._stop.is_set():
            self.samples.append((n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM),
                                 n.nvmlDeviceGetPowerUsage(h) / 1000.0,
                                 n.nvmlDeviceGetCurrentClocksEventReasons(h)))
            time.sleep(SAMPLE_S)

    def __enter__(self) -> _Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def sustain(cp, nvml, handle, stage: str, params: dict, shape_text: str, seconds: float,
            sms: int) -> Sustained:
    """Run one kernel back to back for about `seconds` and sample what the GPU does."""
    shape = parse_shape(shape_text)
    spec = get_spec(stage)
    spec = spec.with_params(**params) if params else spec
    dtype = "bf16"
    prep = prepare(spec, dtype, shape)
    a, b = make_inputs(cp, shape, dtype, 0)
    c = cp.empty((shape.m, shape.n), dtype=a.dtype)
    for _ in range(5):
        prep.launch(a, b, c, None)
    cp.cuda.Device().synchronize()
    launches = max(20, int(seconds / (shape.flops / 700e12)))
    start, end = cp.cuda.Event(), cp.cuda.Event()
    with _Sampler(nvml, handle) as sampler:
        start.record()
        for _ in range(launches):
            prep.launch(a, b, c, None)
        end.record()
        end.synchronize()
    ms = cp.cuda.get_elapsed_time(start, end) / launches
    # The first quarter of the samples is the clock still falling from boost.
    kept = sampler.samples[len(sampler.samples) // 4:] or sampler.samples
    clocks = [s[0] for s in kept]
    power = [s[1] for s in kept]
    tflops = shape.flops / (ms * 1e-3) / 1e12
    clock = _median(clocks)
    peak = sms * DENSE_FLOP_PER_CLOCK_PER_SM * clock * 1e6 / 1e12
    return Sustained(stage=stage, params=params, shape=shape_text, launches=launches, ms=round(ms, 5),
                     tflops=round(tflops, 1), clock_mhz_median=clock, clock_mhz_min=min(clocks),
                     clock_mhz_max=max(clocks), power_w_median=round(_median(power), 1),
                     power_w_max=round(max(power), 1),
                     clock_event_reasons=tuple(sorted({hex(s[2]) for s in sampler.samples})),
                     peak_tflops_at_median_clock=round(peak, 1), share_of_peak=round(tflops / peak, 3))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("reports/reference/h200/sustained_clock.json"))
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES))
    ap.add_argument("--seconds", type=float, default=2.0)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s", stream=sys.stderr)
    cp = require_gpu()
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByPciBusId(cp.cuda.Device().pci_bus_id.encode())
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    rows = []
    for shape in args.shapes:
        for stage, params in KERNELS:
            row = sustain(cp, pynvml, handle, stage, params, shape, args.seconds, sms)
            log.info("%s %s %s: %.1f TFLOP/s at %s MHz (%.0f W), %.3f of the dense peak at that "
                     "clock", stage, params or "", shape, row.tflops, row.clock_mhz_median,
                     row.power_w_median, row.share_of_peak)
            rows.append(asdict(row))
            time.sleep(1.0)   # let the clock recover between kernels
    doc = {"kind": "sustained-clock", "command": "PYTHONPATH=. python3 " + " ".join(sys.argv),
           "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "environment": asdict(collect_environment(cp)), "seconds": args.seconds, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
