"""Where a small fused GEMM's event time goes that its kernel's own duration does not.

    PYTHONPATH=. python3 benchmarks/launch_gap.py --shape 256x4096x4096 [--shape ...] --out F.json

At 256x4096x4096 hgemm_small_m runs 0.82x the cycles of cuBLASLt's GELU_BIAS kernel under
ncu, yet loses to it by CUDA events with the L2 flushed before each launch (fused/README.md).
This times both (bf16, bias + GELU; hgemm_small_m at the host's tile, cuBLASLt through
nvmath-python's planned Matmul, as fused_check sets them up) five ways, in alternating rounds:

- ``flushed``: the L2 flushed by a read, then events around the launch (bench's and
  fused_check's way);
- ``flushed_joined``: events around the flush and the launch together, less the median of
  the flush alone timed the same way: the launch's time when no event stands between it and
  the kernel before it (as in a model's stream of kernels);
- ``flushed_smem``: as ``flushed``, with an empty kernel of one CTA per SM holding 200 KiB of
  dynamic shared memory run after the flush (the SMs' shared-memory carve-out set before
  the GEMM arrives);
- ``flushed_touched``: as ``flushed``, with one word of every 64 KiB of A, B and the bias read
  after the flush (512 sectors for a 32 MiB weight: the L2 stays cold, the address
  translations do not);
- ``warm_stream``: no flush, ``--stream`` launches back to back between two events, per launch
  (the operands stay in L2 where they fit: a throughput figure, not a cold one).

Every batch starts behind a kernel that spins on the GPU for longer than the host takes to
queue the batch (``HOST_US_PER_LAUNCH`` per launch): nvmath-python's ``execute`` spends
75-110 us of host time per call and hgemm_small_m's launch about 20 us, so without it the
warm modes, and any mode with more than the flush before each launch, time the host.
Both outputs are compared before timing (relative Frobenius difference). Needs a GPU, CuPy,
torch and nvmath-python.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import fused_check as fc  # noqa: E402

from perfscope.kernels.spec import parse_shape  # noqa: E402

log = logging.getLogger("launch_gap")

LT = "cuBLASLt GELU_BIAS (nvmath)"
CANDIDATES = (fc.SMALL_M, LT)
MODES = ("flushed", "flushed_joined", "flushed_smem", "flushed_touched", "warm_stream")
# Host time to queue one launch with what precedes it, generously: the spin before a batch
# lasts this long per launch of the batch.
HOST_US_PER_LAUNCH = 250
SPIN_SOURCE = r"""
extern "C" __global__ void spin(long long cycles) {
    const long long start = clock64();
    while (clock64() - start < cycles) {
    }
}
"""
SMEM_HELD = 200 * 1024
SMEM_SOURCE = r"""
extern "C" __global__ void hold_smem(unsigned* sink) {
    extern __shared__ unsigned smem[];
    smem[threadIdx.x] = threadIdx.x;
    __syncthreads();
    if (smem[(threadIdx.x + 1) % blockDim.x] == 0xFFFFFFFFu) *sink = 1;
}
"""
# flushed_touched reads one 4-byte word per this many bytes of each buffer.
TOUCH_STRIDE = 64 * 1024
TOUCH_SOURCE = r"""
extern "C" __global__ void touch(const unsigned* p, long long words, long long step,
                                 unsigned* sink) {
    unsigned acc = 0;
    for (long long i = (blockIdx.x * (long long)blockDim.x + threadIdx.x) * step; i < words;
         i += (long long)gridDim.x * blockDim.x * step)
        acc ^= p[i];
    if (acc == 0x9E3779B9u) *sink = acc;   // never true for these data: keeps the loads
}
"""


@dataclass(frozen=True)
class Around:
    """What runs around the timed launches, each built once: the L2 flush, the spin that
    queues a batch behind it (``spin(us)``), the page touch and the shared-memory holder."""

    flush: Callable[[], None]
    spin: Callable[[float], None]
    touch: Callable[[], None]
    hold_smem: Callable[[], None]


def around(cp: Any, flush: Any, sms: int, buffers: list[Any]) -> Around:
    """The kernels of Around: a spin of one CTA on clock64 (at up to 2 GHz), a read of one
    word per TOUCH_STRIDE bytes of each buffer, and an empty kernel holding SMEM_HELD bytes
    of shared memory in one CTA per SM."""
    spin = cp.RawKernel(SPIN_SOURCE, "spin")
    touch = cp.RawKernel(TOUCH_SOURCE, "touch")
    hold = cp.RawKernel(SMEM_SOURCE, "hold_smem")
    hold.max_dynamic_shared_size_bytes = SMEM_HELD
    sink = cp.zeros(1, dtype=cp.uint32)

    def touch_all() -> None:
        for buf in buffers:
            touch((8,), (256,), (buf.data.ptr, np.int64(buf.nbytes // 4),
                                 np.int64(TOUCH_STRIDE // 4), sink))

    return Around(flush, lambda us: spin((1,), (32,), (np.int64(int(us * 2000)),)), touch_all,
                  lambda: hold((sms,), (128,), (sink,), shared_mem=SMEM_HELD))


def bracketed(gpu: fc.Gpu, work: Callable[[], None], runs: int, name: str) -> list[float]:
    """Events around each of ``runs`` calls of ``work`` (ms)."""
    cp = gpu.cp
    starts = [cp.cuda.Event() for _ in range(runs)]
    ends = [cp.cuda.Event() for _ in range(runs)]
    for s, e in zip(starts, ends, strict=True):
        s.record()
        work()
        e.record()
    gpu.sync(name)
    return [cp.cuda.get_elapsed_time(s, e) for s, e in zip(starts, ends, strict=True)]


def flush_alone(gpu: fc.Gpu, aids: Around, runs: int) -> list[float]:
    """Events around the flush by itself, as flushed_joined brackets it with the launch."""
    aids.spin(runs * HOST_US_PER_LAUNCH)
    return bracketed(gpu, aids.flush, runs, "flush")


def timed(gpu: fc.Gpu, cand: fc.Candidate, mode: str, aids: Around,
          args: argparse.Namespace) -> float:
    """The median time (ms) of one batch of ``cand`` in ``mode`` (the module docstring)."""
    cp = gpu.cp
    aids.spin((args.stream if mode == "warm_stream" else args.runs) * HOST_US_PER_LAUNCH)
    if mode == "flushed":
        return statistics.median(fc.time_batch(gpu, cand, aids.flush, args.runs))
    if mode in ("flushed_touched", "flushed_smem"):
        after = aids.touch if mode == "flushed_touched" else aids.hold_smem

        def flush_then() -> None:
            aids.flush()
            after()
        return statistics.median(fc.time_batch(gpu, cand, flush_then, args.runs))
    if mode == "flushed_joined":
        def flush_and_run() -> None:
            aids.flush()
            cand.run()
        return statistics.median(bracketed(gpu, flush_and_run, args.runs, cand.name))
    s, e = cp.cuda.Event(), cp.cuda.Event()
    s.record()
    for _ in range(args.stream):
        cand.run()
    e.record()
    gpu.sync(cand.name)
    return cp.cuda.get_elapsed_time(s, e) / args.stream


def one_shape(gpu: fc.Gpu, libs: dict[str, Any], shape_text: str, flush: Any,
              args: argparse.Namespace) -> dict[str, Any]:
    cp = gpu.cp
    shape = parse_shape(shape_text)
    m, n, k = shape.m, shape.n, shape.k
    ops = fc.make_operands(gpu, m, n, k, "bf16", False, args.seed)
    c = cp.empty((m, n), dtype=gpu.nd["bf16"])
    errors: dict[str, str] = {}
    cands = [x for x in fc.candidates_for(gpu, libs, ops, c, m, n, k, "bf16", errors)
             if x.name in CANDIDATES]
    if [x.name for x in cands] != list(CANDIDATES):
        raise SystemExit(f"launch_gap: {shape_text}: missing {set(CANDIDATES) - {x.name for x in cands}} "
                         f"({errors})")
    outs = []
    for cand in cands:
        for _ in range(3):
            cand.run()
        gpu.sync(cand.name)
        outs.append(cand.result().view(gpu.nd["bf16"]).astype(cp.float64))
    diff = float(cp.linalg.norm(outs[0] - outs[1]) / cp.linalg.norm(outs[1]))
    if not diff < 1e-2:
        raise SystemExit(f"launch_gap: {shape_text}: the two outputs differ by {diff:.2e}")
    aids = around(cp, flush, gpu.multiprocessors, [ops.a, ops.b, ops.bias])
    rows: dict[str, dict[str, list[float]]] = {x.name: {md: [] for md in MODES} for x in cands}
    flush_ms: list[float] = []
    for r in range(args.rounds):
        flush_ms.append(statistics.median(flush_alone(gpu, aids, args.runs)))
        for mode in MODES:
            order = cands if r % 2 == 0 else cands[::-1]
            for cand in order:
                rows[cand.name][mode].append(timed(gpu, cand, mode, aids, args))
    flush_med = statistics.median(flush_ms)
    out: dict[str, Any] = {"shape": shape_text, "dtype": "bf16", "output_difference": diff,
                           "flush_alone_ms": flush_ms, "candidates": {}}
    for name, modes in rows.items():
        entry = {mode: {"round_medians_ms": v, "median_us": 1e3 * statistics.median(v)}
                 for mode, v in modes.items()}
        entry["flushed_joined"]["less_flush_us"] = entry["flushed_joined"]["median_us"] - 1e3 * flush_med
        out["candidates"][name] = entry
    small, lt = (out["candidates"][x] for x in CANDIDATES)
    out["small_m_over_cublaslt"] = {
        mode: small[mode]["median_us"] / lt[mode]["median_us"] for mode in MODES}
    out["small_m_over_cublaslt"]["flushed_joined_less_flush"] = (
        small["flushed_joined"]["less_flush_us"] / lt["flushed_joined"]["less_flush_us"])
    return out


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    log.setLevel(logging.INFO)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", action="append", required=True, help="MxNxK (repeat)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--stream", type=int, default=200, help="launches per warm_stream batch")
    ap.add_argument("--flush-mib", type=int, default=512)
    ap.add_argument("--seed", type=int, default=19)
    args = ap.parse_args()

    import cupy as cp
    import nvmath
    import torch

    from perfscope.kernels.launch import numpy_dtype, require_gpu
    from perfscope.kernels.tensormap import Driver
    from perfscope.timing import L2Flush

    require_gpu()
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    gpu = fc.Gpu(cp, {"bf16": numpy_dtype("bf16")}, Driver(), int(props["multiProcessorCount"]), 20.0)
    libs = {"torch": torch, "nvmath": nvmath}
    flush = L2Flush(cp, args.flush_mib * 2**20, "read")
    record: dict[str, Any] = {
        "schema": "perfscope.launch-gap/1", "command": "PYTHONPATH=. python3 " + " ".join(sys.argv),
        "time": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "clocks_at_start": fc.nvidia_smi(), "versions": fc.versions(cp, libs), "shapes": []}
    for text in args.shape:
        row = one_shape(gpu, libs, text, flush, args)
        record["shapes"].append(row)
        ratio = row["small_m_over_cublaslt"]
        log.info("%s: hgemm_small_m / cuBLASLt time: %s", text,
                 ", ".join(f"{mode} {v:.3f}" for mode, v in ratio.items()))
        for name, entry in row["candidates"].items():
            log.info("  %-28s %s; joined less flush %.2f us", name,
                     ", ".join(f"{mode} {entry[mode]['median_us']:.2f} us" for mode in MODES),
                     entry["flushed_joined"]["less_flush_us"])
    record["clocks_at_end"] = fc.nvidia_smi()
    args.out.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
