"""What the L2 flush before each timed launch costs the launch itself, measured.

    PYTHONPATH=. python3 benchmarks/l2_flush.py [--out reports/reference/h200/l2_flush.json]

`perfscope bench` empties the L2 before every timed launch so that no run finds A or B
there. Writing a large buffer (what Triton's do_bench and nvbench do, and what perfscope
did until 2026-12-01, 23:00 UTC) leaves the L2 full of dirty lines; the timed kernel then pays to
write them back. Reading the buffer evicts A and B just as well and leaves clean lines.
This script times the same launches after each of three passes, in rotating order in one
process (CUDA events, --runs launches per batch, the median of each batch, --rounds rounds):

- ``write``: a 512 MiB fill (perfscope.timing.L2Flush, mode "write");
- ``read``: a read of the same 512 MiB (mode "read", bench's default);
- ``spin``: a kernel that spins ~150 us and touches no memory: the GPU is as busy, the L2
  keeps what the previous launch left, so a workload whose bytes fit the L2 shows here what
  an L2-resident run costs. That it is faster than under ``read`` is the evidence the read
  evicts.

Workloads: an empty kernel (the launch floor; with ``--only "empty kernel"`` also 128 empty
CTAs of 256 threads with no dynamic shared memory and with the 129 KiB and 208 KiB that
hgemm_small_m's decode ring and cuBLASLt's M = 256 kernels ask for, so the floor of a
launch that reserves a ring is measured beside the bare one), plain reads of 32 and 128 MiB, a
device-to-device copy of 64 MiB and 1 GiB, and bench's own prepared launches:
hgemm_small_m against cublas+gelu at 16 x 8192 x 8192, 64 x 4096 x 4096 and
256 x 8192 x 8192, and hgemm_tma_wgmma_persistent against cuBLAS at 4096^3 (bf16). It
prints each workload's median time under each pass and write / read, and, for the two
sides of each bench pair, the ratio to its reference under each pass (so one sees whether
the flush moves the comparison, not only the times). Nothing here changes the clocks.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import numpy as np

from perfscope import bench
from perfscope.environment import collect_environment
from perfscope.kernels import Shape
from perfscope.kernels.launch import prepare, require_gpu
from perfscope.timing import BenchOptions, L2Flush, _Timer

log = logging.getLogger("l2_flush")

FLUSH_BYTES = BenchOptions.l2_flush_bytes
SPIN_CYCLES = 300_000   # ~150 us at 1.98 GHz, about what the 512 MiB passes take
PASSES = ("write", "read", "spin")
PAIRS = (("hgemm_small_m", "cublas+gelu", Shape(16, 8192, 8192)),
         ("hgemm_small_m", "cublas+gelu", Shape(64, 4096, 4096)),
         ("hgemm_small_m", "cublas+gelu", Shape(256, 8192, 8192)),
         ("hgemm_tma_wgmma_persistent", "cublas_bgemm", Shape(4096, 4096, 4096)))

_SOURCE = r"""
extern "C" __global__ void empty() {}
extern "C" __global__ void empty_ring() {
    extern __shared__ unsigned char ring[];
    if (threadIdx.x > blockDim.x) ring[0] = 0;   // never: the ring is only reserved
}
extern "C" __global__ void spin(long long cycles) {
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
}
extern "C" __global__ void read(const uint4* __restrict__ p, long long n, unsigned* sink) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    unsigned acc = 0;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += stride) {
        const uint4 v = __ldcs(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9E3779B9u) sink[0] = acc;
}
"""


# Dynamic shared memory per CTA of the empty ring launches: hgemm_small_m's decode ring
# (8 x 16 KB + 1 KB, 16 x 8192^2) and cuBLASLt's GELU_BIAS kernels at M = 256 (213,268 B).
RING_BYTES = (0, 132_224, 213_268)


def empty_rings(cp, module) -> dict[str, tuple[Callable[[], None], int]]:
    """128 CTAs of 256 threads that do nothing, reserving each of RING_BYTES."""
    out: dict[str, tuple[Callable[[], None], int]] = {}
    for nbytes in RING_BYTES:
        fn = module.get_function("empty_ring")
        fn.max_dynamic_shared_size_bytes = max(nbytes, 1)
        out[f"empty kernel, 128 CTAs x {nbytes} B shared"] = (
            (lambda f=fn, n=nbytes: f((128,), (256,), (), shared_mem=n)), 0)
    return out


def workloads(cp, only: str | None = None) -> dict[str, tuple[Callable[[], None], int]]:
    """Name -> (enqueue one run, the bytes it must move at least; 0 where none count): every
    workload, or those whose name holds ``only`` (the empty rings only then)."""
    module = cp.RawModule(code=_SOURCE)
    empty, read = module.get_function("empty"), module.get_function("read")
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    sink = cp.zeros(1, dtype=cp.uint32)
    stream = cp.cuda.get_current_stream().ptr
    out: dict[str, tuple[Callable[[], None], int]] = {"empty kernel": (lambda: empty((1,), (32,), ()), 0)}
    if only is not None:
        out.update(empty_rings(cp, module))
        return {k: v for k, v in out.items() if only in k}
    for mib in (32, 128):
        buf = cp.ones(mib * 2**20 // 4, dtype=cp.uint32)
        out[f"read {mib} MiB"] = ((lambda b=buf: read((sms * 4,), (512,),
                                                      (b, np.int64(b.nbytes // 16), sink))),
                                  buf.nbytes)
    for mib in (64, 1024):
        src = cp.ones(mib * 2**20 // 4, dtype=cp.uint32)
        dst = cp.empty_like(src)
        out[f"copy {mib} MiB"] = ((lambda s=src, d=dst: cp.cuda.runtime.memcpyAsync(
            d.data.ptr, s.data.ptr, s.nbytes, cp.cuda.runtime.memcpyDeviceToDevice, stream)),
            2 * src.nbytes)
    for stage, ref, shape in PAIRS:
        for name in (stage, ref):
            job = bench.plan([name], ["bf16"], shape)[0]
            prep = prepare(job.spec, "bf16", shape)
            # bench's operands (A, B, C, bias): a 1 MiB "flush" buffer is never used here.
            t = _Timer(cp, prep, BenchOptions(l2_flush_bytes=2**20))
            t.warm(prep)
            nbytes = 2 * (shape.m * shape.k + shape.k * shape.n + shape.m * shape.n)
            out[f"{name} {shape}"] = ((lambda p=prep, t=t: p.launch(t.a, t.b, t.c, t.extra)), nbytes)
    return out


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("l2_flush.json"))
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", help="only the workloads whose name holds this (e.g. 'empty kernel')")
    args = ap.parse_args()
    cp = require_gpu()
    env = collect_environment(cp)
    spin = cp.RawModule(code=_SOURCE).get_function("spin")
    passes = {"write": L2Flush(cp, FLUSH_BYTES, "write"), "read": L2Flush(cp, FLUSH_BYTES, "read"),
              "spin": lambda: spin((1,), (32,), (np.int64(SPIN_CYCLES),))}

    def batch(before: Callable[[], None], run: Callable[[], None]) -> float:
        starts = [cp.cuda.Event() for _ in range(args.runs)]
        ends = [cp.cuda.Event() for _ in range(args.runs)]
        for s, e in zip(starts, ends, strict=True):
            before()
            s.record()
            run()
            e.record()
        ends[-1].synchronize()
        return statistics.median(cp.cuda.get_elapsed_time(s, e) for s, e in zip(starts, ends, strict=True))

    rows = {}
    for name, (run, nbytes) in workloads(cp, args.only).items():
        for _ in range(3):
            run()
        times: dict[str, list[float]] = {p: [] for p in PASSES}
        for r in range(args.rounds):
            for p in PASSES[r % 3:] + PASSES[:r % 3]:   # rotating order
                times[p].append(batch(passes[p], run) * 1e3)
        med = {p: statistics.median(v) for p, v in times.items()}
        rows[name] = {"bytes": nbytes, "us": times, "median_us": med,
                      "gbps": {p: nbytes / (med[p] * 1e-6) / 1e9 for p in PASSES} if nbytes else None,
                      "write_over_read": med["write"] / med["read"]}
        print(f"{name:40s}" + "".join(f"  {p} {med[p]:8.2f} us" for p in PASSES)
              + f"   write/read {med['write'] / med['read']:.3f}", flush=True)
    pairs = []
    for stage, ref, shape in PAIRS:
        if f"{stage} {shape}" not in rows or f"{ref} {shape}" not in rows:
            continue
        a, b = rows[f"{stage} {shape}"]["median_us"], rows[f"{ref} {shape}"]["median_us"]
        ratio = {p: b[p] / a[p] for p in PASSES}
        pairs.append({"stage": stage, "reference": ref, "shape": str(shape), "ratio": ratio})
        print(f"{stage} vs {ref} at {shape}: " + ", ".join(f"{p} {ratio[p]:.3f}" for p in PASSES))
    doc = {"schema": "perfscope.l2_flush/1", "command": "PYTHONPATH=. python3 " + " ".join(sys.argv),
           "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "flush_bytes": FLUSH_BYTES,
           "spin_cycles": SPIN_CYCLES, "runs": args.runs, "rounds": args.rounds,
           "environment": asdict(env), "rows": rows, "pairs": pairs}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    log.info("wrote %s", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
