"""Global and shared memory: coalescing, vector width, reuse, bank conflicts, stores.

Excess is always judged from the per-instruction actual-against-ideal source counters
(sectors for global, wavefronts for shared), which already account for access width and
active lanes: a float4 copy has no excess, a 32-way conflicting LDS has 31 extra
wavefronts per request. The raw bank-conflict counters are never read here: they count
cp.async writes and the ideal multi-wavefront accesses of wide stores as "conflicts".
"""

from __future__ import annotations

from perfscope.families import base_opcode
from perfscope.metrics import (
    M_GLOBAL_IDEAL,
    M_GLOBAL_SECTORS,
    M_L2_SECTORS,
    M_OPCODES,
    M_SHARED_IDEAL,
    M_SHARED_WAVEFRONTS,
    MEMORY_FIELDS,
    MEMORY_PCT_METRICS,
    OPCODE_METRICS,
    SOL_METRICS,
    STALL_METRICS,
    TRAFFIC_METRICS_GLOBAL,
)
from perfscope.rules.facts import (
    GLOBAL_WAIT_STALLS,
    MIN_EXCESS,
    MIN_SHARE_OF_INSTRUCTIONS,
    MIN_STALL_SHARE,
    SHARED_WAIT_STALLS,
    by_opcode,
    family,
    is_gemm_like,
    is_shared_load,
    is_store,
    local_sectors,
    need_opcodes,
    pressure,
    stall_share,
    total_instructions,
    worst,
)
from perfscope.rules.model import Evidence, Hit, Inputs, Rule, need

# -- thresholds --
# Scalar (<= 4-byte) global loads above this share of all LDGs: vectorising is the fix.
SCALAR_LOAD_SHARE_MIN = 0.5
# The kernel must wait on global loads (long scoreboard + LG throttle) this much of its
# stall time, counted over the LDG part of its LG traffic, before vector width matters.
GLOBAL_WAIT_MIN = 0.20
# 16-byte vectors cut the load instruction count by this factor.
VECTOR_WIDTH = 4
# More global loads per FFMA than this and nothing is reused on chip (a shared tile of
# T elements gives 2/T; 1/4 is already a tile of 8).
LOADS_PER_FMA_MAX = 0.25
# More shared loads per FFMA than this and registers are not blocked (a 4x4 register tile
# gives 8 loads per 16 FMAs = 0.5; 8x8 gives 0.25).
SMEM_LOADS_PER_FMA_MAX = 0.5
SMEM_LOADS_PER_FMA_TARGET = 0.25

_SHARED = (M_SHARED_WAVEFRONTS, M_SHARED_IDEAL)
_SHARED_PRESSURE = (SOL_METRICS["l1tex_pct"], *STALL_METRICS)
_GLOBAL_PRESSURE = (*MEMORY_PCT_METRICS, *STALL_METRICS)


def _sum_excess(ops) -> float:
    return sum(o.excess for o in ops)


def _global_loads(inputs: Inputs):
    p = inputs.profile
    ops = by_opcode(p.memory.global_, "global sectors")
    return p, [o for o in ops if not is_store(o)]


def _check_uncoalesced_global(inputs: Inputs) -> Hit | None:
    """Symptom: global loads fetch more 32-byte sectors than the bytes their active lanes
    use (per instruction, actual against ideal).
    Why: every extra sector costs L1, L2 and often DRAM bandwidth and latency; strided or
    misaligned lanes are the usual cause (seed 000 §6.3 row 1).
    Fix: map threadIdx.x to the contiguous dimension, transpose through shared memory,
    keep vector accesses aligned.
    Estimate: excess load sectors / (all global + local sectors) x pressure, where pressure
    is the busiest memory unit's throughput fraction when >= 60% (it is the bound), else
    the share of stall cycles on long scoreboard + LG throttle.
    Source: seed 000 §6.3 row 1; Nsight Compute Profiling Guide, Source Counters
    (L2 Theoretical Sectors Global Excessive)."""
    p, loads = _global_loads(inputs)
    ideal = need(p.memory.global_.ideal, M_GLOBAL_IDEAL)
    excess = _sum_excess(loads)
    if not ideal or excess / ideal < MIN_EXCESS:
        return None
    pr = pressure(p, MEMORY_FIELDS, GLOBAL_WAIT_STALLS)
    if not pr.significant:
        return None
    total = (p.memory.global_.actual or 0.0) + local_sectors(p)
    w = worst(loads)
    ev = [Evidence(f"{M_GLOBAL_SECTORS} excess / ideal (loads)", round(excess / ideal, 3),
                   f">= {MIN_EXCESS}")]
    if w is not None and w.ratio is not None:
        ev.append(Evidence(f"{w.opcode} sectors actual / ideal", round(w.ratio, 2), "> 1"))
    ev.append(pr.evidence)
    return Hit(tuple(ev), excess / total * pr.value, (("opcode", w.opcode if w else "LDG"),))


UNCOALESCED_GLOBAL = Rule(
    code="PS101", tag="uncoalesced-global", title="Global loads fetch sectors they do not use",
    severity="warning",
    metrics=(*TRAFFIC_METRICS_GLOBAL, *_GLOBAL_PRESSURE),
    check=_check_uncoalesced_global,
    fix="Coalesce {opcode}: let consecutive lanes (threadIdx.x) read consecutive addresses "
        "along the contiguous dimension (K of a row-major A, N of B), stage transposed tiles "
        "through shared memory instead of reading strided, and keep vector loads 16-byte "
        "aligned.",
    reference="seed 000 §6.3 row 1; NCU Profiling Guide: Source Counters, "
              "L2 Theoretical Sectors Global Excessive",
    ncu=("UncoalescedGlobalAccess",),
)


def _is_scalar_ldg(opcode: str) -> bool:
    mods = opcode.split(".")[1:]
    return not any(m in ("64", "128") for m in mods)


def _check_scalar_loads(inputs: Inputs) -> Hit | None:
    """Symptom: a GEMM-like kernel (math in its mix) loads global memory with scalar
    (<= 4-byte) LDGs and spends its stall time waiting on them.
    Why: four 4-byte loads are four LG instructions, queue slots and scoreboard waits
    where one 16-byte LDG.E.128 would do; GEMM tiles are contiguous along K or N, so the
    vector access is possible (seed 002 §3).
    Fix: float4 / 16-byte vector loads with aligned base pointers and leading dimensions.
    Estimate: (long scoreboard + LG throttle stall share) x LDG share of the data-moving
    instructions (LDG against LDG + LDL/STL + LDGSTS + TMA) x scalar share of LDGs
    x (1 - 1/4). LDGs under 1% of all instructions are no finding.
    Source: seed 002 §3 (float4 loads, alignment); NCU Profiling Guide: Warp Stall
    Reasons (lg_throttle: combine narrow memory operations into wider ones)."""
    p = inputs.profile
    need_opcodes(p)
    ldgs = {op: n for op, n in p.opcodes.with_modifiers.items() if base_opcode(op) == "LDG"}
    ldg = sum(ldgs.values())
    if not ldg or not is_gemm_like(p):
        return None
    scalar = sum(n for op, n in ldgs.items() if _is_scalar_ldg(op)) / ldg
    if scalar < SCALAR_LOAD_SHARE_MIN:
        return None
    if ldg / total_instructions(p) < MIN_SHARE_OF_INSTRUCTIONS:
        return None
    # The waits are shared with every other way data arrives (spills, cp.async, TMA).
    ldg_part = ldg / (ldg + sum(family(p, k) for k in ("local", "ldgsts", "tma")))
    wait = stall_share(p, GLOBAL_WAIT_STALLS) * ldg_part
    if wait < GLOBAL_WAIT_MIN:
        return None
    return Hit((
        Evidence("LDG of <= 4 bytes / all LDG (sass__inst_executed_per_opcode_with_modifier_all)",
                 round(scalar, 3), f">= {SCALAR_LOAD_SHARE_MIN}"),
        Evidence("stall share of long_scoreboard + lg_throttle x LDG share of loads",
                 round(wait, 3), f">= {GLOBAL_WAIT_MIN}"),
    ), wait * scalar * (1 - 1 / VECTOR_WIDTH))


SCALAR_LOADS = Rule(
    code="PS102", tag="uncoalesced-global", title="Scalar global loads where 16-byte vectors fit",
    severity="warning",
    metrics=(*OPCODE_METRICS, *STALL_METRICS),
    check=_check_scalar_loads,
    fix="Load 16-byte vectors (float4, LDG.E.128): give each thread 4 consecutive elements "
        "along K of A and N of B, keep base pointers and leading dimensions 16-byte aligned "
        "(K % 4 == 0 and N % 4 == 0 for fp32, % 8 for fp16/bf16) and fall back to scalar loads "
        "only at the matrix edges.",
    reference="seed 002 §3; NCU Profiling Guide: Warp Stall Reasons (lg_throttle)",
    ncu=("CPIStall/Lg Throttle", "CPIStall/Long Scoreboard"),
)


def _check_no_data_reuse(inputs: Inputs) -> Hit | None:
    """Symptom: more than one global load per four FFMAs: each product reads its operands
    straight from global memory.
    Why: the naive triple loop moves M*N*K operands through L1/L2 instead of M*K + K*N;
    the math waits on loads (seed 000 §2.1).
    Fix: shared-memory tiles plus a register block per thread.
    Estimate: the share of stall cycles spent waiting on global loads (long scoreboard +
    LG throttle), all of which a tile that reuses each element T times cuts by 1 - 1/T.
    Source: seed 000 §2.1-2.3; seed 002 §2."""
    p = inputs.profile
    need_opcodes(p)
    fma, ldg = family(p, "ffma"), family(p, "ldg")
    if not fma or ldg / fma <= LOADS_PER_FMA_MAX:
        return None
    wait = stall_share(p, GLOBAL_WAIT_STALLS)
    if wait < MIN_STALL_SHARE:
        return None
    tiles = [k for k in ("shared", "ldsm", "ldgsts", "tma") if p.opcodes.has(k)]
    return Hit((
        Evidence("LDG / FFMA instructions", round(ldg / fma, 3), f"> {LOADS_PER_FMA_MAX}"),
        Evidence("shared-memory opcode families used", ", ".join(tiles) or "none", "tiles expected"),
        Evidence("stall share of long_scoreboard + lg_throttle", round(wait, 3),
                 f">= {MIN_STALL_SHARE}"),
    ), wait)


NO_DATA_REUSE = Rule(
    code="PS103", tag="no-data-reuse", title="Operands come from global memory for every FMA",
    severity="warning",
    metrics=(*OPCODE_METRICS, *STALL_METRICS),
    check=_check_no_data_reuse,
    fix="Stage A and B tiles in shared memory (e.g. 64x64x16 with 256 threads) and let each "
        "thread accumulate a 4x4 or 8x8 block of C in registers, so every global element is "
        "loaded once per tile instead of once per FMA.",
    reference="seed 000 §2.1-2.3; seed 002 §2",
)


def _check_store_inefficiency(inputs: Inputs) -> Hit | None:
    """Symptom: global stores write more sectors than the bytes they carry (C written
    with narrow, scattered per-fragment stores).
    Why: partial-sector writes cost L2 bandwidth and read-modify-write work; the mma
    fragment layout scatters a warp's C values over 8 rows (seed 004 §4).
    Fix: stage C through shared memory and write whole rows with 16-byte stores or TMA.
    Estimate: excess store sectors / all sectors the kernel moves x memory pressure
    (busiest memory unit when >= 60%, else the LG throttle + drain stall share). The
    sectors moved are the per-instruction global + local sectors, or the L2's count of
    sectors the SMs requested (lts__t_sectors_srcunit_tex.sum) when larger: TMA copies
    are no SASS load instruction, so a TMA-fed kernel's operand traffic shows only
    there. A TMA-fed kernel without that count gets no estimate rather than one inflated
    by the missing loads.
    Source: seed 004 §4 (hgemm_bcf_dbf_rw); NCU Profiling Guide: Source Counters."""
    p = inputs.profile
    ops = by_opcode(p.memory.global_, "global sectors")
    stores = [o for o in ops if is_store(o)]
    ideal = sum(o.ideal for o in stores)
    excess = _sum_excess(stores)
    if not ideal or excess / ideal < MIN_EXCESS:
        return None
    pr = pressure(p, MEMORY_FIELDS, ("lg_throttle", "drain"))
    if not pr.significant:
        return None
    per_instruction = (p.memory.global_.actual or 0.0) + local_sectors(p)
    l2 = p.metric(M_L2_SECTORS)
    w = worst(stores)
    evidence = [
        Evidence(f"{M_GLOBAL_SECTORS} excess / ideal (stores)", round(excess / ideal, 3),
                 f">= {MIN_EXCESS}"),
        Evidence(f"{w.opcode} sectors actual / ideal", round(w.ratio or 0.0, 2), "> 1"),
        pr.evidence,
    ]
    if l2 is None and p.opcodes.has("tma"):
        return Hit(tuple(evidence), None)
    total = max(per_instruction, l2 or 0.0)
    if l2 is not None and l2 > per_instruction:
        evidence.append(Evidence(f"{M_L2_SECTORS} (SM traffic to L2, TMA included)", l2,
                                 f"> {per_instruction:.0f} per-instruction sectors"))
    return Hit(tuple(evidence), excess / total * pr.value)


STORE_INEFFICIENCY = Rule(
    code="PS105", tag="store-inefficiency", title="C is written with narrow, scattered stores",
    severity="optimization",
    metrics=(*TRAFFIC_METRICS_GLOBAL, *_GLOBAL_PRESSURE, M_L2_SECTORS, M_OPCODES),
    check=_check_store_inefficiency,
    fix="Write C through shared memory: stage each warp's accumulator fragments in a swizzled "
        "shared tile (stmatrix where available), then store whole rows with 16-byte "
        "STG.E.128, or one TMA store (UTMASTG) per tile on sm_90a.",
    reference="seed 004 §4",
    ncu=("UncoalescedGlobalAccess",),
)


def _shared_excess(inputs: Inputs, select) -> tuple | None:
    p = inputs.profile
    ops = by_opcode(p.memory.shared, "shared wavefronts")
    ideal_all = need(p.memory.shared.ideal, M_SHARED_IDEAL)
    chosen = [o for o in ops if select(o)]
    excess = _sum_excess(chosen)
    if not ideal_all or excess / ideal_all < MIN_EXCESS:
        return None
    pr = pressure(p, ("l1tex_pct",), SHARED_WAIT_STALLS)
    if not pr.significant:
        return None
    w = worst(chosen)
    gain = excess / (p.memory.shared.actual or excess) * pr.value
    ev = (Evidence(f"{M_SHARED_WAVEFRONTS} excess / ideal of all shared", round(excess / ideal_all, 3),
                   f">= {MIN_EXCESS}"),
          Evidence(f"{w.opcode} wavefronts actual / ideal", round(w.ratio or 0.0, 2), "> 1"),
          pr.evidence)
    return ev, gain, w


def _check_bank_conflicts_loads(inputs: Inputs) -> Hit | None:
    """Symptom: shared-memory loads (LDS, LDSM, wgmma operand reads) take more wavefronts
    than ideal: bank conflicts.
    Why: each conflict replays the access; the shared pipe and the warps waiting on it
    (MIO throttle, short scoreboard) slow down (seed 000 §3.3, §6.1 trap 1).
    Fix: XOR swizzle for ldmatrix tiles; transpose or pad an FP32 A tile.
    Estimate: excess load wavefronts / all shared wavefronts x pressure (L1 throughput when
    >= 60%, else the MIO throttle + short scoreboard stall share).
    Source: seed 000 §3.3 and §6.1 trap 1; seed 002 (A transposed in shared memory);
    seed 004 §2 (hgemm_bcf); NCU Profiling Guide: Shared Memory, L1 Wavefronts Shared Excessive."""
    got = _shared_excess(inputs, is_shared_load)
    if got is None:
        return None
    ev, gain, w = got
    return Hit(ev, gain, (("opcode", w.opcode),))


BANK_CONFLICTS_LOADS = Rule(
    code="PS110", tag="bank-conflicts", title="Shared-memory loads replay on bank conflicts",
    severity="warning",
    metrics=(*_SHARED, *_SHARED_PRESSURE),
    check=_check_bank_conflicts_loads,
    fix="Remove the conflicts of {opcode}: for ldmatrix tiles XOR-swizzle the 16-byte chunk "
        "index with the row (chunk ^ (row % 8)) on both the write and the read side; for an "
        "FP32 A tile read down a column, store it transposed (As[k][m]) or pad each row by one "
        "4-byte word.",
    reference="seed 000 §3.3, §6.1 trap 1; seed 002 (A transposed in shared memory); seed 004 §2",
    ncu=("SharedMemoryConflicts/Load", "UncoalescedSharedAccess"),
)


def _check_bank_conflicts_stores(inputs: Inputs) -> Hit | None:
    """Symptom: shared-memory stores (STS, STSM) take more wavefronts than ideal.
    Why: conflicting stores replay like conflicting loads; with the raw counters this is
    easy to misjudge (cuBLAS's nvjet shows 130k raw store "conflicts" at ideal wavefronts),
    so only per-instruction excess counts.
    Fix: pad or swizzle the stored tile so a warp's 32 lanes hit 32 banks per wavefront.
    Estimate: excess store wavefronts / all shared wavefronts x shared pressure (as PS110).
    Source: seed 000 §3.3; NCU Profiling Guide: Shared Memory, L1 Wavefronts Shared Excessive."""
    got = _shared_excess(inputs, lambda o: is_store(o))
    if got is None:
        return None
    ev, gain, w = got
    return Hit(ev, gain, (("opcode", w.opcode),))


BANK_CONFLICTS_STORES = Rule(
    code="PS111", tag="bank-conflicts", title="Shared-memory stores replay on bank conflicts",
    severity="warning",
    metrics=(*_SHARED, *_SHARED_PRESSURE),
    check=_check_bank_conflicts_stores,
    fix="Remove the conflicts of {opcode}: pad each shared row by one 4-byte word or XOR-swizzle "
        "the column with the row, so the 32 lanes of a store land in 32 different banks; "
        "for accumulator fragments, stmatrix into a swizzled tile.",
    reference="seed 000 §3.3",
    ncu=("SharedMemoryConflicts/Store",),
)


def _check_uncoalesced_shared(inputs: Inputs) -> Hit | None:
    """Symptom: cp.async (LDGSTS) writes into shared memory take more wavefronts than
    ideal.
    Why: a cp.async write is not a bank conflict on a load: it comes from the layout the
    copy writes (narrow copies, or a swizzle applied only on the read side). It is often a
    deliberate trade (seed 004; cuBLAS's SGEMM has it), hence "optimization".
    Fix: 16-byte cp.async whose 8-lane groups fill whole 128-byte rows, or TMA.
    Estimate: excess LDGSTS wavefronts / all shared wavefronts x shared pressure (as PS110).
    Source: seed 004 §2 (uncoalesced shared access from cp.async + swizzle); NCU
    UncoalescedSharedAccess rule."""
    got = _shared_excess(inputs, lambda o: o.kind == "async-copy")
    if got is None:
        return None
    ev, gain, w = got
    return Hit(ev, gain, (("opcode", w.opcode),))


UNCOALESCED_SHARED = Rule(
    code="PS112", tag="uncoalesced-shared", title="cp.async writes to shared memory take extra wavefronts",
    severity="optimization",
    metrics=(*_SHARED, *_SHARED_PRESSURE),
    check=_check_uncoalesced_shared,
    fix="Make {opcode} write whole 128-byte shared rows per 8 lanes: 16-byte cp.async with the "
        "same XOR swizzle on the write side as on the ldmatrix read side, or move the copy to "
        "TMA (cp.async.bulk.tensor with a 128B swizzle, sm_90a), which writes shared memory "
        "without per-lane wavefronts.",
    reference="seed 004 §2; NCU Profiling Guide: L1 Wavefronts Shared Excessive",
    ncu=("UncoalescedSharedAccess",),
)


def _check_smem_bandwidth(inputs: Inputs) -> Hit | None:
    """Symptom: an FFMA kernel issues more than one shared load per two FMAs and waits on
    the shared pipe (MIO throttle, short scoreboard).
    Why: without a register block every FMA needs fresh operands from shared memory; the
    LSU/MIO pipe, not the FMA pipe, sets the pace (seed 000 §2.3).
    Fix: register blocking (each thread a TMxTN tile of C), wide shared loads.
    Estimate: (MIO throttle + short scoreboard stall share) x (1 - 0.25 / loads per FMA),
    the part of the shared-load wait an 8x8 register tile removes.
    Source: seed 000 §2.3; seed 002 §2.2."""
    p = inputs.profile
    need_opcodes(p)
    fma = family(p, "ffma")
    loads = sum(n for op, n in p.opcodes.executed.items() if op in ("LDS", "LDSM", "LDSU"))
    if not fma or loads / fma <= SMEM_LOADS_PER_FMA_MAX:
        return None
    wait = stall_share(p, SHARED_WAIT_STALLS)
    if wait < MIN_STALL_SHARE:
        return None
    per_fma = loads / fma
    return Hit((
        Evidence("shared load instructions / FFMA", round(per_fma, 3), f"> {SMEM_LOADS_PER_FMA_MAX}"),
        Evidence("stall share of mio_throttle + short_scoreboard", round(wait, 3), f">= {MIN_STALL_SHARE}"),
    ), wait * (1 - SMEM_LOADS_PER_FMA_TARGET / per_fma))


SMEM_BANDWIDTH = Rule(
    code="PS113", tag="smem-bandwidth", title="Shared loads feed too few FMAs (no register blocking)",
    severity="warning",
    metrics=(*OPCODE_METRICS, *STALL_METRICS),
    check=_check_smem_bandwidth,
    fix="Block registers: let each thread accumulate a 4x4 (or 8x8) tile of C so one shared "
        "load of A feeds TN FMAs and one of B feeds TM, and read the fragments as float4 "
        "(LDS.128); watch the register count for spills (seed 002 §2.2).",
    reference="seed 000 §2.3; seed 002 §2.2",
    ncu=("CPIStall/Mio Throttle", "CPIStall/Short Scoreboard"),
)

RULES = (UNCOALESCED_GLOBAL, SCALAR_LOADS, NO_DATA_REUSE, STORE_INEFFICIENCY,
         BANK_CONFLICTS_LOADS, BANK_CONFLICTS_STORES, UNCOALESCED_SHARED, SMEM_BANDWIDTH)
