"""The mma.sync ceiling: how fast HMMA (m16n8k16, f32 accumulate) can go on this GPU at all.

    PYTHONPATH=. python3 benchmarks/hmma_ceiling.py [--json FILE] [--iters N] [--runs N]
                                                     [--blocks-per-sm 1 2 4]

A kernel that does nothing but ``mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.*.f32``
on registers: every warp keeps CHAINS independent accumulator chains (one HMMA each per
loop trip, all reading the same A and B fragments), so the tensor pipe never waits on a
result; the only memory traffic is one store per thread at the end, which keeps the
compiler from deleting the loop. It runs on every multiprocessor with 8 warps a block
and 1, 2 and 4 blocks a multiprocessor, is timed with CUDA events (median of --runs after
warm-up), and the SM clock is read (NVML, else nvidia-smi) while it runs. One HMMA of a
warp is 2*16*8*16 = 4096 FLOP.

This is the roof an mma.sync (HMMA) kernel cannot pass on Hopper, whatever its memory
pipeline does: the hgemm ladder's stages and Triton's MMAv2 kernels live under it, and
wgmma (HGMMA) is the only way past it. TFLOP/s per GHz lets a figure measured at one
clock be compared with a capture made at another.

The kernel compiles through perfscope's own NVRTC path (perfscope.build, for sm_90a on
the H200, or the GPU's own target), falling back to CuPy's RawModule when that path is
not installed; it is loaded and launched with CuPy. Clocks are left as found.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHAINS = 8
THREADS = 256
FLOP_PER_HMMA = 2 * 16 * 8 * 16
# H100/H200 SXM datasheet: 989 dense BF16/FP16 TFLOP/s at 1.83 GHz (132 SMs).
HOPPER_DENSE_PER_GHZ = 989 / 1.83

# No headers: the operands are raw 32-bit registers holding two 16-bit values each, so
# the same source builds with NVRTC alone (no cuda_fp16.h / cuda_bf16.h needed).
SOURCE = r"""
#define CHAINS 8

#define HMMA_LOOP(NAME, TYPES)                                                              \
extern "C" __global__ void __launch_bounds__(256) NAME(float* __restrict__ out, int iters,  \
                                                       unsigned int seed)                   \
{                                                                                           \
    /* Operands from a runtime value, so nothing folds at compile time. Two 16-bit */      \
    /* values per register, near 0x3c00: about 1.0 in f16 and 2^-7 in bf16, so the */      \
    /* products are normal numbers (not zeros, which draw less power) and the sums */       \
    /* stay finite for any loop count used here. */                                         \
    unsigned int t = threadIdx.x ^ seed;                                                    \
    unsigned int a0 = 0x3c003c00u ^ (t & 0x00070007u), a1 = a0 ^ 0x00010000u;               \
    unsigned int a2 = a0 ^ 0x00000001u, a3 = a0 ^ 0x00010001u;                              \
    unsigned int b0 = 0x3c003c00u ^ ((t >> 3) & 0x00070007u), b1 = b0 ^ 0x00010001u;        \
    float d[CHAINS][4];                                                                     \
    _Pragma("unroll")                                                                       \
    for (int c = 0; c < CHAINS; ++c) {                                                      \
        d[c][0] = 0.f; d[c][1] = 0.f; d[c][2] = 0.f; d[c][3] = 0.f;                         \
    }                                                                                       \
    for (int i = 0; i < iters; ++i) {                                                       \
        _Pragma("unroll")                                                                   \
        for (int c = 0; c < CHAINS; ++c) {                                                  \
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TYPES ".f32 "             \
                         "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"            \
                         : "+f"(d[c][0]), "+f"(d[c][1]), "+f"(d[c][2]), "+f"(d[c][3])       \
                         : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));          \
        }                                                                                   \
    }                                                                                       \
    float s = 0.f;                                                                          \
    _Pragma("unroll")                                                                       \
    for (int c = 0; c < CHAINS; ++c) s += d[c][0] + d[c][1] + d[c][2] + d[c][3];            \
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;                                         \
}

HMMA_LOOP(hmma_loop_bf16, "bf16.bf16")
HMMA_LOOP(hmma_loop_f16, "f16.f16")
"""

KERNELS = {"bf16": "hmma_loop_bf16", "fp16": "hmma_loop_f16"}


# ------------------------------------------------------------------------------- clocks


class ClockSampler:
    """Reads the SM clock (MHz) every few milliseconds on a thread while a kernel runs."""

    def __init__(self, period_s: float = 0.005) -> None:
        self.period_s = period_s
        self.samples: list[int] = []
        self.source = "none"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._read = self._reader()

    def _reader(self):
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            self.source = "nvml"
            return lambda: int(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))
        except Exception:
            pass
        if nvidia_smi_clock() is not None:
            self.source = "nvidia-smi"
            return nvidia_smi_clock
        return lambda: None

    def __enter__(self) -> ClockSampler:
        def loop() -> None:
            while not self._stop.is_set():
                value = self._read()
                if value:
                    self.samples.append(value)
                self._stop.wait(self.period_s)

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def summary(self) -> dict | None:
        if not self.samples:
            return None
        return {"median": statistics.median(self.samples), "min": min(self.samples),
                "max": max(self.samples), "samples": len(self.samples), "source": self.source}


def nvidia_smi_clock() -> int | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20)
        return int(out.stdout.strip().splitlines()[0])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None


# ------------------------------------------------------------------------------ building


def build(arch: str) -> tuple[str, dict[str, str], str]:
    """(cubin path, kernel -> mangled name, how it was built), through perfscope's NVRTC."""
    sys.path.insert(0, str(ROOT))
    from perfscope.build import CompileRequest, compile_cubin

    module = compile_cubin(CompileRequest(source=SOURCE, source_name="hmma_ceiling.cu",
                                          name_expressions=tuple(KERNELS.values()), arch=arch))
    usage = {k: module.usage(k).to_dict() for k in KERNELS.values()}
    return (str(module.cubin_path), {k: module.mangled(k) for k in KERNELS.values()},
            f"perfscope.build NVRTC {module.nvrtc_version} for {arch}; ptxas: {usage}")


def load_functions(cp, arch: str) -> tuple[dict[str, object], str, object]:
    try:
        cubin, mangled, how = build(arch)
        module = cp.RawModule(path=cubin)
        return {dt: module.get_function(mangled[k]) for dt, k in KERNELS.items()}, how, module
    except Exception as exc:  # perfscope's build extra missing: CuPy's NVRTC, its own target
        print(f"perfscope.build unavailable ({type(exc).__name__}: {exc}); using cupy.RawModule")
        module = cp.RawModule(code=SOURCE)
        return ({dt: module.get_function(k) for dt, k in KERNELS.items()},
                "cupy.RawModule (NVRTC, CuPy's default target)", module)


# ------------------------------------------------------------------------------- timing


def time_kernel(cp, fn, blocks: int, iters: int, runs: int, warmup: int) -> tuple[list[float], dict | None]:
    out = cp.empty(blocks * THREADS, dtype=cp.float32)
    args = (out, cp.int32(iters), cp.uint32(0x5a5a))
    for _ in range(warmup):
        fn((blocks,), (THREADS,), args)
    cp.cuda.get_current_stream().synchronize()
    times = []
    with ClockSampler() as clock:
        for _ in range(runs):
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            fn((blocks,), (THREADS,), args)
            end.record()
            end.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, end))
    if not bool(cp.isfinite(out).all()):
        raise RuntimeError("the accumulators are not finite; the operand patterns are wrong")
    return times, clock.summary()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--iters", type=int, default=1 << 17,
                    help="loop trips at 4 blocks/SM (scaled for other occupancies)")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--blocks-per-sm", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--dtypes", nargs="+", default=list(KERNELS), choices=list(KERNELS))
    args = ap.parse_args()

    import cupy as cp

    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    sms = int(props["multiProcessorCount"])
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    cc = int(dev.compute_capability)
    arch = f"sm_{cc}a" if cc in (90, 100, 103) else f"sm_{cc}"
    fns, how, _module = load_functions(cp, arch)
    print(f"{name}: {sms} SMs, compute capability {cc / 10:.1f}; kernel built by {how}")

    rows = []
    for dtype in args.dtypes:
        for per_sm in args.blocks_per_sm:
            blocks = sms * per_sm
            iters = max(1, args.iters * 4 // per_sm)
            row = {"dtype": dtype, "blocks_per_sm": per_sm, "blocks": blocks, "threads": THREADS,
                   "chains_per_warp": CHAINS, "iters": iters}
            try:
                times, clock = time_kernel(cp, fns[dtype], blocks, iters, args.runs, args.warmup)
                ms = statistics.median(times)
                flop = blocks * (THREADS // 32) * iters * CHAINS * FLOP_PER_HMMA
                tflops = flop / (ms * 1e-3) / 1e12
                row.update(ms_median=ms, ms_min=min(times), ms_max=max(times), flop=flop,
                           tflops=tflops, sm_clock_mhz=clock)
                if clock:
                    row["tflops_per_ghz"] = tflops / (clock["median"] / 1000)
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {exc}"
            rows.append(row)

    print(f"\n{'dtype':6s} {'blk/SM':>6s} {'ms':>9s} {'TFLOP/s':>9s} {'SM MHz':>8s} {'TF/GHz':>8s}")
    for r in rows:
        if "error" in r:
            print(f"{r['dtype']:6s} {r['blocks_per_sm']:6d}  error: {r['error']}")
            continue
        clock = r["sm_clock_mhz"]["median"] if r.get("sm_clock_mhz") else None
        print(f"{r['dtype']:6s} {r['blocks_per_sm']:6d} {r['ms_median']:9.3f} {r['tflops']:9.1f} "
              f"{clock if clock else '?':>8} {r.get('tflops_per_ghz', float('nan')):8.1f}")
    best = {}
    for r in rows:
        if "tflops" in r and r["tflops"] > best.get(r["dtype"], {}).get("tflops", 0):
            best[r["dtype"]] = r
    for dtype, r in best.items():
        per_ghz = r.get("tflops_per_ghz")
        line = f"{dtype} mma.sync ceiling: {r['tflops']:.0f} TFLOP/s ({r['blocks_per_sm']} blocks/SM)"
        if per_ghz:
            line += (f"; {per_ghz:.1f} TFLOP/s per GHz, so {per_ghz * 1.98:.0f} at 1.98 GHz and "
                     f"{per_ghz * 1.83:.0f} at 1.83 GHz (dense peak helper: HMMA rate per SM per "
                     f"cycle = {per_ghz * 1e3 / sms:.0f} FLOP)")
        print(line)
        if per_ghz and ("H100" in name or "H200" in name):
            print(f"   = {per_ghz / HOPPER_DENSE_PER_GHZ:.0%} of Hopper's dense BF16/FP16 tensor peak "
                  f"({HOPPER_DENSE_PER_GHZ:.0f} TFLOP/s per GHz: 989 at the 1.83 GHz rating clock), "
                  "which only wgmma reaches")
    if args.json:
        doc = {"schema": "perfscope.hmma-ceiling/1", "gpu": name, "sms": sms, "compute_capability": cc,
               "built_by": how, "flop_per_hmma": FLOP_PER_HMMA, "rows": rows,
               "best": {k: v["tflops"] for k, v in best.items()},
               "command": "PYTHONPATH=. python3 " + " ".join(sys.argv),
               "time": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0 if best else 1


if __name__ == "__main__":
    sys.exit(main())
