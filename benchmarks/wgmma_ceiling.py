"""The wgmma ceiling: how fast the persistent stage's own HGMMA loop can go with no memory traffic.

    PYTHONPATH=. python3 benchmarks/wgmma_ceiling.py [--json FILE] [--iters N] [--runs N]
                                                      [--warpgroups 1 2] [--dtypes bf16 fp16]
                                                      [--widths 256 128] [--rounds N]

One CTA per multiprocessor runs 1 or 2 warpgroups that do nothing but the k-tile step of
hgemm_tma_wgmma_persistent's consumers (hop::Ring::consume in hopper.cuh without its
mbarrier wait): wgmma fence, four ``wgmma.mma_async.m64n256k16.f32`` from one 128B-swizzled
ring slot (hop::Slot<128, 256, 64>, the same descriptors), commit, and a wait that keeps one
group in flight. The slot is filled once with non-zero 16-bit values of random sign and
mantissa (zeros draw less power and would flatter the clock). Two warpgroups are the stage's
two consumers (rows 0-63 and 64-127 of the slot's A, all of its B); one warpgroup says
whether a single consumer can keep the tensor pipe busy on its own. Timed with CUDA events
(median of --runs after warm-up) while the SM clock is sampled (NVML, else nvidia-smi).

What it gives: the TFLOP/s (and TFLOP/s per GHz) the instruction reaches on this GPU at the
clock it runs at, and the time of one 128 x 256 x 64 k tile at that rate, the figure to hold
the stage's measured k-tile time against (benchmarks/tail_split_probe.py: 0.65-0.67 us at
4096^3 on the H200). The stage cannot pass this; what separates it from it is the ring's
feed (TMA, L2, barriers) and the epilogue, not the instruction.

``--widths 128`` asks what the instruction's width costs in power: each warpgroup issues two
``m64n128k16`` per k16 step instead of one ``m64n256k16`` (rows 0-127 of the slot's A against
its first 128 columns of B: cuBLAS's 256 x 128 tile per consumer pair), the same FLOPs per
trip. At the power cap the clock the loop holds is what the width draws; ``--rounds``
repeats the whole set so that the widths alternate rather than follow one another.

The kernel compiles through perfscope's NVRTC path (perfscope.build, sm_90a) with hopper.cuh
from perfscope/kernels; it is loaded and launched with CuPy. Clocks are left as found.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from hmma_ceiling import HOPPER_DENSE_PER_GHZ, ClockSampler  # noqa: E402

from perfscope.hardware import PEAK_FLOP_PER_SM_CLOCK  # noqa: E402

# The dense rating per SM cycle (989.4 TFLOP/s at 1.83 GHz on 132 SMs).
DENSE_FLOP_PER_SM_CYCLE = PEAK_FLOP_PER_SM_CLOCK["9.0"]["tensor16"]

BM, BN, BK = 128, 256, 64
# One k tile of one consumer: BK / 16 wgmmas of m64 x n256 x k16.
FLOP_PER_WG_ITER = (BK // 16) * 2 * 64 * BN * 16
FLOP_PER_K_TILE = 2 * BM * BN * BK   # the stage's k tile (both consumers)
DEFAULT_ITERS = 1 << 17              # 2 warpgroups: about 70 ms at 1.98 GHz

SOURCE = r"""
#include "hopper.cuh"

// The fill pattern: 16-bit values near +-1 with a random mantissa (f16 0x3c00, bf16 0x3f80).
template <typename T> struct One;
template <> struct One<__half> { static constexpr unsigned BITS = 0x3c00u, MANT = 0x3ffu; };
template <> struct One<__nv_bfloat16> { static constexpr unsigned BITS = 0x3f80u, MANT = 0x7fu; };

template <typename T, int WGS, int N>
__global__ void __launch_bounds__(128 * WGS, 1)
wgmma_loop(float* __restrict__ out, unsigned long long* __restrict__ clk, int iters,
           unsigned seed) {
    using S = hop::Slot<128, 256, 64>;
    extern __shared__ unsigned char dyn[];
    const unsigned base = tma::smem_u32(dyn), slot = hop::align1024(base);
    unsigned* words = reinterpret_cast<unsigned*>(dyn + (slot - base));
    for (unsigned i = threadIdx.x; i < S::BYTES / 4; i += blockDim.x) {
        unsigned h = (i * 2654435761u) ^ seed ^ (blockIdx.x * 40503u);
        h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
        const unsigned lo = One<T>::BITS | (h & One<T>::MANT) | (h & 0x8000u);
        const unsigned hi = One<T>::BITS | ((h >> 16) & One<T>::MANT) | ((h << 16) & 0x8000u);
        words[i] = lo | (hi << 16);
    }
    tma::fence_proxy_async();   // generic-proxy writes before wgmma reads them
    __syncthreads();
    // The SM's own cycle count and the global nanosecond timer across the loop: the
    // clock the multiprocessor ran at, which NVML's sampled reading need not be.
    unsigned long long c0 = 0, t0 = 0;
    if (threadIdx.x == 0) {
        c0 = clock64();
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    }
    const int wg = threadIdx.x / 128;
    constexpr int MI = 256 / N;   // m64 fragments per warpgroup: the same FLOPs per trip
    float acc[MI][N / 2];
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int j = 0; j < N / 2; ++j) acc[mi][j] = 0.f;
    for (int i = 0; i < iters; ++i) {
        hop::wgmma_fence();
#pragma unroll
        for (int k = 0; k < 4; ++k)
#pragma unroll
            for (int mi = 0; mi < MI; ++mi)
                hop::Wgmma<T, N>::mma(acc[mi], S::a_desc(slot, MI == 1 ? wg % 2 : mi, k),
                                      S::b_desc(slot, k), 1);
        hop::wgmma_commit();
        hop::wgmma_wait<1>();
    }
    hop::wgmma_wait<0>();
    if (threadIdx.x == 0) {
        unsigned long long t1;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
        clk[2 * blockIdx.x] = clock64() - c0;
        clk[2 * blockIdx.x + 1] = t1 - t0;
    }
    float s = 0.f;
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int j = 0; j < N / 2; ++j) s += acc[mi][j];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
"""

DTYPES = {"bf16": "__nv_bfloat16", "fp16": "__half"}
SMEM_BYTES = (BM + BN) * BK * 2 + 1024   # one slot, 1024-aligned


def expression(dtype: str, wgs: int, width: int = 256) -> str:
    return f"wgmma_loop<{DTYPES[dtype]}, {wgs}, {width}>"


def build(dtypes: list[str], warpgroups: list[int], widths: list[int]):
    """The compiled module and a note of how it was built (ptxas usage per kernel)."""
    from perfscope.build import CompileRequest, compile_cubin
    from perfscope.kernels.spec import KERNEL_DIR

    exprs = tuple(expression(d, w, n) for d in dtypes for w in warpgroups for n in widths)
    module = compile_cubin(CompileRequest(source=SOURCE, source_name="wgmma_ceiling.cu",
                                          name_expressions=exprs, arch="sm_90a",
                                          include_dir=KERNEL_DIR))
    usage = {e: module.usage(e).to_dict() for e in exprs}
    return module, f"perfscope.build NVRTC {module.nvrtc_version} for sm_90a; ptxas: {usage}"


def time_loop(cp, fn, blocks: int, threads: int, iters: int, runs: int, warmup: int):
    out = cp.empty(blocks * threads, dtype=cp.float32)
    clk = cp.zeros(2 * blocks, dtype=cp.uint64)
    args = (out, clk, cp.int32(iters), cp.uint32(0x5A5A))
    launch = dict(shared_mem=SMEM_BYTES)
    for _ in range(warmup):
        fn((blocks,), (threads,), args, **launch)
    cp.cuda.get_current_stream().synchronize()
    times, cycles, mhz = [], [], []
    with ClockSampler() as clock:
        for _ in range(runs):
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            fn((blocks,), (threads,), args, **launch)
            end.record()
            end.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, end))
            c = cp.asnumpy(clk).astype("float64").reshape(-1, 2)
            cycles.append(statistics.median(c[:, 0]))
            mhz.append(statistics.median(c[:, 0] / c[:, 1] * 1e3))
    if not bool(cp.isfinite(out).all()):
        raise RuntimeError("the accumulators are not finite; the fill pattern is wrong")
    return times, clock.summary(), statistics.median(cycles), statistics.median(mhz)


def measure(cp, fn, sms: int, wgs: int, args) -> dict:
    iters = max(1, args.iters * 2 // wgs)   # about the same duration for any warpgroup count
    row = {"warpgroups": wgs, "blocks": sms, "threads": 128 * wgs, "iters": iters}
    times, clock, cycles, mhz = time_loop(cp, fn, sms, 128 * wgs, iters, args.runs, args.warmup)
    ms = statistics.median(times)
    flop = sms * wgs * iters * FLOP_PER_WG_ITER
    tflops = flop / (ms * 1e-3) / 1e12
    row.update(ms_median=ms, ms_min=min(times), ms_max=max(times), flop=flop, tflops=tflops,
               sm_clock_mhz=clock, cta_cycles=cycles, in_kernel_mhz=mhz,
               flop_per_sm_cycle=wgs * iters * FLOP_PER_WG_ITER / cycles,
               k_tile_us=FLOP_PER_K_TILE / (tflops * 1e12 / sms) * 1e6,
               k_tile_cycles=FLOP_PER_K_TILE * cycles / (wgs * iters * FLOP_PER_WG_ITER))
    row["of_dense_peak_per_cycle"] = row["flop_per_sm_cycle"] / DENSE_FLOP_PER_SM_CYCLE
    if clock:
        row["of_dense_peak_at_nvml_clock"] = tflops / (HOPPER_DENSE_PER_GHZ * clock["median"] / 1e3)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--iters", type=int, default=DEFAULT_ITERS,
                    help="loop trips with 2 warpgroups (doubled for 1)")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--warpgroups", type=int, nargs="+", default=[1, 2], choices=[1, 2])
    ap.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    ap.add_argument("--widths", type=int, nargs="+", default=[256], choices=[256, 128],
                    help="wgmma N: one m64n256k16 or two m64n128k16 per k16 step")
    ap.add_argument("--rounds", type=int, default=1, help="repeat the whole set, interleaved")
    args = ap.parse_args()

    import cupy as cp

    from perfscope.environment import collect_environment

    env = collect_environment(cp)
    name, sms = env.gpu, env.sm_count
    if env.compute_capability != "9.0":
        print(f"{name} is compute capability {env.compute_capability}; wgmma needs 9.0 (sm_90a)")
        return 2
    module, how = build(args.dtypes, args.warpgroups, args.widths)
    raw = cp.RawModule(path=str(module.cubin_path))
    print(f"{name}: {sms} SMs; kernel built by {how}")

    rows = []
    cases = [(d, w, n) for d in args.dtypes for w in args.warpgroups for n in args.widths]
    for rnd in range(args.rounds):
        for dtype, wgs, width in cases:
            fn = raw.get_function(module.mangled(expression(dtype, wgs, width)))
            fn.max_dynamic_shared_size_bytes = SMEM_BYTES
            tag = {"dtype": dtype, "n": width, "round": rnd}
            try:
                rows.append({**tag, **measure(cp, fn, sms, wgs, args)})
            except Exception as exc:
                rows.append({**tag, "warpgroups": wgs, "error": f"{type(exc).__name__}: {exc}"})

    print(f"\n{'dtype':6s} {'N':>4s} {'WGs':>4s} {'ms':>8s} {'TFLOP/s':>8s} {'NVML':>6s} {'in-kernel':>9s} "
          f"{'FLOP/SM-clk':>11s} {'of 4096':>8s} {'k tile clk':>10s}")
    for r in rows:
        if "error" in r:
            print(f"{r['dtype']:6s} {r['n']:4d} {r['warpgroups']:4d}  error: {r['error']}")
            continue
        nvml = r["sm_clock_mhz"]["median"] if r.get("sm_clock_mhz") else float("nan")
        print(f"{r['dtype']:6s} {r['n']:4d} {r['warpgroups']:4d} {r['ms_median']:8.2f} {r['tflops']:8.1f} "
              f"{nvml:6.0f} {r['in_kernel_mhz']:9.0f} {r['flop_per_sm_cycle']:11.0f} "
              f"{r['of_dense_peak_per_cycle']:8.1%} {r['k_tile_cycles']:10.0f}")
    print("(MHz: NVML's sampled SM clock and the in-kernel clock64 / %globaltimer; FLOP/SM-clk "
          f"against the dense rating's {DENSE_FLOP_PER_SM_CYCLE}; k tile: one {BM}x{BN}x{BK} k tile "
          "of the stage per SM at this rate, in SM cycles)")
    if args.json:
        doc = {"schema": "perfscope.wgmma-ceiling/1", "gpu": name, "sms": sms,
               "environment": dataclasses.asdict(env),
               "built_by": how,
               "instruction": " / ".join(f"wgmma.mma_async.m64n{n}k16.f32 (SS)" for n in args.widths),
               "flop_per_warpgroup_iter": FLOP_PER_WG_ITER, "rows": rows,
               "command": "PYTHONPATH=. python3 " + " ".join(sys.argv),
               "time": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0 if any("tflops" in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
