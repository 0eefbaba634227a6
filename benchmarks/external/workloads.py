"""The external validation set: GEMM kernels perfscope did not write, to diagnose blind.

    python3 benchmarks/external/workloads.py list [--json]
    python3 benchmarks/external/workloads.py run --nvtx NAME...        # what ncu profiles
    python3 benchmarks/external/workloads.py time --out FILE.json [NAME...] [--runs 20] [--rounds 3]

Every workload is a named GEMM (M x N x K, A row-major M x K, B row-major K x N) with a
dtype and one line on what it is: Triton matmuls written here in several configurations
(good tiles, small tiles, one stage, tiny tiles, TMA descriptors, no tensor cores, FP32
through FFMA), cuBLAS through PyTorch (decode-like skinny M, a long K, the plain 4096^3
in BF16 and true FP32, and the separate GELU kernel PyTorch launches after a matmul with
bias), and cuBLASLt through nvmath-python (plain, and with the fused GELU_BIAS epilogue).

``run`` prepares each named workload (inputs, compilation, cuBLASLt plan), launches it
twice outside any range, then once inside an NVTX push/pop range named after it, and
prints one ``external-workload: NAME ok|skipped|error[: why]`` line; ncu's NVTX filter
(``--nvtx-include NAME/``) then captures exactly the launches of interest. ``time``
checks every workload against a float64 PyTorch reference (relative Frobenius error) and,
if right, times it with CUDA events against torch.matmul (cuBLAS) at the same shape and
dtype: a 256 MiB buffer is written before every timed run (so L2 starts cold), the
workload and its reference alternate in rounds, and the ratio is the median over rounds
of reference time / workload time (above 1: faster than cuBLAS). A workload that fails
is recorded with its error and the others go on.

Nothing here imports torch, triton or nvmath until a workload is prepared, so ``list``
and ``--help`` work on a machine without them (and capture.py can read the registry in a
process that never touches the GPU).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import platform
import statistics
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SEED = 20261201
WARMUP_LAUNCHES = 2
FLUSH_BYTES = 256 << 20          # > 4x the H200's 60 MiB L2
# A GPU-side pause at the head of every timed batch, long enough for the CPU to queue
# the whole batch behind it: what is timed is then the GPU's work, never the host's
# launch overhead (nvmath's execute() costs ~0.1 ms of Python per call).
QUEUE_AHEAD_CYCLES = 40_000_000  # ~20 ms at 1.98 GHz
STATUS_PREFIX = "external-workload:"
BF16_TOL = 1e-2
FP32_TOL = 1e-4
# TF32 keeps 10 of FP32's 23 mantissa bits: about 1e-3 of relative error at K = 4096.
TF32_TOL = 5e-3
# int8 x int8 into int32 is exact at these K (|a|, |b| <= 16: sums below 2^31).
INT8_TOL = 1e-9
INT8_RANGE = 16

# Filled in by _triton() the first time a Triton workload is prepared: the kernels
# below are plain functions until then, and Triton resolves `tl` from this module's
# globals when it compiles them.
tl: Any = None


class Unavailable(Exception):
    """This workload cannot run here (a package or an API is missing): skipped, not failed."""


# ----------------------------------------------------------------------- the registry


@dataclass(frozen=True)
class TritonConfig:
    kernel: str                  # tiled / tma / fma
    block_m: int
    block_n: int
    block_k: int
    num_stages: int
    num_warps: int
    group_m: int = 8
    precision: str = "tf32"      # tl.dot input_precision; only fp32 inputs heed it


@dataclass(frozen=True)
class Workload:
    name: str
    group: str                   # one ncu process per group (capture.py)
    m: int
    n: int
    k: int
    dtype: str                   # bf16 / fp32
    description: str
    builder: str                 # key of BUILDERS
    config: TritonConfig | None = None
    # What each launch inside the NVTX range is, in launch order.
    launches: tuple[str, ...] = ("gemm",)
    # The operands' layout when it is not the set's row-major A[M][K], B[K][N] (a
    # perfscope.manifest layout string, which manifests.py writes into the run manifest).
    layout: str | None = None
    # Products of M x N x K in the one launch (torch.bmm: A[B][M][K] · B[B][K][N]).
    batch: int = 1
    # A grouped GEMM (torch._grouped_mm, as MoE layers run): M's rows in `groups` equal groups,
    # each times a K x N matrix of its own. It has no one shape, so its run manifest leaves
    # the shape unknown (manifests.py) and perfscope judges it by its counters.
    groups: int = 1

    @property
    def shape(self) -> str:
        one = f"{self.m}x{self.n}x{self.k}"
        return f"{self.batch}x{one}" if self.batch > 1 else one

    @property
    def flop(self) -> int:
        return 2 * self.batch * self.m * self.n * self.k

    def prepare(self) -> Prepared:
        return BUILDERS[self.builder](self)

    def run_once(self, nvtx: bool = True, check: bool = False) -> str:
        """Warm up outside any range, then launch once inside the range NAME; the status."""
        torch = _torch()
        prep = self.prepare()
        try:
            for _ in range(WARMUP_LAUNCHES):
                prep.launch()
            torch.cuda.synchronize()
            checked = ""
            if check:
                verdict, err = prep.verify()
                checked = f": checked {verdict}" + (f" (relative error {err:.1e})" if err is not None else "")
                torch.cuda.synchronize()
            if nvtx:
                torch.cuda.nvtx.range_push(self.name)
            try:
                prep.launch()
                torch.cuda.synchronize()
            finally:
                if nvtx:
                    torch.cuda.nvtx.range_pop()
            return "ok" + checked
        finally:
            prep.free()

    def time(self, runs: int = 20, rounds: int = 3) -> dict[str, Any]:
        """Verify, then time against cuBLAS in alternating rounds (see the module doc)."""
        torch = _torch()
        row: dict[str, Any] = self.describe()
        prep = self.prepare()
        try:
            for _ in range(WARMUP_LAUNCHES):
                prep.launch()
                prep.reference()
            torch.cuda.synchronize()
            verdict, err = prep.verify()
            row.update(verdict=verdict, rel_error=err, tolerance=prep.tolerance)
            if verdict != "ok":
                return row          # a wrong kernel gets no speed
            flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
            mine: list[float] = []
            refs: list[float] = []
            ratios: list[float] = []
            clocks: list[int] = []
            for _ in range(rounds):
                t, c = _timed_batch(torch, prep.launch, flush, runs)
                r, c2 = _timed_batch(torch, prep.reference, flush, runs)
                mine += t
                refs += r
                clocks += c + c2
                ratios.append(statistics.median(r) / statistics.median(t))
            ms, ref_ms = statistics.median(mine), statistics.median(refs)
            row.update(ms_median=ms, ms_min=min(mine), ms_max=max(mine), ref_ms_median=ref_ms,
                       ratio=statistics.median(ratios), ratio_rounds=ratios,
                       tflops=self.flop / (ms * 1e-3) / 1e12,
                       ref_tflops=self.flop / (ref_ms * 1e-3) / 1e12, runs=runs, rounds=rounds,
                       sm_clock_mhz={"min": min(clocks), "max": max(clocks),
                                     "median": statistics.median(clocks),
                                     "samples": len(clocks)} if clocks else None)
            del flush
            return row
        finally:
            prep.free()

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "group": self.group, "shape": self.shape, "m": self.m, "n": self.n,
                "k": self.k, "batch": self.batch, "groups": self.groups, "dtype": self.dtype,
                "description": self.description,
                "launches": list(self.launches), "layout": self.layout,
                "config": asdict(self.config) if self.config else None}


def _tc(kernel: str, bm: int, bn: int, bk: int, stages: int, warps: int, **kw: Any) -> TritonConfig:
    return TritonConfig(kernel, bm, bn, bk, stages, warps, **kw)


S4096 = (4096, 4096, 4096)
WORKLOADS: tuple[Workload, ...] = (
    # Triton, written here: one tiled tl.dot kernel in several configurations, one that
    # loads through tensor descriptors (TMA), and one with no tensor cores at all.
    Workload("triton_good", "triton", *S4096, "bf16",
             "Triton tl.dot matmul, 128x256x64 tiles, 3 stages, 8 warps, grouped order: a good config",
             "triton", _tc("tiled", 128, 256, 64, 3, 8)),
    Workload("triton_64x64", "triton", *S4096, "bf16",
             "the same kernel with 64x64x32 tiles (3 stages, 4 warps): little reuse, L2-bandwidth bound",
             "triton", _tc("tiled", 64, 64, 32, 3, 4)),
    Workload("triton_one_stage", "triton", *S4096, "bf16",
             "the same kernel, 128x128x64 tiles with 1 stage (no pipelining), 4 warps: exposed latency",
             "triton", _tc("tiled", 128, 128, 64, 1, 4)),
    Workload("triton_tiny", "triton", *S4096, "bf16",
             "the same kernel with 32x32x32 tiles, 1 stage, 1 warp: tiny tiles (mma.sync, not wgmma)",
             "triton", _tc("tiled", 32, 32, 32, 1, 1)),
    Workload("triton_fp32_ieee", "triton", *S4096, "fp32",
             "the same kernel on FP32 with tl.dot(input_precision='ieee'): FFMA, no TF32 tensor cores",
             "triton", _tc("tiled", 128, 128, 32, 2, 8, precision="ieee")),
    Workload("triton_fma_bf16", "triton", 2048, 2048, 2048, "bf16",
             "BF16 data upcast to FP32, broadcast-multiply + tl.sum (no tl.dot): FFMA on BF16 inputs",
             "triton", _tc("fma", 32, 32, 8, 2, 4)),
    Workload("triton_tf32", "triton", *S4096, "fp32",
             "the tiled kernel on FP32 with tl.dot's default TF32: TF32 tensor cores, timed "
             "against cuBLAS with allow_tf32 (added 2026-12-06)",
             "triton", _tc("tiled", 128, 128, 32, 3, 8)),
    Workload("triton_odd_k", "triton", 4096, 4096, 4095, "bf16",
             "triton_good's kernel and tiles at K = 4095: A's rows 8,190 bytes apart, so Triton "
             "cannot vectorise their loads (added 2026-12-06)",
             "triton", _tc("tiled", 128, 256, 64, 3, 8)),
    Workload("triton_tma", "triton", *S4096, "bf16",
             "triton_good's tiles with A and B loaded through tl.make_tensor_descriptor (TMA on Hopper)",
             "triton", _tc("tma", 128, 256, 64, 3, 8)),
    # cuBLAS through PyTorch.
    Workload("torch_decode_m16", "torch", 16, 8192, 8192, "bf16",
             "torch.matmul 16x8192x8192: decode-like skinny M, bound by streaming B from DRAM",
             "torch_mm"),
    Workload("torch_decode_m64", "torch", 64, 8192, 8192, "bf16",
             "torch.matmul 64x8192x8192: still memory-bound, 4x the reuse of B",
             "torch_mm"),
    Workload("torch_kheavy", "torch", 1024, 1024, 32768, "bf16",
             "torch.matmul 1024x1024x32768: few output tiles, long K (split-K or stream-K territory)",
             "torch_mm"),
    Workload("torch_bf16_4096", "torch", *S4096, "bf16",
             "torch.matmul 4096^3 BF16: cuBLAS's own nvjet kernel (HGMMA, TMA)", "torch_mm"),
    # Its own ncu process too, so PyTorch's GELU module stays out of the cuBLAS reports.
    Workload("torch_gelu_after_mm", "torch_gelu", *S4096, "bf16",
             "torch.addmm(bias, A, B) then F.gelu(approximate='tanh'): the matmul+bias and the "
             "separate elementwise GELU kernel (both launches profiled)",
             "torch_gelu", launches=("matmul+bias", "gelu_tanh elementwise")),
    # FP32 gets an ncu process of its own: cuBLAS's SGEMM module is ~14 MB of SASS, and a
    # split report keeps every module its combined report held.
    Workload("torch_fp32_4096", "torch_fp32", *S4096, "fp32",
             "torch.matmul 4096^3 FP32 with TF32 off: cuBLAS's FFMA SGEMM", "torch_mm"),
    # cuBLAS where the easy path is closed or the math is not 16-bit floats, in an ncu
    # process of its own (added 2026-12-06): rows 8,190 bytes apart, which TMA cannot
    # address (its strides are multiples of 16 bytes); FP32 through TF32 tensor cores; and
    # int8 into int32.
    Workload("torch_odd_4095", "torch_edge", 4095, 4095, 4095, "bf16",
             "torch.matmul 4095^3 BF16: rows 8,190 bytes apart, no TMA possible: cuBLAS's "
             "choice for an unaligned shape", "torch_mm"),
    Workload("torch_odd_k", "torch_edge", 4096, 4096, 4095, "bf16",
             "torch.matmul 4096x4096x4095 BF16: only A's rows (K = 4095) 8,190 bytes apart",
             "torch_mm"),
    Workload("torch_odd_m", "torch_edge", 4095, 4096, 4096, "bf16",
             "torch.matmul 4095x4096x4096 BF16: an odd row count, every row 16-byte aligned",
             "torch_mm"),
    Workload("torch_tf32_4096", "torch_edge", *S4096, "fp32",
             "torch.matmul 4096^3 FP32 with allow_tf32 = True: TF32 tensor cores on FP32 data",
             "torch_tf32"),
    Workload("torch_int8_4096", "torch_edge", *S4096, "int8",
             "torch._int_mm 4096^3: int8 A and B into an int32 C (cuBLASLt's integer GEMM)",
             "torch_int8"),
    Workload("torch_int8_tn", "torch_edge", *S4096, "int8",
             "torch._int_mm 4096^3 with B stored K-major (N x K) and passed as its transpose "
             "view: the TN layout cuBLASLt's int8 wgmma kernels take", "torch_int8_tn",
             layout="row-major TN: C[M][N] = A[M][K] * Bt[N][K]^T"),
    # Batched GEMMs through torch.bmm (cuBLAS's strided batched GEMM: one launch for every
    # product), in an ncu process of their own (added 2026-12-06): attention's two products
    # per head (32 heads x sequences of 2048, head dimension 128) and a batch of square ones.
    Workload("torch_bmm_scores", "torch_batched", 2048, 2048, 128, "bf16",
             "torch.bmm(Q, K^T) over 32 heads: S = Q K^T, 2048 x 2048 scores from a head "
             "dimension of 128 (K^T a transposed view: B K-major), the 256 MiB of C its cost",
             "torch_bmm_kt", batch=32, layout="row-major TN: C[M][N] = A[M][K] * Bt[N][K]^T"),
    Workload("torch_bmm_values", "torch_batched", 2048, 128, 2048, "bf16",
             "torch.bmm(P, V) over 32 heads: O = P V, 2048 x 128 outputs a head from 2048 "
             "probabilities a row", "torch_bmm", batch=32),
    Workload("torch_bmm_square", "torch_batched", 2048, 2048, 2048, "bf16",
             "torch.bmm of 16 products of 2048^3: batched and compute-bound", "torch_bmm",
             batch=16),
    # A grouped GEMM (MoE: 8 experts of 1024 tokens each, hidden 4096 -> 2048), timed against
    # the same work as one strided batched GEMM (torch.bmm); its own ncu process (added
    # 2026-12-06).
    Workload("torch_grouped_moe", "torch_grouped", 8192, 2048, 4096, "bf16",
             "torch._grouped_mm: 8 groups of 1024 rows of A, each times its own 4096 x 2048 B "
             "(an MoE layer's experts), against torch.bmm of the same products",
             "torch_grouped", groups=8,
             launches=("prepare_grouped_gemm_data: each group's pointers and shapes",
                       "grouped GEMM (CUTLASS ptr-array kernel)")),
    Workload("torch_bmm_moe", "torch_grouped", 1024, 2048, 4096, "bf16",
             "torch.bmm of the same 8 experts' products as one strided batch: what "
             "torch_grouped_moe is timed against, captured for `perfscope diff`", "torch_bmm",
             batch=8),
    # cuBLASLt through nvmath-python (stateful Matmul: planned once, executed per call).
    Workload("cublaslt_bf16_4096", "cublaslt", *S4096, "bf16",
             "nvmath-python Matmul (cuBLASLt) 4096^3 BF16, no epilogue", "nvmath_mm"),
    Workload("cublaslt_gelu_bias_4096", "cublaslt", *S4096, "bf16",
             "nvmath-python Matmul (cuBLASLt) 4096^3 BF16 with the fused GELU_BIAS epilogue "
             "(bias of length M; cuBLASLt writes D column-major for it)",
             "nvmath_gelu_bias", launches=("matmul+bias+gelu (fused epilogue)",)),
    # The same epilogue at two of issue 19's decode shapes, where hgemm_small_m is timed
    # against it (benchmarks/fused_check.py): what `perfscope diff` holds our stage to.
    Workload("cublaslt_gelu_bias_m16", "cublaslt", 16, 8192, 8192, "bf16",
             "nvmath-python Matmul (cuBLASLt) 16x8192x8192 BF16 with the GELU_BIAS epilogue: "
             "a decode GEMM that streams its 128 MiB weight once",
             "nvmath_gelu_bias", launches=("matmul+bias+gelu (fused epilogue)",)),
    Workload("cublaslt_gelu_bias_m64_4096", "cublaslt", 64, 4096, 4096, "bf16",
             "nvmath-python Matmul (cuBLASLt) 64x4096x4096 BF16 with the GELU_BIAS epilogue: "
             "a 32 MiB weight, where launch and ramp weigh most",
             "nvmath_gelu_bias", launches=("matmul+bias+gelu (fused epilogue)",)),
    Workload("cublaslt_gelu_bias_m256_4096", "cublaslt", 256, 4096, 4096, "bf16",
             "nvmath-python Matmul (cuBLASLt) 256x4096x4096 BF16 with the GELU_BIAS epilogue: "
             "neither the 32 MiB weight's stream nor the math alone sets its time",
             "nvmath_gelu_bias", launches=("matmul+bias+gelu (fused epilogue)",)),
)
BY_NAME = {w.name: w for w in WORKLOADS}
GROUPS: tuple[str, ...] = tuple(dict.fromkeys(w.group for w in WORKLOADS))


def select(names: list[str] | None) -> list[Workload]:
    """The named workloads in registry order (all when none are named); unknown names raise."""
    if not names:
        return list(WORKLOADS)
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise SystemExit(f"unknown workload {', '.join(unknown)}; `list` shows the {len(WORKLOADS)} known")
    wanted = set(names)
    return [w for w in WORKLOADS if w.name in wanted]


# ------------------------------------------------------------------ a prepared workload


@dataclass
class Prepared:
    """What a workload needs on the GPU: its launch, its reference, and its check."""

    launch: Callable[[], Any]            # enqueue exactly the kernel(s) of interest; the output
    reference: Callable[[], Any]         # torch.matmul (cuBLAS) at the same shape and dtype
    expected: Callable[[], Any]          # the float64 result the output must match
    tolerance: float
    cleanup: list[Callable[[], None]] = field(default_factory=list)

    def verify(self) -> tuple[str, float | None]:
        """("ok" or "WRONG", relative Frobenius error of the output against float64)."""
        torch = _torch()
        out = self.launch()
        torch.cuda.synchronize()
        exp = self.expected()
        got = out.to(torch.float64)
        if not bool(torch.isfinite(got).all()):
            return "WRONG", None
        err = float(torch.linalg.norm(got - exp) / torch.linalg.norm(exp))
        return ("ok" if err <= self.tolerance else "WRONG"), err

    def free(self) -> None:
        for fn in self.cleanup:
            with contextlib.suppress(Exception):
                fn()
        torch = _torch()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise Unavailable("PyTorch is not installed") from None
    if not torch.cuda.is_available():
        raise Unavailable("PyTorch sees no CUDA device")
    return torch


def _dtype(torch: Any, name: str) -> Any:
    return {"bf16": torch.bfloat16, "fp32": torch.float32, "int8": torch.int8}[name]


def _inputs(torch: Any, w: Workload) -> tuple[Any, Any]:
    """Seeded standard-normal A (M x K) and B (K x N), row-major, in the workload's dtype
    (B of each for a batch)."""
    g = torch.Generator(device="cuda").manual_seed(SEED)
    lead = (w.batch,) if w.batch > 1 else ()
    a = torch.randn(*lead, w.m, w.k, device="cuda", dtype=torch.float32, generator=g)
    b = torch.randn(*lead, w.k, w.n, device="cuda", dtype=torch.float32, generator=g)
    dt = _dtype(torch, w.dtype)
    return a.to(dt).contiguous(), b.to(dt).contiguous()


def _tolerance(w: Workload) -> float:
    if w.dtype == "fp32" and w.config is not None and w.config.precision == "tf32":
        return TF32_TOL
    return {"fp32": FP32_TOL, "int8": INT8_TOL}.get(w.dtype, BF16_TOL)


def _with_tf32(torch: Any, fn: Callable[[], Any]) -> Callable[[], Any]:
    """fn with cuBLAS allowed TF32 for its call, the switch put back after: the FP32
    workloads of the same `time` process want it off."""
    def call() -> Any:
        before = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True
        try:
            return fn()
        finally:
            torch.backends.cuda.matmul.allow_tf32 = before
    return call


def _fp32_exact(torch: Any) -> None:
    """cuBLAS FP32 in true FP32: no TF32 anywhere in this process (the FP32 check's
    1e-4 tolerance would catch TF32: its error is about 1e-3)."""
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
    except Exception:  # a PyTorch that takes only the newer spelling
        torch.backends.cuda.matmul.fp32_precision = "ieee"


def _reference(torch: Any, a: Any, b: Any) -> Callable[[], Any]:
    out = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device="cuda")
    return lambda: torch.matmul(a, b, out=out)


def _product64(a: Any, b: Any) -> Any:
    import torch

    return torch.matmul(a.to(torch.float64), b.to(torch.float64))


# ---------------------------------------------------------------------- Triton kernels
# Plain functions here; _triton() hands them to triton.jit. Shapes that are multiples of
# the tiles take the EVEN_K path; loads wrap rows and columns modulo M and N (so they
# stay in bounds without masks) and the store is masked.


def tiled_matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                        stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, EVEN_K: tl.constexpr,
                        PRECISION: tl.constexpr):
    # Grouped ordering: GROUP_M row-tiles sweep the column tiles together, so the B
    # columns they share stay in L2 while the group passes over them.
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    rows_in_group = min(tiles_m - first_m, GROUP_M)
    tile_m = first_m + (pid % per_group) % rows_in_group
    tile_n = (pid % per_group) // rows_in_group

    rm = (tile_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    rn = (tile_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    rk = tl.arange(0, BLOCK_K)
    a_tile = a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak
    b_tile = b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_tile)
            b = tl.load(b_tile)
        else:
            k_left = K - kt * BLOCK_K
            a = tl.load(a_tile, mask=rk[None, :] < k_left, other=0.0)
            b = tl.load(b_tile, mask=rk[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_tile += BLOCK_K * stride_ak
        b_tile += BLOCK_K * stride_bk

    cm = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cn = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_tile = c_ptr + cm[:, None] * stride_cm + cn[None, :] * stride_cn
    tl.store(c_tile, acc.to(c_ptr.dtype.element_ty), mask=(cm[:, None] < M) & (cn[None, :] < N))


def tma_matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_cm, stride_cn, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    # The same tiles and order as tiled_matmul_kernel, but A and B arrive through tensor
    # descriptors (TMA bulk copies on Hopper; out-of-range boxes fill with zeros).
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1],
                                       block_shape=[BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[N, 1],
                                       block_shape=[BLOCK_K, BLOCK_N])
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    rows_in_group = min(tiles_m - first_m, GROUP_M)
    tile_m = first_m + (pid % per_group) % rows_in_group
    tile_n = (pid % per_group) // rows_in_group

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(0, tl.cdiv(K, BLOCK_K)):
        a = a_desc.load([tile_m * BLOCK_M, kt * BLOCK_K])
        b = b_desc.load([kt * BLOCK_K, tile_n * BLOCK_N])
        acc = tl.dot(a, b, acc)

    cm = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cn = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_tile = c_ptr + cm[:, None] * stride_cm + cn[None, :] * stride_cn
    tl.store(c_tile, acc.to(c_ptr.dtype.element_ty), mask=(cm[:, None] < M) & (cn[None, :] < N))


def fma_matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                      stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    # No tl.dot: each K slice is upcast to FP32 and contracted by a broadcast multiply
    # and a sum over K, on the CUDA cores (FMUL/FADD/FFMA). B's slice is loaded as
    # [BLOCK_N, BLOCK_K] and K is the last axis on purpose: Triton's combiner rewrites
    # sum(a[:, :, None] * b[None, :, :], axis=1) into a tl.dot, which would put the
    # tensor cores back (seen: HMMA in the SASS of that form).
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    rows_in_group = min(tiles_m - first_m, GROUP_M)
    tile_m = first_m + (pid % per_group) % rows_in_group
    tile_n = (pid % per_group) // rows_in_group

    rm = (tile_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    rn = (tile_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    rk = tl.arange(0, BLOCK_K)
    a_tile = a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak      # [BLOCK_M, BLOCK_K]
    bt_tile = b_ptr + rn[:, None] * stride_bn + rk[None, :] * stride_bk     # [BLOCK_N, BLOCK_K]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - kt * BLOCK_K
        a = tl.load(a_tile, mask=rk[None, :] < k_left, other=0.0).to(tl.float32)
        bt = tl.load(bt_tile, mask=rk[None, :] < k_left, other=0.0).to(tl.float32)
        acc += tl.sum(a[:, None, :] * bt[None, :, :], axis=2)
        a_tile += BLOCK_K * stride_ak
        bt_tile += BLOCK_K * stride_bk

    cm = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cn = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_tile = c_ptr + cm[:, None] * stride_cm + cn[None, :] * stride_cn
    tl.store(c_tile, acc.to(c_ptr.dtype.element_ty), mask=(cm[:, None] < M) & (cn[None, :] < N))


_JITTED: dict[str, Any] = {}


def _triton() -> tuple[Any, dict[str, Any]]:
    """The triton module and the jitted kernels (made once)."""
    global tl
    try:
        import triton
        import triton.language as language
    except ImportError:
        raise Unavailable("Triton is not installed") from None
    tl = language
    if not _JITTED:
        for fn in (tiled_matmul_kernel, tma_matmul_kernel, fma_matmul_kernel):
            _JITTED[fn.__name__.removesuffix("_matmul_kernel")] = triton.jit(fn)
    return triton, _JITTED


def _build_triton(w: Workload) -> Prepared:
    torch = _torch()
    triton, kernels = _triton()
    cfg = w.config
    assert cfg is not None
    if cfg.precision != "tf32":
        _fp32_exact(torch)
    a, b = _inputs(torch, w)
    c = torch.empty(w.m, w.n, dtype=a.dtype, device="cuda")
    grid = (triton.cdiv(w.m, cfg.block_m) * triton.cdiv(w.n, cfg.block_n),)
    tiles = {"BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k,
             "GROUP_M": cfg.group_m, "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    if cfg.kernel == "tiled":
        kernel = kernels["tiled"]

        def launch() -> Any:
            kernel[grid](a, b, c, w.m, w.n, w.k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                         c.stride(0), c.stride(1), EVEN_K=w.k % cfg.block_k == 0,
                         PRECISION=cfg.precision, **tiles)
            return c
    elif cfg.kernel == "fma":
        kernel = kernels["fma"]

        def launch() -> Any:
            kernel[grid](a, b, c, w.m, w.n, w.k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                         c.stride(0), c.stride(1), **tiles)
            return c
    elif cfg.kernel == "tma":
        if not hasattr(tl, "make_tensor_descriptor") or not hasattr(triton, "set_allocator"):
            raise Unavailable(f"Triton {triton.__version__} has no tl.make_tensor_descriptor / "
                              "triton.set_allocator")
        if torch.cuda.get_device_capability() < (9, 0):
            raise Unavailable("TMA needs compute capability 9.0 or newer")

        # Device-side descriptors live in a global scratch buffer Triton asks for at
        # every launch: hand it torch's caching allocator (no kernel, no cudaMalloc).
        def scratch(size: int, alignment: int, stream: int | None) -> Any:
            return torch.empty(size, dtype=torch.int8, device="cuda")

        triton.set_allocator(scratch)
        kernel = kernels["tma"]

        def launch() -> Any:
            kernel[grid](a, b, c, w.m, w.n, w.k, c.stride(0), c.stride(1), **tiles)
            return c
    else:
        raise ValueError(f"unknown Triton kernel {cfg.kernel!r}")
    reference = _reference(torch, a, b)
    if w.dtype == "fp32" and cfg.precision == "tf32":
        reference = _with_tf32(torch, reference)     # cuBLAS on the same TF32 tensor cores
    return Prepared(launch, reference, lambda: _product64(a, b), _tolerance(w))


# ------------------------------------------------------------------ PyTorch and nvmath


def _build_torch_mm(w: Workload) -> Prepared:
    torch = _torch()
    if w.dtype == "fp32":
        _fp32_exact(torch)
    a, b = _inputs(torch, w)
    c = torch.empty(w.m, w.n, dtype=a.dtype, device="cuda")

    def launch() -> Any:
        return torch.matmul(a, b, out=c)

    return Prepared(launch, _reference(torch, a, b), lambda: _product64(a, b), _tolerance(w))


def _build_torch_bmm(w: Workload, k_major_b: bool = False) -> Prepared:
    """torch.bmm over the batch; with k_major_b, each B stored K-major (N x K, as attention's
    K is) and passed as its transpose view, as Q·K^T is written."""
    torch = _torch()
    a, b = _inputs(torch, w)
    operand = b.transpose(1, 2).contiguous().transpose(1, 2) if k_major_b else b
    c = torch.empty(w.batch, w.m, w.n, dtype=a.dtype, device="cuda")
    ref = torch.empty_like(c)
    return Prepared(lambda: torch.bmm(a, operand, out=c), lambda: torch.bmm(a, operand, out=ref),
                    lambda: _product64(a, b), _tolerance(w))


def _build_torch_grouped(w: Workload) -> Prepared:
    """torch._grouped_mm over equal groups of A's rows (offsets at every M / groups rows),
    each with a B of its own; the reference is torch.bmm of the same products."""
    torch = _torch()
    if not hasattr(torch, "_grouped_mm"):
        raise Unavailable("this PyTorch has no torch._grouped_mm")
    g = torch.Generator(device="cuda").manual_seed(SEED)
    rows = w.m // w.groups
    a = torch.randn(w.m, w.k, device="cuda", generator=g).to(torch.bfloat16)
    b = torch.randn(w.groups, w.k, w.n, device="cuda", generator=g).to(torch.bfloat16)
    offs = torch.arange(rows, w.m + 1, rows, device="cuda", dtype=torch.int32)
    # Each expert's B K-major (its transpose view), as MoE weights lie and the grouped kernels
    # take it; row-major where this PyTorch's kernel refuses that.
    operand = b.transpose(1, 2).contiguous().transpose(1, 2)
    try:
        torch._grouped_mm(a, operand, offs=offs)
    except RuntimeError:
        operand = b
    a3 = a.view(w.groups, rows, w.k)
    ref = torch.empty(w.groups, rows, w.n, dtype=a.dtype, device="cuda")
    return Prepared(lambda: torch._grouped_mm(a, operand, offs=offs),
                    lambda: torch.bmm(a3, b, out=ref),
                    lambda: _product64(a3, b).reshape(w.m, w.n), _tolerance(w))


def _build_torch_tf32(w: Workload) -> Prepared:
    """FP32 inputs through TF32 tensor cores, as `torch.backends.cuda.matmul.allow_tf32 =
    True` (or set_float32_matmul_precision("high")) asks, around each call (_with_tf32)."""
    torch = _torch()
    a, b = _inputs(torch, w)
    c = torch.empty(w.m, w.n, dtype=a.dtype, device="cuda")

    out = torch.empty_like(c)
    return Prepared(_with_tf32(torch, lambda: torch.matmul(a, b, out=c)),
                    _with_tf32(torch, lambda: torch.matmul(a, b, out=out)),
                    lambda: _product64(a, b), TF32_TOL)


def _build_torch_int8(w: Workload, k_major_b: bool = False) -> Prepared:
    """torch._int_mm: int8 A and B into an int32 C (cuBLASLt's integer GEMM), exact; with
    k_major_b, B stored K-major once (as a weight can be) and passed as its transpose view:
    the TN layout."""
    torch = _torch()
    g = torch.Generator(device="cuda").manual_seed(SEED)
    a = torch.randint(-INT8_RANGE, INT8_RANGE + 1, (w.m, w.k), device="cuda", generator=g,
                      dtype=torch.int8)
    b = torch.randint(-INT8_RANGE, INT8_RANGE + 1, (w.k, w.n), device="cuda", generator=g,
                      dtype=torch.int8)
    if not hasattr(torch, "_int_mm"):
        raise Unavailable("this PyTorch has no torch._int_mm")
    c = torch.empty(w.m, w.n, dtype=torch.int32, device="cuda")
    ref = torch.empty_like(c)
    operand = b.t().contiguous().t() if k_major_b else b
    return Prepared(lambda: torch._int_mm(a, operand, out=c),
                    lambda: torch._int_mm(a, operand, out=ref), lambda: _product64(a, b), INT8_TOL)


def _build_torch_gelu(w: Workload) -> Prepared:
    torch = _torch()
    import torch.nn.functional as F

    a, b = _inputs(torch, w)
    g = torch.Generator(device="cuda").manual_seed(SEED + 1)
    bias = torch.randn(w.n, device="cuda", dtype=torch.float32, generator=g).to(a.dtype)

    def launch() -> Any:
        # Two launches: cuBLAS(Lt) computes A@B + bias, then PyTorch's elementwise GELU.
        return F.gelu(torch.addmm(bias, a, b), approximate="tanh")

    def expected() -> Any:
        return F.gelu(_product64(a, b) + bias.to(torch.float64)[None, :], approximate="tanh")

    return Prepared(launch, _reference(torch, a, b), expected, _tolerance(w))


def _nvmath() -> Any:
    try:
        import nvmath.linalg.advanced as advanced
    except Exception as exc:  # ImportError, or a missing CUDA library behind it
        raise Unavailable(f"nvmath-python is not importable ({type(exc).__name__}: {exc})") from None
    if not hasattr(advanced, "Matmul"):
        raise Unavailable("this nvmath-python has no nvmath.linalg.advanced.Matmul")
    return advanced


def _quiet_logger() -> logging.Logger:
    # nvmath logs to the root logger unless given one; keep its INFO lines out of the
    # profiled program's output.
    log = logging.getLogger("external.nvmath")
    log.setLevel(logging.WARNING)
    return log


def _build_nvmath(w: Workload, epilog: str | None) -> Prepared:
    torch = _torch()
    advanced = _nvmath()
    a, b = _inputs(torch, w)
    mm = advanced.Matmul(a, b, options={"logger": _quiet_logger()})
    cleanup = [mm.free]
    try:
        if epilog is None:
            mm.plan()
            expected = lambda: _product64(a, b)  # noqa: E731
        else:
            import torch.nn.functional as F

            g = torch.Generator(device="cuda").manual_seed(SEED + 1)
            # cuBLASLt's bias has one value per row of D (length M), broadcast along N.
            bias = torch.randn(w.m, device="cuda", dtype=torch.float32, generator=g).to(a.dtype)
            mm.plan(epilog=getattr(advanced.MatmulEpilog, epilog), epilog_inputs={"bias": bias})

            def expected() -> Any:
                return F.gelu(_product64(a, b) + bias.to(torch.float64)[:, None], approximate="tanh")
    except Exception:
        mm.free()
        raise

    def launch() -> Any:
        # Planned once above; execute() only launches the planned cuBLASLt kernel.
        return mm.execute()

    return Prepared(launch, _reference(torch, a, b), expected, _tolerance(w), cleanup)


BUILDERS: dict[str, Callable[[Workload], Prepared]] = {
    "triton": _build_triton,
    "torch_mm": _build_torch_mm,
    "torch_gelu": _build_torch_gelu,
    "torch_tf32": _build_torch_tf32,
    "torch_int8": _build_torch_int8,
    "torch_int8_tn": lambda w: _build_torch_int8(w, k_major_b=True),
    "torch_bmm": _build_torch_bmm,
    "torch_grouped": _build_torch_grouped,
    "torch_bmm_kt": lambda w: _build_torch_bmm(w, k_major_b=True),
    "nvmath_mm": lambda w: _build_nvmath(w, None),
    "nvmath_gelu_bias": lambda w: _build_nvmath(w, "GELU_BIAS"),
}


# ---------------------------------------------------------------------------- timing


def _timed_batch(torch: Any, fn: Callable[[], Any], flush: Any, runs: int) -> tuple[list[float], list[int]]:
    """Event-timed ms of `runs` calls of fn, each after writing the flush buffer, and the
    SM clock (MHz) sampled while the batch runs."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
    sleep = getattr(torch.cuda, "_sleep", None)
    with ClockSampler() as clock:
        if sleep is not None:
            sleep(QUEUE_AHEAD_CYCLES)
        for start, end in zip(starts, ends, strict=True):
            flush.zero_()
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)], clock.samples


class ClockSampler:
    """Reads the SM clock every few milliseconds on a thread (the GIL is released while
    the main thread waits in cudaDeviceSynchronize)."""

    def __init__(self, period_s: float = 0.004) -> None:
        self.period_s = period_s
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _loop(self) -> None:
        while True:
            value = sm_clock_mhz()
            if value:
                self.samples.append(value)
            if self._stop.wait(self.period_s):
                return

    def __enter__(self) -> ClockSampler:
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)


_NVML: list[Any] = []


def sm_clock_mhz() -> int | None:
    """The SM clock now, through NVML (nvidia-ml-py), else nvidia-smi; None if neither."""
    if not _NVML:
        try:
            import pynvml

            pynvml.nvmlInit()
            _NVML.append((pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)))
        except Exception:
            _NVML.append(None)
    if _NVML[0] is not None:
        pynvml, handle = _NVML[0]
        try:
            return int(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))
        except Exception:
            return None
    out = _sh(["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits"])
    try:
        return int(out.splitlines()[0])
    except (ValueError, IndexError):
        return None


def _sh(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def environment() -> dict[str, Any]:
    env: dict[str, Any] = {"python": platform.python_version(), "host": platform.node()}
    try:
        import torch

        env["torch"] = torch.__version__
        env["torch_cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            env["gpu"] = torch.cuda.get_device_name(0)
            env["compute_capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
            env["sm_count"] = torch.cuda.get_device_properties(0).multi_processor_count
        env["allow_tf32"] = bool(torch.backends.cuda.matmul.allow_tf32)
    except Exception as exc:
        env["torch"] = f"unavailable ({type(exc).__name__})"
    for mod in ("triton", "nvmath", "cupy"):
        try:
            env[mod] = __import__(mod).__version__
        except Exception as exc:
            env[mod] = f"unavailable ({type(exc).__name__})"
    try:
        from nvmath.bindings import cublasLt

        env["cublaslt"] = cublasLt.get_version()
    except Exception:
        pass
    smi = _sh(["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,"
                              "power.limit", "--format=csv,noheader"])
    env["nvidia_smi"] = smi or None
    if smi:
        env["driver"] = smi.split(",")[1].strip() if "," in smi else None
    env["sm_clock_mhz_at_start"] = sm_clock_mhz()
    return env


# ------------------------------------------------------------------------------- CLI


def _status_line(name: str, status: str) -> str:
    return f"{STATUS_PREFIX} {name} {status}"


def cmd_list(args: argparse.Namespace) -> int:
    if args.json:
        print(json.dumps([w.describe() for w in WORKLOADS], indent=1))
        return 0
    print(f"{'name':24s} {'group':11s} {'shape':18s} {'dtype':5s} description")
    for w in WORKLOADS:
        print(f"{w.name:24s} {w.group:11s} {w.shape:18s} {w.dtype:5s} {w.description}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    failed = 0
    rows = []
    for w in select(args.names):
        try:
            status = w.run_once(nvtx=args.nvtx, check=args.check)
        except Unavailable as exc:
            status = f"skipped: {exc}"
        except Exception as exc:
            failed += 1
            status = f"error: {type(exc).__name__}: {_one_line(exc)}"
            traceback.print_exc()
        print(_status_line(w.name, status), flush=True)
        rows.append((w.name, status))
    print(f"\n{'workload':24s} status")
    for name, status in rows:
        print(f"{name:24s} {status}")
    return 1 if failed else 0


def cmd_time(args: argparse.Namespace) -> int:
    chosen = select(args.names)
    doc: dict[str, Any] = {"schema": "perfscope.external-timing/1",
                           "command": "python3 " + " ".join(sys.argv),
                           "time": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                           "method": {"runs": args.runs, "rounds": args.rounds, "flush_bytes": FLUSH_BYTES,
                                      "reference": "torch.matmul (cuBLAS), same shape and dtype",
                                      "ratio": "median over rounds of reference ms / workload ms"},
                           "environment": environment(), "workloads": {}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for w in chosen:
        t0 = time.monotonic()
        try:
            row = w.time(runs=args.runs, rounds=args.rounds)
        except Unavailable as exc:
            row = {**w.describe(), "verdict": "skipped", "error": str(exc)}
        except Exception as exc:
            row = {**w.describe(), "verdict": "error", "error": f"{type(exc).__name__}: {_one_line(exc)}"}
            traceback.print_exc()
        row["wall_seconds"] = round(time.monotonic() - t0, 2)
        doc["workloads"][w.name] = row
        print(_status_line(w.name, row["verdict"] + (f": {row['error']}" if row.get("error") else "")),
              flush=True)
        # Written after every workload, so a crash later keeps what was measured.
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print_timing_table(doc)
    print(f"wrote {args.out}")
    return 0 if all(r["verdict"] in ("ok", "skipped") for r in doc["workloads"].values()) else 1


def print_timing_table(doc: dict[str, Any]) -> None:
    env = doc.get("environment", {})
    print(f"\n{env.get('gpu', '?')}, torch {env.get('torch')}, triton {env.get('triton')}, "
          f"nvmath {env.get('nvmath')}, driver {env.get('driver')}")
    print(f"{'workload':24s} {'shape':18s} {'verdict':8s} {'rel err':>9s} {'ms':>8s} {'cuBLAS ms':>9s} "
          f"{'ratio':>6s} {'TFLOP/s':>8s} {'SM MHz':>10s}")
    for name, r in doc["workloads"].items():
        err = f"{r['rel_error']:.1e}" if r.get("rel_error") is not None else "-"
        if "ms_median" in r:
            clk = r.get("sm_clock_mhz") or {}
            clock = f"{clk.get('min')}-{clk.get('max')}" if clk else "?"
            print(f"{name:24s} {r['shape']:18s} {r['verdict']:8s} {err:>9s} {r['ms_median']:8.3f} "
                  f"{r['ref_ms_median']:9.3f} {r['ratio']:6.2f} {r['tflops']:8.1f} {clock:>10s}")
        else:
            print(f"{name:24s} {r['shape']:18s} {r['verdict']:8s} {err:>9s}  {r.get('error', '')[:80]}")


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("list", help="the workloads")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_list)
    p = sub.add_parser("run", help="launch the named workloads once each (what ncu profiles)")
    p.add_argument("--nvtx", action="store_true", help="inside an NVTX range named after each workload")
    p.add_argument("--check", action="store_true",
                   help="also verify each against float64 before its range (runs extra kernels)")
    p.add_argument("names", nargs="+")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("time", help="verify and time against cuBLAS; write a JSON file")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("names", nargs="*")
    p.set_defaults(func=cmd_time)
    args = ap.parse_args(argv)
    if getattr(args, "runs", 20) < 20 or getattr(args, "rounds", 3) < 1:
        ap.error("--runs must be at least 20 and --rounds at least 1")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
