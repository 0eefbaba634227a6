"""What bounds an estimate: the work a kernel does, its roofline, and its headroom.

An estimate is a claim about time: the fraction of this kernel's time a fix saves if it
is applied alone. No fix can take a kernel below the time its work needs at the chip's
peak, so every estimate is capped at the kernel's headroom

    headroom = 1 - t_min / t,   t_min = max(FLOPs / peak FLOP/s, bytes / peak DRAM B/s)

with t the kernel's duration under ncu, the FLOPs on the fastest dense path for the
element type (fp16/bf16: tensor cores; fp32: the FFMA pipe) at the SM clock measured during
the kernel, and the bytes its compulsory traffic (each input read once, the output written
once, from the run manifest's shape) at the DRAM peak the report states. Without a
manifest the FLOPs are read from the SASS (HGMMA/HMMA shapes, FFMA lanes) and the bytes
are the DRAM bytes measured, an upper bound on what the work needs; the evidence says
which. When the kernel was timed against its reference, an estimate is also capped at the
gap to it plus REFERENCE_MARGIN.

A kernel that does its tensor math with mma.sync (HMMA) on a chip where wgmma is the
full-rate path (the H200: HMMA peaks at 61% of it, ``hardware.hmma_share``) has a second,
nearer roof: the same FLOPs at the HMMA rate. A fix that keeps the instruction (a deeper
pipeline, more occupancy, fewer conflicts) cannot take the kernel below it, so those
findings are capped at ``path_fraction``; only a change of path (PATH_CHANGE_TAGS: to
wgmma, to tensor cores at all) is bounded by the dense peak alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

from perfscope.families import base_opcode
from perfscope.hardware import (
    DRAM_PRACTICAL_SHARE,
    ELEMENT_BYTES,
    KERNEL_FIXED_NS,
    empty_kernel_ns,
    hmma_share,
    math_kind,
    output_element_bytes,
    peak_flops,
)
from perfscope.manifest import RunManifest
from perfscope.metrics import M_DRAM_READ, M_DRAM_WRITE, SECTOR_BYTES
from perfscope.profile import KernelProfile
from perfscope.rules.model import Evidence, Inputs

# The gap to a timed reference plus this much: timing spread and the difference between
# ncu's replay and the event-timed run.
REFERENCE_MARGIN = 0.05
M_DRAM_READ_PCT = "dram__bytes_read.sum.pct_of_peak_sustained_elapsed"
# Below this share of its peak the DRAM rate is too small to derive the peak from. The ratio
# holds far below 1%: on the H200 a read of 25 KB (0.19% of the peak over its 2.7 us) implies
# 4.78 TB/s, its reads of 1 GiB 4.80 (probes/kernel-floor-h200); an empty kernel's 80 sectors
# (0.035%) are left out.
MIN_PCT_FOR_PEAK = 0.1
# A launch whose SASS counts less than this share of the manifest's 2·M·N·K does only
# part of the manifest's work (one launch of a group): it is judged by its own counters.
PART_OF_WORK = 0.5
# The most work a launch of the manifest's products can execute: every tile padded (tiles
# of up to 256 x 256, k steps of up to 64), with BEYOND_PADDING of slack for the FP math
# that is not the product's (an FFMA kernel's scaling and address math: 1.06x the
# product's FLOPs for ps_regs_uncapped at 1024^3). More than that, and the launch ran more
# products than the manifest names (a batch labelled with one product's shape: 2x or more).
PADDED_TILE_MAX, PADDED_K_STEP = 256, 64
BEYOND_PADDING = 1.5

# Findings whose fix changes the math instruction itself: bounded by the dense peak, not by
# the roof of the instruction the kernel uses now.
# (A layout that closes the library's fast path changes the instruction with it.)
PATH_CHANGE_TAGS = frozenset({"legacy-mma", "no-tensor-cores", "unaligned-rows", "operand-layout"})

# The M x N x K of a warpgroup MMA opcode (HGMMA.64x256x16.F32.BF16).
MMA_SHAPE = re.compile(r"^(?:H|Q|I|B)GMMA\.(\d+)x(\d+)x(\d+)")
# FLOP per warp-level instruction of the mma.sync shapes (m x n x k x 2): HMMA's, and
# IMMA's (8-bit: m16n8k16, m16n8k32, m8n8k16; 4-bit m8n8k32).
_HMMA_FLOPS = {"16816": 16 * 8 * 16 * 2, "1688": 16 * 8 * 8 * 2, "884": 8 * 8 * 4 * 2,
               "16832": 16 * 8 * 32 * 2, "8816": 8 * 8 * 16 * 2, "8832": 8 * 8 * 32 * 2}
# Tensor MMAs on 32-bit float data (HGMMA.64x256x8.F32.TF32, HMMA.1684.F32.TF32): held to
# the TF32 peak, half the 16-bit one; the data's bytes stay fp32's.
TF32_MARK = ".TF32"
# Integer tensor MMAs (IMMA.16816.S8.S8, IGMMA.64x256x32.S32.S8.S8): 8-bit inputs.
INT_MMA = ("IMMA", "IGMMA")
_BF16_MARKS = (".BF16", "BF16")
_DEMANGLED_TYPES = (("__nv_bfloat16", "bf16"), ("BFloat16", "bf16"), ("bfloat16", "bf16"),
                    ("__half", "fp16"), ("c10::Half", "fp16"))


@dataclass(frozen=True)
class Work:
    """What the kernel computes and moves, and where each number comes from."""

    flops: float | None
    flops_source: str
    bytes: float | None
    bytes_source: str
    dtype: str | None
    dtype_source: str
    kind: str | None = None     # the peak it is held to (hardware.math_kind, or tf32 by the SASS)


def work_kind(p: KernelProfile, dtype: str | None) -> str | None:
    """The peak the work is held to: its element type's (hardware.math_kind), except fp32
    data that the SASS multiplies on TF32 tensor cores (cuBLAS with allow_tf32), which is
    held to the TF32 peak rather than the FFMA pipe's."""
    if dtype in (None, "fp32") and any(
            base_opcode(op) in ("HGMMA", "HMMA") and TF32_MARK in op
            for op in p.opcodes.with_modifiers):
        return "tf32"
    return math_kind(dtype)


@dataclass(frozen=True)
class Headroom:
    """How much of the kernel's time any fix could save: 1 - t_min / t."""

    fraction: float
    t_ns: float
    t_min_ns: float
    bound: str                  # what sets t_min: "math (tensor16)", "DRAM", ...
    work: Work
    evidence: tuple[Evidence, ...]
    t_math_ns: float | None = None      # the work's FLOPs at the math peak
    t_bytes_ns: float | None = None     # its bytes at the DRAM peak
    # The same for the kernel's own instruction path when that path is slower than the
    # dense peak (mma.sync on Hopper); None when the kernel is on the full-rate path.
    path_fraction: float | None = None
    path: str | None = None             # e.g. "mma.sync (HMMA)"
    t_path_ns: float | None = None      # the work's FLOPs at that path's rate
    # Where DRAM bounds the roofline: a launch's fixed time (none where unmeasured) plus the
    # bytes at the practical DRAM rate, the least the kernel can take in practice.
    t_floor_ns: float | None = None

    @property
    def t_bytes_practical_ns(self) -> float | None:
        """The work's bytes at the practical DRAM rate (DRAM_PRACTICAL_SHARE of the peak)."""
        return None if self.t_bytes_ns is None else _at_practical_rate(self.t_bytes_ns)

    @property
    def floor_fraction(self) -> float | None:
        """Memory-bound work's gap to its floor, 1 - t_floor / t (None where math bounds
        the work): no fix inside that envelope saves more."""
        return None if self.t_floor_ns is None else max(0.0, min(1.0, 1 - self.t_floor_ns / self.t_ns))

    def cap_for(self, tag: str) -> tuple[float, str]:
        """The headroom that bounds a finding of this tag, and its name."""
        if self.path_fraction is not None and tag not in PATH_CHANGE_TAGS:
            return self.path_fraction, f"headroom on {self.path}"
        return self.fraction, "headroom"


class WgmmaWork(NamedTuple):
    """One wgmma opcode's shape (M x N x K), its warpgroup instructions and their FLOPs."""

    rows: int
    cols: int
    depth: int
    instructions: float
    flops: float


def wgmma_work(op: str, executed: float) -> WgmmaWork | None:
    """The shape, warpgroup instructions and FLOPs of a wgmma opcode (HGMMA.64x256x16...)
    executed this many times as the SASS counts it, once per warp: four per warpgroup
    instruction; None for another opcode."""
    if (m := MMA_SHAPE.match(op)) is None:
        return None
    rows, cols, depth = int(m[1]), int(m[2]), int(m[3])
    instructions = executed / 4
    return WgmmaWork(rows, cols, depth, instructions, instructions * rows * cols * depth * 2)


def sass_flops(p: KernelProfile) -> float | None:
    """FLOPs from the executed SASS: wgmma and mma.sync shapes, FFMA lanes (all active)."""
    ops = p.opcodes.with_modifiers
    if not ops:
        return None
    flops = 0.0
    for op, n in ops.items():
        base = base_opcode(op)
        if (w := wgmma_work(op, n)) is not None:
            flops += w.flops
        elif base in ("HMMA", "IMMA"):
            shape = op.split(".")[1] if "." in op else ""
            flops += n * _HMMA_FLOPS.get(shape, 0)
        elif base in ("FFMA", "DFMA"):
            flops += n * 32 * 2
        elif base == "FFMA2":
            flops += n * 32 * 4
    return flops or None


def infer_dtype(p: KernelProfile) -> tuple[str | None, str]:
    """The element type the math works on, from the SASS or the demangled signature."""
    ops = p.opcodes.with_modifiers
    for op in ops:
        base = base_opcode(op)
        if base in ("HGMMA", "HMMA") and TF32_MARK in op:
            return "fp32", f"inferred from the SASS ({op}: fp32 data on TF32 tensor cores)"
        if base in ("HGMMA", "HMMA"):
            return ("bf16" if any(m in op for m in _BF16_MARKS) else "fp16",
                    f"inferred from the SASS ({op})")
        if base in INT_MMA:
            return "int8", f"inferred from the SASS ({op})"
        if base == "QGMMA":   # e4m3 / e5m2 inputs: held to the 8-bit tensor peak
            return "fp8", f"inferred from the SASS ({op})"
    for op in ops:
        if op.startswith("F2FP.BF16"):
            return "bf16", f"inferred from the SASS ({op}: bf16 results packed)"
        # Not HFMA2/HADD2: compilers use HFMA2.MMA to move and zero registers in fp32 code.
        if op.startswith("F2FP.F16"):
            return "fp16", f"inferred from the SASS ({op}: fp16 results packed)"
    for mark, dtype in _DEMANGLED_TYPES:
        if mark in p.identity.demangled:
            return dtype, f"inferred from the signature ({mark})"
    if p.opcodes.has("ffma") and not p.opcodes.has("hmma") and not p.opcodes.has("gmma"):
        return "fp32", "inferred from the SASS (FFMA math, no half-precision packs)"
    return None, "unknown"


def work_of(inputs: Inputs) -> Work:
    """The work, from the run manifest when there is one, else from the report."""
    p, m = inputs.profile, inputs.manifest
    dtype, dtype_source = inputs.dtype, "run manifest" if m is not None else "stage"
    if dtype is None:
        dtype, dtype_source = infer_dtype(p)
    elem = ELEMENT_BYTES.get(dtype or "")
    counted = sass_flops(p)
    if m is not None and not m.shape_known:
        m = None    # a program captured without --shape: its manifest says 0x0x0
    if m is not None and counted is not None and counted < PART_OF_WORK * m.flops:
        # One launch of several (a split-K reduction, an elementwise op after the GEMM):
        # the manifest's shape is the group's work, not this launch's.
        m = None
    beyond = None
    if m is not None and counted is not None and counted > BEYOND_PADDING * padded_flops(m):
        beyond, m = counted / m.flops, None
    if m is not None:
        flops = float(m.flops)
        flops_source = (f"2·M·N·K of {m.shape} (run manifest)" if m.batch == 1 else
                        f"2·B·M·N·K of {m.shape}, a batch of {m.batch} (run manifest)")
        out = output_element_bytes(dtype)
        nbytes = (m.batch * ((m.m * m.k + m.k * m.n) * elem + m.m * m.n * out)
                  if elem and out else None)
        bytes_source = ("A, B read once and C written once (run manifest)" if m.batch == 1 else
                        "each product's A, B read once and C written once (run manifest)")
    else:
        flops, flops_source = counted, "executed SASS (MMA shapes, FFMA lanes)"
        if beyond is not None:
            flops_source += (f"; {beyond:.1f}x the run manifest's {inputs.manifest.shape}, more "
                             "than its tiles' padding explains: a batch of products, or a "
                             "--shape that is not this launch's (BxMxNxK names a batch)")
        nbytes = dram_bytes_moved(p)
        bytes_source = ("DRAM bytes measured, the writes at least what the stores wrote (an upper "
                        "bound on what the work needs)")
        useful = _useful_share(p)
        if nbytes is not None and useful is not None and useful < 1:
            # Excess sectors and spills are bytes a fix removes, not bytes the work needs.
            nbytes *= useful
            bytes_source = (f"DRAM bytes measured x {useful:.2f}, the share of sectors the "
                            "source counters call useful")
    return Work(flops, flops_source, nbytes, bytes_source, dtype, dtype_source, work_kind(p, dtype))


def padded_flops(m: RunManifest) -> float:
    """The most FLOPs the MMAs of the manifest's products can execute with every tile padded:
    M and N up to multiples of PADDED_TILE_MAX, K of PADDED_K_STEP."""
    def up(x: int, step: int) -> int:
        return -(-x // step) * step

    return 2.0 * m.batch * up(m.m, PADDED_TILE_MAX) * up(m.n, PADDED_TILE_MAX) * up(m.k, PADDED_K_STEP)


def dram_bytes_moved(p: KernelProfile) -> float | None:
    """Bytes read from DRAM plus the bytes written, None unless both DRAM counts were
    collected. What the stores wrote reaches DRAM too, after the kernel when the L2 holds
    it at the end, where ncu's replay does not count it: PyTorch's GELU of 32 MiB on the
    H200 (probes/kernel-floor-h200) stores 32 MiB that DRAM counts 13.5 MB of."""
    read, write = p.metric(M_DRAM_READ), p.metric(M_DRAM_WRITE)
    if read is None or write is None:
        return None
    stored = sum(o.actual for o in p.memory.global_.of_kind("store")) * SECTOR_BYTES
    return read + max(write, stored)


def _useful_share(p: KernelProfile) -> float | None:
    """Ideal global sectors over all global and local sectors the SMs moved."""
    g = p.memory.global_
    if g.actual is None or g.ideal is None:
        return None
    local = (p.memory.local_bytes or 0.0) / SECTOR_BYTES
    moved = g.actual + local
    return min(1.0, g.ideal / moved) if moved else None


def dram_peak(p: KernelProfile) -> float | None:
    """The DRAM peak in bytes/s the report itself implies (bytes over time over % of peak)."""
    read, pct, t = p.metric(M_DRAM_READ), p.metric(M_DRAM_READ_PCT), p.sol.duration_ns
    if not read or not pct or not t or pct < MIN_PCT_FOR_PEAK:
        return None
    return read / (t * 1e-9 * pct / 100)


def headroom(inputs: Inputs) -> Headroom | None:
    """The kernel's headroom, None when neither its math nor its bytes can be bounded."""
    p = inputs.profile
    t = p.sol.duration_ns
    if not t:
        return None
    w = work_of(inputs)
    ident = p.identity
    pf = peak_flops(ident.compute_capability, w.kind, ident.sm_count, ident.sm_clock_hz)
    t_math = w.flops / pf * 1e9 if w.flops and pf else None
    bw = dram_peak(p)
    t_bytes = w.bytes / bw * 1e9 if w.bytes and bw else None
    candidates = [(v, name) for v, name in ((t_math, f"math ({w.kind})"),
                                             (t_bytes, "DRAM")) if v is not None]
    if not candidates:
        return None
    t_min, bound = max(candidates)
    fraction = max(0.0, min(1.0, 1 - t_min / t))
    ev = [Evidence("kernel duration under ncu (ns)", round(t, 1), "-")]
    if t_math is not None:
        ev.append(Evidence(f"FLOPs ({w.flops_source}) / peak at the measured clock (ns)",
                           round(t_math, 1), f"{pf / 1e12:,.0f} TFLOP/s, {w.dtype} ({w.dtype_source})"))
    if t_bytes is not None:
        ev.append(Evidence(f"bytes ({w.bytes_source}) / DRAM peak (ns)", round(t_bytes, 1),
                           f"{bw / 1e12:.2f} TB/s"))
    ev.append(Evidence("headroom 1 - t_min / t", round(fraction, 3), f"bound by {bound}"))
    t_floor = None
    if bound == "DRAM" and t_bytes is not None:
        t_floor = (fixed_time_ns(p) or 0.0) + _at_practical_rate(t_bytes)
        ev.append(Evidence("floor: a launch's fixed time + bytes at the practical DRAM rate (ns)",
                           round(t_floor, 1), f"{DRAM_PRACTICAL_SHARE} of the peak"))
    # mma.sync's rate is measured for 16-bit floats only (hmma_share).
    share = _hmma_path_share(p) if t_math is not None and w.kind == "tensor16" else None
    if share is None:
        return Headroom(fraction, t, t_min, bound, w, tuple(ev), t_math, t_bytes,
                        t_floor_ns=t_floor)
    t_path = t_math / share
    path_fraction = max(0.0, min(1.0, 1 - max(t_path, t_bytes or 0.0) / t))
    ev.append(Evidence("FLOPs at the mma.sync (HMMA) rate, the kernel's own path (ns)",
                       round(t_path, 1), f"{pf * share / 1e12:,.0f} TFLOP/s ({share:.2f} of the "
                       "dense peak, measured)"))
    ev.append(Evidence("headroom on the mma.sync path", round(path_fraction, 3),
                       "caps every finding but a change of instruction"))
    return Headroom(fraction, t, t_min, bound, w, tuple(ev), t_math, t_bytes,
                    path_fraction, HMMA_PATH, t_path, t_floor)


HMMA_PATH = "mma.sync (HMMA)"


def _at_practical_rate(t_peak_ns: float) -> float:
    """A transfer's time at the DRAM peak, stretched to the rate DRAM delivers in practice."""
    return t_peak_ns / DRAM_PRACTICAL_SHARE


def fixed_time_ns(p: KernelProfile) -> float | None:
    """A launch's fixed time on the report's chip (KERNEL_FIXED_NS), None where unmeasured."""
    return KERNEL_FIXED_NS.get(p.identity.compute_capability or "")


def launch_floor_fraction(p: KernelProfile) -> float | None:
    """1 - (an empty launch's time under ncu on this device, hardware.empty_kernel_ns) / the
    kernel's duration: the most any change inside the kernel saves, whatever its work (a
    kernel as short as an empty one has nothing left to save but its launch). None where
    the chip's empty launch is unmeasured or the duration unknown."""
    empty = empty_kernel_ns(p.identity.device, p.identity.compute_capability)
    t = p.sol.duration_ns
    if empty is None or not t:
        return None
    return max(0.0, 1 - empty / t)


def is_memory_bound(inputs: Inputs) -> bool:
    """Whether the work's bytes at the DRAM peak take longer than its FLOPs at the math peak
    (False when either is unknown)."""
    room = headroom(inputs)
    return (room is not None and room.t_bytes_ns is not None and room.t_math_ns is not None
            and room.t_bytes_ns > room.t_math_ns)


def _hmma_path_share(p: KernelProfile) -> float | None:
    """HMMA's rate over the dense peak when the tensor math is mma.sync on a chip where it
    is measured to be slower (None otherwise: wgmma/tcgen05 kernels, FFMA kernels)."""
    ops = p.opcodes
    if not ops.with_modifiers or not ops.has("hmma") or ops.has("gmma") or ops.has("utcmma"):
        return None
    share = hmma_share(p.identity.compute_capability)
    return share if share is not None and share < 1 else None


def reference_cap(inputs: Inputs) -> tuple[float | None, Evidence | None]:
    """The gap to the timed reference plus the margin, when the manifest holds a ratio."""
    m = inputs.manifest
    timing = m.timing if m is not None else None
    spread = timing.ratio_to_reference if timing is not None else None
    if spread is None or spread.median <= 0:
        return None, None
    r = spread.median
    return (max(0.0, 1 - r) + REFERENCE_MARGIN,
            Evidence("TFLOP/s ratio to its reference (run manifest)", round(r, 3),
                     f"estimates <= 1 - ratio + {REFERENCE_MARGIN}"))
