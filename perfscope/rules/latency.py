"""Latency: warps waiting on loads, barriers or epilogues that a deeper pipeline would hide.

Each rule here needs the latency symptom (warps stalled on loads or barriers, issue slots
idle) and that nothing else already bounds the kernel: a unit counts as the bound only
when it is confirmed twice (perfscope.rules.facts ``saturated_unit``). A busy L1 with no
throttle stalls is not a bound: a 1-stage pipeline whose shared stores wait on the global
loads of the same k-step shows exactly that.
"""

from __future__ import annotations

from dataclasses import dataclass

from perfscope.families import base_opcode
from perfscope.hardware import TENSOR_PIPE_ACTIVE_PRACTICAL, TENSOR_PIPE_PRACTICAL
from perfscope.metrics import (
    M_CYCLES,
    M_INST_EXECUTED_PC,
    M_ISSUE_ACTIVE,
    M_LONG_SCOREBOARD_SAMPLES,
    M_OPCODES,
    M_PC_SAMPLES,
    M_SM_ACTIVE_AVG,
    M_SM_COUNT,
    M_SPILL_INST,
    M_TENSOR_PIPE,
    M_WAVES,
    MEMORY_PCT_METRICS,
    OPCODE_METRICS,
    SOL_METRICS,
    STALL_METRICS,
)
from perfscope.profile import BURST_LOADS_MIN, HotLoop, KernelProfile
from perfscope.rules.bounds import is_memory_bound
from perfscope.rules.facts import (
    ISSUE_ACTIVE_MAX,
    family,
    is_async_mma,
    is_gemm_like,
    is_warp_specialised,
    need_opcodes,
    saturated_unit,
    stall_share,
    total_instructions,
)
from perfscope.rules.model import Evidence, Hit, Inputs, Rule, need
from perfscope.structure import SERIAL_WAITS_PER_MMA, launch_shape

# -- thresholds --
# Long-scoreboard waits above this share of stall time: loads are not overlapped.
LONG_SCOREBOARD_MIN = 0.30
# ... and from this share on, part of the global latency is exposed (PS122).
PARTLY_EXPOSED_MIN = 0.12
# Barrier waits above this share of stall time: a synchronous load-sync-compute loop.
BARRIER_MIN = 0.25
# Spill instructions above this share of all instructions explain the load waits
# (PS130 owns them).
SPILL_SHARE_MAX = 0.01
# An asynchronous-MMA kernel (wgmma/tcgen05) issues one instruction per 64xNx16 block, so
# its issue slots idle even at full speed (cuBLAS: 12% issue active at 90% SM). Its idle
# measure is the SM throughput instead (the tensor pipe, for such a kernel), and it counts
# as busy only from this SM % on.
ASYNC_MMA_BUSY_SM_PCT = 80.0
# A grid of more than this many waves is not persistent: each CTA's prologue and epilogue
# leave the tensor pipe idle (a persistent kernel runs one wave and overlaps them).
PERSISTENT_WAVES_MAX = 1.05
# Per-element FP math (FP32/FP16 ALU and MUFU) issued per scheduler, as a share of the
# SMs' active cycles, from which an asynchronous-MMA kernel has an epilogue worth a
# finding (PS124). Measured on the H200 at 4096^3: 2.4-2.7% for the bias + GELU
# epilogues (hgemm_fused_bias_act, hgemm_fused_quant, cuBLASLt's GELU_BIAS nvjet), 0.4%
# for nvjet's bias-only epilogue, 0.0% for the plain GEMMs (a convert and a store).
EPILOGUE_MATH_MIN = 0.01
# FP math operations per output element beyond which the math is not an epilogue's but
# the k loop's (PS125): bias + GELU-tanh measured 7, fp8 quantisation with its amax 8,
# cuBLASLt's scale 2 (H200, 4096^3); cuBLASLt's e4m3 promotion 34 at K = 4096 (K / 128 + 2),
# so from K of about 2048 on with its 128-deep interval.
EPILOGUE_OPS_PER_ELEMENT_MAX = 16
# Warp schedulers (SM sub-partitions) per multiprocessor, sm_70 onwards: each issues one
# warp-instruction per cycle; a warp-instruction is WARP_LANES operations.
SCHEDULERS_PER_SM = 4
WARP_LANES = 32
# The per-element math of an epilogue, by base opcode: what a bias, an activation, a
# scale or a residual add costs beyond the plain GEMM's convert-and-store.
EPILOGUE_MATH_OPCODES = ("FFMA", "FMUL", "FADD", "FMNMX", "MUFU", "HFMA2", "HMUL2", "HADD2",
                         "HMNMX2")

_COMMON = (*STALL_METRICS, SOL_METRICS["sm_pct"], *MEMORY_PCT_METRICS, M_ISSUE_ACTIVE)


def _idle(p) -> float:
    return 1 - need(p.stalls.issue_active_pct, M_ISSUE_ACTIVE) / 100


def _not_spilling(p) -> bool:
    total = total_instructions(p)
    spills = p.memory.spill_instructions or 0.0
    return not total or spills / total < SPILL_SHARE_MAX


# PS120's fix for tiles loaded synchronously (LDG then STS, or plain loads).
_SYNC_HOW = ("a 3-4 stage cp.async ring (commit_group per stage, wait_group STAGES-2) on sm_80+, "
             "or TMA loads completing on per-stage mbarriers on sm_90a; at the least, "
             "double-buffer the shared tiles")


def _check_loads_not_overlapped(inputs: Inputs) -> Hit | None:
    """Symptom: warps spend most stall time on long scoreboard (waiting for global/L1TEX
    data) while nothing bounds the kernel and the schedulers idle: loads are not
    overlapped with math.
    Why: a single-buffered tile loop exposes the full memory latency every K step; more
    stages in flight hide it. A kernel already bound by a unit (confirmed by its throttle
    stalls or by running near its peak) needs less traffic, not more overlap; a spilling
    one is PS130's; memory-bound work (its bytes at the DRAM peak take longer than its
    FLOPs at the math peak: a decode GEMM) waits on loads by nature, and PS170 judges it
    by the bandwidth it reaches.
    Fix: a 3-4 stage cp.async ring or TMA with mbarriers; when the tiles already arrive
    asynchronously (TMA or cp.async in the SASS), the ring is too shallow: more stages.
    Estimate: long-scoreboard stall share x idle issue fraction (1 - issue active). In a
    warp-specialised kernel the producer waits on long scoreboard for free slots by design,
    so its share is the main loop's operand waits instead (HotLoop.operand_waits: the
    consumers at the full barrier), where the report has them per PC: cuBLASLt's GELU_BIAS
    at M = 256 has 0.70 of its stalls on long scoreboard and 0.34 in its main loop.
    Example:
        before: for (k) { load tile k; __syncthreads(); mma(tile k); __syncthreads(); }
        after:  prefetch tiles 0..S-2; for (k) { wait tile k; issue load k+S-1; mma(tile k); }
    Source: seed 000 §3.1-3.2, §6.1 trap 2, §6.3 row 2; seed 002 §4."""
    p = inputs.profile
    share, what = stall_share(p, ("long_scoreboard",)), "stall share of long_scoreboard"
    waits = p.hot_loop.operand_waits if p.hot_loop is not None else None
    if waits is not None and p.opcodes.executed and is_warp_specialised(p):
        share, what = waits, ("long_scoreboard samples in the main loop / all samples (the "
                              "consumers; the producer's waits for free slots are its design)")
    if share < LONG_SCOREBOARD_MIN or not is_gemm_like(p):
        return None
    if is_memory_bound(inputs):
        return None     # its loads wait on the DRAM stream: PS170 judges it by bandwidth
    bound = saturated_unit(p)
    if bound is not None or not _not_spilling(p):
        return None
    idle = _idle(p)
    copies = [name for key, name in (("tma", "TMA"), ("ldgsts", "cp.async")) if p.opcodes.has(key)]
    how = (f"the tiles already arrive asynchronously ({' and '.join(copies)} in the SASS), so "
           "the ring is too shallow to cover the latency: add stages (as shared memory allows) "
           "or issue each tile's loads further ahead of its math" if copies else _SYNC_HOW)
    return Hit((
        Evidence(what, round(share, 3), f">= {LONG_SCOREBOARD_MIN}"),
        Evidence(M_ISSUE_ACTIVE, round(100 * (1 - idle), 1), f"< {ISSUE_ACTIVE_MAX:.0f}"),
        Evidence("a unit that bounds the kernel (busy and confirmed by its stalls)", "none",
                 "none"),
    ), share * idle, fix_args=(("how", how),))



LOADS_NOT_OVERLAPPED = Rule(
    code="PS120", tag="latency-exposed", title="Warps wait on loads that are not overlapped with math",
    severity="warning",
    metrics=(*_COMMON, M_SPILL_INST, M_OPCODES, M_TENSOR_PIPE, M_LONG_SCOREBOARD_SAMPLES),
    check=_check_loads_not_overlapped,
    fix="Overlap the next K tile's loads with this tile's math: {how}.",
    reference="NCU Profiling Guide: Warp Stall Reasons (long_scoreboard); CUDA C++ Programming "
              "Guide: Asynchronous Data Copies (cp.async pipelines)",
    ncu=("CPIStall/Long Scoreboard",),
    thresholds=(("LONG_SCOREBOARD_MIN", LONG_SCOREBOARD_MIN), ("ISSUE_ACTIVE_MAX", ISSUE_ACTIVE_MAX),
                ("SPILL_SHARE_MAX", SPILL_SHARE_MAX)),
)


def _check_partly_exposed(inputs: Inputs) -> Hit | None:
    """Symptom: a GEMM whose tiles travel global -> registers -> shared memory (LDG then
    STS, no cp.async or TMA) still spends a visible share of its stall time on long
    scoreboard, although its warps are busy enough that PS120 does not speak.
    Why: a register-staged tile loop prefetches at most one tile ahead through registers,
    so part of every load's latency stays exposed; asynchronous copies into a ring of
    shared buffers hide it and free the registers and issue slots the staging costs.
    Fix: cp.async (or TMA) into a 3-stage ring of shared buffers.
    Estimate: the long-scoreboard share of stall cycles: the waits a pipeline removes.
    Example:
        before: float4 r = A4[g]; __syncthreads(); As4[s] = r;      // LDG -> STS
        after:  cp.async.cg.shared.global [As + s], [A + g], 16;    // LDGSTS, 3 stages
    Source: seed 002 §4 (sgemm_warptile -> sgemm_pipe: 18% on the H200, which no rule
    predicted before this one); CUDA C++ Programming Guide: Asynchronous Data Copies."""
    p = inputs.profile
    need_opcodes(p)
    if p.opcodes.has("ldgsts") or p.opcodes.has("tma") or not is_gemm_like(p):
        return None
    if not (p.opcodes.has("ldg") and p.opcodes.executed.get("STS", 0.0) > 0):
        return None
    share = stall_share(p, ("long_scoreboard",))
    if share < PARTLY_EXPOSED_MIN or not _not_spilling(p):
        return None
    return Hit((
        Evidence("stall share of long_scoreboard", round(share, 3), f">= {PARTLY_EXPOSED_MIN}"),
        Evidence("LDG + STS tile staging, no LDGSTS or TMA", "yes", "asynchronous copies expected"),
    ), share)


PARTLY_EXPOSED = Rule(
    code="PS122", tag="latency-exposed", title="Register-staged tile loads leave global latency exposed",
    severity="warning",
    metrics=(*STALL_METRICS, M_SPILL_INST, *OPCODE_METRICS),
    check=_check_partly_exposed,
    fix="Copy the tiles asynchronously: cp.async (LDGSTS, 16 bytes per lane) into a 3-stage "
        "ring of shared buffers with commit_group/wait_group, or TMA on sm_90a, instead of "
        "LDG into registers then STS.",
    reference="CUDA C++ Programming Guide: Asynchronous Data Copies; PTX ISA: cp.async",
    ncu=("CPIStall/Long Scoreboard",),
    thresholds=(("PARTLY_EXPOSED_MIN", PARTLY_EXPOSED_MIN), ("SPILL_SHARE_MAX", SPILL_SHARE_MAX)),
)


def _check_barrier_bound(inputs: Inputs) -> Hit | None:
    """Symptom: warps spend a large share of stall time at CTA barriers while the
    schedulers idle and no unit is busy.
    Why: load -> __syncthreads -> compute -> __syncthreads serialises copy and math; with a
    double buffer one barrier per K tile suffices and the copy runs under the math. A
    wgmma kernel that waits for its own MMAs (wait_group 0) and then a CTA barrier before
    each slot is refilled drains the tensor pipe every K tile the same way; for it the
    idle measure is the SM throughput (the tensor pipe), not issue slots, which an
    asynchronous MMA leaves idle by design. Warp-specialised kernels (recognised by their
    structure: TMA, wgmma/tcgen05, mbarrier waits and several warpgroups) wait at barriers
    by design and are excluded.
    Fix: double-buffer; with TMA use per-stage mbarriers instead of CTA barriers, keep one
    wgmma group in flight and give the copies to a producer warpgroup; or, cheaper, a
    smaller ring so two CTAs share a multiprocessor and hide each other's drain.
    Estimate: barrier stall share x idle fraction (1 - issue active; 1 - SM % for wgmma).
    Example:
        before: wgmma(slot k); wgmma.wait_group 0; __syncthreads(); refill slot k;
        after:  wgmma(slot k); wgmma.wait_group 1; mbarrier.arrive(empty[k - 1]);
    Source: seed 004 §3 (hgemm_bcf_dbf); seed 000 §3.1, §4; the hgemm_tma_wgmma variant
    with STAGES=3 (two CTAs per SM) measured 1.3x its 4-stage default on the H200."""
    p = inputs.profile
    share = stall_share(p, ("barrier",))
    if share < BARRIER_MIN:
        return None
    need_opcodes(p)
    if is_warp_specialised(p) or not is_gemm_like(p):
        return None
    if is_async_mma(p):
        sm = need(p.sol.sm_pct, SOL_METRICS["sm_pct"])
        if sm >= ASYNC_MMA_BUSY_SM_PCT:
            return None
        return Hit((
            Evidence("stall share of barrier", round(share, 3), f">= {BARRIER_MIN}"),
            Evidence(SOL_METRICS["sm_pct"], round(sm, 1),
                     f"< {ASYNC_MMA_BUSY_SM_PCT:.0f} (wgmma/tcgen05: the tensor pipe idles)"),
        ), share * (1 - sm / 100))
    if saturated_unit(p) is not None:
        return None
    idle = _idle(p)
    return Hit((
        Evidence("stall share of barrier", round(share, 3), f">= {BARRIER_MIN}"),
        Evidence(M_ISSUE_ACTIVE, round(100 * (1 - idle), 1), f"< {ISSUE_ACTIVE_MAX:.0f}"),
    ), share * idle)


BARRIER_BOUND = Rule(
    code="PS121", tag="latency-exposed", title="Warps wait at barriers around a synchronous tile loop",
    severity="warning",
    metrics=(*_COMMON, M_OPCODES, M_TENSOR_PIPE),
    check=_check_barrier_bound,
    fix="Double-buffer the shared tiles so tile k+1's cp.async (or TMA) is in flight during tile "
        "k's math and one __syncthreads() per K tile suffices; with TMA, wait on per-stage "
        "mbarriers instead of CTA-wide barriers; with wgmma, keep one group in flight "
        "(wgmma.wait_group 1), free each slot with an mbarrier arrive and let a producer "
        "warpgroup issue the copies (warp specialisation). The cheap alternative: a shallower "
        "ring, so two CTAs fit on one multiprocessor and overlap each other's drain.",
    reference="NCU Profiling Guide: Warp Stall Reasons (barrier); PTX ISA: wgmma.wait_group, "
              "mbarrier",
    ncu=("CPIStall/Barrier",),
    thresholds=(("BARRIER_MIN", BARRIER_MIN), ("ASYNC_MMA_BUSY_SM_PCT", ASYNC_MMA_BUSY_SM_PCT),
                ("ISSUE_ACTIVE_MAX", ISSUE_ACTIVE_MAX)),
)


# Fence waits (membar stalls) of working warps from this share of their stall time on: a
# fence on the critical path. No committed capture (ladder, fused or external) reaches 2.2%
# once parked warps are left out; hgemm_small_m's pulled split-K reduction read 13.2% (64 x
# 4096^2) and 7.1% (64 x 8192^2) with its producer warpgroup's fences at its exit barriers
# counted, 1.2% and 1.6% without.
MEMBAR_MIN = 0.05
# The SASS that waits for a fence: a memory barrier, its error barrier, and a cluster
# barrier's arrive (release semantics unless .relaxed).
FENCE_OPCODES = ("MEMBAR", "ERRBAR", "UCGABAR_ARV")
# PS126's fix by where the fence sits: behind a cluster barrier, or a fence of its own.
_CLUSTER_FENCE_HOW = (
    "the fence is a cluster barrier's arrive (UCGABAR_ARV; barrier.cluster.arrive is .release "
    "by default: "
    "it waits for all of the thread's earlier memory operations, global ones included, "
    "before the peer may go on). When the barrier guards a split-K partial exchanged through "
    "distributed shared memory, push the partial instead of pulling it: the sending CTA "
    "writes it into the receiver's shared memory with st.async (or cp.async.bulk "
    "shared::cluster), completing on the receiver's own mbarrier (complete_tx), so only the "
    "receiver waits, and only for those bytes; keep the barriers that order nothing "
    "(start-up, exit) as barrier.cluster.arrive.relaxed")
_PLAIN_FENCE_HOW = (
    "the fence stands on its own (MEMBAR: a __threadfence() or fence.sc/acq_rel before a flag, "
    "as a split-K semaphore does). Scope it to the data that crosses: fence.acq_rel.cluster or "
    ".cta instead of .gpu where the reader is that close, red.release / ld.acquire on the "
    "flag instead of a full fence and a relaxed atomic, or one fence per tile rather than one "
    "per store")


def _fence_hotspots(p) -> list[tuple[str, int]]:
    """(opcode, membar samples) of the fence instructions among the hotspots that carry
    membar samples."""
    fences = [(h.opcode, dict(h.reasons).get("membar", 0)) for h in p.hotspots
              if base_opcode(h.opcode) in FENCE_OPCODES]
    return [(op, n) for op, n in fences if n > 0]


def _check_fence_bound(inputs: Inputs) -> Hit | None:
    """Symptom: warps spend 5% or more of their stall time waiting for memory fences
    (membar stalls) while the schedulers have little else to issue.
    Why: a fence waits until every earlier memory operation of the thread is performed at
    the fence's scope. barrier.cluster.arrive has release semantics unless it says
    .relaxed, so on sm_90 it compiles to a wait for the thread's outstanding memory
    operations (ERRBAR before UCGABAR_ARV) at GPU scope: a split-K reduction that reads a
    peer's partial through distributed shared memory between two cluster barriers pays
    that wait twice per tile, for the CTA's global traffic as well as for the shared
    memory the peer reads. A __threadfence() before a flag (the split-K semaphore) is the
    same wait without the barrier.
    Fix: for a cluster barrier, push the partial instead of fencing before reading it
    (st.async into the receiver's shared memory, completing on its mbarrier), and keep the
    barriers that order nothing relaxed; for a fence of its own, scope it to the data that
    crosses (cluster or CTA scope, release/acquire on the flag).
    Not a wait of the work: a fence in the arrive of warps parked at a barrier until the
    kernel ends (KernelProfile.parked: a producer warpgroup's spare warps at a cluster's
    exit barrier), which stall_share leaves out. hgemm_small_m's pulled split-K reduction
    (64 x 4096^2, H200) read 13.2% membar stalls, nearly all at its producer warpgroup's
    exit barriers, and this rule fired on them; without them 1.2%, and silent. Pushing the
    partial saved 5.2-5.7% at 16 and 64 x 4096^2 all the same: its consumers' two cluster
    barriers around the reduction (1.28 us between the last k tile and the epilogue, per-CTA
    probes) are a wait no rule reads yet.
    Estimate: the membar share of stall time x the idle issue fraction (1 - issue active):
    the fence waits while the scheduler has nothing else to issue; an upper bound, since the
    receiver still waits for the partial's bytes.
    Example:
        before: barrier.cluster.arrive; wait; ld.shared::cluster partial; add; arrive; wait
        after:  split 1: st.async partial -> split 0's smem (complete_tx on its mbarrier)
                split 0: mbarrier wait (tx bytes); add
    Source: hgemm_small_m's pushed partial (fused.cu PUSH, 2026-12-04: 0.943-0.948 of the
    pulled kernel's time at 16 and 64 x 4096^2); the PTX ISA's barrier.cluster (.release by
    default); seed 000 §6.2 (split-K reductions), §7.1 (small inference shapes)."""
    p = inputs.profile
    share = stall_share(p, ("membar",))
    if share < MEMBAR_MIN:
        return None
    idle = _idle(p)
    fences = _fence_hotspots(p)
    evidence = [
        Evidence("stall share of membar", round(share, 3), f">= {MEMBAR_MIN}"),
        Evidence(M_ISSUE_ACTIVE, round(100 * (1 - idle), 1), "- (the estimate's idle share)"),
    ]
    if not p.hotspots:
        # No PC sampling: where the fence sits is unknown, never read as "not a cluster
        # barrier"; both fixes are given.
        evidence.append(Evidence("fence instructions (hotspots)", "not collected (no PC "
                                 "sampling in the report)", "-"))
        how = f"either {_CLUSTER_FENCE_HOW}; or {_PLAIN_FENCE_HOW}"
    else:
        if fences:
            hottest = max(fences, key=lambda f: f[1])[0]
            evidence.append(Evidence("hottest fence instruction (membar samples at fences "
                                     "among the hotspots)",
                                     f"{hottest} ({sum(n for _, n in fences)})", "-"))
        cluster = any(base_opcode(op) == "UCGABAR_ARV" for op, _ in fences)
        how = _CLUSTER_FENCE_HOW if cluster else _PLAIN_FENCE_HOW
    return Hit(tuple(evidence), share * idle, fix_args=(("how", how),))


FENCE_BOUND = Rule(
    code="PS126", tag="memory-fence", title="Warps wait at memory fences",
    severity="warning",
    metrics=(*STALL_METRICS, M_ISSUE_ACTIVE),
    check=_check_fence_bound,
    fix="Take the fence off the critical path: {how}.",
    reference="NCU Profiling Guide: Warp Stall Reasons (membar); PTX ISA: barrier.cluster "
              "(.relaxed), st.async, mbarrier complete_tx, membar/fence scopes",
    ncu=("CPIStall/Membar",),
    thresholds=(("MEMBAR_MIN", MEMBAR_MIN),),
)


def _check_epilogue_exposed(inputs: Inputs) -> Hit | None:
    """Symptom: an asynchronous-MMA (wgmma/tcgen05) kernel runs more than one wave of CTAs
    and its tensor pipe is busy less than the practical ceiling, while no barrier loop
    (PS121) and no main loop waiting on its own loads (PS120: long_scoreboard 30% or more
    of a kernel without warp roles, where those stalls are the loads' and not barrier
    waits) explains the idle pipe: every CTA's prologue (filling its ring) and epilogue
    (storing C) run with the tensor pipe idle, and so does the last, partial wave. (Triton's
    TF32 matmul on a row-major B, an H100 capture, idles its pipe 83% waiting on 4-byte
    strided copies: making it persistent would not feed it.)
    Why: a non-persistent grid pays prologue + epilogue per tile in series; a persistent
    grid of one CTA per multiprocessor walks the tiles and overlaps each tile's epilogue
    with the next tile's loads (the producer runs ahead).
    Fix: a persistent kernel: one CTA per SM looping over tiles in a grouped order, the
    ring's phases carried across tiles, C stored through shared memory by TMA.
    Estimate: 1 - tensor pipe busy / 0.90, the idle pipe time up to what cuBLAS and the
    persistent stage sustain on the H200 (89-90% of elapsed cycles).
    Example:
        before: grid = tiles; one tile per CTA: load ring, mma loop, store C, exit
        after:  grid = #SMs; for (tile = blockIdx.x; tile < tiles; tile += gridDim.x) {...}
    Source: the hgemm_tma_wgmma_ws -> _persistent step (11% on the H200, which no rule
    predicted before this one); seed 000 §4 (persistent kernels)."""
    p = inputs.profile
    need_opcodes(p)
    if not is_async_mma(p):
        return None
    waves = need(p.launch.waves_per_sm, M_WAVES)
    if waves <= PERSISTENT_WAVES_MAX:
        return None
    if _serialized(inputs):
        return None     # the wgmmas wait one by one: the idle pipe is PS145's
    busy = need(p.metric(M_TENSOR_PIPE), M_TENSOR_PIPE)
    if stall_share(p, ("barrier",)) >= BARRIER_MIN and not is_warp_specialised(p):
        return None     # the synchronous loop is what idles the pipe (PS121)
    if stall_share(p, ("long_scoreboard",)) >= LONG_SCOREBOARD_MIN and not is_warp_specialised(p):
        return None     # its warps wait on their own loads: the main loop idles the pipe (PS120)
    idle = 1 - busy / 100 / TENSOR_PIPE_PRACTICAL
    if idle <= 0:
        return None
    return Hit((
        Evidence(M_WAVES, round(waves, 2), f"> {PERSISTENT_WAVES_MAX} (not persistent)"),
        Evidence(M_TENSOR_PIPE, round(busy, 1), f"< {100 * TENSOR_PIPE_PRACTICAL:.0f}"),
    ), idle)


EPILOGUE_EXPOSED = Rule(
    code="PS123", tag="epilogue-exposed", title="Each tile's epilogue runs with the tensor pipe idle",
    severity="warning",
    metrics=(M_TENSOR_PIPE, M_WAVES, *STALL_METRICS, *OPCODE_METRICS),
    check=_check_epilogue_exposed,
    fix="Make the kernel persistent: launch one CTA per multiprocessor (or per co-resident "
        "cluster), loop over output tiles in a grouped, L2-friendly order, carry the ring's "
        "mbarrier phases from tile to tile, and store C through shared memory with a TMA store "
        "so the producer warpgroup loads the next tile during the epilogue.",
    reference="NCU Profiling Guide: Compute Workload Analysis (pipe utilization); CUDA C++ "
              "Programming Guide: Tensor Memory Access (TMA stores)",
    thresholds=(("PERSISTENT_WAVES_MAX", PERSISTENT_WAVES_MAX), ("BARRIER_MIN", BARRIER_MIN),
                ("LONG_SCOREBOARD_MIN", LONG_SCOREBOARD_MIN),
                ("TENSOR_PIPE_PRACTICAL", TENSOR_PIPE_PRACTICAL)),
)

def _check_epilogue_math_exposed(inputs: Inputs) -> Hit | None:
    """Symptom: a persistent asynchronous-MMA kernel (wgmma/tcgen05, one wave of CTAs)
    issues per-element FP math (FFMA/FMUL/FADD, MUFU, half2 math: a bias, an activation, a
    scale) worth at least 1% of its active cycles on every scheduler, and its tensor pipe
    is busy for less of its active cycles than the best GEMMs sustain.
    Why: in a cooperative kernel both consumer warpgroups work on the same tile, so the
    accumulators they run the epilogue on are the ones the next tile's wgmmas need: the
    tensor pipe waits for the whole epilogue of every tile (the producer only gets the
    next tile's loads ahead). The more math per element (GELU is a polynomial and a tanh),
    the longer that idle span; a plain GEMM's convert-and-store hides behind it, an
    activation does not.
    Fix: overlap the epilogue with MMA. With wgmma: give the two consumer warpgroups
    different tiles and order their k loops (ping-pong), so one warpgroup's epilogue runs
    under the other's wgmmas (each tile is then 64 rows per warpgroup: 1.67x the A + B
    bytes per FLOP from L2 of a shared 128 x 256 tile, so time it against the cooperative
    kernel).
    With tcgen05: double-buffer the accumulator in tensor memory and give the epilogue its
    own warps. Or trim the epilogue's instructions per element (bias pairs loaded once,
    packed f16x2/bf16x2 math where the precision allows).
    Not this rule's: a one-wave grid of one tile per CTA (the run manifest's tiles against
    the CTAs: hgemm_small_m's split-K at M = 256, whose idle is its stream's start and its
    one reduction), and a kernel whose consumer warpgroups already own whole tiles (its tile
    is one wgmma fragment, 64 x 256, with two consumers: perfscope.structure), whose idle
    tensor pipe lies elsewhere (hgemm_fused_pingpong on the H200: one warpgroup issues
    wgmmas at a time, and its waits at the full barrier idle the pipe; perfscope diff
    names the consumers' tiles).
    Estimate: 1 - (tensor pipe busy per active SM cycle) / 0.96, the share cuBLAS's nvjet
    sustains at 4096^3 on the H200 (96.0-96.4%); active cycles leave the last round's idle
    SMs to PS153, so the two never count the same cycles.
    Example:
        before: both consumers: k loop (tile t) -> bias + GELU + store (tile t) -> k loop (t+1)
        after:  consumer 0: k loop (t)   | epilogue (t)   | k loop (t+2) ...
                consumer 1: ...epilogue  | k loop (t+1)   | epilogue (t+1) ...
    Source: hgemm_tma_wgmma_persistent -> hgemm_fused_bias_act (1.07x the cycles on the
    H200, which no rule explained before this one; cuBLASLt's GELU_BIAS nvjet pays 1.05x
    its plain kernel the same way); seed 000 §7.1 (fused epilogues), §4 (persistent,
    warp-specialised kernels)."""
    m = _fp_math_idle(inputs)
    if m is None or (m.per_element is not None and m.per_element > EPILOGUE_OPS_PER_ELEMENT_MAX):
        return None     # math that grows with K runs in the k loop: PS125's
    ev = list(m.evidence)
    if m.per_element is None and m.mma.startswith("QGMMA"):
        ev.append(Evidence("MMA instruction (no run manifest: FP math per output element "
                           "unknown)", m.mma, "QGMMA: an fp8 k loop's partial-sum promotion "
                           "(PS125) reads the same"))
    how = _TMEM_HOW if m.tcgen05 else _PINGPONG_HOW
    return Hit(tuple(ev), m.idle, fix_args=(("how", how),))


@dataclass(frozen=True)
class _FpMath:
    """A persistent asynchronous-MMA kernel's FP math and its tensor pipe's idle share."""

    evidence: tuple[Evidence, ...]
    idle: float                     # 1 - tensor pipe busy per active cycle / practical
    share: float                    # FP math issue cycles per scheduler / active cycles
    per_element: float | None       # FP math operations per output element (None: no shape)
    mma: str                        # the MMA instruction, e.g. QGMMA.64x256x32 ("" unknown)
    tcgen05: bool


def _fp_math_idle(inputs: Inputs) -> _FpMath | None:
    """PS124's and PS125's shared reading: None unless a persistent asynchronous-MMA kernel
    issues FP math worth EPILOGUE_MATH_MIN of its active cycles with its tensor pipe below
    the practical busy share and no second consumer to hide it under."""
    p = inputs.profile
    need_opcodes(p)
    if not is_async_mma(p):
        return None
    waves = need(p.launch.waves_per_sm, M_WAVES)
    if waves > PERSISTENT_WAVES_MAX:
        return None     # not persistent: each CTA's epilogue is PS123's
    sms = need(p.identity.sm_count, M_SM_COUNT)
    busy_active = _tensor_busy_per_active_cycle(p)
    if not sms or busy_active is None:
        return None
    active = need(p.metric(M_SM_ACTIVE_AVG), M_SM_ACTIVE_AVG)
    math_ops = sum(p.opcodes.executed.get(op, 0.0) for op in EPILOGUE_MATH_OPCODES)
    math_share = math_ops / (sms * SCHEDULERS_PER_SM) / active
    if math_share < EPILOGUE_MATH_MIN:
        return None
    idle = 1 - busy_active / TENSOR_PIPE_ACTIVE_PRACTICAL
    if idle <= 0:
        return None
    shape = launch_shape(p, inputs.manifest)
    if shape.serialized:
        return None     # the wgmmas wait one by one: the idle pipe is PS145's
    if shape.persistent is False:
        return None     # one tile per CTA: no next tile whose MMAs could wait on this math
    if shape.consumers_own_tiles:
        return None     # ping-pong already: one consumer's math runs under the other's MMAs
    ev = [
        Evidence("FP math (FFMA, FMUL, FADD, MUFU, ...) issue cycles per scheduler / active SM "
                 "cycles", round(math_share, 4), f">= {EPILOGUE_MATH_MIN}"),
        Evidence("tensor pipe busy per active SM cycle", round(100 * busy_active, 1),
                 f"< {100 * TENSOR_PIPE_ACTIVE_PRACTICAL:.0f}"),
        Evidence(M_WAVES, round(waves, 2), f"<= {PERSISTENT_WAVES_MAX} (persistent)"),
    ]
    m = inputs.manifest
    per_element = None
    if m is not None and m.m and m.n:
        # An epilogue's math is a few operations per output element whatever K is.
        per_element = math_ops * WARP_LANES / (m.batch * m.m * m.n)
        dims = "M x N" if m.batch == 1 else "B x M x N"
        ev.append(Evidence(f"FP math operations per output element (run manifest's {dims})",
                           round(per_element, 1), f"<= {EPILOGUE_OPS_PER_ELEMENT_MAX} an "
                           "epilogue's, more grows with K"))
    return _FpMath(tuple(ev), idle, math_share, per_element, shape.mma or "",
                   p.opcodes.has("utcmma"))


def _check_k_loop_math(inputs: Inputs) -> Hit | None:
    """Symptom: a persistent asynchronous-MMA kernel issues FP math worth at least 1% of its
    active cycles on every scheduler, more of it per output element than any epilogue
    needs (over EPILOGUE_OPS_PER_ELEMENT_MAX: the count grows with K), and its tensor pipe
    is busy for less of its active cycles than the best GEMMs sustain.
    Why: math in the k loop between the wgmmas, most often an fp8 kernel's partial sums
    promoted from the tensor core's accumulator into fp32 registers every few k tiles
    (cuBLASLt's default for e4m3, which keeps its error from growing with K; its fast
    accumulation mode does not), or weights dequantised in registers. The warpgroup must
    wait for its wgmmas (WARPGROUP.DEPBAR) before it may read their accumulators, so the
    tensor pipe idles while the adds issue, once per promotion rather than once per tile.
    Fix: promote less often (every 2 to 4 k tiles, error growing with the interval);
    issue the next k tile's wgmmas into a second accumulator set before adding the first
    (registers permitting: a 128 x 128 cooperative tile holds 64 fp32 per thread); or
    take fast accumulation where the error budget allows it.
    Not this rule's: an epilogue's few operations per element (PS124), and without the
    run manifest's M x N the two cannot be told apart (PS124 fires and says so for QGMMA).
    Estimate: the lesser of the tensor pipe's idle share (1 - busy per active cycle /
    0.96, as PS124) and the math's own issue share: hidden perfectly, the adds cost no
    more than their issue slots, and they cannot give back more than the idle pipe.
    Example:
        before: k tile t: wgmma x4 -> wait -> acc32 += partial (FADD per element) -> k tile t+1
        after:  k tile t: wgmma x4 into partial[t % 2] -> wait for t - 1 -> acc32 += partial[(t - 1) % 2]
    cuBLASLt's e4m3 nvjet at 4096^3 on the H200, default against fast accumulation: 34
    against 2 FP operations per output element (4096 / 128 promotions), tensor pipe 86.8%
    against 89.6% of active cycles, 1326 against 1419 TFLOP/s (1.07x the time); relative
    error 0.0017 against 0.0021.
    Source: seed 000 §7.1 (quantised GEMMs); the PTX ISA's wgmma.wait_group; DeepSeek-V3's
    fp8 GEMM note on promoting partial sums to fp32 every 128 elements of K."""
    m = _fp_math_idle(inputs)
    if m is None or m.per_element is None or m.per_element <= EPILOGUE_OPS_PER_ELEMENT_MAX:
        return None
    return Hit(m.evidence, min(m.idle, m.share))


K_LOOP_MATH = Rule(
    code="PS125", tag="k-loop-math",
    title="FP math in the k loop (fp8 partial sums promoted, or dequantisation) idles the "
          "tensor pipe",
    severity="warning",
    metrics=(M_TENSOR_PIPE, M_WAVES, M_SM_ACTIVE_AVG, M_CYCLES, M_SM_COUNT, *OPCODE_METRICS),
    check=_check_k_loop_math,
    fix="Promote the partial sums less often (every 2 to 4 k tiles: the error grows with the "
        "interval), or issue the next k tile's wgmmas into a second accumulator set before "
        "adding the first (registers permitting), or take fast accumulation where the error "
        "budget allows (cuBLASLt's at 4096^3 on the H200: 1.07x faster, relative error "
        "0.0021 against 0.0017).",
    reference="PTX ISA: wgmma.wait_group; NCU Profiling Guide: Instruction Statistics; "
              "DeepSeek-V3 technical report (fp8 GEMM: promotion to fp32 every 128 of K)",
    thresholds=(("PERSISTENT_WAVES_MAX", PERSISTENT_WAVES_MAX),
                ("EPILOGUE_MATH_MIN", EPILOGUE_MATH_MIN),
                ("EPILOGUE_OPS_PER_ELEMENT_MAX", EPILOGUE_OPS_PER_ELEMENT_MAX),
                ("TENSOR_PIPE_ACTIVE_PRACTICAL", TENSOR_PIPE_ACTIVE_PRACTICAL)),
)


# PS124's fix, by where the accumulators live.
_PINGPONG_HOW = (
    "give the two consumer warpgroups different tiles and order their k loops (ping-pong), so "
    "one warpgroup's bias/activation/store runs under the other's wgmmas; each warpgroup's "
    "tile is then 64 rows, which brings 1.67x the A + B bytes per FLOP of a shared 128 x 256 "
    "tile from L2 into shared memory (wgmma's reads per FLOP stay the same), so time it "
    "against the cooperative kernel")
_TMEM_HOW = (
    "double-buffer the accumulator in tensor memory (two column ranges of its 512) and give "
    "the epilogue its own warps: tcgen05.mma fills one buffer while the epilogue warps read "
    "the other (tcgen05.ld) and store it")


EPILOGUE_MATH_EXPOSED = Rule(
    code="PS124", tag="epilogue-exposed",
    title="Each tile's epilogue math runs with the tensor pipe idle (persistent kernel)",
    severity="warning",
    metrics=(M_TENSOR_PIPE, M_WAVES, M_SM_ACTIVE_AVG, M_CYCLES, M_SM_COUNT, *OPCODE_METRICS),
    check=_check_epilogue_math_exposed,
    fix="Overlap the epilogue with MMA: {how}; or trim the epilogue's instructions per element "
        "(bias pairs loaded once, packed f16x2/bf16x2 math where the precision allows).",
    reference="NCU Profiling Guide: Compute Workload Analysis (pipe utilization), Instruction "
              "Statistics; CUDA C++ Programming Guide: warpgroup MMA (wgmma)",
    thresholds=(("PERSISTENT_WAVES_MAX", PERSISTENT_WAVES_MAX),
                ("EPILOGUE_MATH_MIN", EPILOGUE_MATH_MIN),
                ("TENSOR_PIPE_ACTIVE_PRACTICAL", TENSOR_PIPE_ACTIVE_PRACTICAL)),
)

def _tensor_busy_per_active_cycle(p) -> float | None:
    """The tensor pipe's busy share of the SMs' *active* cycles (0-1), so that the last
    round's idle SMs stay PS153's; None when no SM was active."""
    active = need(p.metric(M_SM_ACTIVE_AVG), M_SM_ACTIVE_AVG)
    elapsed = need(p.metric(M_CYCLES), M_CYCLES)
    busy = need(p.metric(M_TENSOR_PIPE), M_TENSOR_PIPE)
    return busy / 100 * elapsed / active if active > 0 else None


def _serialized(inputs: Inputs) -> bool:
    return bool(launch_shape(inputs.profile, inputs.manifest).serialized)


def _check_mma_serialized(inputs: Inputs) -> Hit | None:
    """Symptom: an asynchronous-MMA kernel executes a warpgroup wait (WARPGROUP.DEPBAR) for
    nearly every wgmma (SERIAL_WAITS_PER_MMA or more per HGMMA/QGMMA), and its tensor pipe is
    busy for less of its active cycles than the best GEMMs sustain.
    Why: a pipelined k loop issues a k tile's 2-8 wgmmas and waits once (0.125-0.5 waits
    per wgmma in every pipelined kernel measured on the H200: ours, cuBLAS's and
    cuBLASLt's nvjet, Triton's); one wait per wgmma is the serialized pipeline ptxas falls
    back to when something other than a wgmma writes the accumulator registers inside the
    pipeline stage (its C7515 info, PS144 of `perfscope sass`), and the tensor pipe then
    runs one wgmma at a time. The counter twin of PS144, for a report whose build log is
    not at hand.
    Fix: keep the accumulators untouched between the fence and the wait, keep values held
    across the k loop out of the registers the accumulators need, inline every call in the
    pipeline; `perfscope sass` (PS144) prints ptxas's reason.
    Not this rule's epilogue or load findings: with the pipeline serialized, the tensor
    pipe's idle is this rule's (PS123, PS124 and PS125 stay silent, so one idle is never
    counted twice).
    Estimate: 1 - (tensor pipe busy per active SM cycle) / 0.96, the idle share PS124 reads;
    an upper bound, since the kernel's epilogue would leave some of it.
    Example:
        before: wgmma(k0); wait 0; wgmma(k1); wait 0; ... (1.00 waits per HGMMA)
        after:  wgmma(k0); wgmma(k1); wgmma(k2); wgmma(k3); wait 1 (0.25 per HGMMA)
    hgemm_fused_quant (fp8 outputs) with its bias held across the k loop on the H200: 1.00
    waits per HGMMA against 0.25 committed, 1.11x the cycles under ncu; this rule estimates
    0.18 where PS124 used to claim it as epilogue time with a ping-pong fix.
    Source: PTX ISA: wgmma.fence, wgmma.commit_group, wgmma.wait_group; seed 000 §4
    (Hopper: wgmma); tests/fixtures/h200/wgmma-serialized."""
    p = inputs.profile
    need_opcodes(p)
    if not is_async_mma(p):
        return None
    shape = launch_shape(p, inputs.manifest)
    if not shape.serialized:
        return None
    busy_active = _tensor_busy_per_active_cycle(p)
    if busy_active is None:
        return None
    idle = 1 - busy_active / TENSOR_PIPE_ACTIVE_PRACTICAL
    if idle <= 0:
        return None
    return Hit((
        Evidence("WARPGROUP.DEPBAR per wgmma executed", round(shape.mma_waits, 2),
                 f">= {SERIAL_WAITS_PER_MMA} (pipelined kernels: 0.125-0.5)"),
        Evidence("tensor pipe busy per active SM cycle", round(100 * busy_active, 1),
                 f"< {100 * TENSOR_PIPE_ACTIVE_PRACTICAL:.0f}"),
    ), idle)


MMA_SERIALIZED = Rule(
    code="PS145", tag="mma-serialized",
    title="The wgmmas wait one by one: the pipeline is serialized",
    severity="warning",
    metrics=(M_TENSOR_PIPE, M_SM_ACTIVE_AVG, M_CYCLES, *OPCODE_METRICS),
    check=_check_mma_serialized,
    fix="Keep the wgmma accumulators untouched between the fence and the wait (initialise or "
        "scale them before it, read them after), keep values held across the k loop out of the "
        "registers the accumulators need, and inline every call in the pipeline; `perfscope "
        "sass` names ptxas's reason (PS144).",
    reference="PTX ISA: Asynchronous Warpgroup Level Matrix Instructions (wgmma.fence, "
              "wgmma.commit_group, wgmma.wait_group)",
    thresholds=(("SERIAL_WAITS_PER_MMA", SERIAL_WAITS_PER_MMA),
                ("TENSOR_PIPE_ACTIVE_PRACTICAL", TENSOR_PIPE_ACTIVE_PRACTICAL)),
)


# What the loop rules (PS127-PS129) read per PC, named where a report lacks it.
PER_PC_SAMPLES = "executions and warp samples per instruction (the Source Counters section)"


def _sampled_loop(p: KernelProfile, math: str) -> HotLoop | None:
    """The main loop as sampled per PC; not evaluated where a kernel whose math is `math`
    (an opcode family) has no per-PC samples."""
    loop = p.hot_loop
    if p.opcodes.has(math) and (loop is None or loop.operand_waits is None):
        need(None, PER_PC_SAMPLES)
    return loop


# -- PS127 --
# A math-free run of at least this many main-loop instructions is a block of work: a wait on
# a load or a barrier is one instruction, and PS120/PS121 read those.
MATH_GAP_RUN_MIN = 16
# The block's own work (its warps issuing it, or stalled on its fixed-latency dependencies,
# dispatch or branches) from this share of all warp samples on. Below it the fix returns
# little: on the one step measured it gave back 0.4 of the share (hgemm_ring, 0.129 ->
# 0.051 on an H100, 0.055 in the H200 reference run), and cuBLAS's own mma.sync kernels for
# odd shapes reach 0.050.
MATH_GAP_WORK_MIN = 0.06
MATH_GAP_WORK_REASONS = ("selected", "wait", "dispatch_stall", "branch_resolving")
# A block whose warps mostly wait (on memory, a barrier, a fence) is a wait with copies in
# it: the latency rules' (hgemm_bcf_dbf's: 0.56 of all samples, 0.31 of them waits).
MATH_GAP_WAITING_MAX = 0.5


def _check_math_gap(inputs: Inputs) -> Hit | None:
    """Symptom: the main loop of an mma.sync GEMM holds a block of at least 16 instructions
    with no mma.sync in it, among them its global copies, and the warps' own work in that
    block (issuing it, or stalled on its fixed-latency dependencies, dispatch or branches:
    not waiting on memory or a barrier) is at least 6% of all warp samples, and waits are
    under half of the block's samples (a wait with copies in it is PS120/PS121's).
    Why: mma.sync is synchronous: a warp in its copy block (address arithmetic, bounds
    checks, LDGSTS) issues no math, and the tensor pipe is fed by the scheduler's other
    warps alone, one or two at the occupancy a 64 x 64 warp tile allows. The barrier that
    ends each k tile lines the warps up, so they reach the block together and the pipe
    runs dry for about as long as the block takes.
    Fix: make the copies cheap and spread them out: work out each thread's copy addresses
    and bounds once before the loop (a whole-K tile's copy is then one address and one
    LDGSTS; only the tile past K checks k), and issue a tile's copies in shares between the
    next tile's k16 steps, so each warp's block is a few instructions between mma.syncs.
    Estimate: the block's own-work share of the samples, an upper bound: the pipe idles
    that long only if every warp of a scheduler sits in the block at once with no mma.sync
    still queued. On the one step measured (hgemm_ring to its copies spread over the k16
    steps, H100, probes/ring-spread-h100.jsonl) the block held 0.129 of the samples in its
    own work and the spread saved 0.051 of the time (1.054x; in the H200 reference run,
    hgemm_ring_spread, 0.130 / 0.128 estimated and 0.055 / 0.053 saved, bf16 / fp16): other
    warps' queued math covers the rest, so the declared severity stays below a warning. Of
    that, 0.037 came from making the copies cheap; issued at the top of each tile, ptxas
    scattered them among the HMMAs itself (no run without mma.sync past one instruction:
    silent), and the spread over the k16 steps gave the last 0.013-0.014
    (probes/spread-vs-barrier-h100.jsonl).
    Example:
        before: barrier; 12 x { address, bounds checks, select, LDGSTS } (108 instructions); 128 HMMA
        after:  barrier; 4 x { 3 x { address, LDGSTS }; 32 HMMA }
    Source: seed 004 §3 (the cp.async ring); seed 002 §4 (prefetch under the math); the
    interleaved copies of CUTLASS's multistage mainloop; NCU Profiling Guide: Source
    Counters (warp samples per instruction)."""
    p = inputs.profile
    loop = _sampled_loop(p, "hmma")
    gap = loop.math_gap if loop is not None else None
    if gap is None or gap.math != "hmma" or not is_gemm_like(p):
        return None
    reasons = dict(gap.reasons)
    sampled = sum(reasons.values())
    work = gap.share * sum(reasons.get(k, 0) for k in MATH_GAP_WORK_REASONS) / sampled if sampled else 0.0
    if (gap.instructions < MATH_GAP_RUN_MIN or not gap.copies or work < MATH_GAP_WORK_MIN
            or gap.waiting > MATH_GAP_WAITING_MAX * gap.share):
        return None
    top = ", ".join(f"{k} {n}" for k, n in gap.reasons[:3])
    return Hit((
        Evidence(f"main-loop instructions in a row with no mma.sync (from offset {gap.first:#x})",
                 gap.instructions, f">= {MATH_GAP_RUN_MIN}"),
        Evidence("global loads and copies among them", gap.copies, "> 0"),
        Evidence(f"their warp samples / all samples (most: {top})", round(gap.share, 3), "-"),
        Evidence("of which waits on memory, a barrier or a fence / all samples",
                 round(gap.waiting, 3), f"<= {MATH_GAP_WAITING_MAX} of theirs"),
        Evidence("of which their own work (issuing; wait, dispatch, branch stalls) / all samples",
                 round(work, 3), f">= {MATH_GAP_WORK_MIN}"),
    ), work, fix_args=(("first", f"{gap.first:#x}"), ("n", str(gap.instructions))))


MATH_GAP = Rule(
    code="PS127", tag="math-gap",
    title="The mma.sync loop stops for a block of copy work each k tile",
    severity="optimization",
    metrics=(M_PC_SAMPLES, M_INST_EXECUTED_PC, *OPCODE_METRICS),
    check=_check_math_gap,
    fix="Work out each thread's copy addresses and bounds once, before the k loop (a whole-K "
        "tile's copy is then one address and one LDGSTS; only a tile past K checks k), and "
        "issue each tile's copies in shares between the next tile's k16 steps, so no warp "
        "leaves its mma.sync stream for the {n} instructions at {first}.",
    reference="NCU Profiling Guide: Source Counters (warp state samples per instruction); "
              "CUTLASS: the multistage (cp.async) mainloop's interleaved copies",
    thresholds=(("MATH_GAP_RUN_MIN", MATH_GAP_RUN_MIN), ("MATH_GAP_WORK_MIN", MATH_GAP_WORK_MIN),
                ("MATH_GAP_WAITING_MAX", MATH_GAP_WAITING_MAX)),
)


# -- PS128 --
# Write-after-read waits in the main loop from this share of all warp samples on. The one
# step measured (hgemm_ring_persistent at EPI 2 -> EPI 0, H100) took 0.084 to 0.013 and
# saved 0.12 of the time; in the H200's committed reports the mma.sync and FFMA stages past
# hgemm_bcf_dbf_rw hold 0.003-0.032, where the rule stays silent.
REUSE_WAIT_MIN = 0.05
# A kernel whose shared or global traffic is this far over its ideal waits on the queue of
# an L1TEX unit doing extra work: its waits, whatever their register, are PS101/PS110/PS112's
# (hgemm_naive's 338% bank conflicts; Triton's uncoalesced TF32 copies, 0.42 of its samples
# at such waits behind 299% extra wavefronts).
REUSE_EXCESS_MAX_PCT = 25.0


def _check_register_reuse(inputs: Inputs) -> Hit | None:
    """Symptom: in the main loop of a GEMM whose math is synchronous (mma.sync or FFMA),
    warps stall on the long scoreboard at instructions that read no loaded register but
    write one that a global copy, load or store (LDGSTS, LDG, STG: an L1TEX instruction)
    reads, for at least 5% of all warp samples, while the kernel's shared and global
    traffic is within 25% of its ideal.
    Why: an L1TEX instruction reads its register operands (addresses, a store's data) when
    its unit takes it, not when the warp issues it; until then the scoreboard holds them,
    and an instruction that writes one of them waits for the copy to leave the queue,
    behind the warps' shared-memory loads. ptxas recycles a copy's address registers at once
    when registers are scarce (a 64 x 64 mma.sync warp tile leaves a few), so each k tile's
    address arithmetic waits on the previous copies, and with it the warp's next mma.sync.
    Fix: give the copies registers that live until they have issued: work each copy's
    source out once per tile from a base kept for the whole loop (one add per tile, not one
    per copy), keep fewer values live across the loop (a deferred store's pointers, flags)
    so ptxas need not reuse the address registers at once, or issue the copies earlier in
    the k step than the arithmetic that reuses their registers.
    Estimate: the share of warp samples at those waits: what the warps lose there themselves.
    The step measured saved more (0.12 for a share of 0.071 removed: warps that arrive late
    at the k tile's barrier hold the others there too), so it is a floor of the step's
    saving, under the loop's whole long-scoreboard share (PS120 reads that; both are
    latency, so a combined estimate counts the larger).
    Example:
        before: LDGSTS [R232], desc[UR12][R234.64]; ...; IMAD.WIDE.U32 R234, R213, UR14, R220  // waits
        after:  LDGSTS [R232], desc[UR12][R234.64]; ...; IMAD.WIDE.U32 R240, R213, UR14, R220
    Source: hgemm_ring_persistent with its C stores deferred into the next tile's k steps
    (probes/ring-persistent-h100.jsonl: 0.881x / 0.889x the spread stage where the
    undeferred form ran 1.005x / 1.004x, bf16 / fp16; `perfscope diff` named no finding
    for the 1.15x in cycles before this one); NCU Profiling Guide: Warp Stall Reasons
    (long_scoreboard: an L1TEX operation's scoreboard dependency)."""
    p = inputs.profile
    ops = p.opcodes
    if ops.families and (ops.has("gmma") or ops.has("utcmma")
                         or not (ops.has("hmma") or ops.has("ffma"))):
        return None     # asynchronous math runs on while its warps wait, or no math to stall
    loop = p.hot_loop
    if loop is None or loop.reuse_waits is None:
        need(None, PER_PC_SAMPLES)
    fam = loop.families
    if not (fam.get("hmma") or fam.get("ffma")) or fam.get("gmma") or fam.get("utcmma"):
        return None
    if not is_gemm_like(p):
        return None
    reuse = loop.reuse_waits
    excess = [t.excess_pct for t in (p.memory.shared, p.memory.global_)]
    if reuse.share < REUSE_WAIT_MIN or any(x is not None and x > REUSE_EXCESS_MAX_PCT for x in excess):
        return None
    shown = ", ".join(f"{x:.0f}%" if x is not None else "n/a" for x in excess)
    return Hit((
        Evidence(f"main-loop long_scoreboard samples at write-after-read waits ({reuse.instructions} "
                 "PCs) / all samples", round(reuse.share, 3), f">= {REUSE_WAIT_MIN}"),
        Evidence(f"most waited, at {reuse.first:#x}: {reuse.sass}" + (
            f" (the register read by {reuse.holder_sass} at {reuse.holder:#x})"
            if reuse.holder is not None else ""), reuse.samples, "-"),
        Evidence("shared / global traffic over ideal", shown, f"<= {REUSE_EXCESS_MAX_PCT:.0f}%"),
    ), reuse.share, fix_args=(("first", f"{reuse.first:#x}"),))


REGISTER_REUSE = Rule(
    code="PS128", tag="register-reuse",
    title="Registers are rewritten while copies still hold them",
    severity="warning",
    metrics=(M_PC_SAMPLES, M_INST_EXECUTED_PC, M_LONG_SCOREBOARD_SAMPLES, *OPCODE_METRICS),
    check=_check_register_reuse,
    fix="Keep the registers an in-flight LDGSTS, LDG or STG reads out of reuse until it has "
        "issued: work each copy's source out once per tile from a base kept for the whole "
        "loop, keep fewer values live across the loop, or issue the copies earlier than the "
        "arithmetic that rewrites their registers (the most waited at {first}).",
    reference="NCU Profiling Guide: Warp Stall Reasons (long_scoreboard), Source Counters",
    thresholds=(("REUSE_WAIT_MIN", REUSE_WAIT_MIN), ("REUSE_EXCESS_MAX_PCT", REUSE_EXCESS_MAX_PCT)),
)


# -- PS129 --
# Shared loads in bursts (profile.BURST_LOADS_MIN or more between two FFMAs) from this share
# of the FFMA loop's shared loads on. The committed FP32 reports: 0.06-0.15 for the ladder's
# 128 x 256 stages (their one burst is the tile-boundary block, at the barrier), 0.19-0.41
# for the smaller tiles, 0.71-0.78 for the three FFMA orders that measured slower at the
# same instructions (sgemm_fma_order, sgemm_stages4 at JOUTER 2 and 4); cuBLAS's SGEMM 0.
BURST_SHARE_MIN = 0.6
# ... and the warps held at them for their own sake from this share of all samples on.
BURST_WAITS_MIN = 0.02
# At more shared loads per FFMA than this (PS113's threshold) the loop has too few FFMAs to
# spread its loads among: the shared pipe, not their order, is the bound.
BURST_LOADS_PER_FMA_MAX = 0.5


def _check_fragment_bursts(inputs: Inputs) -> Hit | None:
    """Symptom: a register-blocked FFMA main loop (at most one shared load per two FFMAs)
    issues 60% or more of its shared loads in bursts, four or more between two FFMAs, and
    the warps held at those loads for their own sake (the instruction's wait, dispatch or
    MIO throttle: not a wait on memory or a barrier, not passed over for another warp) are
    2% of the samples or more.
    Why: a warp issues in order. Where the next k step's fragment loads come back to back,
    the warp stops at them while the shared pipe's queue takes one after another, and the
    FFMAs behind them, which need none of those fragments yet, wait too; the FFMAs that do
    need them wait for the whole burst (short scoreboard). Spread one at a time between
    FFMAs, the loads issue in slots the math leaves and their latency hides behind it. ptxas
    places the loads where the FFMA order lets it: an order that consumes the fragments in
    the order they load (row by row over a thread's outer product) gets them spread;
    column by column, serpentine or by row pairs, they come bunched.
    Fix: order each k step's FFMAs row by row over the thread's tile, consuming A's and B's
    fragments in the order they are loaded, or load the next step's fragments yourself into
    a second register buffer, one LDS between every few FFMAs of this step.
    Estimate: the samples of warps held at the bursts' loads for their own sake over all
    samples: what the warps spend stopped there that spread loads would not. On the H100,
    sgemm_stages4 at JOUTER 2 and 4 against the stage's own order (its loads spread):
    0.043 and 0.051, where the orders lost 0.048 and 0.058 of their time
    (probes/fma-order-h100.jsonl); on the H200 sgemm_fma_order against sgemm_dyn: 0.056 of
    the 0.16 it lost, the rest in FFMA dispatch stalls that no reading here assigns.
    Example:
        before: for (j) for (i) c[i][j] += a[i] * b[j];   // by columns: 72 of 96 LDS in bursts
        after:  for (i) for (j) c[i][j] += a[i] * b[j];   // by rows: 14 of 96 (sgemm_dyn)
    Source: seed 002 §2.2 (the register-blocked inner loop), §5 (the FFMA schedule); NCU
    Profiling Guide: Warp Stall Reasons (mio_throttle, short_scoreboard, wait), Source
    Counters."""
    p = inputs.profile
    loop = _sampled_loop(p, "ffma")
    fb = loop.fragment_bursts if loop is not None else None
    if fb is None or not fb.loads or not is_gemm_like(p):
        return None
    need_opcodes(p)
    ffma = family(p, "ffma")
    shared = sum(n for op, n in p.opcodes.executed.items() if op in ("LDS", "LDSM"))
    if not ffma or shared / ffma > BURST_LOADS_PER_FMA_MAX:
        return None
    share = fb.in_bursts / fb.loads
    if share < BURST_SHARE_MIN or fb.waits < BURST_WAITS_MIN:
        return None
    top = ", ".join(f"{k} {n}" for k, n in fb.reasons[:3])
    return Hit((
        Evidence("shared loads / FFMA executed", round(shared / ffma, 3),
                 f"<= {BURST_LOADS_PER_FMA_MAX}"),
        Evidence(f"main-loop shared loads in bursts of {BURST_LOADS_MIN}+ between two FFMAs",
                 f"{fb.in_bursts} of {fb.loads} in {fb.bursts} bursts", f">= {BURST_SHARE_MIN:.0%}"),
        Evidence(f"warps held at them for their own sake / all samples (most: {top})",
                 round(fb.waits, 3), f">= {BURST_WAITS_MIN}"),
    ), fb.waits, fix_args=(("first", f"{fb.first:#x}"),))


FRAGMENT_BURSTS = Rule(
    code="PS129", tag="fragment-bursts",
    title="The FFMA loop issues its fragment loads in bursts",
    severity="optimization",
    metrics=(M_PC_SAMPLES, M_INST_EXECUTED_PC, *OPCODE_METRICS),
    check=_check_fragment_bursts,
    fix="Order each k step's FFMAs row by row over the thread's tile, so A's and B's fragments "
        "are consumed in the order they load and ptxas can put one load between every few "
        "FFMAs (the burst that holds warps longest is at {first}); or load the next step's "
        "fragments into a second register buffer yourself, one LDS at a time among this "
        "step's FFMAs. `perfscope sass --listing` shows where they went.",
    reference="NCU Profiling Guide: Warp Stall Reasons (mio_throttle, short_scoreboard, wait), "
              "Source Counters",
    thresholds=(("BURST_SHARE_MIN", BURST_SHARE_MIN), ("BURST_WAITS_MIN", BURST_WAITS_MIN),
                ("BURST_LOADS_PER_FMA_MAX", BURST_LOADS_PER_FMA_MAX)),
)


# -- PS133 --
# Dispatch-stall samples at an FFMA loop's FFMAs over all its samples, at and below which no
# compile measured here gave time back: ptxas's compiles of our FFMA stages hold 0.050-0.081
# (sgemm_stages4 0.076-0.077 on the H100 and the H200), and orders of its loop that cut the
# share to 0.052-0.063 ran 0.94-0.98x as fast (JOUTER 2, 4 and 13, probes/fma-*-h100.jsonl).
# cuBLAS's hand-scheduled SASS holds 0.034, but nothing here reached that share with its time.
FFMA_DISPATCH_FLOOR = 0.08
# ... and the rule speaks from this much above it on (3% of the time, as the others do).
FFMA_DISPATCH_EXCESS_MIN = 0.03


def _check_ffma_dispatch(inputs: Inputs) -> Hit | None:
    """Symptom: an FFMA main loop's FFMAs are held at dispatch (the warp's FFMA was ready, the
    dispatcher held it back) in 11% or more of all warp samples: 3% above the 0.08 that
    ptxas's compiles of register-blocked FFMA loops hold (0.050-0.081 over our stages).
    Why: the NCU guide puts a dispatch stall down to conflicts or events at dispatch; at an
    FFMA, whose three source registers the register file must deliver unless the operand
    reuse cache holds them, the suspects are its register-file reads. Which FFMAs stall is
    a property of the compiled loop, not of the run: per PC the samples come in quanta (an
    FFMA held on about every execution, or on almost none), and sgemm_stages4's loop stalls
    at the same FFMAs on an H100 and an H200 (257 of its 265 and 271 stalling FFMAs in
    common). The order of the FFMAs and the registers ptxas gives them decide it: at the same
    instructions, orders alone moved the share from 0.052 to 0.182, and no register-bank
    count of the SASS we could make predicts which FFMAs stall (probes/README.md).
    Fix: an order that compiles to fewer held FFMAs, row by row over the thread's tile
    first (consuming the fragments in the order they load, which also keeps the loads
    spread, PS129); where a compiler picks the order (Triton's IEEE fp32 matmul, 0.123),
    its configurations compile different loops. Compare the compiles' shares in
    `perfscope sass --listing` of their reports. Below 0.08 no order measured here bought
    time back.
    Estimate: the samples the loop's FFMAs spend held at dispatch above 0.08, over all
    samples. Against orders of sgemm_stages4's loop timed before this rule (H100,
    probes/fma-order-more-h100.jsonl) it is low by 30-40%: JOUTER 5 and 7 hold
    0.056 and 0.102 above it and lost 0.093 and 0.146 of their time beyond what their bursts
    held; on the H200 sgemm_fma_order holds 0.069 above it and lost 0.10 beyond PS129's
    0.056. JOUTER 9 (0.097, 0.017 above) lost 0.032 beyond its bursts, under the line.
    Example:
        before: acc[i][j] += a[i] * b[j], each row's even j, then odd  // 921 of 2048 held, 0.182
        after:  acc[i][j] += a[i] * b[j], each row's j in order        // 290 of 2048, 0.077
    Source: seed 002 §5 (the scheduling gap to cuBLAS); NCU Profiling Guide: Warp Stall
    Reasons (dispatch_stall), Source Counters."""
    p = inputs.profile
    loop = _sampled_loop(p, "ffma")
    fd = loop.ffma_dispatch if loop is not None else None
    if fd is None or not is_gemm_like(p):
        return None
    excess = fd.share - FFMA_DISPATCH_FLOOR
    if excess < FFMA_DISPATCH_EXCESS_MIN:
        return None
    return Hit((
        Evidence("dispatch-stall samples at the main loop's FFMAs / all samples",
                 round(fd.share, 3), f">= {FFMA_DISPATCH_FLOOR} + {FFMA_DISPATCH_EXCESS_MIN}"),
        Evidence(f"of its FFMAs, those held on about every execution (most at {fd.first:#x})",
                 f"{fd.stalling} of {fd.ffmas}", "-"),
    ), excess)


FFMA_DISPATCH = Rule(
    code="PS133", tag="ffma-dispatch",
    title="The FFMA loop's FFMAs are held at dispatch",
    severity="optimization",
    metrics=(M_PC_SAMPLES, M_INST_EXECUTED_PC),
    check=_check_ffma_dispatch,
    fix="Compile the loop to fewer held FFMAs: in CUDA C an FFMA order row by row over the "
        "thread's tile first (it also keeps the fragment loads spread); where a compiler picks "
        "the order (Triton), its configurations compile different loops. Compare the "
        "compiles' shares in `perfscope sass --listing` of their reports.",
    reference="NCU Profiling Guide: Warp Stall Reasons (dispatch_stall), Source Counters",
    thresholds=(("FFMA_DISPATCH_FLOOR", FFMA_DISPATCH_FLOOR),
                ("FFMA_DISPATCH_EXCESS_MIN", FFMA_DISPATCH_EXCESS_MIN)),
)

RULES = (LOADS_NOT_OVERLAPPED, PARTLY_EXPOSED, BARRIER_BOUND, EPILOGUE_EXPOSED,
         EPILOGUE_MATH_EXPOSED, K_LOOP_MATH, MMA_SERIALIZED, MATH_GAP, REGISTER_REUSE,
         FRAGMENT_BURSTS, FFMA_DISPATCH)
