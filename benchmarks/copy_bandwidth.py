"""Device-to-device copy bandwidth: the memory roof a diagnosis holds memory-bound kernels to.

    python3 benchmarks/copy_bandwidth.py [--gib 4] [--runs 20] [--json FILE]

One 4 GiB buffer copied into another on the GPU with CuPy, two ways: ``cudaMemcpyAsync``
(device to device, what frameworks call for a contiguous copy) and an elementwise copy
kernel (``cupy.copyto``). Each is timed with CUDA events, median of --runs copies after
warm-up; bandwidth counts the bytes read plus the bytes written (2 x size), the way
Nsight Compute's DRAM throughput counts them. The buffers are 70 times the 60 MiB L2, so
the copy runs at HBM speed. The SM clock is read before and after (NVML or nvidia-smi).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path


def sm_clock_mhz() -> int | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetClockInfo(pynvml.nvmlDeviceGetHandleByIndex(0),
                                                 pynvml.NVML_CLOCK_SM))
    except Exception:
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20)
        return int(out.stdout.strip().splitlines()[0])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None


def time_copies(cp, copy, runs: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        copy()
    cp.cuda.get_current_stream().synchronize()
    times = []
    for _ in range(runs):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        copy()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end))
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=4.0, help="buffer size in GiB")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    import cupy as cp

    nbytes = int(args.gib * (1 << 30)) // 16 * 16
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    src = cp.empty(nbytes // 4, dtype=cp.float32)
    src[...] = 1.5      # touched, not zeros: every page is really there
    dst = cp.empty_like(src)
    stream = cp.cuda.get_current_stream()

    def memcpy() -> None:
        cp.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, nbytes,
                                    cp.cuda.runtime.memcpyDeviceToDevice, stream.ptr)

    def kernel() -> None:
        cp.copyto(dst, src)

    clock_before = sm_clock_mhz()
    rows = []
    for label, fn in (("cudaMemcpyAsync D2D", memcpy), ("copy kernel (cupy.copyto)", kernel)):
        row: dict = {"method": label, "bytes_copied": nbytes, "bytes_moved": 2 * nbytes}
        try:
            times = time_copies(cp, fn, args.runs, args.warmup)
            ms = statistics.median(times)
            row.update(ms_median=ms, ms_min=min(times), ms_max=max(times),
                       gbps=2 * nbytes / (ms * 1e-3) / 1e9, gbps_best=2 * nbytes / (min(times) * 1e-3) / 1e9)
            if not bool((dst[:: 1 << 20] == 1.5).all()):
                row["error"] = "the destination does not hold the source after the copy"
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"
        rows.append(row)
    clock_after = sm_clock_mhz()

    print(f"{name}: {nbytes / (1 << 30):.2f} GiB copied, bytes read + written counted")
    print(f"{'method':28s} {'ms':>8s} {'GB/s':>9s} {'best GB/s':>10s}")
    for r in rows:
        if "ms_median" in r:
            print(f"{r['method']:28s} {r['ms_median']:8.3f} {r['gbps']:9.0f} {r['gbps_best']:10.0f}"
                  + (f"  {r['error']}" if "error" in r else ""))
        else:
            print(f"{r['method']:28s} error: {r.get('error')}")
    print(f"SM clock before/after: {clock_before} / {clock_after} MHz")
    ok = [r for r in rows if "gbps" in r and "error" not in r]
    if ok:
        print(f"device-to-device copy bandwidth: {max(r['gbps'] for r in ok) / 1000:.2f} TB/s")
    if args.json:
        doc = {"schema": "perfscope.copy-bandwidth/1", "gpu": name, "rows": rows,
               "gbps": ok[0]["gbps"] if ok else None,
               "sm_clock_mhz": {"before": clock_before, "after": clock_after},
               "command": "python3 " + " ".join(sys.argv),
               "time": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
