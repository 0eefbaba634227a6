"""What a kernel costs beyond its bytes: the fixed time of a launch that streams from DRAM.

    PYTHONPATH=. python3 benchmarks/kernel_floor.py --out F.json      # CUDA events
    PYTHONPATH=. python3 benchmarks/kernel_floor.py --launch          # for ncu, below
    perfscope profile --nvtx floor/ --out R.ncu-rep -- \\
        python3 benchmarks/kernel_floor.py --launch                   # one report of it all
    PYTHONPATH=. python3 benchmarks/kernel_floor.py --from-report R.ncu-rep[.xz]   # no GPU

A read of n bytes (perfscope's L2 flush kernel under its own name: 16-byte loads, 4 CTAs of
512 threads launched per SM, 3 of them resident at once, grid-stride, nothing stored) after
a 512 MiB read flush, for n from 16 KiB to 1 GiB, and an empty kernel of one CTA, each
timed by CUDA events (median of --runs). A least-squares line t = F + n / R through the
sizes of at least FIT_MIN_BYTES gives the stream's rate R and its intercept F: the time a
launch that reads from DRAM takes beyond its bytes (the launch's start, the first round trip
to DRAM, the drain at its end). The small sizes show how a short kernel's time approaches F.

``--launch`` runs each read once (and, as kernels perfscope did not write, PyTorch's GELU,
layer norm and softmax at 1-32 MiB) inside NVTX ranges under one range ``floor``, for
``perfscope profile --nvtx floor/``; ``--from-report`` fits the same line to that report's
durations against its DRAM bytes read (ncu replays each launch with the caches flushed).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

log = logging.getLogger("kernel_floor")

MIB = 2**20
SIZES = tuple(s * MIB // 64 for s in (1, 16)) + tuple(s * MIB for s in (
    1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024))
# The line is fitted where the stream has reached its rate: a read this large keeps every
# SM's loads in flight for many round trips.
FIT_MIN_BYTES = 64 * MIB
STREAM_KERNEL = "perfscope_read_stream"
EMPTY_SOURCE = 'extern "C" __global__ void perfscope_empty() {}'
# PyTorch's elementwise and reduction kernels at sizes where the launch weighs most
# (bf16; MiB of input): what the rule on short kernels is checked on besides our own read.
TORCH_OPS = (("gelu", 1), ("gelu", 32), ("layer_norm", 2), ("layer_norm", 32), ("softmax", 2))


@dataclass(frozen=True)
class Line:
    """t = intercept + bytes / rate, fitted by least squares."""

    intercept_us: float
    rate_gbps: float
    points: int


def fit(points: list[tuple[float, float]]) -> Line:
    """The least-squares line through (bytes, microseconds) points."""
    n = len(points)
    if n < 2:
        raise ValueError("a line needs two sizes at least")
    mx = sum(b for b, _ in points) / n
    my = sum(t for _, t in points) / n
    sxx = sum((b - mx) ** 2 for b, _ in points)
    slope = sum((b - mx) * (t - my) for b, t in points) / sxx      # us per byte
    return Line(my - slope * mx, 1e-3 / slope, n)


def _stream(cp: Any):
    from perfscope.timing import READ_SOURCE

    return cp.RawKernel(READ_SOURCE.replace("perfscope_l2_flush", STREAM_KERNEL), STREAM_KERNEL)


class Reads:
    """The read stream over a buffer's first n bytes, launched as the L2 flush is."""

    def __init__(self, cp: Any, largest: int) -> None:
        import numpy as np

        from perfscope.timing import READ_BLOCK, READ_BLOCKS_PER_SM

        self.cp, self.np = cp, np
        self.kernel = _stream(cp)
        self.buffer = cp.ones(largest // 4, dtype=cp.uint32)
        self.sink = cp.zeros(1, dtype=cp.uint32)
        sms = cp.cuda.Device().attributes["MultiProcessorCount"]
        self.grid, self.block = (sms * READ_BLOCKS_PER_SM,), (READ_BLOCK,)
        self.empty = cp.RawKernel(EMPTY_SOURCE, "perfscope_empty")

    def read(self, nbytes: int) -> None:
        self.kernel(self.grid, self.block, (self.buffer, self.np.int64(nbytes // 16), self.sink))

    def nothing(self) -> None:
        self.empty((1,), (32,), ())


def timed(cp: Any, flush: Any, launch, runs: int) -> float:
    """Median microseconds of `launch` between two events, the L2 flushed before each."""
    times = []
    for _ in range(runs + 2):
        flush()
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        launch()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end) * 1e3)
    return statistics.median(times[2:])


def run_timing(runs: int) -> dict[str, Any]:
    import cupy as cp

    from perfscope.environment import ClockReader, collect_environment
    from perfscope.timing import L2Flush

    env = collect_environment(cp)
    clock = ClockReader()
    flush = L2Flush(cp, 512 * MIB)
    reads = Reads(cp, max(SIZES))
    rows = [{"bytes": 0, "kernel": "perfscope_empty (1 CTA)",
             "us": round(timed(cp, flush, reads.nothing, runs), 3)}]
    for n in SIZES:
        rows.append({"bytes": n, "kernel": STREAM_KERNEL,
                     "us": round(timed(cp, flush, lambda n=n: reads.read(n), runs), 3)})
    line = fit([(r["bytes"], r["us"]) for r in rows if r["bytes"] >= FIT_MIN_BYTES])
    return {"schema": "perfscope.kernel-floor/1", "command": " ".join(sys.argv),
            "time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "environment": asdict(env),
            "sm_clock_mhz_after": clock.sm_mhz(), "runs": runs,
            "timing": "CUDA events around one launch, a 512 MiB read flush before each",
            "rows": rows, "fit_min_bytes": FIT_MIN_BYTES,
            "fit": line.__dict__,
            "share_of_line": [{"bytes": r["bytes"], "line_us": round(
                line.intercept_us + r["bytes"] / (line.rate_gbps * 1e3), 3),
                "measured_us": r["us"]} for r in rows]}


def run_launches() -> None:
    """Each read once, then PyTorch's ops, inside NVTX ranges under `floor`."""
    import cupy as cp
    import torch

    reads = Reads(cp, max(SIZES))
    reads.nothing()
    reads.read(SIZES[0])
    cp.cuda.Device().synchronize()
    torch_inputs = {}
    for op, mib in TORCH_OPS:
        x = torch.randn(mib * MIB // 2 // 4096, 4096, device="cuda", dtype=torch.bfloat16)
        torch_inputs[(op, mib)] = x
        _torch_op(torch, op, x)          # warm-up, outside the ranges
    torch.cuda.synchronize()
    nvtx = torch.cuda.nvtx
    nvtx.range_push("floor")
    nvtx.range_push("empty")
    reads.nothing()
    nvtx.range_pop()
    for n in SIZES:     # ncu flushes the caches before each replay (--cache-control all)
        nvtx.range_push(f"read-{n}")
        reads.read(n)
        nvtx.range_pop()
    for (op, mib), x in torch_inputs.items():
        nvtx.range_push(f"torch-{op}-{mib}MiB")
        _torch_op(torch, op, x)
        nvtx.range_pop()
    nvtx.range_pop()
    torch.cuda.synchronize()


def _torch_op(torch, op: str, x) -> Any:
    f = torch.nn.functional
    if op == "gelu":
        return f.gelu(x, approximate="tanh")
    if op == "layer_norm":
        return f.layer_norm(x, (x.shape[-1],))
    return torch.softmax(x, dim=-1)


def from_report(path: Path) -> dict[str, Any]:
    """Durations and DRAM bytes of a --launch capture, and the same line fitted to them."""
    from perfscope.reader import load_reader_first

    load_reader_first()     # before numpy: the GPU machines' install reader needs it so
    from perfscope.metrics import M_DRAM_READ, M_DRAM_WRITE
    from perfscope.profile import load

    rows = []
    for p in load(path):
        read, write = p.metric(M_DRAM_READ), p.metric(M_DRAM_WRITE)
        rows.append({"kernel": p.identity.name, "grid": p.launch.grid_size,
                     "us": round(p.sol.duration_ns / 1e3, 3),
                     "dram_read_bytes": read, "dram_write_bytes": write})
    stream = [(r["dram_read_bytes"], r["us"]) for r in rows
              if r["kernel"] == STREAM_KERNEL and (r["dram_read_bytes"] or 0) >= FIT_MIN_BYTES]
    return {"report": str(path), "rows": rows,
            "fit": fit(stream).__dict__ if len(stream) >= 2 else None}


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="write the timing's JSON here")
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--launch", action="store_true", help="launch each once for ncu")
    ap.add_argument("--from-report", type=Path, help="fit a --launch capture (no GPU)")
    a = ap.parse_args()
    if a.from_report is not None:
        print(json.dumps(from_report(a.from_report), indent=1))
        return 0
    if a.launch:
        run_launches()
        return 0
    doc = run_timing(a.runs)
    text = json.dumps(doc, indent=1, default=str)
    if a.out is not None:
        a.out.write_text(text + "\n")
    log.info("fit: F = %.2f us, R = %.0f GB/s over %d sizes", doc["fit"]["intercept_us"],
             doc["fit"]["rate_gbps"], doc["fit"]["points"])
    for r in doc["share_of_line"]:
        log.info("%12d B  %8.2f us  (line %8.2f)", r["bytes"], r["measured_us"], r["line_us"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
