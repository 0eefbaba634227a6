"""The rule table (issue 5): every rule fires on a case that shows its symptom and stays
silent on one that does not, judged on the real H200 captures wherever one shows the
symptom. Synthetic profiles (``dataclasses.replace`` on a real one) are used only where
no capture has the symptom; each such case says so in its docstring.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections import ChainMap
from collections.abc import Mapping
from functools import cache

import pytest
from conftest import FIXTURES, report
from typer.testing import CliRunner

from perfscope.cli import app
from perfscope.collection import EXTRA_METRICS
from perfscope.manifest import RunManifest, Verification
from perfscope.metrics import M_SM_ACTIVE_AVG, M_SM_ACTIVE_MAX, VIEW_METRICS
from perfscope.profile import KernelProfile, OpcodeTraffic, Stall, Traffic, load
from perfscope.rules import BY_CODE, REGISTRY, SEVERITIES, TAGS, Context, evaluate
from perfscope.rules.engine import combine
from perfscope.rules.launch import split_pieces
from perfscope.rules.model import DOC_SECTIONS, Inputs, severity_rank

ISSUE_TAGS = {
    "uncoalesced-global", "narrow-loads", "no-data-reuse", "small-tile", "smem-bandwidth",
    "bank-conflicts", "uncoalesced-shared", "latency-exposed", "epilogue-exposed",
    "register-spills", "occupancy-limited", "no-tensor-cores", "legacy-mma", "no-tma",
    "tail-effect", "small-grid", "l2-locality", "dram-bound", "store-inefficiency",
    "incorrect-result", "issue-overhead",
    # Not in the first vocabulary: the clock a kernel runs at (PS171, the power cap), and
    # ptxas serializing the wgmma pipeline (PS144, the static audit's), and FP math in the
    # k loop (PS125: an fp8 kernel promoting its partial sums), and index math in the loop
    # that issues the TMA loads (PS146, the static audit's).
    "clock-held", "mma-serialized", "k-loop-math", "producer-loop",
    # and warps waiting at memory fences (PS126: a split-K partial pulled between two
    # release-semantics cluster barriers), and a stream read in short runs (PS172: the
    # boxes of a stage's tensor maps).
    "memory-fence", "short-runs",
    # and TMA box rows that straddle 128-byte lines (PS106: measured by aligning the column
    # split's pieces, 1.15x).
    "misaligned-tma",
    # and a launch's fixed time in a short kernel (PS173: measured by benchmarks/kernel_floor.py).
    "fixed-time",
    # and layouts that send a library to its fallback kernels (PS107: rows not 16-byte
    # aligned; PS108: 8-bit operands along N), from cuBLAS captures at 4095^3 and of _int_mm.
    "unaligned-rows", "operand-layout",
    # and an mma.sync loop that stops its math for a block of copy work (PS127: measured by
    # spreading hgemm_ring's copies over its k16 steps, 1.054x on an H100), and registers
    # rewritten under the copies that read them (PS128: a deferred epilogue's 0.88x).
    "math-gap", "register-reuse",
    # and an FFMA loop whose fragment loads come in bursts (PS129: three FFMA orders at the
    # same instructions, 0.84-0.95x the orders that spread them).
    "fragment-bursts",
    # and an FFMA loop whose FFMAs are held at dispatch (PS133: orders at the same
    # instructions, 0.78-0.94x the stage's, timed on an H100 before the rule was written).
    "ffma-dispatch",
}


@cache
def kernels(name: str) -> tuple[KernelProfile, ...]:
    return tuple(load(report(name)))


def one(name: str, index: int = 0) -> KernelProfile:
    return kernels(name)[index]


def codes(kp: KernelProfile, **kw) -> set[str]:
    return {f.code for f in evaluate(kp, **kw).findings}


def manifest(verdict: str = "ok", m: int = 4096, n: int = 4096, k: int = 4096,
             params: dict | None = None, stage: str = "hgemm_naive", dtype: str = "fp16") -> RunManifest:
    return RunManifest(stage=stage, family="hgemm", dtype=dtype, m=m, n=n, k=k,
                       params=params if params is not None else {"BM": 128, "BN": 128, "BK": 32},
                       verification=Verification(verdict=verdict, rel_fro_error=0.5, tolerance=1e-2))


# --------------------------------------------------------------- synthetic helpers


def with_stalls(kp: KernelProfile, issue_active: float | None = None, eligible: float | None = None,
                **cycles: float) -> KernelProfile:
    reasons = tuple(Stall(r, c, None) for r, c in sorted(cycles.items(), key=lambda kv: -kv[1]))
    st = dataclasses.replace(kp.stalls, reasons=reasons)
    if issue_active is not None:
        st = dataclasses.replace(st, issue_active_pct=issue_active)
    if eligible is not None:
        st = dataclasses.replace(st, eligible_warps_per_cycle=eligible)
    return dataclasses.replace(kp, stalls=st)


def with_sol(kp: KernelProfile, **pcts: float) -> KernelProfile:
    return dataclasses.replace(kp, sol=dataclasses.replace(kp.sol, **pcts))


def with_families(kp: KernelProfile, families: dict[str, float], executed: dict[str, float] | None = None,
                  cc: str | None = None) -> KernelProfile:
    ops = dataclasses.replace(kp.opcodes, families=families,
                              executed=executed if executed is not None else kp.opcodes.executed)
    out = dataclasses.replace(kp, opcodes=ops)
    if cc is not None:
        out = dataclasses.replace(out, identity=dataclasses.replace(out.identity, compute_capability=cc))
    return out


def with_metric(kp: KernelProfile, name: str, value: float) -> KernelProfile:
    return dataclasses.replace(kp, metrics=ChainMap({name: (value, "")}, kp.metrics))


def idle_uncapped() -> KernelProfile:
    """The uncapped FFMA kernel made latency-bound: nothing busy, issue slots idle."""
    kp = with_sol(one("spill", 0), sm_pct=20.0, l1tex_pct=20.0, l2_pct=20.0, dram_pct=10.0)
    return with_stalls(kp, issue_active=20.0, eligible=0.3, long_scoreboard=6.0, wait=1.0,
                       not_selected=0.5)


def hmma_kernel(cc: str = "9.0") -> KernelProfile:
    """An mma.sync + cp.async + ldmatrix GEMM (the hgemm ladder's fingerprint), built from
    the nvjet capture's profile: no capture holds an HMMA kernel."""
    fams = {"hmma": 2.0e6, "ldgsts": 5.0e5, "ldsm": 1.0e6, "barrier": 1.0e5, "stg": 3.0e4}
    executed = {"HMMA": 2.0e6, "LDGSTS": 5.0e5, "LDSM": 1.0e6, "BAR": 1.0e5, "STG": 3.0e4,
                "IMAD": 1.0e6}
    return with_families(one("cublas_hgemm_4096"), fams, executed, cc=cc)


# ------------------------------------------------------------- the case table
# One row per (rule, outcome): the rule fires on the first kind of case and stays silent
# on the second. "real" cases are captures as they are (H200 fixtures, the external set,
# the committed reference run); "synthetic" ones change a real capture where no capture
# shows the symptom, and say what they change.

EXTERNAL = FIXTURES.parent / "external"
REFERENCE = FIXTURES.parents[2] / "reports" / "reference" / "h200"


@cache
def _records(path: str) -> tuple:
    from perfscope.diagnosis import diagnose

    return tuple(diagnose([path]))


def _context(r) -> Context:
    """What the loader tells the rules of a record: its stage and how its run read A and B."""
    return Context(stage=r.stage, reads=r.reads)


def external(name: str, index: int = 0):
    """A launch of the external set with its run manifest (the H200 timing)."""
    r = _records(str(EXTERNAL / f"{name}.ncu-rep.xz"))[index]
    return r.profile, {"manifest": r.manifest}


def reference(stage: str, dtype: str):
    """A ladder stage of the committed reference run, with its manifest and stage."""
    r = _records(str(REFERENCE / f"{stage}-{dtype}-4096x4096x4096.ncu-rep.xz"))[0]
    return r.profile, {"manifest": r.manifest, "context": _context(r)}


def fused(name: str, index: int = 0):
    """A launch of the committed reference run's fused folder (issue 19), with its manifest."""
    r = _records(str(REFERENCE / "fused" / f"{name}.ncu-rep.xz"))[index]
    return r.profile, {"manifest": r.manifest, "context": _context(r)}


def probe(name: str, index: int = 0):
    """A launch of a report of the committed reference run's probes folder, with its manifest."""
    r = _records(str(REFERENCE / "probes" / f"{name}.ncu-rep.xz"))[index]
    return r.profile, {"manifest": r.manifest, "context": _context(r)}


def fused_fixture(name: str):
    """A launch of tests/fixtures/h200/fused (an older hgemm_small_m), with its manifest."""
    r = _records(str(FIXTURES / "fused" / f"{name}.ncu-rep.xz"))[0]
    return r.profile, {"manifest": r.manifest, "context": _context(r)}


def fp8(stage: str):
    """An fp8 report of the committed reference run's fp8 folder (issue 19), with its manifest."""
    r = _records(str(REFERENCE / "fp8" / f"{stage}-fp8-4096x4096x4096.ncu-rep.xz"))[0]
    return r.profile, {"manifest": r.manifest, "context": _context(r)}


def _packed_stand_in():
    """hgemm_small_m's 16 x 8192^2 report told the reads of hgemm_small_m_packed at the same
    parameters: the same kernel, boxes and shared-memory image, B in 64-column strips. A
    stand-in until the packed stage's own report is captured: it has not run on a GPU yet."""
    from perfscope.kernels import Shape, run_reads

    kp, kw = fused(SMALL_M_M16)
    m = kw["manifest"]
    reads = run_reads("hgemm_small_m_packed", m.params, m.dtype, Shape(m.m, m.n, m.k))
    assert reads is not None and reads[1].run_bytes == 64 * 128
    return kp, {"manifest": m, "context": Context(stage=kw["context"].stage, reads=reads)}


def wgmma_pipeline(build: str):
    """hgemm_fused_quant at 4096^3 as committed, or built with the bias held across the k
    loop, which ptxas serialized (tests/fixtures/h200/wgmma-serialized/)."""
    path = FIXTURES / "wgmma-serialized" / build / "hgemm_fused_quant-bf16-4096x4096x4096.ncu-rep.xz"
    r = _records(str(path))[0]
    return r.profile, {"manifest": r.manifest, "context": _context(r)}


def tail_split(name: str):
    """A report of the tail-split pairs (fixtures/h200/tail-split/), with its manifest."""
    r = _records(str(FIXTURES / "tail-split" / f"{name}.ncu-rep.xz"))[0]
    return r.profile, {"manifest": r.manifest, "context": _context(r)}


SPLIT_PROBE = "hgemm_tma_wgmma_persistent@STREAMK=4-bf16-4096x4096x4096"
SMALL_M_M16 = "hgemm_small_m@AROWS=16,BN=64-bf16-16x8192x8192"
SMALL_M_DECODE = "hgemm_small_m@BN=64,STAGES=12-bf16-64x8192x8192"
SMALL_M_256 = "hgemm_small_m@AROWS=256,BM=256,STAGES=4-bf16-256x8192x8192"
# The split-K decode kernel at 64x4096x4096, one report name in two folders: fused/ holds it
# pulling its partial (2026-12-02), probes/ pushing it (2026-12-04);
# tests/fixtures/h200/fused holds the first split kernel.
SMALL_M_SPLIT = "hgemm_small_m@BN=64-bf16-64x4096x4096"
SMALL_M_SPLIT_OLD = "hgemm_small_m-bf16-64x8192x8192"


def _unparked(kp: KernelProfile, kw: dict):
    """The same launch as if the report could not tell where warps are parked: every stall
    counted as a wait of the work (KernelProfile.parked empty)."""
    return dataclasses.replace(kp, parked=()), kw


def _balanced(kp: KernelProfile, kw: dict):
    """The same launch with its average SM active 99% of the busiest one's cycles."""
    return with_metric(kp, M_SM_ACTIVE_AVG, 0.99 * kp.metric(M_SM_ACTIVE_MAX)), kw


@dataclasses.dataclass(frozen=True)
class Case:
    code: str
    fires: bool
    kind: str                 # "real" or "synthetic"
    why: str
    make: object              # () -> (profile, evaluate() keyword arguments)


def _shift_global_excess_to_stores():
    kp = one("strided_copy")
    g = kp.memory.global_
    ops = tuple(dataclasses.replace(o, actual=o.ideal * (1 if o.kind == "load" else 8.0))
                for o in g.by_opcode)
    mem = dataclasses.replace(kp.memory, global_=dataclasses.replace(g, by_opcode=ops))
    return dataclasses.replace(kp, memory=mem)


def _shift_shared_excess_to_stores():
    kp = one("smem_transpose")
    s = kp.memory.shared
    ops = tuple(dataclasses.replace(o, actual=o.ideal * (32.0 if o.kind == "store" else 1.0))
                for o in s.by_opcode)
    mem = dataclasses.replace(kp.memory, shared=dataclasses.replace(s, by_opcode=ops))
    return dataclasses.replace(kp, memory=mem)


def smem_limited(kp: KernelProfile) -> KernelProfile:
    la = dataclasses.replace(kp.launch, occupancy_limiter="shared memory",
                             occupancy_limits={**kp.launch.occupancy_limits, "registers": 9.0,
                                               "shared memory": 3.0})
    return dataclasses.replace(kp, launch=la)


def _low_l2(carve: float) -> KernelProfile:
    kp = with_sol(one("spill", 0), dram_pct=70.0)
    kp = dataclasses.replace(kp, memory=dataclasses.replace(kp.memory, l2_hit_rate_pct=30.0))
    kp = with_metric(kp, "dram__bytes_read.sum", 36e6)
    kp = with_metric(kp, "dram__bytes_write.sum", 4e6)
    return with_metric(kp, "launch__persisting_l2_cache_size", carve)


def _ptxas(log_name: str):
    """The committed hgemm_fused_quant report with the compiler's report of a build (the
    static audit's inputs: PS144 reads ptxas's words, not counters)."""
    from perfscope.build import parse_ptxas_log
    from perfscope.rules import STATIC_REGISTRY

    (res,) = parse_ptxas_log((FIXTURES.parent / "ptxas" / log_name).read_text()).values()
    kp, _ = fused("hgemm_fused_quant-bf16-4096x4096x4096")
    return kp, {"context": Context(resources=res), "rules": STATIC_REGISTRY}


def _static_sass(name: str):
    """A committed build's static SASS (tests/fixtures/sass/README.md) as the static audit
    judges it: the opcode histogram in place of counters, the instructions (their loops) in
    the context."""
    import lzma

    from perfscope.audit import static_profile
    from perfscope.rules import STATIC_REGISTRY
    from perfscope.sass.disasm import KernelSass

    mangled, *instructions = lzma.decompress(
        (FIXTURES.parent / "sass" / f"{name}.sass.xz").read_bytes()).decode().splitlines()
    sass = KernelSass(mangled, tuple(instructions), arch="sm_90a")
    return static_profile(sass, "sm_90a", None), {"context": Context(sass=sass.instructions),
                                                   "rules": STATIC_REGISTRY}


def _reread_manifest():
    return manifest(stage="ps_regs_uncapped", dtype="fp32", m=1024, n=1024, k=1024)


CASES: tuple[Case, ...] = (
    Case("PS101", True, "real", "the strided copy reads 8x its ideal sectors",
         lambda: (one("strided_copy"), {})),
    Case("PS101", False, "real", "the float4 copy moves 16-byte vectors at ideal sectors",
         lambda: (one("float4_copy"), {})),
    Case("PS101", False, "real", "cuBLAS's bf16 GEMM through PyTorch loads its tiles by TMA",
         lambda: external("torch_bf16_4096")),
    Case("PS101", False, "real", "torch._grouped_mm's GEMM loads each group's pointers by LDG at "
         "1.5x their ideal sectors, 0.0002 of all it takes in (its operands come by TMA)",
         lambda: external("torch_grouped_moe", 1)),
    Case("PS102", True, "real", "sgemm_naive waits on scalar LDG.E.CONSTANT (86% of stalls)",
         lambda: reference("sgemm_naive", "fp32")),
    Case("PS102", False, "real", "the uncapped FFMA kernel is compute-bound (3% long scoreboard)",
         lambda: (one("spill", 0), {})),
    Case("PS103", True, "real", "sgemm_naive: 2 LDG per FFMA, operands re-read 23x from the caches",
         lambda: reference("sgemm_naive", "fp32")),
    Case("PS103", False, "real", "cuBLAS's SGEMM issues one LDG per 260k FFMAs",
         lambda: (one("cublas_sgemm_4096"), {})),
    Case("PS103", False, "real", "cuBLAS's split-K reduction reads each byte once: no GEMM",
         lambda: external("torch_kheavy", 1)),
    Case("PS104", True, "real", "Triton 64x64 tiles: 2.5x the L2 bytes per FLOP, L2 at 87%",
         lambda: external("triton_64x64")),
    Case("PS104", False, "real", "Triton 128x256 tiles: L2 at 44%", lambda: external("triton_good")),
    Case("PS104", False, "real", "a decode GEMM (M=16) streams its weight once: no tile can reuse it",
         lambda: external("torch_decode_m16")),
    Case("PS104", False, "real", "hgemm_small_m's 128x64 tiles at M = 256, L2 at 75%: a 128x256 "
         "tile would make 32 tiles for its 128 CTAs, and no tile filling them reuses more",
         lambda: fused("hgemm_small_m@AROWS=128,BM=128,BN=64-bf16-256x4096x4096")),
    Case("PS105", True, "synthetic", "the strided copy with its excess moved from loads to stores",
         lambda: (_shift_global_excess_to_stores(), {})),
    Case("PS105", False, "real", "the strided copy's STG.E stores are at ideal sectors",
         lambda: (one("strided_copy"), {})),
    Case("PS106", True, "real", "the column split's pieces start on multiples of 8 columns: B's "
         "128-byte box rows straddle lines, 2.95 sectors per L2 request",
         lambda: probe(SPLIT_PROBE)),
    Case("PS106", False, "real", "the same kernel unsplit: every box starts on a line, 3.99",
         lambda: reference("hgemm_tma_wgmma_persistent", "bf16")),
    Case("PS107", True, "real", "cuBLAS at 4095^3 bf16 (H100): 8,190-byte rows, an align1 "
         "fallback with 2-byte loads at 0.21 of the aligned rate", lambda: external("torch_odd_4095")),
    Case("PS107", False, "real", "cuBLAS with A's rows 8,080 bytes apart: 16-byte aligned, its TMA "
         "kernel runs", lambda: probe("cublas-ld4040-h100")),
    Case("PS108", True, "real", "torch._int_mm with B[K][N] (H100): an sm_80 WMMA fallback at 128 "
         "TOPS", lambda: external("torch_int8_4096")),
    Case("PS108", False, "real", "perfscope's fp8 stage: TN, its QGMMA runs",
         lambda: fp8("hgemm_fp8")),
    Case("PS106", True, "real", "the split again, profiled as a program on an H100 with its "
         "tensor maps recorded: 2.99", lambda: probe("column-split-h100")),
    Case("PS106", False, "real", "the same pieces started on 64-column boundaries: 3.91, and "
         "13.6% less time", lambda: probe("column-split-aligned-h100")),
    Case("PS106", True, "real", "cuBLAS (torch.matmul) with A's rows 8,080 bytes apart: 2.35 "
         "sectors a request, twice the aligned GEMM's requests", lambda: probe("cublas-ld4040-h100")),
    Case("PS106", False, "real", "the same GEMM with A's rows 8,192 bytes apart: 3.96",
         lambda: probe("cublas-ld4096-h100")),
    Case("PS106", True, "real", "the split's pair again on the H200: 2.90 sectors a request",
         lambda: probe("column-split-h200")),
    Case("PS106", False, "real", "its aligned pieces on the H200: 4.15",
         lambda: probe("column-split-aligned-h200")),
    Case("PS106", True, "real", "Triton's TMA matmul with A's rows 8,080 bytes apart (H200): 2.21 "
         "sectors a request, its rows taken as a line", lambda: probe("triton-ld4040-h200")),
    Case("PS106", False, "real", "the same Triton GEMM with A's rows 8,192 apart: 4.17",
         lambda: probe("triton-ld4096-h200")),
    Case("PS106", False, "real", "Triton's TMA matmul, its maps not recorded: 3.90 sectors a "
         "request leave no row straddling, whatever its boxes", lambda: external("triton_tma")),
    Case("PS110", True, "real", "the transpose's LDS read 32x the ideal wavefronts",
         lambda: (one("smem_transpose"), {})),
    Case("PS110", False, "real", "nvjet's shared loads (LDS, HGMMA operands) are at ideal wavefronts",
         lambda: (one("cublas_hgemm_4096"), {})),
    Case("PS111", True, "synthetic", "the transpose with its 32-way excess moved to the STS",
         lambda: (_shift_shared_excess_to_stores(), {})),
    Case("PS111", False, "real", "nvjet has 130k raw store conflicts but ideal STS/STSM wavefronts",
         lambda: (one("cublas_hgemm_4096"), {})),
    Case("PS112", True, "real", "cuBLAS's SGEMM writes shared memory with 4-byte cp.async at 3x ideal",
         lambda: (one("cublas_sgemm_4096"), {})),
    Case("PS112", False, "real", "the transpose's excess is on LDS loads, a bank conflict",
         lambda: (one("smem_transpose"), {})),
    Case("PS112", True, "real", "Triton's TF32 matmul transposes B in its 4-byte copies: 16x "
         "the ideal wavefronts with L1TEX 90% busy, its bound",
         lambda: external("triton_tf32")),
    Case("PS114", True, "real", "hgemm_small_m's paired 128x64 tiles at 256x4096x14336: m64n64 "
         "wgmmas and 24 KB in per k tile, roof 0.57 of the tensor peak, run at 0.59",
         lambda: fused("hgemm_small_m@AROWS=128,BM=128,BN=64,MPAIR=2-bf16-256x4096x14336")),
    Case("PS114", False, "real", "the same shape on 128x128 tiles split over the grid: roof 0.80",
         lambda: fused("hgemm_small_m@AROWS=128,BM=128,GSPLIT=2,MPAIR=2,STAGES=6-bf16-256x4096x14336")),
    Case("PS114", False, "real", "Triton's 64x64 tiles run at 0.62 of their roof: L2, not the banks "
         "(PS104)", lambda: external("triton_64x64")),
    Case("PS113", True, "real", "sgemm_smem: 1.25 shared loads per FFMA, MIO-throttled",
         lambda: reference("sgemm_smem", "fp32")),
    Case("PS113", False, "real", "cuBLAS's SGEMM reads LDS.128 fragments, 0.05 shared loads per FFMA",
         lambda: (one("cublas_sgemm_4096"), {})),
    Case("PS120", True, "real", "Triton's 1-stage loop: long scoreboard 54%, L1 78% with no throttle",
         lambda: external("triton_one_stage")),
    Case("PS120", False, "real", "hgemm_small_m at 256 x 4096^2: 0.31 of its stalls on long scoreboard, "
         "but its consumers wait 0.27 of the samples; the rest is its producer waiting for free "
         "slots", lambda: fused("hgemm_small_m@AROWS=128,BM=128,BN=64-bf16-256x4096x4096")),
    Case("PS120", False, "real", "the persistent wgmma stage: long scoreboard 48% but the tensor pipe at 89%",
         lambda: reference("hgemm_tma_wgmma_persistent", "bf16")),
    Case("PS120", False, "real", "hgemm_small_m at M = 64 waits on its weight stream (52% long "
         "scoreboard): memory-bound work, PS170's", lambda: fused(SMALL_M_DECODE)),
    Case("PS121", True, "real", "hgemm_tma_wgmma drains its wgmmas behind a CTA barrier (54% of stalls)",
         lambda: reference("hgemm_tma_wgmma", "bf16")),
    Case("PS121", False, "real",
         "nvjet waits at barriers 32% of its stall time, by design (warp-specialised)",
         lambda: (one("cublas_hgemm_4096"), {})),
    Case("PS122", True, "real", "sgemm_warptile stages tiles LDG -> STS: long scoreboard 20%",
         lambda: reference("sgemm_warptile", "fp32")),
    Case("PS122", False, "real", "sgemm_pipe copies with cp.async into a 3-stage ring",
         lambda: reference("sgemm_pipe", "fp32")),
    Case("PS123", True, "real", "hgemm_tma_wgmma_ws: 3.88 waves, tensor pipe 78%",
         lambda: reference("hgemm_tma_wgmma_ws", "bf16")),
    Case("PS123", False, "real", "the persistent stage runs one wave",
         lambda: reference("hgemm_tma_wgmma_persistent", "bf16")),
    Case("PS123", False, "real", "Triton's TF32 matmul (H100): 7.8 waves and its pipe 17% busy, "
         "but its warps wait on their own 4-byte strided copies (long_scoreboard 77%, no warp "
         "roles): the main loop, not the epilogue", lambda: external("triton_tf32")),
    Case("PS124", True, "real", "hgemm_fused_bias_act: bias + GELU on 2.5% of the cycles, tensor "
         "pipe 92.0% of the active cycles", lambda: fused("hgemm_fused_bias_act-bf16-4096x4096x4096")),
    Case("PS124", True, "real", "cuBLASLt's GELU_BIAS nvjet: 2.5% FP math, tensor pipe 91.8%",
         lambda: external("cublaslt_gelu_bias_4096")),
    Case("PS124", False, "real", "the persistent stage's epilogue is a convert and a store",
         lambda: reference("hgemm_tma_wgmma_persistent", "bf16")),
    Case("PS124", False, "real", "nvjet's bias-only epilogue (torch's addmm): 0.4% FP math",
         lambda: external("torch_gelu_after_mm")),
    Case("PS124", False, "real", "hgemm_tma_wgmma_ws runs 3.88 waves: its epilogues are PS123's",
         lambda: reference("hgemm_tma_wgmma_ws", "bf16")),
    Case("PS124", False, "real", "hgemm_fused_pingpong: the same epilogue (2.3% FP math), tensor "
         "pipe 84.9%, but each consumer owns its 64 x 256 tiles: the epilogue runs under the "
         "other's wgmmas", lambda: fused("hgemm_fused_pingpong-bf16-4096x4096x4096")),
    Case("PS124", False, "real", "hgemm_small_m at 256x8192x8192: 64 tiles x split-K 2 on 128 "
         "CTAs, one tile each: no next tile waits on its epilogue (tensor pipe 79.4%)",
         lambda: fused(SMALL_M_256)),
    Case("PS124", False, "real", "cuBLASLt's default e4m3 nvjet: 34 FP operations per output "
         "element at K = 4096, its partial sums promoted in the k loop (PS125's)",
         lambda: fp8("cublaslt_fp8gemm_precise")),
    Case("PS125", True, "real", "cuBLASLt's default e4m3 nvjet promotes its partial sums every "
         "128 of K: 34 FP operations per output element, tensor pipe 86.8%",
         lambda: fp8("cublaslt_fp8gemm_precise")),
    Case("PS125", False, "real", "cuBLASLt's e4m3 nvjet with fast accumulation: 2 per element, "
         "the scale", lambda: fp8("cublaslt_fp8gemm")),
    Case("PS125", False, "real", "hgemm_fused_bias_act's bias + GELU: 7 per element, an "
         "epilogue (PS124's)", lambda: fused("hgemm_fused_bias_act-bf16-4096x4096x4096")),
    Case("PS126", True, "synthetic", "hgemm_small_m pulling its split-K partial at "
         "64x4096x4096 with its parked warps unknown: 13.2% membar stalls, all counted as "
         "waits of the work", lambda: _unparked(*fused(SMALL_M_SPLIT))),
    Case("PS126", False, "real", "the same report: its membar stalls are the producer "
         "warpgroup's, parked at its exit barriers (fused.cu:618-619); 1.2% without them",
         lambda: fused(SMALL_M_SPLIT)),
    Case("PS126", False, "real", "the 2-CTA split-K hgemm_small_m of 2026-12-01 at 64x8192x8192: "
         "7.1% membar stalls, 1.6% without its parked producer warps (fused.cu:361)",
         lambda: fused_fixture(SMALL_M_SPLIT_OLD)),
    Case("PS126", False, "real", "the same shape with the partial pushed by st.async onto an "
         "mbarrier: no membar stalls", lambda: probe(SMALL_M_SPLIT)),
    Case("PS126", False, "real", "cuBLAS's decode GEMM (split over K as well): 0% membar",
         lambda: external("torch_decode_m16")),
    Case("PS127", True, "real", "hgemm_ring (H200): a 108-instruction block of copy work with "
         "no mma.sync after each k tile's barrier, 0.130 of the samples its own work",
         lambda: reference("hgemm_ring", "bf16")),
    Case("PS127", False, "real", "the same ring with its copies cheap and spread between the "
         "k16 steps (probes/, H100): no run without mma.sync longer than one instruction",
         lambda: probe("hgemm_ring_spread-bf16-4096x4096x4096-h100")),
    Case("PS127", False, "real", "the spread stage at SPREAD=1 (probes/, H100): its 12 cheap "
         "copies at the top of each tile, which ptxas scatters among the HMMAs itself (longest "
         "run one instruction); spreading them further saved 1.3-1.4%",
         lambda: probe("hgemm_ring_spread@SPREAD=1-bf16-4096x4096x4096-h100")),
    Case("PS127", False, "real", "cuBLAS's mma.sync kernel for an odd K (torch): a 60-instruction "
         "run, mostly waiting on its loads (PS120's), 0.050 its own work",
         lambda: external("torch_odd_k")),
    Case("PS127", False, "real", "hgemm_bcf_dbf (H200): its 62-instruction block holds the "
         "copies but its warps mostly wait there, on loads and the barrier: 0.31 of 0.56",
         lambda: reference("hgemm_bcf_dbf", "bf16")),
    Case("PS127", False, "real", "sgemm_stages4: an FFMA loop (its 95-instruction copy block "
         "takes issue slots, PS143's measure, not tensor-pipe time)",
         lambda: reference("sgemm_stages4", "fp32")),
    Case("PS128", True, "real", "hgemm_ring_persistent with its C stores deferred (probes/, "
         "H100): 0.084 of the samples wait to rewrite the copies' address registers (IADD3 "
         "R236 under an LDGSTS of R236), 0.88x the undeferred form",
         lambda: probe("hgemm_ring_persistent@EPI=2-bf16-4096x4096x4096-h100")),
    Case("PS128", True, "real", "hgemm_bcf_dbf_rw (H200): each k tile's first LDSM writes R12-R15 "
         "while the LDGSTS just issued still hold R12-R13 as an address: 0.102",
         lambda: reference("hgemm_bcf_dbf_rw", "bf16")),
    Case("PS128", False, "real", "the same persistent stage storing C at each tile's end "
         "(probes/, H100): 0.013", lambda: probe("hgemm_ring_persistent-bf16-4096x4096x4096-h100")),
    Case("PS128", True, "real", "the spread stage as 2 x 2 warps on 128 x 128 tiles, BK 32 "
         "(probes/, H100; written after the rule): 0.076, its LOP3 address arithmetic under the "
         "LDGSTS, 0.954x the 2 x 4 form",
         lambda: probe("hgemm_ring_spread@BK=32,BN=128,STAGES=6,WARPS=4-bf16-4096x4096x4096-h100")),
    Case("PS128", False, "real", "sgemm_tile8x16 (H200): 0.030, under the line",
         lambda: reference("sgemm_tile8x16", "fp32")),
    Case("PS128", False, "real", "hgemm_naive (H200): 0.067 at such waits, behind 338% extra "
         "shared wavefronts (its bank conflicts, PS110's)", lambda: reference("hgemm_naive", "bf16")),
    Case("PS129", True, "real", "sgemm_fma_order (H200): FFMAs column by column, 72 of 96 LDS in "
         "bursts, 0.056 of the samples held at them; 0.84x sgemm_dyn",
         lambda: reference("sgemm_fma_order", "fp32")),
    Case("PS129", True, "real", "sgemm_stages4 with serpentine rows (probes/, H100; written after "
         "the timing): 68 of 96 in bursts, 0.043; 0.952x the stage",
         lambda: probe("sgemm_stages4@JOUTER=2-fp32-4096x4096x4096-h100")),
    Case("PS129", False, "real", "sgemm_stages4 (H200): 6 of 96 LDS in a burst, the tile-boundary "
         "block's", lambda: reference("sgemm_stages4", "fp32")),
    Case("PS129", False, "real", "sgemm_dyn (H200): 14 of 96", lambda: reference("sgemm_dyn", "fp32")),
    Case("PS129", False, "real", "sgemm_smem (H200): one LDS an FFMA, the shared pipe the bound "
         "(PS113's), whatever the order", lambda: reference("sgemm_smem", "fp32")),
    Case("PS129", False, "real", "cuBLAS's SGEMM: none of its 48 LDS in a burst",
         lambda: (one("cublas_sgemm_4096"), {})),
    Case("PS129", False, "real", "Triton's IEEE fp32 matmul: 13 of 160 LDS in bursts",
         lambda: external("triton_fp32_ieee")),
    Case("PS129", False, "real", "Triton's bf16 matmul on FMAs: 6 of its 8 LDS in a burst, but "
         "0.016 of the samples held there, under the line", lambda: external("triton_fma_bf16")),
    Case("PS133", True, "real", "sgemm_stages4 with each row's evens, then odds (probes/, H100; "
         "timed before the rule): 921 of 2048 FFMAs held, 0.182 of the samples; 0.783x the stage",
         lambda: probe("sgemm_stages4@JOUTER=7-fp32-4096x4096x4096-h100")),
    Case("PS133", True, "real", "sgemm_fma_order (H200): 0.149 of the samples; 0.84x sgemm_dyn",
         lambda: reference("sgemm_fma_order", "fp32")),
    Case("PS133", True, "real", "Triton's IEEE fp32 matmul: 546 of 2048 FFMAs held, 0.123 of the "
         "samples", lambda: external("triton_fp32_ieee")),
    Case("PS133", False, "real", "sgemm_stages4 (H200): 0.077, the level its order compiles to; "
         "orders that cut it to 0.052-0.063 ran 0.94-0.98x", lambda: reference("sgemm_stages4", "fp32")),
    Case("PS133", False, "real", "sgemm_stages4 in 2 x 2 rings with its loads spread by hand "
         "(probes/, H100): 0.060, and 0.976x the stage",
         lambda: probe("sgemm_stages4@JOUTER=13-fp32-4096x4096x4096-h100")),
    Case("PS133", False, "real", "sgemm_stages4 with every other row rotated (probes/, H100): "
         "0.097, under the line", lambda: probe("sgemm_stages4@JOUTER=9-fp32-4096x4096x4096-h100")),
    Case("PS133", False, "real", "cuBLAS's SGEMM: 0.034", lambda: (one("cublas_sgemm_4096"), {})),
    Case("PS133", False, "real", "Triton's bf16 matmul on FMAs: no FFMA held at dispatch",
         lambda: external("triton_fma_bf16")),
    Case("PS124", False, "real", "hgemm_fused_quant with its bias held: one wait per wgmma, the "
         "idle pipe is the serialization's (PS145)", lambda: wgmma_pipeline("held")),
    Case("PS145", True, "real", "hgemm_fused_quant with its bias held: 1.00 WARPGROUP.DEPBAR per "
         "HGMMA, tensor pipe 78.9% of active cycles", lambda: wgmma_pipeline("held")),
    Case("PS145", False, "real", "the committed hgemm_fused_quant: 0.25 waits per HGMMA",
         lambda: wgmma_pipeline("committed")),
    Case("PS145", False, "real", "cuBLASLt's default e4m3 nvjet keeps its wgmmas in flight",
         lambda: fp8("cublaslt_fp8gemm_precise")),
    Case("PS144", True, "real", "ptxas serialized the fp8 quant stage's wgmmas (C7515) when it "
         "held its bias across the k loop", lambda: _ptxas("hgemm_fused_quant_fp8_held.log")),
    Case("PS144", False, "real", "the committed fp8 quant stage: no such line",
         lambda: _ptxas("hgemm_fused_quant_fp8.log")),
    Case("PS146", True, "real", "hgemm_small_m_streamk with its producer dividing per k tile: 4 "
         "I2F.RP among the 8 TMA loads of its unrolled loop",
         lambda: _static_sass("hgemm_small_m_streamk_divides")),
    Case("PS146", False, "real", "the committed hgemm_small_m_streamk: the tile's corner once "
         "per piece, outside the k loop", lambda: _static_sass("hgemm_small_m_streamk")),
    Case("PS130", True, "real", "the kernel built with --maxrregcount=32 spills",
         lambda: (one("spill", 1), {})),
    Case("PS130", False, "real", "the same code uncapped (80 registers) does not",
         lambda: (one("spill", 0), {})),
    Case("PS130", True, "real", "sgemm_stages4 with its copies spread over the k steps (probes/, "
         "H100): spills under 1% of its instructions, but 0.56 of the sectors it moves are local",
         lambda: probe("sgemm_stages4-fp32-4096x4096x4096-spread-h100")),
    Case("PS130", False, "real", "cuBLAS's TF32 kernel (torch): 2.8 MB of local traffic, nothing "
         "beside the tiles TMA brings (no LDG counts them)", lambda: external("torch_tf32_4096")),
    Case("PS131", True, "real", "hgemm_bcf: registers alone cap 2 blocks, 74% latency stalls, issue 20%",
         lambda: reference("hgemm_bcf", "bf16")),
    Case("PS131", False, "real", "cuBLAS's SGEMM at 254 registers keeps its FMA pipe busy",
         lambda: (one("cublas_sgemm_4096"), {})),
    Case("PS131", False, "real", "nvjet: registers and shared memory both cap it at one block",
         lambda: (one("cublas_bgemm_4096"), {})),
    Case("PS132", True, "real", "hgemm_tma_wgmma: a 4-stage ring allows one CTA per SM, latency unhidden",
         lambda: reference("hgemm_tma_wgmma", "bf16")),
    Case("PS132", False, "synthetic", "nvjet with shared memory as the only limiter: still silent, "
         "it is warp-specialised and its tensor pipe is busy",
         lambda: (smem_limited(one("cublas_hgemm_4096")), {})),
    Case("PS140", True, "real", "triton_fma_bf16: bf16 inferred from the SASS (F2FP.BF16), FFMA math",
         lambda: external("triton_fma_bf16")),
    Case("PS140", False, "real", "nvjet computes fp16 with HGMMA", lambda: (one("cublas_hgemm_4096"), {})),
    Case("PS140", False, "real", "an FP32 GEMM is right to use FFMA", lambda: (one("cublas_sgemm_4096"), {})),
    Case("PS140", False, "real", "PyTorch's GELU kernel packs bf16 but is no GEMM",
         lambda: external("torch_gelu_after_mm", 1)),
    Case("PS141", True, "real", "hgemm_bcf_dbf_rw runs mma.sync on sm_90",
         lambda: reference("hgemm_bcf_dbf_rw", "bf16")),
    Case("PS141", False, "synthetic", "the same HMMA kernel on sm_89, where mma.sync is the right path",
         lambda: (hmma_kernel("8.9"), {})),
    Case("PS142", True, "real", "Triton's 64x64 kernel feeds wgmma with cp.async on sm_90",
         lambda: external("triton_64x64")),
    Case("PS142", False, "real", "nvjet loads its tiles with UTMALDG",
         lambda: (one("cublas_hgemm_4096"), {})),
    Case("PS143", True, "real", "sgemm_pipe: issue slots 80% busy, 15.3% of them not FFMA",
         lambda: reference("sgemm_pipe", "fp32")),
    Case("PS143", False, "real", "sgemm_tile8x16, its tuned child: 10.1% not FFMA",
         lambda: reference("sgemm_tile8x16", "fp32")),
    Case("PS143", False, "real", "cuBLAS's SGEMM: 11.5% not FFMA",
         lambda: (one("cublas_sgemm_4096"), {})),
    Case("PS143", False, "real", "sgemm_warptile: 11.6% not FFMA but its issue slots idle (63%)",
         lambda: reference("sgemm_warptile", "fp32")),
    Case("PS150", True, "synthetic", "cuBLAS's SGEMM with its grid cut to 1.5 waves",
         lambda: (dataclasses.replace(one("cublas_sgemm_4096"), launch=dataclasses.replace(
             one("cublas_sgemm_4096").launch, waves_per_sm=1.5)), {})),
    Case("PS150", False, "real", "cuBLAS's SGEMM runs 3.88 waves (3% idle)",
         lambda: (one("cublas_sgemm_4096"), {})),
    Case("PS151", True, "synthetic", "manifest: 4100x4100 on 128x128 tiles pads 5.8% of the work",
         lambda: (one("cublas_hgemm_4096"), {"manifest": manifest(m=4100, n=4100)})),
    Case("PS151", False, "synthetic", "manifest: 4096x4096 on 128x128 tiles",
         lambda: (one("cublas_hgemm_4096"), {"manifest": manifest()})),
    Case("PS151", False, "real", "hgemm_small_m pads M = 16 to 64 rows (75% of the tiles' work), "
         "but 4x its math at the peak is shorter than its 128 MiB stream: the padding is hidden",
         lambda: fused(SMALL_M_M16)),
    Case("PS152", True, "real", "a 64-CTA transpose in the 24-launch capture leaves 68 of 132 SMs "
         "without a CTA", lambda: (one("many_launches", 18), {})),
    Case("PS152", False, "real", "the 256-CTA transpose fills a quarter of the slots but every SM",
         lambda: (one("many_launches", 14), {})),
    Case("PS152", False, "real", "cuBLAS's SGEMM runs 3.88 waves", lambda: (one("cublas_sgemm_4096"), {})),
    Case("PS152", False, "real", "torch._grouped_mm's setup kernel: one CTA of 8 threads, nothing "
         "to spread over more SMs (3.0 us, its launch: PS173's)",
         lambda: external("torch_grouped_moe", 0)),
    Case("PS173", True, "real", "torch._grouped_mm's setup kernel: 3.0 us, 2.5 of them a launch's "
         "fixed time", lambda: external("torch_grouped_moe", 0)),
    Case("PS153", True, "real", "hgemm_tma_wgmma_persistent: 512 tiles on 132 CTAs, the idlest SM "
         "active 0.75 of the busiest", lambda: reference("hgemm_tma_wgmma_persistent", "bf16")),
    Case("PS153", True, "real", "cuBLAS's nvjet 256x128 persistent grid has the same last round",
         lambda: (one("cublas_bgemm_4096"), {})),
    Case("PS153", True, "real", "the tail split at 4096^3: every SM busy, its spares run on",
         lambda: tail_split("hgemm_tma_wgmma_persistent@STREAMK=3-bf16-4096x4096x4096")),
    Case("PS153", False, "synthetic", "the persistent stage with its SMs within 1% of each other",
         lambda: _balanced(*reference("hgemm_tma_wgmma_persistent", "bf16"))),
    Case("PS153", False, "real", "cuBLAS's SGEMM runs 3.88 waves: its last wave is PS150's",
         lambda: (one("cublas_sgemm_4096"), {})),
    Case("PS160", True, "synthetic", "the FFMA kernel: 30% L2 hits, DRAM at 70%, 3x its compulsory bytes",
         lambda: (_low_l2(0.0), {"manifest": _reread_manifest()})),
    Case("PS160", False, "real", "a decode GEMM streams its weight once (8% hits, no re-reads)",
         lambda: external("torch_decode_m16")),
    Case("PS161", True, "synthetic", "the low-hit kernel with a carve-out of its own (the machine's is 0)",
         lambda: (_low_l2(11796480.0),
                  {"context": Context(machine={"launch__persisting_l2_cache_size": 0.0})})),
    Case("PS161", False, "real", "every launch on the H200 has the 11.25 MiB carve-out: the machine's",
         lambda: (one("many_launches", 3), {})),
    Case("PS170", True, "real", "PyTorch's GELU after the GEMM moves its bytes at 53% of the DRAM rate",
         lambda: external("torch_gelu_after_mm", 1)),
    Case("PS170", True, "real", "hgemm_small_m with A multicast in pairs (MCAST=2) streams 130 MiB "
         "at 84% of the DRAM rate, where cuBLAS's decode GEMM of the same shape reaches 89%",
         lambda: fused("hgemm_small_m@BN=64,MCAST=2,STAGES=12-bf16-64x8192x8192")),
    Case("PS170", False, "real", "hgemm_small_m at 16 x 8192^2 with its 8-stage ring streams 128 MiB "
         "at 90% of the DRAM rate", lambda: fused(SMALL_M_M16)),
    Case("PS170", False, "real", "cuBLAS's decode GEMM streams its weight at 91% of the DRAM rate",
         lambda: external("torch_decode_m16")),
    Case("PS170", False, "real", "cuBLAS's split-K reduction at 256 x 4096 x 14336 reads the "
         "partials its GEMM wrote, cold under ncu: 2.46 us of bytes at the rate, under a launch's "
         "fixed time: PS173's",
         lambda: fused("cublas+gelu-bf16-256x4096x14336", 1)),
    Case("PS170", False, "real", "cublas+gelu's pass at M = 64 reads and writes 1 MiB (0.5 us at "
         "the DRAM rate) in 2.7 us: a launch's fixed time sets that, not bandwidth",
         lambda: fused("cublas+gelu-bf16-64x8192x8192", 1)),
    Case("PS171", True, "real", "the persistent stage at 4096^3 runs at 1589 of 1980 MHz, its tensor "
         "pipe 89.5% busy", lambda: reference("hgemm_tma_wgmma_persistent", "bf16")),
    Case("PS171", True, "real", "cuBLASLt's bf16 GEMM at 4096^3 is held to 1597 MHz as well (info: "
         "the machine's condition, no warning)", lambda: external("cublaslt_bf16_4096")),
    Case("PS171", False, "real", "hgemm_ring (mma.sync, tensor pipe 72% busy) runs at 0.88 of the "
         "maximum clock", lambda: reference("hgemm_ring", "bf16")),
    Case("PS171", False, "real", "sgemm_pipe's FFMA runs at the full 1976 MHz",
         lambda: reference("sgemm_pipe", "fp32")),
    Case("PS171", False, "real", "cuBLAS's decode GEMM (tensor pipe 7% busy) runs at 0.91",
         lambda: external("torch_decode_m16")),
    Case("PS172", True, "real", "hgemm_small_m at 16 x 8192^2 streams B in 64 x 128-byte boxes, rows "
         "16 KB apart, at 0.89 of the DRAM rate", lambda: fused(SMALL_M_M16)),
    Case("PS172", True, "real", "the same at 16 x 14336 x 4096: rows 28 KB apart",
         lambda: fused("hgemm_small_m@AROWS=16,STAGES=6-bf16-16x14336x4096")),
    Case("PS172", False, "synthetic", "the same report told the packed stage's reads (B in "
         "64-column strips: each box 8 KB contiguous)", lambda: _packed_stand_in()),
    Case("PS172", False, "real", "hgemm_small_m at M = 256 is bound by its math, not its stream",
         lambda: fused(SMALL_M_256)),
    Case("PS115", True, "real", "cuBLAS's bf16 GEMM at 4096^3 (m64n128 wgmma, 128 x 256 tiles "
         "arriving) runs at its shared-memory roof of 0.89", lambda: (one("cublas_bgemm_4096"), {})),
    Case("PS115", True, "real", "hgemm_small_m's 128 x 128 pairs at 256 x 8192^2 run at 0.77 "
         "under a roof of 0.80", lambda: fused("hgemm_small_m@AROWS=128,BM=128,MPAIR=2,STAGES=6-bf16-"
                                               "256x8192x8192")),
    Case("PS115", False, "real", "the persistent stage's m64n256 wgmmas leave a roof of 1.0",
         lambda: reference("hgemm_tma_wgmma_persistent", "bf16")),
    Case("PS115", False, "real", "hgemm_small_m's 128 x 64 pairs: a roof of 0.57 is PS114's fault",
         lambda: fused("hgemm_small_m@AROWS=128,BM=128,BN=64,MPAIR=2-bf16-256x4096x14336")),
    Case("PS150", False, "real", "perfscope's read stream of 1 GiB runs 1.33 waves at 0.92 of the "
         "DRAM peak, past its floor: its last wave keeps DRAM busy", lambda: probe("kernel-floor-h200", 13)),
    Case("PS170", False, "real", "cuBLAS's bias + GELU pass at 4096^2 reads and writes 32 MiB each "
         "at 4.0 TB/s, where ncu counted 6.4 MiB of the writes",
         lambda: fused("cublas+gelu-bf16-4096x4096x4096", 1)),
    Case("PS140", False, "real", "PyTorch's bf16 softmax (its exp on FFMA) moves 7 FLOP per byte: "
         "no GEMM (an H100 capture)", lambda: probe("kernel-floor-h100", 18)),
    Case("PS173", True, "real", "cublas+gelu's bias + GELU pass at M = 64 reads and writes 1 MiB "
         "(0.5 us at the DRAM rate) in 2.7 us", lambda: fused("cublas+gelu-bf16-64x8192x8192", 1)),
    Case("PS173", True, "real", "PyTorch's layer norm of 2 MiB lasts 8.2 us, 0.5 us of it bytes",
         lambda: probe("kernel-floor-h200", 16)),
    Case("PS173", False, "real", "cuBLAS's decode GEMM streams 128 MiB in 34.5 us: the fixed time "
         "is 8% of it", lambda: external("torch_decode_m16")),
    Case("PS173", False, "real", "PyTorch's GELU of 32 MiB lasts 20.7 us",
         lambda: probe("kernel-floor-h200", 15)),
    Case("PS190", True, "synthetic", "manifest: verdict WRONG",
         lambda: (one("cublas_hgemm_4096"), {"manifest": manifest("WRONG")})),
    Case("PS190", False, "synthetic", "manifest: verdict ok",
         lambda: (one("cublas_hgemm_4096"), {"manifest": manifest("ok")})),
    Case("PS191", True, "synthetic", "manifest: verdict error",
         lambda: (one("cublas_hgemm_4096"), {"manifest": manifest("error")})),
    Case("PS191", False, "synthetic", "manifest: verdict ok",
         lambda: (one("cublas_hgemm_4096"), {"manifest": manifest("ok")})),
)


def _case_id(c: Case) -> str:
    return f"{c.code}-{'fires' if c.fires else 'silent'}-{c.why[:40]}"


def test_every_rule_has_a_firing_and_a_silent_case():
    assert {c.code for c in CASES if c.fires} == set(BY_CODE)
    assert {c.code for c in CASES if not c.fires} == set(BY_CODE)


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_case(case: Case):
    kp, kw = case.make()
    ev = evaluate(kp, **kw)
    found = [f for f in ev.findings if f.code == case.code]
    if case.fires:
        assert found, (case.code, [f.code for f in ev.findings], ev.not_evaluated)
        f = found[0]
        assert f.tag == BY_CODE[case.code].tag and f.evidence and f.fix
        assert "{" not in f.fix, f.fix   # every placeholder filled
        assert f.estimated_gain is None or 0 < f.estimated_gain <= 1
        room = ev.headroom.fraction if ev.headroom is not None else 1.0
        assert f.estimated_gain is None or f.estimated_gain <= room + 1e-9
    else:
        assert case.code in ev.silent, (case.code, [f.code for f in ev.findings], ev.not_evaluated)


def test_a_capture_with_locked_clocks_leaves_the_clock_unjudged():
    """Under ncu's --clock-control base the clock over the kernel is the lock's, not the
    card's: PS171 is not evaluated, and says why."""
    kp, kw = reference("hgemm_tma_wgmma_persistent", "bf16")
    locked = dataclasses.replace(kw["manifest"], clock_control="base")
    ev = evaluate(kp, **{**kw, "manifest": locked})
    (skip,) = [n for n in ev.not_evaluated if n.code == "PS171"]
    assert "--clock-control base" in skip.reason
    assert "PS171" in {f.code for f in evaluate(kp, **kw).findings}


@pytest.mark.parametrize("name, stragglers", [
    ("hgemm_tma_wgmma_persistent@STREAMK=3-bf16-4096x4096x4096", True),
    ("hgemm_tma_wgmma_persistent@STREAMK=3-bf16-1024x8192x8192", True),
    ("hgemm_tma_wgmma_persistent-bf16-4096x4096x4096", False),
    ("hgemm_tma_wgmma_persistent-bf16-1024x8192x8192", False)])
def test_tail_effect_fix_follows_the_shape_of_the_spread(name, stragglers):
    # The data-parallel kernel leaves SMs idle for its last round (split it); the tail split
    # keeps every SM busy but its spares run on (split less): the opposite advice. Read from
    # the predicate: the data-parallel kernel's net estimate is under a finding's (below).
    fix, _ = _uneven_sms(*tail_split(name))
    assert fix.startswith("Every SM works nearly to the end") == stragglers, fix
    assert ("Share the last, partial round" in fix) != stragglers
    # The idle last round also names the grid that takes the same rounds on fewer CTAs,
    # measured at the power cap (probes/balanced-grid-h100.jsonl); not where SMs run on.
    assert ("ceil(tiles / rounds) CTAs" in fix) != stragglers


def _uneven_sms(kp, kw):
    """PS153's fix text and evidence as its predicate writes them, before the engine weighs
    the estimate."""
    from perfscope.rules.launch import UNEVEN_SMS

    hit = UNEVEN_SMS.check(Inputs(profile=kp, **kw))
    return UNEVEN_SMS.fix.format(**dict(hit.fix_args)), {e.metric: e.value for e in hit.evidence}


def test_tail_effect_is_net_of_what_sharing_the_last_round_costs():
    """PS153 at 4096^3 (3.88 rounds of 64 k tiles) counts stream-K's cut pieces, about 6 k
    tiles of the busiest CTA's 4 x 64: the persistent stage's 0.034 idle share is worth 0.011
    (the stream-K stage saved nothing there, the balanced grid 0.001-0.006); at 8192^3 (16 x
    128) 0.032 is worth 0.029, where stream-K saved 0.023-0.024 (bench-8192.json)."""
    for shape, worth in (("4096x4096x4096", 0.0101), ("8192x8192x8192", 0.0292)):
        folder = REFERENCE / ("large" if shape.startswith("8192") else "")
        r = _records(str(folder / f"hgemm_tma_wgmma_persistent-bf16-{shape}.ncu-rep.xz"))[0]
        (f,) = [f for f in evaluate(r.profile, manifest=r.manifest, context=_context(r)).findings
                if f.code == "PS153"]
        assert f.estimated_gain == pytest.approx(worth, abs=2e-4)
        _, ev = _uneven_sms(r.profile, {"manifest": r.manifest, "context": _context(r)})
        idle = ev["idle share while the busiest SM works (1 - avg / max)"]
        (cost,) = [v for k, v in ev.items() if k.startswith("what sharing the last round costs")]
        assert cost == pytest.approx(6 / ((4 if shape.startswith("4096") else 16) *
                                          (64 if shape.startswith("4096") else 128)), abs=1e-4)
        assert f.estimated_gain == pytest.approx(idle - cost, abs=1e-3)
        # The idle share is what the symptom costs (what diff compares), apart from the estimate.
        assert f.cost == pytest.approx(idle, abs=1e-3)
    # Without the tile's k depth (cuBLAS: no manifest tile) the idle share alone stays, and is
    # the cost too.
    kp = one("cublas_bgemm_4096")
    (f,) = [f for f in evaluate(kp).findings if f.code == "PS153"]
    assert not any(e.metric.startswith("what sharing") for e in f.evidence) and f.cost is None
    # The tuned stage at 4096^3: idle 0.031, worth under 0.01 net: silent, its cost kept quiet.
    kp, kw = reference("hgemm_tma_wgmma_tuned", "bf16")
    ev = evaluate(kp, **kw)
    assert "PS153" not in {f.code for f in ev.findings}
    assert dict(ev.quiet)["PS153"] == pytest.approx(0.031, abs=2e-3)


@pytest.mark.parametrize("tiles, ctas, pieces", [
    (512, 132, 9),      # 4096^3 in 128 x 256 tiles: 116 in the last round, 16 CTAs idle
    (2048, 132, 3),     # 8192^3: 68 in the last round, 64 idle
    (256, 132, 17),     # 1024 x 8192^2: 124 in the last round, 8 idle
    (264, 132, None),   # whole rounds: nothing to split
    (100, 132, None)])  # fewer tiles than CTAs: PS152's, not a round to split
def test_split_pieces_is_the_fewest_equal_cut_that_shortens_the_last_round(tiles, ctas, pieces):
    assert split_pieces(tiles, ctas) == pieces
    if pieces is not None:
        rest = tiles % ctas
        # s pieces each: the busiest CTA holds ceil(rest s / ctas) of them; fewer than s
        # (the round shortened) first at `pieces`, never before.
        shorter = [s for s in range(1, 40) if math.ceil(rest * s / ctas) < s]
        assert shorter[0] == pieces


@pytest.mark.parametrize("name, pieces", [
    ("hgemm_tma_wgmma_persistent-bf16-4096x4096x4096", 9),
    ("hgemm_tma_wgmma_persistent-bf16-1024x8192x8192", 17)])
def test_tail_effect_says_how_finely_the_last_round_must_be_cut(name, pieces):
    # Halves, or a split kept inside 2-CTA clusters, leave some CTA a whole tile at 4096^3:
    # the finding says so with the number, so nobody builds the split that cannot pay.
    fix, ev = _uneven_sms(*tail_split(name))
    (value,) = [v for k, v in ev.items() if k.startswith("equal pieces per last-round tile")]
    assert value == pieces
    assert f"fewer than {pieces} equal pieces" in fix


def test_tail_effect_without_the_rounds_names_no_piece_count():
    # cuBLAS's persistent grid has no manifest tile: the rule cannot count its last round.
    kp, kw = one("cublas_bgemm_4096"), {}
    (f,) = [f for f in evaluate(kp, **kw).findings if f.code == "PS153"]
    assert not any(e.metric.startswith("equal pieces") for e in f.evidence)
    assert "equal pieces each" not in f.fix


# ------------------------------------------------------------------- the table itself


def test_tag_vocabulary_is_closed_and_covered():
    assert set(TAGS) == ISSUE_TAGS
    # The compiler-only rules (the static audit's) count: PS144's tag is only theirs.
    assert {r.tag for r in BY_CODE.values()} == ISSUE_TAGS


def test_rule_metrics_are_in_the_collection_set():
    declared = set(VIEW_METRICS) | set(EXTRA_METRICS)
    for rule in REGISTRY:
        assert set(rule.metrics) <= declared, (rule.code, set(rule.metrics) - declared)


def test_math_gap_is_the_copy_block_of_the_ring():
    """PS127's input, read per PC: hgemm_ring's (H200, bf16) longest main-loop run without an
    mma.sync is its 108-instruction copy block after each k tile's barrier (12 LDGSTS);
    cuBLAS's wgmma kernel has none (its math is asynchronous), sgemm_stages4's is FFMA's."""
    kp, _ = reference("hgemm_ring", "bf16")
    gap = kp.hot_loop.math_gap
    assert (gap.math, gap.first, gap.instructions, gap.copies) == ("hmma", 0x2380, 108, 12)
    assert 0.14 < gap.share < 0.16 and gap.waiting < 0.1 * gap.share
    assert reference("cublas_bgemm", "bf16")[0].hot_loop.math_gap is None
    assert reference("sgemm_stages4", "fp32")[0].hot_loop.math_gap.math == "ffma"


def test_reuse_waits_name_the_copy_that_holds_the_register():
    """PS128's input, read per PC with the registers of the SASS text: in the deferred
    persistent stage an IADD3 writing R236 waits 1,625 samples three instructions after the
    LDGSTS that takes R236.64 as its address; in hgemm_bcf_dbf_rw (H200) the tile's first
    LDSM writes R12-R15 eight after the LDGSTS that reads R12.64."""
    kp, _ = probe("hgemm_ring_persistent@EPI=2-bf16-4096x4096x4096-h100")
    w = kp.hot_loop.reuse_waits
    assert (w.first, w.holder, w.samples) == (0x8370, 0x8340, 1625)
    assert w.sass.startswith("IADD3 R236") and "[R236.64]" in w.holder_sass
    assert 0.08 < w.share < 0.09
    w = reference("hgemm_bcf_dbf_rw", "bf16")[0].hot_loop.reuse_waits
    assert (w.first, w.holder) == (0x1140, 0x10c0) and w.sass.startswith("LDSM")
    assert "[R12.64]" in w.holder_sass
    # No copy, no such wait: cuBLAS's TMA kernel.
    assert reference("cublas_bgemm", "bf16")[0].hot_loop.reuse_waits.share < 0.01


def test_math_gap_without_per_instruction_counts_is_not_evaluated():
    # An mma.sync kernel profiled without the Source Counters: PS127 says so, never "none".
    kp, kw = reference("hgemm_ring", "bf16")
    bare = dataclasses.replace(kp, hot_loop=None)
    ev = evaluate(bare, **kw)
    assert "PS127" not in {f.code for f in ev.findings}
    (skip,) = [n for n in ev.not_evaluated if n.code == "PS127"]
    assert "Source Counters" in skip.reason


def test_register_reuse_reads_the_math_before_asking_for_source_counters():
    # Without per-instruction counters PS128 is "not evaluated" for an mma.sync kernel, but
    # a wgmma kernel's opcodes already settle it (asynchronous math): silent, not unknown.
    kp, kw = reference("hgemm_ring", "bf16")
    ev = evaluate(dataclasses.replace(kp, hot_loop=None), **kw)
    (skip,) = [n for n in ev.not_evaluated if n.code == "PS128"]
    assert "Source Counters" in skip.reason
    kp, kw = reference("hgemm_tma_wgmma_balanced", "bf16")
    ev = evaluate(dataclasses.replace(kp, hot_loop=None), **kw)
    assert "PS128" in ev.silent
    assert "PS128" not in {n.code for n in ev.not_evaluated}


def test_rules_are_documented_data():
    for rule in BY_CODE.values():
        assert rule.severity in SEVERITIES
        for section in DOC_SECTIONS:
            assert f"{section}:" in rule.doc, (rule.code, section)
        # A before/after fragment, and a citation a user can open (seeds stay in the doc).
        example = rule.doc.split("Example:", 1)[1]
        assert "before:" in example and "after:" in example, rule.code
        assert "seed" not in rule.reference.lower(), (rule.code, rule.reference)
        assert rule.reference and rule.fix and rule.title
        # A pure predicate of one argument.
        assert list(inspect.signature(rule.check).parameters) == ["inputs"]


def test_fingerprint_fixes_name_the_compile_target():
    f = next(f for f in evaluate(hmma_kernel("9.0")).findings if f.code == "PS141")
    assert "sm_90a" in f.fix
    # PS142 on a real mma.sync kernel (the synthetic one above runs at its HMMA roof, where
    # TMA alone could save nothing and the rule is capped silent).
    rw = REFERENCE / "hgemm_bcf_dbf_rw-bf16-4096x4096x4096.ncu-rep.xz"
    f = next(f for r in _records(str(rw)) for f in r.evaluation.findings if f.code == "PS142")
    assert "sm_90a" in f.fix
    f = next(f for f in evaluate(hmma_kernel("10.0")).findings if f.code == "PS141")
    assert "sm_100a" in f.fix and "tcgen05" in f.fix
    f = next(f for f in evaluate(one("spill", 0), context=Context(dtype="bf16")).findings
             if f.code == "PS140")
    assert "sm_90a" in f.fix


@pytest.mark.parametrize("cc", ["8.0", "8.6", "8.9", "12.0"])
def test_mma_sync_is_right_on_ampere_ada_and_consumer_blackwell(cc):
    assert "legacy-mma" not in evaluate(hmma_kernel(cc)).tags


@pytest.mark.parametrize("cc", ["9.0", "10.0", "10.3"])
def test_mma_sync_is_legacy_on_hopper_and_datacenter_blackwell(cc):
    assert "legacy-mma" in evaluate(hmma_kernel(cc)).tags


# ----------------------------------------------------------------- the real captures


@pytest.mark.parametrize("name", ["cublas_sgemm_4096", "cublas_hgemm_4096", "cublas_bgemm_4096"])
def test_cublas_has_no_warning_or_worse(name):
    kp = one(name)
    dtype = {"cublas_sgemm_4096": "fp32"}.get(name, "fp16")
    for kw in ({}, {"context": Context(dtype=dtype)}):
        assert evaluate(kp, **kw).at_least("warning") == ()


def test_nvjet_raw_store_conflicts_are_not_bank_conflicts():
    kp = one("cublas_hgemm_4096")
    assert kp.memory.bank_conflicts_st > 100_000      # the misleading raw counter
    ev = evaluate(kp)
    assert "bank-conflicts" not in ev.tags and "occupancy-limited" not in ev.tags


def test_transpose_is_bank_conflicts_on_lds():
    ev = evaluate(one("smem_transpose"))
    f = next(f for f in ev.findings if f.tag == "bank-conflicts")
    assert f.code == "PS110" and f.severity == "warning"
    assert any(e.metric.startswith("LDS ") and e.value == 32.0 for e in f.evidence)
    assert f.ncu_rule.startswith("SharedMemoryConflicts") and f.ncu_speedup_pct > 50
    assert "uncoalesced-shared" not in ev.tags


def test_strided_is_uncoalesced_global_and_float4_is_clean():
    ev = evaluate(one("strided_copy"))
    assert [f.tag for f in ev.findings] == ["uncoalesced-global"]
    assert ev.findings[0].estimated_gain > 0.5
    assert evaluate(one("float4_copy")).findings == ()


def test_spill_capped_and_uncapped():
    capped = evaluate(one("spill", 1))
    assert "register-spills" in capped.tags
    assert {f.tag for f in capped.at_least("warning")} == {"register-spills"}
    assert evaluate(one("spill", 0)).findings == ()


def test_cpasync_excess_is_uncoalesced_shared_not_bank_conflicts():
    ev = evaluate(one("cublas_sgemm_4096"))
    assert "bank-conflicts" not in ev.tags
    f = next(f for f in ev.findings if f.tag == "uncoalesced-shared")
    # A real but small cost: its FMA pipe is 77% busy, so the replays cost ~2% of its time.
    assert f.severity in ("info", "optimization") and "LDGSTS" in f.fix


def test_many_launches_judged_per_launch():
    for kp in kernels("many_launches"):
        tags = evaluate(kp).tags
        if kp.name == "ps_strided_copy":
            assert "uncoalesced-global" in tags
        if kp.name == "ps_float4_copy":
            assert "uncoalesced-global" not in tags
        if kp.name == "ps_regs_capped":
            assert "register-spills" in tags


def test_narrow_report_fires_nothing():
    ev = evaluate(one("narrow_sol_only"))
    assert ev.findings == ()
    skipped = {n.code for n in ev.not_evaluated}
    assert {"PS101", "PS110", "PS120", "PS130", "PS141"} <= skipped
    assert all("not collected" in n.reason for n in ev.not_evaluated)


def _blank(view):
    """A view with every value missing, as a report from another chip would have it."""
    out = {}
    for f in dataclasses.fields(view):
        v = getattr(view, f.name)
        if isinstance(v, Traffic):
            out[f.name] = Traffic(None, None, None, ())
        elif isinstance(v, tuple):
            out[f.name] = ()
        elif isinstance(v, Mapping):
            out[f.name] = {}
        else:
            out[f.name] = None
    return dataclasses.replace(view, **out)


def test_missing_metrics_never_fire():
    """Blank each view of each capture in turn: a rule either stays silent or is not
    evaluated, it never fires on a None read as zero."""
    for name in ("strided_copy", "smem_transpose", "spill", "cublas_sgemm_4096", "cublas_hgemm_4096"):
        for kp in kernels(name):
            baseline = {f.code for f in evaluate(kp).findings}
            for view in ("stalls", "memory", "opcodes", "sol", "launch"):
                blank = dataclasses.replace(kp, **{view: _blank(getattr(kp, view))})
                fired = {f.code for f in evaluate(blank).findings}
                assert fired <= baseline, (name, view, fired - baseline)


def test_without_manifest_manifest_rules_are_not_evaluated():
    ev = evaluate(one("cublas_hgemm_4096"))
    assert {"PS151", "PS190", "PS191"} <= {n.code for n in ev.not_evaluated}


def test_wrong_result_is_an_error_above_everything():
    ev = evaluate(hmma_kernel(), manifest=manifest("WRONG"))
    assert ev.findings[0].code == "PS190" and ev.findings[0].severity == "error"


# ------------------------------------------------------------------------ the CLI

runner = CliRunner()


def test_rules_command_lists_the_table():
    result = runner.invoke(app, ["rules"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    for rule in REGISTRY:
        assert rule.code in result.output and rule.tag in result.output


def test_diagnose_shows_findings_above_nsight_computes():
    result = runner.invoke(app, ["diagnose", str(report("smem_transpose"))], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    out = result.output
    assert "perfscope findings" in out and "PS110" in out and "bank-conflicts" in out
    assert out.index("PS110") < out.index("Nsight Compute's own findings")
    assert "Nsight Compute SharedMemoryConflicts" in out     # its estimate beside ours


def test_diagnose_json_findings():
    import json

    result = runner.invoke(app, ["diagnose", "--json", str(report("spill"))])
    assert result.exit_code == 0, result.output
    uncapped, capped = json.loads(result.output)["kernels"]
    assert uncapped["findings"] == []
    f = capped["findings"][0]
    assert set(f) >= {"code", "tag", "title", "severity", "estimated_gain", "evidence", "fix"}
    assert f["tag"] == "register-spills"
    assert set(f["evidence"][0]) == {"metric", "value", "threshold"}
    assert any(n["code"] == "PS190" for n in capped["rules_not_evaluated"])


def test_diagnose_markdown_findings():
    result = runner.invoke(app, ["diagnose", "--markdown", str(report("strided_copy"))])
    assert result.exit_code == 0
    assert "**perfscope findings**" in result.output and "PS101" in result.output


def test_diagnose_reads_the_manifest_beside_the_report(tmp_path):
    import json
    import shutil

    rep = tmp_path / "hgemm_naive-fp16-4096x4096x4096.ncu-rep.xz"
    shutil.copy(report("float4_copy"), rep)
    (tmp_path / "hgemm_naive-fp16-4096x4096x4096.json").write_text(
        json.dumps(manifest("WRONG").to_dict()))
    result = runner.invoke(app, ["diagnose", "--json", str(rep)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["kernels"][0]["findings"][0]["code"] == "PS190"
    # A broken manifest is logged and the report is still diagnosed.
    (tmp_path / "hgemm_naive-fp16-4096x4096x4096.json").write_text("{broken")
    result = runner.invoke(app, ["diagnose", "--json", str(rep)])
    assert result.exit_code == 0


def test_exposed_latency_fix_knows_whether_the_loads_are_already_asynchronous():
    """hgemm_bcf stages its tiles with cp.async (LDGSTS) into one buffer: the advice is more
    stages, not "use cp.async". Triton's one-stage kernel stages them with LDG + STS: there
    the async ring is the fix."""
    from perfscope.diagnosis import diagnose

    (bcf,) = diagnose([REFERENCE / "hgemm_bcf-fp16-4096x4096x4096.ncu-rep.xz"])
    (one,) = diagnose([FIXTURES.parent / "external" / "triton_one_stage.ncu-rep.xz"])
    fix = {d.label: next(f.fix for f in d.evaluation.findings if f.code == "PS120") for d in (bcf, one)}
    assert "already arrive asynchronously (cp.async in the SASS)" in fix[bcf.label]
    assert "add stages" in fix[bcf.label] and "3-4 stage cp.async ring" not in fix[bcf.label]
    assert "3-4 stage cp.async ring" in fix[one.label]


def test_epilogue_fix_follows_where_the_accumulators_live():
    """PS124 on wgmma (the real fused report) says ping-pong; the same counters with the
    MMA on tcgen05 (synthetic: no Blackwell capture exists) say tensor-memory double
    buffering, since there the accumulators are not in the consumers' registers."""
    kp, kw = fused("hgemm_fused_bias_act-bf16-4096x4096x4096")
    (f,) = [f for f in evaluate(kp, **kw).findings if f.code == "PS124"]
    assert "ping-pong" in f.fix and "tensor memory" not in f.fix and "{" not in f.fix
    fams = {("utcmma" if k == "gmma" else k): v for k, v in kp.opcodes.families.items()}
    blackwell = with_families(kp, fams, cc="10.0")
    (g,) = [g for g in evaluate(blackwell, **kw).findings if g.code == "PS124"]
    assert "tensor memory" in g.fix and "ping-pong" not in g.fix


def test_dram_bound_advice_does_not_ask_for_depth_past_the_latency():
    """hgemm_small_m's 12-stage ring streamed 6% slower than its 8-stage one (the committed
    pair at 16x8192x8192, ncu 37.6 against 35.5 us; the deeper one sits near PS170's
    threshold, 0.839-0.845 of the practical DRAM rate in two captures). Where a 12-stage
    ring is below the rate in every capture (A multicast in pairs at 64x8192x8192: 0.81 and
    0.84), PS170 gives the shared memory per SM it holds in flight and does not tell it to
    go deeper; the 8-stage one (0.89-0.90) gets no finding."""
    deep = "hgemm_small_m@BN=64,MCAST=2,STAGES=12-bf16-64x8192x8192"
    shallow = "hgemm_small_m@AROWS=16,BN=64-bf16-16x8192x8192"
    kp, kw = fused(deep)
    (f,) = [f for f in evaluate(kp, **kw).findings if f.code == "PS170"]
    row = next(e for e in f.evidence if e.metric.startswith("shared memory per SM"))
    assert row.value == 12 * 16384 + 1024   # 12 slots of 8 KB of A and 8 KB of B
    assert "no deeper" in f.fix and "deeper TMA ring" not in f.fix
    assert f.fix.startswith("Reach the DRAM rate:")
    kp, kw = fused(shallow)
    assert "PS170" not in {g.code for g in evaluate(kp, **kw).findings}
    # An elementwise kernel that loads with plain LDGs has no ring to size: no such row.
    kp, kw = external("torch_gelu_after_mm", 1)
    (f,) = [f for f in evaluate(kp, **kw).findings if f.code == "PS170"]
    assert not any(e.metric.startswith("shared memory per SM") for e in f.evidence)


def test_short_runs_name_the_boxes_and_bound_their_estimate():
    """PS172 on hgemm_small_m at 16 x 8192^2: the evidence names B's boxes (64 rows of 128
    bytes, 16 KB apart) and its share of the bytes; the estimate is the measured 5% of the
    stream times that share times the stream's share of the time, under the gap to the DRAM
    rate; it composes with PS170 (same gap) as the larger, never the sum. Without a manifest
    (a program's kernel, cuBLAS) the boxes are unknown and the rule says so."""
    from perfscope.rules.roofline import SHORT_RUN_LOSS

    kp, kw = fused(SMALL_M_M16)
    ev = evaluate(kp, **kw)
    (f,) = [f for f in ev.findings if f.code == "PS172"]
    rows = {e.metric: e.value for e in f.evidence}
    (b,) = [k for k in rows if k.startswith("B's contiguous bytes")]
    assert rows[b] == 128 and "rows 16384 bytes apart (row-major)" in b
    assert not any(k.startswith("A's") for k in rows)     # A: 16 rows, read from L2
    share = rows["short-run operands' share of the compulsory bytes"]
    stream = next(v for k, v in rows.items() if k.startswith("bytes / time"))
    assert 0.99 < share <= 1 and 0.85 < stream < 0.95
    assert f.estimated_gain == pytest.approx(SHORT_RUN_LOSS * share * stream, abs=2e-3)
    # About a percent (the measured step): information, not an optimization to chase first.
    assert f.severity == "info" and "hgemm_small_m_packed" in f.fix
    # The deeper ring's report: PS170 fires too. PS172 is a cause inside PS170's gap (the
    # envelope): the kernel's combined estimate is the envelope or the causes, the larger.
    kp, kw = fused("hgemm_small_m@AROWS=16,BN=64,STAGES=12-bf16-16x8192x8192")
    ev = evaluate(kp, **kw)
    by = {f.code: f for f in ev.findings}
    assert by["PS172"].group == "global memory" and by["PS170"].group == "roofline"
    causes = [(f.group, f.estimated_gain) for f in ev.findings
              if f.estimated_gain and f.group != "roofline"]
    assert ev.combined_gain == pytest.approx(
        max(by["PS170"].estimated_gain, combine(causes)), abs=1e-4)
    kp, kw = external("torch_decode_m16")
    (skip,) = [n for n in evaluate(kp, **kw).not_evaluated if n.code == "PS172"]
    assert "tensor map" in skip.reason


def test_misaligned_tma_counts_the_requests_the_straddling_rows_add():
    """PS106 on the column-split probe: 34.8M sectors in 11.8M requests where its boxes'
    128-byte rows make 4 per request; (4 R - S) / 3 = 4.1M rows split, 35% of the requests,
    times the main loop's operand waits (long-scoreboard samples at its PCs, 0.199 of all
    samples): 0.069. It shares the latency group with PS120. Without the boxes it takes rows
    of a line where requests carry over 2 sectors, clears a kernel at 3.4 or more (cuBLAS's
    nvjet, 4.0) and is not evaluated at 2 or fewer; with other global loads beside TMA
    (their requests hold other sector counts) it is not evaluated either."""
    from perfscope.metrics import M_L2_READ_REQUESTS, M_L2_READ_SECTORS

    kp, kw = probe(SPLIT_PROBE)
    ev = evaluate(kp, **kw)
    (f,) = [f for f in ev.findings if f.code == "PS106"]
    rows = {e.metric.split(" (")[0]: e.value for e in f.evidence}
    s, r = kp.metric(M_L2_READ_SECTORS), kp.metric(M_L2_READ_REQUESTS)
    assert rows[f"{M_L2_READ_SECTORS} / {M_L2_READ_REQUESTS}"] == round(s / r, 2) == 2.95
    added = rows["L2 read requests the straddling rows add / all"]
    assert added == pytest.approx((4 * r - s) / 3 / r, abs=1e-3) and 0.34 < added < 0.36
    waits = rows["long_scoreboard samples in the main loop / all samples"]
    assert waits == round(kp.hot_loop.operand_waits, 3) and 0.19 < waits < 0.21
    assert f.raw_gain == pytest.approx(kp.hot_loop.operand_waits * added, abs=1e-4)
    assert f.group == "latency" and f.severity == "optimization" and "128-byte row" in f.fix
    assert "B 64 x 128 B" in next(e.threshold for e in f.evidence if "/" in e.metric)
    kp, kw = external("cublaslt_bf16_4096")
    assert "PS106" in evaluate(kp, **kw).silent
    kp, kw = probe(SPLIT_PROBE)
    unknown = {**kw, "context": dataclasses.replace(kw["context"], reads=None)}
    (f,) = [f for f in evaluate(kp, **unknown).findings if f.code == "PS106"]
    assert "taken as a line" in f.evidence[0].threshold
    narrow = with_metric(kp, M_L2_READ_REQUESTS, s / 1.9)
    (skip,) = [n for n in evaluate(narrow, **unknown).not_evaluated if n.code == "PS106"]
    assert "tensor map" in skip.reason
    ldg = OpcodeTraffic("LDG.E.128", "load", 1, 0.2 * s, 0.2 * s)
    mixed = dataclasses.replace(kp, memory=dataclasses.replace(
        kp.memory, global_=Traffic(0.2 * s, 0.2 * s, 0.0, (ldg,))))
    (skip,) = [n for n in evaluate(mixed, **kw).not_evaluated if n.code == "PS106"]
    assert "TMA alone" in skip.reason and "20%" in skip.reason


def test_misaligned_tma_estimate_against_what_aligning_saved():
    """Two kernels, each profiled with and without straddling rows in one H100 call. The
    split against the same pieces aligned: PS106 says 0.079 where aligning saved 0.136 under
    ncu (0.135 by events): an under-estimate, its pieces' own k loops (the last round's)
    lying outside the main loop. cuBLAS's nvjet with A's rows 8,080 bytes apart against the
    same GEMM at 8,192 (a kernel we did not write; its maps go through a pointer, so the
    rows are taken as a line): twice the requests, 0.017 where padding saved 0.024 under
    ncu and 0.004 / 0.020 by events. Reading every long-scoreboard stall instead of the main
    loop's said 0.180 and 0.120: cuBLAS's are its producer waiting for free slots."""
    for bad, good, low, high in (("column-split-h100", "column-split-aligned-h100", 0.07, 0.09),
                                 ("column-split-h200", "column-split-aligned-h200", 0.065, 0.085),
                                 ("cublas-ld4040-h100", "cublas-ld4096-h100", 0.012, 0.022)):
        kp, kw = probe(bad)
        (f,) = [f for f in evaluate(kp, **kw).findings if f.code == "PS106"]
        aligned, akw = probe(good)
        assert "PS106" in evaluate(aligned, **akw).silent
        saved = 1 - aligned.sol.duration_ns / kp.sol.duration_ns
        assert low < f.estimated_gain < high and f.estimated_gain < saved < 2 * f.estimated_gain, bad


def test_misaligned_tma_gives_no_estimate_without_register_roles():
    """Triton's TMA matmul (no setmaxnreg: its warps load and multiply alike) with A's rows
    8,080 bytes apart on the H200: twice the requests, operand waits 0.34 of the samples
    against 0.19 aligned, and 1.022-1.026x the time by events (probes/triton-leading-dim-h200*):
    waits x added requests would say 0.20, eight times what padding saved. The finding
    stands, with its evidence, and no estimate; a kernel with roles keeps one."""
    kp, kw = probe("triton-ld4040-h200")
    (f,) = [f for f in evaluate(kp, **kw).findings if f.code == "PS106"]
    assert f.estimated_gain is None and f.severity == "optimization"
    ev = {e.metric: e.value for e in f.evidence}
    assert ev["register roles (setmaxnreg) in the SASS"] == "none"
    assert 0.3 < ev["long_scoreboard samples in the main loop / all samples (its warps waiting "
                    "for operands)"] < 0.4
    aligned, akw = probe("triton-ld4096-h200")
    assert "PS106" in evaluate(aligned, **akw).silent
    assert 0.02 < 1 - aligned.sol.duration_ns / kp.sol.duration_ns < 0.04   # 186.6 / 191.7 us
    roles, rkw = probe("cublas-ld4040-h100")
    (g,) = [g for g in evaluate(roles, **rkw).findings if g.code == "PS106"]
    assert g.estimated_gain is not None


def test_loads_not_overlapped_reads_a_warp_specialised_kernels_consumers():
    """PS120 on cuBLASLt's GELU_BIAS at M = 256, a warp-specialised nvjet: 0.70 of its stalls
    are long scoreboard, but its main loop's operand waits are 0.34 of the samples; the
    estimate reads the latter (raw 0.28, not 0.58). A kernel without warp roles keeps the
    stall share (hgemm_bcf's 0.37)."""
    kp, kw = external("cublaslt_gelu_bias_m256_4096")
    (f,) = [f for f in evaluate(kp, **kw).findings if f.code == "PS120"]
    assert f.evidence[0].metric.startswith("long_scoreboard samples in the main loop")
    assert f.evidence[0].value == round(kp.hot_loop.operand_waits, 3) and 0.33 < f.evidence[0].value < 0.35
    assert 0.27 < f.raw_gain < 0.30
    kp, kw = reference("hgemm_bcf", "bf16")
    (f,) = [f for f in evaluate(kp, **kw).findings if f.code == "PS120"]
    assert f.evidence[0].metric == "stall share of long_scoreboard" and 0.36 < f.evidence[0].value < 0.38


def test_a_combined_estimate_at_its_cap_is_rounded_down_to_it():
    """hgemm_small_m at 16 x 14336 x 4096 told no machine setting (its carve-out then reads
    as its own: PS161) has findings that compose past its headroom (0.230189) and past its
    gap to its floor (0.056684; PS161 alone says 0.57, PS152 0.15): each finding and the
    combined estimate are that gap rounded down (0.0566), never up past it (0.0567)."""
    kp, kw = fused("hgemm_small_m@AROWS=16,STAGES=6-bf16-16x14336x4096")
    ev = evaluate(kp, **{**kw, "context": dataclasses.replace(kw["context"], machine={})})
    by_code = {f.code: f for f in ev.findings}
    assert by_code["PS161"].raw_gain > ev.headroom.fraction > ev.headroom.floor_fraction
    assert by_code["PS152"].raw_gain > ev.headroom.floor_fraction
    assert {by_code[c].estimated_gain for c in ("PS161", "PS152")} == {0.0566}
    assert ev.combined_gain == 0.0566 <= ev.headroom.floor_fraction < 0.05669


def test_memory_bound_estimates_stay_inside_the_floor():
    """Memory-bound work cannot run faster than its floor (a launch's fixed time plus its
    bytes at the practical DRAM rate): the transpose's bank conflicts (PS110, 0.67 by the
    rule, the headroom to the DRAM peak) are capped at its gap to that floor (0.60), and in a
    launch so short that the fixed time is most of it, at 0.09 where the rule said 0.40;
    PS173, whose fix removes the fixed time itself, is not held by the floor. Together the
    causes inside the envelope save no more than the gap, then the fixed time's share."""
    for kp in (one("smem_transpose"), one("many_launches", 18)):
        ev = evaluate(kp)
        floor = ev.headroom.floor_fraction
        assert floor is not None and ev.headroom.bound == "DRAM"
        (f,) = [f for f in ev.findings if f.code == "PS110"]
        assert f.raw_gain > floor and f.capped_by == "gap to the floor"
        assert f.estimated_gain == f.bounded_gain == math.floor(floor * 1e4) / 1e4
        for g in ev.findings:
            if g.code != "PS173" and g.estimated_gain is not None:
                assert g.estimated_gain <= floor
    (fixed,) = [f for f in ev.findings if f.code == "PS173"]
    assert fixed.estimated_gain > floor and fixed.capped_by is None
    assert ev.combined_gain == pytest.approx(1 - (1 - floor) * (1 - fixed.estimated_gain), abs=1e-4)
    # What the causes inside the envelope compose to is bounded; the fixed time stays outside.
    assert combine([("shared memory", 0.5), ("global memory", 0.5)], 0.6) == 0.6
    assert combine([("shared memory", 0.5), ("fixed time", 0.5)], 0.2) == pytest.approx(0.6)
    assert combine([("shared memory", 0.5), ("global memory", 0.5)]) == 0.75


def test_bytes_into_shared_memory_are_measured_at_the_crossbar():
    """PS114's incoming bytes: the crossbar's share of its peak x 4 sectors per clock x the
    L1TEX cycles reproduces, to the sector, the TMA bytes the tiles bring: the persistent
    stage's 512 tiles of (128 + 256) x 4096 x 2 bytes, and the paired 128 x 64 tiles' 24 KB
    per k tile in each of 128 CTAs (multicast B counted in both) plus 512 sectors of bias
    loads. L2's own read count sees about half of those TMA bytes (0.54 of them for the
    persistent stage since its k order, 0.47 before), so without the crossbar the rule takes
    the manifest's tile, and with neither the L2 reads, a lower bound."""
    from perfscope.metrics import M_L2_READ_SECTORS, M_XBAR_IN_PCT
    from perfscope.rules import memory

    persistent, _ = reference("hgemm_tma_wgmma_persistent", "bf16")
    assert memory._xbar_in_sectors(persistent) == pytest.approx(512 * 384 * 4096 * 2 / 32, rel=1e-6)
    assert persistent.metric(M_L2_READ_SECTORS) < 0.6 * memory._xbar_in_sectors(persistent)
    pairs, extra = fused("hgemm_small_m@AROWS=128,BM=128,BN=64,MPAIR=2-bf16-256x4096x14336")
    assert memory._xbar_in_sectors(pairs) == pytest.approx(128 * 224 * 24 * 1024 / 32 + 512,
                                                          rel=1e-6)
    (finding,) = [f for f in evaluate(pairs, **extra).findings if f.code == "PS114"]
    incoming = next(e for e in finding.evidence if e.metric.startswith("bytes into shared"))
    assert M_XBAR_IN_PCT in incoming.threshold
    # The crossbar's share blanked: the manifest's tile gives the same roof.
    blind = dataclasses.replace(pairs, metrics=ChainMap({M_XBAR_IN_PCT: (None, "")}, pairs.metrics))
    assert memory._xbar_in_sectors(blind) is None
    (again,) = [f for f in evaluate(blind, **extra).findings if f.code == "PS114"]
    assert again.estimated_gain == pytest.approx(finding.estimated_gain, rel=0.01)
    assert "manifest" in next(e for e in again.evidence
                              if e.metric.startswith("bytes into shared")).threshold


def test_small_tile_reads_each_tiles_own_bytes_per_flop():
    """PS104 counts the bytes entering the SMs at the crossbar, which gives each tile its
    arithmetic, (BM + BN) x 2 / (2 BM BN) bytes per FLOP against a 128 x 256 tile's: 1.00 for
    the persistent stage's 128 x 256 TMA tiles, 1.33 for hgemm_tma_wgmma's 128 x 128, 2.67
    for Triton's 64 x 64 (the one that fires). L2's read counter, which it read before,
    put the 128 x 256 TMA tiles at 0.47 (0.54 since the persistent stage's k order), under
    what such a tile must read."""
    from perfscope.metrics import M_L2_READ_SECTORS
    from perfscope.rules import memory
    from perfscope.rules.bounds import work_of
    from perfscope.rules.model import Inputs

    reference_bytes = (128 + 256) * 2 / (2 * 128 * 256)

    def ratio(kp, extra, count):
        flops = work_of(Inputs(profile=kp, manifest=extra["manifest"])).flops
        return count / flops / reference_bytes

    for (kp, extra), tile in ((reference("hgemm_tma_wgmma_persistent", "bf16"), 1.0),
                              (reference("hgemm_tma_wgmma", "bf16"), 4 / 3),
                              (external("triton_64x64"), 8 / 3)):
        into, source = memory.bytes_into_sms(kp)
        assert source == memory.CROSSBAR_SOURCE
        assert ratio(kp, extra, into) == pytest.approx(tile, rel=0.01)
    kp, extra = reference("hgemm_tma_wgmma_persistent", "bf16")
    assert ratio(kp, extra, kp.metric(M_L2_READ_SECTORS) * 32) < 0.6
    kp, extra = external("triton_64x64")
    (finding,) = [f for f in evaluate(kp, **extra).findings if f.code == "PS104"]
    assert "2.7x" in finding.fix


def test_small_tile_holds_a_kernel_to_a_tile_that_still_fills_its_ctas():
    """At 256x4096x4096 hgemm_small_m's 128 x 64 tiles take in 2.0x a 128 x 256 tile's bytes
    per FLOP with L2 75% busy, and PS104 said so (est. 0.38) on a kernel that ran 0.82x
    cuBLASLt's cycles there (tests/fixtures/external/cublaslt_gelu_bias_m256_4096). But a
    128 x 256 tile makes 32 tiles of that problem for the 128 CTAs the kernel fills, and
    hgemm_small_m's sweep of larger tiles (fused/small-m-tiles.json: 128 x 128 at 1.005 and
    128 x 256 at 0.824 of cublas+gelu, against 1.107) found none faster. The reference is
    the largest-reuse tile that still makes as many tiles as the kernel fills SMs: here 64 x
    128 or 128 x 64, the kernel's own. Without the manifest's shape it stays 128 x 256."""
    from perfscope.rules import memory

    kp, extra = fused("hgemm_small_m@AROWS=128,BM=128,BN=64-bf16-256x4096x4096")
    assert kp.launch.grid_size == 128 and kp.identity.sm_count == 132
    bm, bn, why = memory._reference_tile(kp, extra["manifest"])
    assert (bm, bn) in ((64, 128), (128, 64)) and "128 tiles" in why
    assert memory._reference_tile(kp, None) == (128, 256, "")
    assert "PS104" not in codes(kp, **extra)
    # Triton's 64 x 64 tiles at 4096^3 fill 132 SMs with 4096 CTAs; 128 x 256 makes 512 tiles.
    kp, extra = external("triton_64x64")
    assert memory._reference_tile(kp, extra["manifest"]) == (128, 256, "")
    # A kernel that fills its 128 CTAs by splitting K (64 x 4096^2, 64 x 64 tiles in two K
    # slabs): no tile of the problem makes 128, so the reference is the one that makes the
    # most, 64 x 64 with 64, not the strictest (64 x 256).
    kp, extra = fused("hgemm_small_m@BN=64-bf16-64x4096x4096")
    assert kp.launch.grid_size == 128
    assert memory._reference_tile(kp, extra["manifest"]) == (
        64, 64, ": the one that makes the most tiles, 64")


def test_small_tile_leaves_a_multicasting_kernel_unjudged():
    """The crossbar counts a multicast tile in every CTA it lands in, while L2 sends it once:
    with UTMALDG .MULTICAST executed, PS104 cannot say how much L2 moves and stays silent
    (so the cluster it advises leaves nothing to fire on). Synthetic: Triton's 64x64 capture,
    which fires, with multicast TMA loads added to its opcode counts."""
    kp, extra = external("triton_64x64")
    assert "PS104" in {f.code for f in evaluate(kp, **extra).findings}
    ops = dict(kp.opcodes.with_modifiers, **{"UTMALDG.2D.MULTICAST": 1000.0})
    multicast = dataclasses.replace(kp, opcodes=dataclasses.replace(kp.opcodes, with_modifiers=ops))
    assert "PS104" not in {f.code for f in evaluate(multicast, **extra).findings}


def test_fence_stalls_of_parked_warps_are_not_a_finding():
    """The pulled kernel (64x4096x4096, 2026-12-02) had PS126 fire at 13.2% membar stalls
    with an estimate of 0.107 against the 0.057 that pushing the partial saved
    (fused/probe-push.json). Those stalls sit at fused.cu:618-619, the producer warpgroup's
    two cluster barriers (each a fence ERRBAR, an arrive and a wait, 3 and 4 warp passes per
    CTA, with nothing but branches between them and EXIT), where the warps wait out the
    kernel: without them 1.2%, and PS126 is silent. Read as if the report could not say
    where warps park, it fires, names the cluster barrier's fence, and its estimate is no
    bound worth the name (1.9x the saving)."""
    import json

    kp, kw = fused(SMALL_M_SPLIT)
    (parked,) = kp.parked
    assert parked.line == 618 and {0x5C00, 0x5C20, 0x5CA0, 0x5D50, 0x5D70, 0x5E70} <= set(
        parked.addresses)
    assert dict(parked.reasons)["membar"] > 0.9 * sum(s.samples or 0 for s in kp.stalls.reasons
                                                       if s.reason == "membar")
    assert "PS126" not in {f.code for f in evaluate(kp, **kw).findings}
    assert 0.01 < kp.working_stall_share("membar") < 0.015 < 0.13 < kp.stalls.share("membar")
    f = next(f for f in evaluate(_unparked(kp, kw)[0], **kw).findings if f.code == "PS126")
    rows = json.loads((REFERENCE / "fused" / "probe-push.json").read_text())["rows"]
    saved = 1 - next(r["time_ratio"] for r in rows if r["shape"] == "64x4096x4096")
    assert 1.5 * saved < f.raw_gain < 2.5 * saved, (f.raw_gain, saved)
    assert "st.async" in f.fix and "UCGABAR_ARV" in f.fix


def test_fence_fix_for_a_fence_of_its_own():
    """A membar-stalled kernel with no cluster barrier among its hotspots gets the scoping
    advice, not the push (synthetic: the pulled kernel's hotspots without its cluster
    barriers; no capture shows a __threadfence() wait)."""
    kp, kw = _unparked(*fused(SMALL_M_SPLIT))
    kp = dataclasses.replace(kp, hotspots=tuple(h for h in kp.hotspots
                                                if not h.opcode.startswith("UCGABAR")))
    f = next(f for f in evaluate(kp, **kw).findings if f.code == "PS126")
    assert "fence.acq_rel.cluster" in f.fix and "st.async" not in f.fix
    assert any("ERRBAR" in str(e.value) for e in f.evidence)


def test_fence_without_pc_sampling_names_both_fixes():
    """A report without PC sampling cannot say where the fence sits: PS126 says so in its
    evidence and gives both fixes, never the plain fence's alone (synthetic: the pulled
    kernel's report with its hotspots removed)."""
    kp, kw = _unparked(*fused(SMALL_M_SPLIT))
    f = next(f for f in evaluate(dataclasses.replace(kp, hotspots=()), **kw).findings
             if f.code == "PS126")
    assert "st.async" in f.fix and "fence.acq_rel.cluster" in f.fix
    assert any("not collected" in str(e.value) for e in f.evidence)


def test_fixed_time_lies_outside_the_bandwidth_gap():
    """PS173 on hgemm_small_m at 64 x 4096^2 (a 32 MiB weight in 13.5 us on the H200): the
    launch's 2.5 us are 19% of it, and PS170's gap starts at that floor (the fixed time
    plus the bytes at the practical rate). The two compose as independent savings, never one
    inside the other: 1 - (1 - PS170) (1 - PS173), where a cause inside PS170's envelope
    counts as the larger of the two."""
    from perfscope.hardware import KERNEL_FIXED_NS

    kp, kw = fused("hgemm_small_m@BN=64-bf16-64x4096x4096")
    ev = evaluate(kp, **kw)
    by = {f.code: f for f in ev.findings}
    fixed = KERNEL_FIXED_NS["9.0"]
    t = kp.sol.duration_ns
    assert by["PS173"].estimated_gain == pytest.approx(fixed / t, abs=1e-3)
    assert by["PS173"].group == "fixed time" and by["PS173"].severity == "optimization"
    floor = ev.headroom.t_floor_ns
    assert floor == pytest.approx(fixed + ev.headroom.t_bytes_ns / 0.89, rel=1e-6)
    assert by["PS170"].estimated_gain == pytest.approx(1 - floor / t, abs=1e-3)
    a, b = by["PS170"].estimated_gain, by["PS173"].estimated_gain
    assert combine([("roofline", a), ("fixed time", b)]) == pytest.approx(1 - (1 - a) * (1 - b))
    assert combine([("roofline", 0.2), ("global memory", 0.1), ("fixed time", 0.2)]) == \
        pytest.approx(0.36)
    # A chip whose fixed time is not measured: the rule says so.
    assert KERNEL_FIXED_NS.get("8.0") is None


def test_a_program_without_a_shape_is_bounded_by_its_measured_bytes():
    """A program captured without --shape has a manifest that says 0x0x0: its work is the
    report's own (the DRAM bytes measured, the SASS's FLOPs), not a zero-sized GEMM that
    left every launch of kernel_floor's capture without a roofline."""
    kp, kw = probe("kernel-floor-h200", 13)
    assert not kw["manifest"].shape_known
    ev = evaluate(kp, **kw)
    assert ev.headroom is not None and ev.headroom.bound == "DRAM"
    assert 0.05 < ev.headroom.fraction < 0.12       # a 1 GiB read at 0.92 of the DRAM peak
    assert not any(e.metric == "problem shape (run manifest)"
                   for f in ev.findings for e in f.evidence)


def test_the_bytes_written_count_what_the_stores_wrote():
    """cuBLAS's in-place bias + GELU pass at 4096^2: ncu counted 6.4 MiB of DRAM writes
    because the L2 still held the rest when the kernel ended; its stores wrote 32 MiB, and
    the work's bytes count them."""
    from perfscope.metrics import M_DRAM_READ, M_DRAM_WRITE
    from perfscope.rules.bounds import dram_bytes_moved

    kp, _ = fused("cublas+gelu-bf16-4096x4096x4096", 1)
    assert kp.metric(M_DRAM_WRITE) < 0.25 * 2**25
    moved = dram_bytes_moved(kp)
    assert moved == pytest.approx(kp.metric(M_DRAM_READ) + 2**25, rel=0.01)


def test_idle_sms_cost_memory_bound_work_no_more_than_its_gap_to_the_floor():
    """hgemm_small_m at 16 x 14336 x 4096: 112 CTAs leave 20 of 132 SMs idle (0.15), but the
    stream runs at 0.94 of its floor, so PS152 says 0.06; perfscope's read stream of 1 GiB
    (1.33 waves) runs past its floor, and PS150 is silent there."""
    kp, kw = fused("hgemm_small_m@AROWS=16,STAGES=6-bf16-16x14336x4096")
    ev = evaluate(kp, **kw)
    (f,) = [f for f in ev.findings if f.code == "PS152"]
    gap = 1 - ev.headroom.t_floor_ns / kp.sol.duration_ns
    assert kp.launch.grid_size == 112
    assert f.estimated_gain == pytest.approx(gap, abs=1e-3) and gap < 1 - 112 / 132 - 0.05
    kp, kw = probe("kernel-floor-h200", 13)
    assert kp.launch.waves_per_sm == pytest.approx(4 / 3)
    assert "PS150" not in {g.code for g in evaluate(kp, **kw).findings}


def test_no_change_inside_a_kernel_takes_it_below_an_empty_launch():
    """An empty kernel of one CTA (1.54 us under ncu on the H200, 2.11 us on an H100) leaves
    131 of 132 SMs idle, which PS152 alone called 0.99 of its time: a kernel that short has
    nothing to save but its launch, and gets no finding. Made 10 us long with a block of 256
    threads (a synthetic edge: only the duration and the block changed; one CTA of a warp's
    threads or fewer has nothing to spread, which PS152 leaves alone) it is held at
    1 - 1536 / 10000 by the empty launch; PS173, whose fix removes the launch, is not (the
    16 KiB read stream: 2.5 of its 2.72 us)."""
    for name in ("kernel-floor-h200", "kernel-floor-h100"):
        kp, kw = probe(name, 0)
        ev = evaluate(kp, **kw)
        assert kp.launch.grid_size == 1 and kp.identity.device.startswith(("NVIDIA H200", "NVIDIA H100"))
        assert not ev.findings and ev.combined_gain is None
    kp, kw = probe("kernel-floor-h200", 0)
    longer = dataclasses.replace(kp, sol=dataclasses.replace(kp.sol, duration_ns=10_000.0),
                                 identity=dataclasses.replace(kp.identity, block=(256, 1, 1)))
    ev = evaluate(longer, **kw)
    assert "PS152" in evaluate(dataclasses.replace(longer, identity=kp.identity), **kw).silent
    assert math.prod(kp.identity.block) <= 32
    (f,) = [f for f in ev.findings if f.code == "PS152"]
    assert f.raw_gain > 0.99 and f.capped_by == "empty launch's time"
    assert f.estimated_gain == ev.combined_gain == 0.8464
    kp, kw = probe("kernel-floor-h200", 1)
    (f,) = [f for f in evaluate(kp, **kw).findings if f.code == "PS173"]
    assert f.estimated_gain > 1 - 1536 / kp.sol.duration_ns and f.capped_by is None
    from perfscope.hardware import empty_kernel_ns
    assert empty_kernel_ns("NVIDIA H100 80GB HBM3", "9.0") == 2112.0
    assert empty_kernel_ns("NVIDIA H800", "9.0") == 1536.0     # its chip's least
    assert empty_kernel_ns("NVIDIA A100-SXM4-80GB", "8.0") is None


def test_rows_not_16_byte_aligned_name_the_layout_not_its_symptoms():
    """cuBLAS at 4095^3 bf16 (an H100 capture): rows 8,190 bytes apart, which TMA, 16-byte
    copies and vector loads cannot address, so it runs an sm_75 align1 kernel (2-byte LDGs,
    mma.sync) at 153 TFLOP/s. PS107 names the layout with the gap to the rate aligned
    kernels reach (0.79, not held to the gap to the reference, which has the same rows,
    nor by being near it), the fallback's symptoms stay optimizations at that gap, and
    PS142 does not ask for TMA. The aligned 4096^3 nvjet kernel draws no PS107."""
    kp, kw = external("torch_odd_4095")
    ev = evaluate(kp, **kw)
    by = {f.code: f for f in ev.findings}
    f = by["PS107"]
    assert f.severity == "warning" and f.capped_by is None and 0.75 < f.estimated_gain < 0.82
    assert [e.value for e in f.evidence[:3]] == [8190, 8190, 8190]
    assert "PS142" not in by and ev.reference_cap is not None and ev.reference_cap < 0.1
    assert all(by[c].severity == "optimization" for c in ("PS101", "PS102", "PS141"))
    assert ev.combined_gain == f.estimated_gain and not ev.notes
    kp, kw = external("torch_odd_k")          # only A's rows: K = 4095
    (f,) = [f for f in evaluate(kp, **kw).findings if f.code == "PS107"]
    assert f.evidence[0].metric.startswith("operand A's rows") and f.evidence[1].metric.startswith("global")
    for name in ("torch_bf16_4096", "torch_odd_m"):    # an odd M leaves every row aligned
        kp, kw = external(name)
        assert "PS107" in evaluate(kp, **kw).silent
    kp, _ = external("torch_odd_4095")
    assert "PS107" in {n.code for n in evaluate(kp).not_evaluated}     # no manifest: no shape


def test_eight_bit_operands_along_n_name_the_layout():
    """torch._int_mm at 4096^3 with B[K][N] (an H100 capture): cuBLASLt runs an sm_80 WMMA
    kernel (IMMA, byte-wide shared loads) at 128 TOPS: PS108 asks for B K-major (0.91 of
    the time, against the practical int8 rate), and the work is held to the 8-bit tensor
    peak with an int32 C. perfscope's own fp8 stage, TN, draws no PS108."""
    kp, kw = external("torch_int8_4096")
    ev = evaluate(kp, **kw)
    (f,) = [f for f in ev.findings if f.code == "PS108"]
    assert f.severity == "warning" and 0.85 < f.estimated_gain < 0.95
    assert ev.headroom.bound == "math (tensor8)" and ev.headroom.work.dtype == "int8"
    assert ev.headroom.work.bytes == 2 * 4096 * 4096 + 4 * 4096 * 4096
    assert "dram-bound" not in {g.tag for g in ev.findings}
    kp, kw = fp8("hgemm_fp8")
    assert "PS108" in evaluate(kp, **kw).silent


def test_fp32_on_tf32_tensor_cores_is_held_to_the_tf32_peak():
    """cuBLAS with allow_tf32 (an H100 capture) runs HGMMA.64x256x8.F32.TF32 on fp32 data:
    held to the FFMA pipe it had no headroom at all, to the 16-bit tensor peak 56%; on the
    TF32 peak it has 12%, and no finding above an optimization."""
    kp, kw = external("torch_tf32_4096")
    ev = evaluate(kp, **kw)
    assert ev.headroom.bound == "math (tf32)" and 0.10 < ev.headroom.fraction < 0.15
    assert not [f for f in ev.findings if severity_rank(f.severity) >= severity_rank("warning")]
    from perfscope.rules.bounds import infer_dtype
    assert infer_dtype(kp)[0] == "fp32"
    kp, _ = external("torch_int8_4096")
    assert infer_dtype(kp)[0] == "int8"


def test_an_l1tex_busy_with_its_own_copies_is_the_bound():
    """Triton's TF32 matmul (H100): L1TEX 90% busy with 4-byte cp.async at 16x the shared
    wavefronts, long_scoreboard 77% of the stalls and few throttle stalls (0.08): the unit
    is the bound, so PS120 (a deeper ring) and PS131 (more warps) do not speak. L1TEX as busy
    from wgmma's operand reads (cuBLAS: 73%, warp-specialised, TMA) confirms nothing, and
    triton_one_stage (78%) stays below the saturation line."""
    from perfscope.rules.facts import saturated_unit
    kp, kw = external("triton_tf32")
    assert saturated_unit(kp) == ("l1tex", pytest.approx(90.0, abs=0.1))
    assert not {"PS120", "PS131"} & codes(kp, **kw)
    kp, _ = external("torch_bf16_4096")
    assert saturated_unit(kp)[0] == "math pipe"
    kp, kw = external("triton_one_stage")
    assert saturated_unit(kp) is None and "PS120" in codes(kp, **kw)


def test_uncoalesced_shared_writes_warn_only_where_they_bound_the_kernel():
    """PS112's severity follows its estimate: cuBLAS's SGEMM's 4-byte cp.async writes (3x
    ideal) cost it little, an info; Triton's TF32 matmul's (16x ideal, L1TEX 90% busy, its
    warps waiting on the copies) are what bounds it, the warning, ahead of PS101's."""
    def ps112(kp, kw):
        (f,) = [f for f in evaluate(kp, **kw).findings if f.code == "PS112"]
        return f

    assert ps112(one("cublas_sgemm_4096"), {}).severity == "info"
    f = ps112(*external("triton_tf32"))
    assert f.severity == "warning" and f.estimated_gain > 0.5


def test_ffma_dispatch_estimate_against_what_the_orders_lost():
    """PS133 on sgemm_stages4's orders timed before the rule was written (probes/, H100,
    alternating rounds against the stage's own order: fma-order-more-h100.jsonl). Where it
    fires (JOUTER 5 and 7: 0.869 and 0.783x), its estimate with the waits PS129 reads at the
    burst loads is what the order lost, low by up to a half and never above it; the stage's
    own order and the orders with their loads spread by hand (fma-order-spread-h100.jsonl: JOUTER
    10, 11 and 13, 0.976-0.994x, at 0.060-0.078) stay under the line."""
    import json

    def timed(name):
        return {row["params"]["JOUTER"]: row["speed_over_other"]["median"] for row in
                map(json.loads, (REFERENCE / "probes" / name).read_text().splitlines())}

    more, spread = timed("fma-order-more-h100.jsonl"), timed("fma-order-spread-h100.jsonl")
    assert sorted(more) == [5, 7, 9] and sorted(spread) == [10, 11, 13]
    for jouter in (5, 7):
        kp, kw = probe(f"sgemm_stages4@JOUTER={jouter}-fp32-4096x4096x4096-h100")
        (f,) = [f for f in evaluate(kp, **kw).findings if f.code == "PS133"]
        held = f.estimated_gain + kp.hot_loop.fragment_bursts.waits
        lost = 1 - more[jouter]
        assert 0.5 * lost < held < lost, (jouter, held, lost)
    for name in ("sgemm_stages4-fp32-4096x4096x4096-fma-order-h100",
                 *(f"sgemm_stages4@JOUTER={j}-fp32-4096x4096x4096-h100" for j in spread)):
        kp, kw = probe(name)
        assert "PS133" in evaluate(kp, **kw).silent, name

def test_fragment_bursts_estimate_against_what_spreading_them_saved():
    """PS129 on sgemm_stages4's serpentine rows and row pairs (probes/, H100): the warps held
    at their burst loads, 0.043 and 0.051 of the samples, where the stage's own order (its
    loads spread) was 1/0.952 and 1/0.942 as fast in alternating rounds: 0.048 and 0.058 of
    their time (probes/fma-order-h100.jsonl). The stage itself, compiled from the same tree
    and profiled in the same call, is silent."""
    import json

    timed = {row["params"]["JOUTER"]: row["speed_over_other"]["median"] for row in
             map(json.loads, (REFERENCE / "probes" / "fma-order-h100.jsonl").read_text().splitlines())}
    for jouter in (2, 4):
        kp, kw = probe(f"sgemm_stages4@JOUTER={jouter}-fp32-4096x4096x4096-h100")
        (f,) = [f for f in evaluate(kp, **kw).findings if f.code == "PS129"]
        lost = 1 - timed[jouter]
        assert 0.8 * lost < f.estimated_gain < lost, (jouter, f.estimated_gain, lost)
    kp, kw = probe("sgemm_stages4-fp32-4096x4096x4096-fma-order-h100")
    assert "PS129" in evaluate(kp, **kw).silent
