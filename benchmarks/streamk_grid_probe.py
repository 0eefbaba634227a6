"""hgemm_small_m_streamk at chosen grid sizes beside hgemm_small_m, one decode shape at a time.

    PYTHONPATH=. python3 benchmarks/streamk_grid_probe.py [--out FILE]

Separates what the stream-K stage's split costs from what its code path costs: at a grid of
one CTA per tile every range is one whole tile, the work hgemm_small_m's CTAs do; at the
host's one CTA per SM the tiles are cut. Median of alternating rounds (CUDA events, read
flush), bf16, bias + GELU; prints us per launch and the ratio to hgemm_small_m.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from fused_check import (
    DTYPES,
    SMALL_M,
    STREAMK,
    FusedLaunch,
    Gpu,
    make_operands,
    nvidia_smi,
    variant,
)

from perfscope.kernels.launch import numpy_dtype, require_gpu
from perfscope.kernels.spec import Shape
from perfscope.kernels.tensormap import Driver
from perfscope.timing import L2Flush

# shape -> stream-K grids beside the host's (one CTA per tile first).
GRIDS = {Shape(16, 8192, 8192): (128, 132), Shape(16, 14336, 4096): (112, 132),
         Shape(16, 4096, 14336): (64, 128, 132)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    cp = require_gpu()
    sms = int(cp.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"])
    gpu = Gpu(cp, {d: numpy_dtype(d) for d in DTYPES}, Driver(), sms, 20.0)
    flush = L2Flush(cp, 512 * 2**20, "read")
    out = []
    clocks = {"at_start": nvidia_smi()}
    for shape, grids in GRIDS.items():
        ops = make_operands(gpu, shape.m, shape.n, shape.k, "bf16", False, 7)
        c = cp.empty((shape.m, shape.n), dtype=gpu.nd["bf16"])
        cands = {"hgemm_small_m": gpu.launcher(variant(SMALL_M, "gelu", False, shape), "bf16", shape)}
        sk = variant(STREAMK, "gelu", False, shape)
        fn = gpu.function(sk, "bf16").kernel.ptr
        for g in grids:
            cands[f"streamk G={g}"] = FusedLaunch(sk, "bf16", shape, fn, gpu.driver, (g, 1, 1),
                                                  sk.block_dims(), sk.dynamic_smem_bytes())
        times: dict[str, list[float]] = {k: [] for k in cands}
        for _ in range(args.rounds):
            for name, launch in cands.items():
                for _ in range(args.runs):
                    flush()
                    s, e = cp.cuda.Event(), cp.cuda.Event()
                    s.record()
                    launch(ops.a.data.ptr, ops.b.data.ptr, c.data.ptr, ops.bias.data.ptr, 0,
                           cp.cuda.get_current_stream().ptr)
                    e.record()
                    e.synchronize()
                    times[name].append(cp.cuda.get_elapsed_time(s, e) * 1000)
        base = statistics.median(times["hgemm_small_m"])
        for name, ts in times.items():
            med = statistics.median(ts)
            print(f"{shape!s:>14} {name:18s} {med:7.2f} us  {base / med:5.3f}x hgemm_small_m")
            out.append({"shape": str(shape), "candidate": name, "median_us": med, "times_us": ts})
    clocks["at_end"] = nvidia_smi()
    if args.out:
        args.out.write_text(json.dumps({"command": " ".join(sys.argv), "clocks": clocks,
                                        "cupy": cp.__version__, "rows": out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
