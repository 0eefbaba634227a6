"""Instruction fingerprints: what a GEMM's SASS says about the path it took.

Nsight Compute judges one kernel at a time and cannot know that a Hopper GEMM built on
mma.sync and cp.async is on the wrong road while cuBLAS uses wgmma and TMA. These rules
read the executed opcode families (perfscope.families) and the chip, and name the
instruction and the compile target the fix needs. Their estimates are the time the
instruction itself costs, not the whole gap to cuBLAS: mma.sync runs the same tensor
cores at 61% of wgmma's rate (measured), so the HMMA work costs its pipe time x 0.39.
"""

from __future__ import annotations

from perfscope.families import FAMILY_BY_KEY, base_opcode
from perfscope.hardware import TENSOR_PRACTICAL_SHARE, hmma_share, peak_flops
from perfscope.metrics import CC_METRICS, M_ISSUE_ACTIVE, M_OPCODES, M_TENSOR_PIPE, OPCODE_METRICS
from perfscope.rules.bounds import INT_MMA, TF32_MARK, infer_dtype
from perfscope.rules.facts import (
    TENSOR_FAMILIES,
    achieved_flops,
    arch_target,
    compute_capability,
    family,
    has_tensor_cores,
    is_gemm_like,
    need_opcodes,
    total_instructions,
)
from perfscope.rules.layout import misaligned_rows
from perfscope.rules.model import Evidence, Hit, Inputs, NotCollected, Rule, need
from perfscope.sass.loops import tma_leaf_loops

# -- thresholds --
# Chips where mma.sync (HMMA) is the legacy path: wgmma (sm_90) or tcgen05 (sm_100/103)
# is faster. On sm_80/86/89/120 mma.sync is the right instruction.
LEGACY_MMA_CHIPS = {(9, 0): "wgmma.mma_async (SASS HGMMA) on operands in shared memory",
                    (10, 0): "tcgen05.mma (SASS UTC*MMA) with the accumulator in tensor memory",
                    (10, 3): "tcgen05.mma (SASS UTC*MMA) with the accumulator in tensor memory"}
# TMA (cp.async.bulk.tensor) exists from sm_90 on.
TMA_MIN_MAJOR = 9
HALF_DTYPES = ("fp16", "bf16")
# Where mma.sync's rate against the new path was not measured (sm_100), this is assumed.
HMMA_SHARE_UNMEASURED = 0.5

_FIX_PATH = {(9, 0): "wgmma.mma_async (HGMMA) fed by TMA", (10, 0): "tcgen05.mma (UTC*MMA)",
             (10, 3): "tcgen05.mma (UTC*MMA)"}


def _tensor_intended(inputs: Inputs) -> tuple[bool, Evidence]:
    stage = inputs.stage
    if stage is not None and any(k in TENSOR_FAMILIES for k in stage.fingerprint):
        return True, Evidence("the stage's declared fingerprint", ", ".join(stage.fingerprint),
                              "tensor-core instructions")
    dtype, source = inputs.dtype, "run manifest or stage"
    if dtype is None:
        dtype, source = infer_dtype(inputs.profile)
    if dtype is None:
        raise NotCollected("the element type (run manifest, stage, or the SASS)")
    return dtype in HALF_DTYPES, Evidence(f"element type ({source})", dtype, "fp16 or bf16")


def _check_no_tensor_cores(inputs: Inputs) -> Hit | None:
    """Symptom: an FP16/BF16 GEMM (by the manifest's dtype, the stage's fingerprint, or
    inferred from the SASS: half-precision packs, 16-bit loads, or the signature) executes
    FFMA and no HMMA/HGMMA/UTC*MMA at all.
    Why: dense FP16/BF16 tensor-core throughput is many times the FP32 FFMA peak on every
    chip since sm_70; FFMA math caps the kernel far below cuBLAS.
    Fix: mma.sync on sm_80-sm_89/sm_120, wgmma on sm_90a, tcgen05 on sm_100a/sm_103a.
    Estimate: 1 - achieved FLOP/s / practical tensor-core FLOP/s (0.75 of the dense peak at
    the measured clock, what cuBLAS reaches): the whole implementation changes path.
    Example:
        before: acc += __bfloat162float(a[k]) * __bfloat162float(b[k]);    // FFMA
        after:  wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 ...;  // HGMMA
    Source: seed 004 §1; seed 000 §4.1; PTX ISA: mma, wgmma, tcgen05."""
    p = inputs.profile
    need_opcodes(p)
    intended, why = _tensor_intended(inputs)
    if not intended or has_tensor_cores(p) or not p.opcodes.has("ffma") or not is_gemm_like(p):
        return None
    cc = compute_capability(p)
    path = _FIX_PATH.get(cc, "mma.sync.m16n8k16 with ldmatrix")
    ident = p.identity
    peak = peak_flops(ident.compute_capability, "tensor16", ident.sm_count, ident.sm_clock_hz)
    got = achieved_flops(inputs)
    gain = max(0.0, 1 - got / (TENSOR_PRACTICAL_SHARE * peak)) if got and peak else None
    ev = [Evidence("FFMA instructions (sass__inst_executed_per_opcode)", family(p, "ffma"), "> 0"),
          Evidence("HMMA + HGMMA + UTC*MMA instructions", 0, "> 0 for FP16/BF16"), why]
    if got and peak:
        ev.append(Evidence("achieved TFLOP/s / practical tensor-core TFLOP/s",
                           round(got / (TENSOR_PRACTICAL_SHARE * peak), 4),
                           f"{TENSOR_PRACTICAL_SHARE} x {peak / 1e12:,.0f} TFLOP/s"))
    return Hit(tuple(ev), gain, (("path", path), ("target", arch_target(cc))))


NO_TENSOR_CORES = Rule(
    code="PS140", tag="no-tensor-cores", title="FP16/BF16 math runs on FFMA, not tensor cores",
    severity="warning",
    metrics=(*OPCODE_METRICS, *CC_METRICS),
    check=_check_no_tensor_cores,
    fix="Do the math on tensor cores with {path}, compiled for {target} "
        "(mma.sync works from sm_80; wgmma needs sm_90a, tcgen05 sm_100a/sm_103a).",
    reference="PTX ISA: Warp-level Matrix Instructions (mma), Asynchronous Warpgroup Level "
              "Matrix Instructions (wgmma); CUDA C++ Programming Guide: Warp Matrix Functions",
    thresholds=(("TENSOR_PRACTICAL_SHARE", TENSOR_PRACTICAL_SHARE),),
)


def _check_legacy_mma(inputs: Inputs) -> Hit | None:
    """Symptom: the main loop's MMA is mma.sync (SASS HMMA) on sm_90, sm_100 or sm_103,
    where HMMA outnumbers HGMMA and UTC*MMA.
    Why: on Hopper wgmma (HGMMA) and on datacenter Blackwell tcgen05 (UTC*MMA) are the
    full-rate tensor-core paths; mma.sync reaches 61% of wgmma's rate on the H200 even with
    no memory traffic at all (benchmarks/hmma_ceiling.py), so an HMMA ladder cannot reach
    cuBLAS's nvjet kernels there. On sm_80/86/89/120 mma.sync is the right path and this
    rule is silent.
    Fix: wgmma with TMA on sm_90a; tcgen05 with tmem on sm_100a/sm_103a.
    Estimate: tensor pipe busy x (1 - HMMA rate / wgmma rate): the pipe time the same MMAs
    would not take on the full-rate path (the rest of the gap is other findings').
    Example:
        before: mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {d}, {a}, {b}, {d};
        after:  wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {d}, descA, descB;
    Source: seed 000 §4.1, §5.2, §6.3 row 5; PTX ISA: wgmma.mma_async, tcgen05.mma."""
    p = inputs.profile
    need_opcodes(p)
    cc = compute_capability(p)
    hmma = family(p, "hmma")
    if cc not in LEGACY_MMA_CHIPS or not hmma or hmma <= family(p, "gmma") + family(p, "utcmma"):
        return None
    pipe = p.metric(M_TENSOR_PIPE)
    # The rate is measured for 16-bit float HMMA; integer (IMMA) and TF32 mma.sync are not.
    measured = hmma_share(p.identity.compute_capability) if _half_mma(p) else None
    share = measured or HMMA_SHARE_UNMEASURED
    ev = [Evidence("HMMA instructions (mma.sync)", hmma, "> HGMMA + UTC*MMA"),
          Evidence("compute capability", f"{cc[0]}.{cc[1]}", "9.0, 10.0 or 10.3"),
          Evidence("mma.sync rate / full-rate path (measured)" if measured else
                   "mma.sync rate / full-rate path (not measured for this chip and type: assumed)",
                   round(share, 2), "< 1")]
    if pipe is not None:
        ev.append(Evidence(M_TENSOR_PIPE, round(pipe, 1), "-"))
    # The instruction is the symptom; without the pipe's busy share (a static audit) there
    # is no estimate.
    gain = pipe / 100 * (1 - share) if pipe is not None else None
    return Hit(tuple(ev), gain, (("path", LEGACY_MMA_CHIPS[cc]), ("target", arch_target(cc))))


def _half_mma(p) -> bool:
    """Whether the kernel's mma.sync is on 16-bit floats (HMMA.*.F16/BF16, not TF32, not
    IMMA): the type mma.sync's rate on this chip was measured for (also when the report
    names no opcode modifiers)."""
    ops = p.opcodes.with_modifiers
    half = sum(n for op, n in ops.items() if base_opcode(op) == "HMMA" and TF32_MARK not in op)
    other = sum(n for op, n in ops.items()
                if base_opcode(op) in INT_MMA or (base_opcode(op) == "HMMA" and TF32_MARK in op))
    return half >= other


LEGACY_MMA = Rule(
    code="PS141", tag="legacy-mma", title="mma.sync (HMMA) on a chip whose fast path is wgmma/tcgen05",
    severity="warning",
    metrics=(*OPCODE_METRICS, *CC_METRICS, M_TENSOR_PIPE),
    check=_check_legacy_mma,
    fix="Move the main loop to {path}, with A/B tiles brought in by TMA and a warp-specialised "
        "producer/consumer pipeline on mbarriers; compile for {target} (the arch-specific "
        "target: plain sm_90/sm_100 has no wgmma/tcgen05).",
    reference="PTX ISA: Asynchronous Warpgroup Level Matrix Instructions (wgmma.mma_async), "
              "TensorCore 5th Generation Family Instructions (tcgen05.mma)",
)


def _check_no_tma(inputs: Inputs) -> Hit | None:
    """Symptom: a tensor-core kernel on a chip with TMA (sm_90+) loads its tiles through
    LDGSTS (cp.async) or LDG and executes no TMA instruction (or its stage declares TMA and
    none ran). Not where the run manifest's shape leaves rows that are not 16-byte aligned:
    TMA's strides cannot address them (PS107 names the layout).
    Why: per-thread copies spend issue slots, registers and address math that TMA does
    from one thread with hardware swizzling; cuBLAS's Hopper kernels use UTMALDG.
    Fix: cp.async.bulk.tensor through a CUtensorMap with 128B swizzle, on mbarriers.
    Estimate: the issue slots the copies take: copy instructions / all instructions x
    issue active (TMA issues one instruction per tile from one thread). A kernel that is
    not issue-bound gains little from TMA alone (Triton's cp.async + wgmma kernel runs at
    0.96 of cuBLAS on the H200).
    Example:
        before: cp.async.cg.shared.global [sA + off], [gA + off], 16;   // per thread
        after:  cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes
                    [sA], [tmapA, {k, m}], [bar];                        // one thread, one tile
    Source: seed 000 §3.2, §5.2, §6.3 row 5; CUDA C++ Programming Guide: Tensor Memory
    Accelerator; PTX ISA: cp.async.bulk.tensor."""
    p = inputs.profile
    need_opcodes(p)
    cc = compute_capability(p)
    if cc[0] < TMA_MIN_MAJOR or not has_tensor_cores(p) or p.opcodes.has("tma"):
        return None
    if misaligned_rows(inputs):
        return None     # TMA cannot address rows that are not 16-byte aligned: PS107's
    copies = family(p, "ldgsts") + family(p, "ldg")
    declared = inputs.stage is not None and "tma" in inputs.stage.fingerprint
    if not copies and not declared:
        return None
    issue = p.stalls.issue_active_pct
    share = copies / total_instructions(p)
    return Hit((
        Evidence("LDGSTS + LDG instructions", copies, "> 0 with tensor-core math"),
        Evidence("TMA instructions (UTMALDG/UBLKCP)", 0, "> 0 on sm_90+"),
        Evidence("compute capability", f"{cc[0]}.{cc[1]}", f">= {TMA_MIN_MAJOR}.0"),
        Evidence("copy instructions / all instructions", round(share, 4), "-"),
    ), share * issue / 100 if issue is not None else None, (("target", arch_target(cc)),))


NO_TMA = Rule(
    code="PS142", tag="no-tma", title="Tensor-core tiles loaded per thread on a chip with TMA",
    severity="warning",
    metrics=(*OPCODE_METRICS, *CC_METRICS, M_OPCODES, M_ISSUE_ACTIVE),
    check=_check_no_tma,
    fix="Load the A/B tiles with TMA: encode CUtensorMaps (cuTensorMapEncodeTiled, 128B "
        "swizzle), issue cp.async.bulk.tensor from one thread per stage and complete each stage "
        "on an mbarrier (expect_tx); compile for {target}.",
    reference="CUDA C++ Programming Guide: Tensor Memory Accelerator (TMA); PTX ISA: "
              "cp.async.bulk.tensor, mbarrier",
)

def _check_wgmma_serialized(inputs: Inputs) -> Hit | None:
    """Symptom: (the static audit's, from the compiler, no counters) ptxas reports that it
    serialized the kernel's wgmma.mma_async pipeline ("Potential Performance Loss:
    wgmma.mma_async instructions are serialized due to <reason>", info C7515 and its kin).
    Why: wgmma runs asynchronously only while nothing but wgmmas writes its accumulator
    registers between the warpgroup's fence/arrive and its wait; where ptxas cannot keep it
    so (a non-wgmma instruction defining an accumulator register inside the pipeline stage,
    too few registers, the pipeline crossing a call), it waits for each wgmma before issuing
    the next, and the tensor pipe runs one at a time.
    Fix: keep the accumulators untouched between wgmma_fence and wgmma_wait (initialise or
    rescale them before the fence, read them after the wait), keep values that live across
    the k loop (held epilogue operands, loop state) out of the registers ptxas needs for
    the accumulators, and inline every call inside the pipeline; compile again until ptxas
    prints no such line.
    Estimate: none without counters: what serialization costs depends on how much of the
    kernel's time the wgmmas take.
    Example:
        before: ptxas info : (C7515) Potential Performance Loss: wgmma.mma_async instructions
                are serialized due to non wgmma instructions defining accumulator registers
                of a wgmma between start and end of the pipeline stage in the function '...'
        after:  no such line; the k loop's HGMMAs stay in flight together
    Source: hgemm_fused_quant with fp8 outputs and its bias pairs held in registers across
    the k loop (2026-12-02, H200): ptxas C7515, 1.11x the cycles of the same stage without
    the held bias under ncu and 0.86-0.95 of cublas+gelu+fp8 against 0.99-1.03; PTX ISA:
    wgmma.fence, wgmma.wait_group; seed 000 §4 (Hopper: wgmma)."""
    res = need(inputs.context.resources, "the compiler's resource usage (ptxas -v)")
    if not res.wgmma_serialized:
        return None
    return Hit((Evidence("ptxas: wgmma.mma_async instructions serialized due to",
                         res.wgmma_serialized, "any"),), None,
               fix_args=(("reason", "ptxas: " + res.wgmma_serialized),))


WGMMA_SERIALIZED = Rule(
    code="PS144", tag="mma-serialized", title="ptxas serialized the wgmma pipeline",
    severity="warning",
    metrics=("ptxas -v: wgmma serialization (C7515 and kin)",),
    check=_check_wgmma_serialized,
    fix="Keep the wgmma accumulators untouched between the fence and the wait (initialise or "
        "scale them before it, read them after), keep values held across the k loop out of the "
        "registers the accumulators need, and inline every call in the pipeline, until ptxas "
        "no longer reports the serialization ({reason}).",
    reference="PTX ISA: Asynchronous Warpgroup Level Matrix Instructions (wgmma.fence, "
              "wgmma.commit_group, wgmma.wait_group)",
)


def _check_producer_division(inputs: Inputs) -> Hit | None:
    """Symptom: (the static audit's, from the SASS, no counters) the innermost loop that
    issues the kernel's TMA loads (UTMALDG) also divides by a value the compiler does not
    know: the integer-division idiom, I2F.RP then MUFU.RCP and a dozen integer
    instructions, once per k tile.
    Why: in a warp-specialised TMA kernel one thread issues every load, one k tile per
    iteration of this loop, so the loop is the only thing that refills the ring; what it
    does per k tile besides the wait and the loads sets how fast the slots come back, and an
    integer division (tens of dependent cycles) is most of such a loop. Index math that
    changes once per tile (a tile's corner from its index: a grouped order, a stream-K
    piece) belongs outside the k loop.
    Fix: work out each tile's corner (and anything else that needs a division or a modulo)
    once per tile or piece, before its k loop, and step k by addition inside it.
    Estimate: none without counters; where it was measured it was large: a memory-bound
    decode GEMM with a ring of 8 x 8 KB ran at 0.84 of the same work with the division
    moved out of the loop.
    Example:
        before: for (kt = k0; kt < k1; ++kt) load(tile % tiles_m * BM, tile / tiles_m * BN, kt)
        after:  m0 = tile % tiles_m * BM; n0 = tile / tiles_m * BN;
                for (kt = k0; kt < k1; ++kt) load(m0, n0, kt)
    Source: hgemm_small_m_streamk's first builds (H200, 2026-12-04, fused/README.md):
    1.18x hgemm_small_m's time at 16 x 8192^2 with a CTA per tile, the parent's own work,
    against 1.03x with the corner worked out once per piece; CUDA C++ Best Practices Guide:
    integer division and modulo are expensive; seed 000 §4 (warp specialisation)."""
    sass = need(inputs.context.sass, "the kernel's static SASS (its loops)")
    loops = tma_leaf_loops(sass)
    if not loops:
        return None     # no TMA load in a loop, or branch targets that are labels
    dividing = [t for t in loops if t.divisions]
    if not dividing:
        return None
    worst = max(dividing, key=lambda t: t.divisions / t.loads)
    return Hit((
        Evidence("integer divisions (I2F.RP) in the innermost loop issuing TMA loads",
                 worst.divisions, "0"),
        Evidence("TMA loads (UTMALDG) in that loop", worst.loads, "-"),
        Evidence("the loop's SASS instructions (its span)", worst.loop.size, "-"),
        Evidence("such loops that divide / all innermost TMA-load loops",
                 f"{len(dividing)} / {len(loops)}", "0"),
    ), None)


PRODUCER_DIVISION = Rule(
    code="PS146", tag="producer-loop",
    title="An integer division in the loop that issues the TMA loads",
    severity="warning",
    metrics=("static SASS: the innermost loops holding UTMALDG",),
    check=_check_producer_division,
    fix="Work out each tile's coordinates (and any other division or modulo) once per tile or "
        "stream-K piece, before its k loop, and step k by addition inside it: the one thread "
        "that issues every load runs this loop once per k tile, and the ring refills no "
        "faster than it does.",
    reference="CUDA C++ Best Practices Guide: Arithmetic Instructions (integer division and "
              "modulo); PTX ISA: cp.async.bulk.tensor",
)


# -- PS143 thresholds --
# FFMA is the kernel's math when at least this share of its instructions is FFMA.
FFMA_MATH_SHARE_MIN = 0.5
# The issue slots are the bound when they issue this much of the active time.
ISSUE_BOUND_PCT = 75.0
# The non-FFMA share of instructions a tuned FFMA GEMM keeps (measured on the H200 at
# 4096^3: cuBLAS's sm80 SGEMM kernel 0.115, sgemm_tile8x16 0.101); the rule fires above
# OVERHEAD_MIN and estimates the saving down to OVERHEAD_TARGET.
OVERHEAD_TARGET = 0.10
OVERHEAD_MIN = 0.12
_OVERHEAD_FAMILIES = ("shared", "ldgsts", "ldg", "barrier")


def _check_issue_overhead(inputs: Inputs) -> Hit | None:
    """Symptom: an FFMA GEMM whose issue slots are busy (>= 75% of active cycles) spends
    more than 12% of them on instructions that are not FFMA.
    Why: each warp-level FFMA needs an issue slot; every shared load, copy, barrier, loop
    and address instruction takes one an FFMA could have had. An issue-bound kernel runs
    as fast as its instruction count allows, so the overhead is time.
    Fix: fewer instructions per FFMA: a larger thread tile (shared loads per FFMA fall as
    1/TM + 1/TN), a larger BK (the per-k-tile barrier, loop and copy-address instructions
    spread over more FFMA), 16-byte copies instead of 4-byte ones.
    Estimate: issue active x (1 - (1 - overhead) / (1 - OVERHEAD_TARGET)): the issue time
    the same FFMA would not need at a tuned GEMM's overhead share.
    Example:
        before: TM = TN = 8, BK = 8:  6.25% LDS.128 + per-tile copies and barrier (15% overhead)
        after:  TM = 8, TN = 16, BK = 16:  4.7% LDS.128, half the per-tile work (10%)
    Source: seed 002 §2-4 (register and warp tiling); seed 000 §5.1 (tune the tile); NCU
    Profiling Guide: Warp Scheduler Statistics (issue slot utilisation)."""
    p = inputs.profile
    total = total_instructions(p)
    ffma = family(p, "ffma")
    if not total or ffma / total < FFMA_MATH_SHARE_MIN or has_tensor_cores(p):
        return None
    issue = p.stalls.issue_active_pct
    if issue is None:
        raise NotCollected(f"issue activity ({M_ISSUE_ACTIVE})")
    overhead = 1 - ffma / total
    if issue < ISSUE_BOUND_PCT or overhead <= OVERHEAD_MIN:
        return None
    parts = sorted(((family(p, k) / total, k) for k in _OVERHEAD_FAMILIES if family(p, k)),
                   reverse=True)
    rest = overhead - sum(share for share, _ in parts)
    named = ", ".join(f"{FAMILY_BY_KEY[k].label} {share:.1%}" for share, k in parts)
    gain = issue / 100 * (1 - (1 - overhead) / (1 - OVERHEAD_TARGET))
    return Hit((
        Evidence("non-FFMA instructions / all instructions", round(overhead, 3), f"> {OVERHEAD_MIN}"),
        Evidence(M_ISSUE_ACTIVE, round(issue, 1), f">= {ISSUE_BOUND_PCT:.0f} (the slots are the bound)"),
        Evidence("of them, not " + (named or "shared, copy or barrier") + ": integer, branch, other",
                 round(rest, 3), "-"),
    ), gain, (("parts", named or "integer, branch and address instructions"),))


ISSUE_OVERHEAD = Rule(
    code="PS143", tag="issue-overhead", title="FFMA issue slots go to overhead instructions",
    severity="warning",
    metrics=(*OPCODE_METRICS, M_ISSUE_ACTIVE),
    check=_check_issue_overhead,
    fix="Issue fewer instructions per FFMA (now {parts}, plus integer and loop work): a larger "
        "thread tile (shared loads per FFMA fall as 1/TM + 1/TN), a larger BK (fewer barrier and "
        "copy instructions per FFMA); `perfscope tune` searches both.",
    reference="NCU Profiling Guide: Warp Scheduler Statistics (Issue Slot Utilization); CUDA C++ "
              "Best Practices Guide: Instruction Optimization",
    ncu=("IssueSlotUtilization", "CPIStall/Not Selected Stalls"),
    thresholds=(("FFMA_MATH_SHARE_MIN", FFMA_MATH_SHARE_MIN), ("ISSUE_BOUND_PCT", ISSUE_BOUND_PCT),
                ("OVERHEAD_TARGET", OVERHEAD_TARGET), ("OVERHEAD_MIN", OVERHEAD_MIN)),
)

RULES = (NO_TENSOR_CORES, LEGACY_MMA, NO_TMA, ISSUE_OVERHEAD)
