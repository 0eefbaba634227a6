"""FFMA operand reads against dispatch stalls, with the registers set by hand in the SASS.

ptxas picks the registers of a CUDA C FFMA loop, so no CUDA C order can hold the register
file's banks fixed while the rest stays the same. This probe compiles one FFMA-only loop
(256 FFMAs a pass, 64 float operands, no dependency closer than 8 FFMAs), then rewrites
every FFMA of the loop in the cubin: the source and destination register fields and the
operand reuse flags, nothing else (the control codes' stall counts stay ptxas's), to one
pattern of register-file reads at a time. Each pattern is timed by the kernel's own
clock64 around the loop, at one and at two warps per scheduler.

    python3 ffma_bank_probe.py build DIR        # nvcc + cuobjdump: DIR/<pattern>.cubin
    python3 ffma_bank_probe.py run DIR OUT.json # a GPU: cycles per FFMA per scheduler

The register fields of an sm_90 FFMA R_d, R_a, R_b, R_c (reg-reg-reg form, opcode 0x223):
R_d bits 16-23, R_a bits 24-31, R_b bits 32-39 of the low word; R_c bits 0-7 of the high
word; reuse flags for slots a, b, c in bits 58, 59, 60 of the high word (read off
`cuobjdump -sass` of known instructions; `build` checks every rewritten instruction by
disassembling the patched cubin).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

SOURCE = r"""
extern "C" __global__ void __launch_bounds__(256, 1)
ffma_loop(float* out, long long* cycles, const float* in, int iters)
{
    float r[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) r[i] = in[(threadIdx.x + i) & 255];
    long long t0 = clock64();
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int k = 0; k < 8; ++k)
#pragma unroll
            for (int j = 0; j < 32; ++j)
                r[j] = fmaf(r[32 + (j & 7)], r[40 + (((j >> 3) + k) & 7) + 8 * (k & 1)], r[j]);
    }
    long long t1 = clock64();
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 64; ++i) s += r[i];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
    if (threadIdx.x % 32 == 0) cycles[(blockIdx.x * blockDim.x + threadIdx.x) / 32] = t1 - t0;
}
"""
LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;?\s*/\* 0x([0-9a-f]{16}) \*/")
FFMA = re.compile(r"FFMA R(\d+), R(\d+)(\.reuse)?, R(\d+)(\.reuse)?, R(\d+)(\.reuse)?")
ACCUMULATORS = 8       # distinct destinations in a row: each is read again 8 FFMAs later


def _sass(cubin: Path) -> list[tuple[int, str, int, int]]:
    text = subprocess.run(["cuobjdump", "-sass", str(cubin)], check=True, capture_output=True,
                          text=True).stdout.splitlines()
    out = []
    for i, line in enumerate(text):
        m = LINE.search(line)
        if m:
            hi = int(re.search(r"0x([0-9a-f]{16})", text[i + 1]).group(1), 16)
            out.append((int(m.group(1), 16), m.group(2).rstrip(" ;"), int(m.group(3), 16), hi))
    return out


def _loop(sass):
    """The FFMAs between the loop's first FFMA and its backward branch."""
    back = next(a for a, t, _, _ in sass if re.match(r"@!?P\d BRA", t) and
                int(t.split()[-1], 16) < a)
    start = int(next(t for a, t, _, _ in sass if a == back).split()[-1], 16)
    return [(a, t, lo, hi) for a, t, lo, hi in sass if start <= a < back and FFMA.search(t)]


def _by_class(regs, k, n):
    """n registers of the pool with number % 4 == k."""
    picked = [r for r in sorted(regs) if r % 4 == k][:n]
    assert len(picked) == n, (k, n, picked)
    return picked


def patterns(pool: set[int]) -> dict[str, list[tuple[int, int, int, int]]]:
    """Per pattern, per FFMA slot i of the loop: (d = c, a, b, reuse bits). Classes are
    register number mod 4; two classes of one parity share a bank if banks are mod 2."""
    n = 256

    def make(c_cls, a_cls, b_cls, reuse_a, reuse_b):
        acc = _by_class(pool, c_cls, ACCUMULATORS)
        free = {k: [r for r in sorted(pool) if r % 4 == k and r not in acc] for k in range(4)}
        a_regs, b_regs = free[a_cls], free[b_cls]
        if a_cls == b_cls:      # disjoint halves: never one register read twice
            half = len(a_regs) // 2
            a_regs, b_regs = a_regs[:half], a_regs[half:]
        rows = []
        for i in range(n):
            a = a_regs[0] if reuse_a else a_regs[i % len(a_regs)]
            b = b_regs[0] if reuse_b else b_regs[i % len(b_regs)]
            rows.append((acc[i % ACCUMULATORS], a, b, (1 if reuse_a else 0) | (2 if reuse_b else 0)))
        return rows

    return {
        "1read_c0": make(0, 1, 2, True, True),          # a, b from the reuse cache
        "2read_b1_c0": make(0, 3, 1, True, False),      # b, c: other parity
        "2read_b2_c0": make(0, 3, 2, True, False),      # b, c: same parity, other class
        "2read_b0_c0": make(0, 3, 0, True, False),      # b, c: same class
        "2read_a1_c0": make(0, 1, 3, False, True),      # b from the cache; a, c other parity
        "2read_a2_c0": make(0, 2, 3, False, True),      # a, c: same parity, other class
        "3read_a1_b2_c0": make(0, 1, 2, False, False),  # a, b, c: three classes
        "3read_a1_b3_c0": make(0, 1, 3, False, False),  # a, b odd, c even
        "3read_a2_b2_c0": make(0, 2, 2, False, False),  # all even, a and b one class
        "3read_a0_b0_c0": make(0, 0, 0, False, False),  # all one class
    }


def _patch(data: bytearray, base: int, addr: int, row) -> None:
    c, a, b, reuse = row
    off = base + addr
    lo = int.from_bytes(data[off:off + 8], "little")
    hi = int.from_bytes(data[off + 8:off + 16], "little")
    lo = (lo & ~(0xFF << 16) & ~(0xFF << 24) & ~(0xFF << 32)) | (c << 16) | (a << 24) | (b << 32)
    hi = (hi & ~0xFF & ~(0x7 << 58)) | c | (reuse << 58)
    data[off:off + 8] = lo.to_bytes(8, "little")
    data[off + 8:off + 16] = hi.to_bytes(8, "little")


def build(out: Path) -> None:
    """Compile the loop and write one cubin a pattern into out, each rewritten FFMA checked
    against the disassembly of the patched cubin; manifest.json names them."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "ffma_loop.cu").write_text(SOURCE)
    base_cubin = out / "base.cubin"
    subprocess.run(["nvcc", "-cubin", "-arch=sm_90a", "-O3", "-o", str(base_cubin),
                    str(out / "ffma_loop.cu")], check=True)
    sass = _sass(base_cubin)
    loop = _loop(sass)
    assert len(loop) == 256, len(loop)
    pool = {int(x) for _, t, _, _ in loop for x in FFMA.search(t).group(1, 2, 4, 6)}
    data = bytearray(base_cubin.read_bytes())
    first = loop[0][2].to_bytes(8, "little") + loop[0][3].to_bytes(8, "little")
    assert data.count(first) == 1
    base = data.index(first) - loop[0][0]
    manifest = {"pool": sorted(pool), "patterns": {}}
    for name, rows in patterns(pool).items():
        patched = bytearray(data)
        for (addr, _, _, _), row in zip(loop, rows, strict=True):
            _patch(patched, base, addr, row)
        path = out / f"{name}.cubin"
        path.write_bytes(bytes(patched))
        check = _loop(_sass(path))
        for (_, text, _, _), (c, a, b, reuse) in zip(check, rows, strict=True):
            m = FFMA.search(text)
            got = (int(m.group(1)), int(m.group(2)), int(m.group(4)), int(m.group(6)),
                   (1 if m.group(3) else 0) | (2 if m.group(5) else 0) | (4 if m.group(7) else 0))
            assert got == (c, a, b, c, reuse), (name, text, (c, a, b, reuse))
        manifest["patterns"][name] = check[0][1] + " ... " + check[1][1]
    manifest["patterns"]["base"] = "ptxas's own: " + loop[0][1]
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    print(json.dumps(manifest, indent=1))


def run(folder: Path, out: Path, iters: int = 2000) -> None:
    """Time every cubin of folder in three rounds, at one and two warps per scheduler (one
    CTA of 128 or 256 threads an SM): the median warp's clock64 span over its FFMAs."""
    import cupy as cp

    names = ["base", *json.loads((folder / "manifest.json").read_text())["patterns"]]
    names = list(dict.fromkeys(names))
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    x = cp.random.rand(256, dtype=cp.float32)
    rows = []
    for rnd in range(3):
        for name in names:
            fn = cp.RawModule(path=str(folder / f"{name}.cubin")).get_function("ffma_loop")
            for threads in (128, 256):
                y = cp.empty(sms * threads, dtype=cp.float32)
                cyc = cp.empty(sms * threads // 32, dtype=cp.int64)
                fn((sms,), (threads,), (y, cyc, x, cp.int32(iters)))
                cp.cuda.Device().synchronize()
                c = cp.asnumpy(cyc)
                per_warp = float(sorted(c)[len(c) // 2]) / (iters * 256)
                rows.append({"pattern": name, "round": rnd, "warps_per_scheduler": threads // 128,
                             "cycles_per_ffma_per_warp": per_warp,
                             "cycles_per_ffma_per_scheduler": per_warp / (threads // 128)})
    out.write_text(json.dumps({"gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                               "iters": iters, "rows": rows}, indent=1))
    for name in names:
        for w in (1, 2):
            v = sorted(r["cycles_per_ffma_per_scheduler"] for r in rows
                       if r["pattern"] == name and r["warps_per_scheduler"] == w)
            print(f"{name:18s} {w} warp(s)/scheduler: {v[len(v) // 2]:.3f} cycles per FFMA")


if __name__ == "__main__":
    if sys.argv[1] == "build":
        build(Path(sys.argv[2]))
    else:
        run(Path(sys.argv[2]), Path(sys.argv[3]))
