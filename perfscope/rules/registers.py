"""Registers and occupancy: spills, and occupancy limits that cost latency hiding.

Low occupancy alone is no finding: cuBLAS's SGEMM runs at 12.5% with 254 registers and
its FMA pipe busy, and warp-specialised TMA kernels run one CTA per SM by design. An
occupancy finding needs the symptom more warps would cure: few eligible warps, idle
issue slots, stalls that are latency (not throughput), nothing already bounding the
kernel, and a limiter that is the only one holding the block count where it is.
"""

from __future__ import annotations

from dataclasses import replace

from perfscope.metrics import (
    M_BLOCK_SIZE,
    M_ELIGIBLE,
    M_ISSUE_ACTIVE,
    M_LOCAL_LD_REQ,
    M_LOCAL_LD_SECT,
    M_LOCAL_ST_REQ,
    M_LOCAL_ST_SECT,
    M_OPCODES,
    M_REGISTERS,
    M_SMEM_DYNAMIC,
    M_SMEM_STATIC,
    M_SPILL_INST,
    M_THEORETICAL_OCCUPANCY,
    MEMORY_PCT_METRICS,
    OCCUPANCY_LIMITS,
    SECTOR_BYTES,
    SOL_METRICS,
    STALL_METRICS,
    TRAFFIC_METRICS_GLOBAL,
)
from perfscope.rules.facts import (
    GLOBAL_FIELDS,
    GLOBAL_WAIT_STALLS,
    ISSUE_ACTIVE_MAX,
    LATENCY_STALLS,
    MIN_SHARE_OF_INSTRUCTIONS,
    compute_capability,
    is_warp_specialised,
    local_sectors,
    need_opcodes,
    pressure,
    saturated_unit,
    stall_share,
    total_instructions,
)
from perfscope.rules.memory import bytes_into_sms
from perfscope.rules.model import Evidence, Hit, Inputs, Rule, need

# -- thresholds --
# Spill (or other local-memory) instructions above this share of all instructions.
SPILL_SHARE_MIN = MIN_SHARE_OF_INSTRUCTIONS
# ... or local memory carries at least this share of the sectors the kernel's loads and
# stores move (local + global): a few spilled registers reloaded in the main loop. The FP32
# ring with its copies spread over the k steps (probes/, an H100) spilled 20 registers'
# worth there: 0.9% of its instructions, 0.56 of its sectors, 1.17x the cycles.
SPILL_TRAFFIC_MIN = 0.10
# Theoretical occupancy under this is "low".
OCCUPANCY_LOW_PCT = 50.0
# Fewer eligible warps per scheduler per cycle than this: issue slots go empty.
ELIGIBLE_MIN = 1.0
# Latency stalls (long/short scoreboard, wait, barrier) at least this share of stall time.
LATENCY_SHARE_MIN = 0.40
# A register cap more than this far below the registers the kernel uses now would spill:
# the fix is then a smaller per-thread tile, not a cap.
REGISTER_CUT_MAX = 0.25
REGISTER_FILE = 65536      # 32-bit registers per SM, sm_70 through sm_120
REGISTER_GRANULE = 8       # registers per thread are allocated in steps of 8
# Tensor memory (tcgen05) exists from compute capability 10.0 on.
TMEM_MIN_MAJOR = 10

_LAUNCH = (M_REGISTERS, M_BLOCK_SIZE, M_THEORETICAL_OCCUPANCY, *OCCUPANCY_LIMITS.values())


def spill_share_significant(spills: float, total: float) -> bool:
    """The part of PS130 both paths share: spill (local) instructions are at least
    SPILL_SHARE_MIN of all instructions (executed under ncu, static in the SASS)."""
    return bool(total) and spills / total >= SPILL_SHARE_MIN


def _check_spills(inputs: Inputs) -> Hit | None:
    """Symptom: local-memory (LDL/STL) instructions are a visible share of the kernel, or
    local memory a visible share of the sectors its loads and stores move: registers spill.
    Why: a register tile larger than the register budget (the cap from -maxrregcount or
    __launch_bounds__, or 255) turns accumulators into local-memory traffic through L1/L2.
    Fix: a smaller per-thread tile, a higher cap, constant-indexed fragment arrays.
    Estimate: local sectors / (local + global sectors) x memory pressure (L2/DRAM when the
    bound, else the long scoreboard + LG throttle stall share).
    Example:
        before: float acc[8][8]; ...  // under -maxrregcount=64: STL/LDL in the inner loop
        after:  float acc[8][4]; ...  // or drop the cap; ptxas -v: 0 bytes spill stores
    Source: seed 002 §2.2, §6.3; seed 000 §6.1 trap 3, §6.3 last row."""
    p = inputs.profile
    total = total_instructions(p)
    spills = p.memory.spill_instructions
    if spills is None:
        reqs = (p.memory.local_load_requests, p.memory.local_store_requests)
        need(reqs[0], M_SPILL_INST)
        spills = sum(r or 0.0 for r in reqs)
    local = local_sectors(p)
    # What the SMs move besides: their global loads and stores, or, where TMA brings the
    # tiles (no LDG counts them), every sector they take in from L2.
    into = bytes_into_sms(p) if p.opcodes.has("tma") else None
    other = max(p.memory.global_.actual or 0.0, into[0] / SECTOR_BYTES if into else 0.0)
    share = local / (local + other) if local else 0.0
    if not spill_share_significant(spills, total) and share < SPILL_TRAFFIC_MIN:
        return None
    pr = pressure(p, GLOBAL_FIELDS, GLOBAL_WAIT_STALLS)
    ev = [Evidence(f"{M_SPILL_INST} / all instructions", round(spills / total, 3) if total else 0.0,
                   f">= {SPILL_SHARE_MIN}, or"),
          Evidence("local sectors / (local + global sectors, or all into the SMs from L2)",
                   round(share, 3),
                   f">= {SPILL_TRAFFIC_MIN}")]
    if p.memory.local_bytes is not None:
        ev.append(Evidence("local memory bytes (l1tex local ld+st sectors x 32)",
                           p.memory.local_bytes, "> 0"))
    if p.launch.registers_per_thread is not None:
        ev.append(Evidence(M_REGISTERS, p.launch.registers_per_thread, "at the cap"))
    ev += pr.evidence
    return Hit(tuple(ev), share * pr.value)


SPILLS = Rule(
    code="PS130", tag="register-spills", title="Registers spill to local memory",
    severity="warning",
    metrics=(M_SPILL_INST, M_LOCAL_LD_REQ, M_LOCAL_ST_REQ, M_LOCAL_LD_SECT, M_LOCAL_ST_SECT,
             M_OPCODES, M_REGISTERS, *TRAFFIC_METRICS_GLOBAL, *MEMORY_PCT_METRICS, *STALL_METRICS),
    check=_check_spills,
    fix="Bring live registers under the cap: shrink the per-thread tile (8x8 -> 8x4 or 4x4), "
        "raise or drop -maxrregcount / the __launch_bounds__ minimum blocks, and index "
        "fragment arrays only with compile-time constants (fully unrolled loops) so they stay "
        "in registers; confirm with ptxas -v (0 bytes spill stores).",
    reference="CUDA C++ Best Practices Guide: Register Pressure; NCU Profiling Guide: Memory "
              "Workload Analysis (local memory)",
    ncu=("MemoryCacheAccessPattern/Local",),
    thresholds=(("SPILL_SHARE_MIN", SPILL_SHARE_MIN), ("SPILL_TRAFFIC_MIN", SPILL_TRAFFIC_MIN)),
)


def _check_spills_static(inputs: Inputs) -> Hit | None:
    """Symptom (static audit, no counters): ptxas reports spill stores or loads and the
    local-memory instructions (LDL/STL) are at least 1% of the kernel's SASS.
    Why: as PS130: the register tile does not fit the register budget.
    Fix: as PS130.
    Estimate: none without counters (what the spills cost depends on how often they run).
    Example:
        before: ptxas info: 256 bytes spill stores, 256 bytes spill loads
        after:  ptxas info: 0 bytes spill stores, 0 bytes spill loads
    Source: seed 002 §2.2, §6.3 (ptxas -v); seed 000 §6.1 trap 3."""
    res = need(inputs.context.resources, "the compiler's resource usage (ptxas -v)")
    if not res.spills:
        return None
    p = inputs.profile
    local = p.opcodes.families.get("local", 0.0)
    total = total_instructions(p)
    if not spill_share_significant(local, total):
        return None
    return Hit((
        Evidence("ptxas spill stores + loads (bytes per thread)",
                 res.spill_stores + res.spill_loads, "> 0"),
        Evidence("static LDL/STL instructions / all SASS instructions", round(local / total, 3),
                 f">= {SPILL_SHARE_MIN}"),
        Evidence("registers per thread (ptxas)", res.registers, "at the cap"),
    ), None)


# PS130 for `perfscope sass`: the same rule (code, title, fix, threshold), read from the
# compiler's resource usage and the static SASS instead of executed counters.
SPILLS_STATIC = replace(SPILLS, metrics=("ptxas -v spill stores/loads", "static SASS LDL/STL"),
                        check=_check_spills_static)


def _occupancy(inputs: Inputs, limiter: str) -> Hit | None:
    p = inputs.profile
    la = p.launch
    if need(la.occupancy_limiter, "occupancy limits (Occupancy)") != limiter:
        return None
    occ = need(la.theoretical_occupancy_pct, M_THEORETICAL_OCCUPANCY)
    if occ >= OCCUPANCY_LOW_PCT:
        return None
    blocks = int(la.occupancy_limits.get(limiter, 0))
    # Another limit at the same block count: freeing this one alone adds no block.
    if any(k != limiter and int(v) <= blocks for k, v in la.occupancy_limits.items()):
        return None
    eligible = need(p.stalls.eligible_warps_per_cycle, M_ELIGIBLE)
    issue = need(p.stalls.issue_active_pct, M_ISSUE_ACTIVE)
    if eligible >= ELIGIBLE_MIN or saturated_unit(p) is not None:
        return None
    latency = stall_share(p, LATENCY_STALLS)
    if latency < LATENCY_SHARE_MIN:
        return None
    need_opcodes(p)
    if is_warp_specialised(p):
        return None
    cc = compute_capability(p)
    args = [("blocks", str(blocks + 1)), ("tmem", " or, on sm_100a, moving the accumulator to "
                                          "tensor memory" if cc[0] >= TMEM_MIN_MAJOR else "")]
    if limiter == "registers" and la.block_size:
        regs = REGISTER_FILE // ((blocks + 1) * la.block_size) // REGISTER_GRANULE * REGISTER_GRANULE
        now = la.registers_per_thread or regs
        if regs < now * (1 - REGISTER_CUT_MAX):
            # A smaller tile costs reuse; a kernel engineer would as often keep the tile and
            # hide the latency inside the block (hgemm_bcf_dbf_rw -> hgemm_ring on the H200).
            args.append(("how", f"shrink the per-thread tile: a cap alone ({now} -> {regs} registers) "
                                "would spill; or keep the tile and hide the latency inside the "
                                "block: a deeper cp.async ring with a larger BK (fewer barriers "
                                "per k) and the shared-memory fragments double-buffered in "
                                "registers across the barrier"))
        else:
            args.append(("how", f"cap registers at {regs} per thread (__launch_bounds__(threads, "
                                f"{blocks + 1}) or -maxrregcount)"))
    else:
        args.append(("how", "use less of it per block"))
    return Hit((
        Evidence(M_THEORETICAL_OCCUPANCY, round(occ, 1),
                 f"< {OCCUPANCY_LOW_PCT:.0f}, limited by {limiter} alone"),
        Evidence(M_ELIGIBLE, round(eligible, 2), f"< {ELIGIBLE_MIN}"),
        Evidence(M_ISSUE_ACTIVE, round(issue, 1), f"< {ISSUE_ACTIVE_MAX:.0f}"),
        Evidence("stall share of " + " + ".join(LATENCY_STALLS), round(latency, 3),
                 f">= {LATENCY_SHARE_MIN}"),
    ), (1 - issue / 100) * latency, tuple(args))


def _check_register_occupancy(inputs: Inputs) -> Hit | None:
    """Symptom: registers per thread alone limit occupancy below 50% AND the latency
    symptom is there: under one eligible warp per cycle, issue slots idle, latency stalls
    >= 40%, nothing bounding the kernel, and no warp specialisation.
    Why: with few resident warps nothing covers the scoreboard and barrier waits (an
    oversized FP32 register tile is the classic case).
    Fix: fewer registers per thread to fit one more block: a cap when the cut is small
    (under a quarter), else a smaller per-thread tile (a deep cap would spill), or, keeping
    the tile, latency hidden inside the block (a deeper ring, a larger BK, fragments
    double-buffered in registers), which is what took hgemm_bcf_dbf_rw to hgemm_ring.
    Estimate: idle issue fraction x latency stall share (an upper bound: what full latency
    hiding would recover).
    Example:
        before: __global__ void __launch_bounds__(256) k(...)      // 124 regs: 2 blocks/SM
        after:  __global__ void __launch_bounds__(256, 3) k(...)   // <= 80 regs: 3 blocks/SM
    Source: seed 000 §6.1 trap 3, §6.3 last row; NCU Profiling Guide: Occupancy."""
    return _occupancy(inputs, "registers")


REGISTER_OCCUPANCY = Rule(
    code="PS131", tag="occupancy-limited", title="Registers cap occupancy and latency goes unhidden",
    severity="warning",
    metrics=(*_LAUNCH, M_ELIGIBLE, M_ISSUE_ACTIVE, SOL_METRICS["sm_pct"], *MEMORY_PCT_METRICS,
             *STALL_METRICS, M_OPCODES, "launch__cluster_size"),
    check=_check_register_occupancy,
    fix="Fit {blocks} blocks per SM: {how}{tmem}; then check ptxas -v for spills.",
    reference="NCU Profiling Guide: Occupancy; CUDA C++ Programming Guide: Launch Bounds",
    ncu=("TheoreticalOccupancy",),
    thresholds=(("OCCUPANCY_LOW_PCT", OCCUPANCY_LOW_PCT), ("ELIGIBLE_MIN", ELIGIBLE_MIN),
                ("LATENCY_SHARE_MIN", LATENCY_SHARE_MIN), ("REGISTER_CUT_MAX", REGISTER_CUT_MAX)),
)


def _check_smem_occupancy(inputs: Inputs) -> Hit | None:
    """Symptom: shared memory per block alone limits occupancy below 50% AND the latency
    symptom is there (as PS131).
    Why: deep pipelines and big tiles buy reuse with shared memory; past a point the SM
    holds too few blocks to hide latency.
    Fix: fewer stages or a smaller BK, or a larger carve-out so one more block fits.
    Estimate: idle issue fraction x latency stall share (upper bound).
    Example:
        before: constexpr int STAGES = 4;   // 160 KB per block: 1 block per SM
        after:  constexpr int STAGES = 3;   // 112 KB per block: 2 blocks per SM
    Source: seed 002 §6.3 (shared memory per block); seed 000 §3.1; NCU Profiling Guide:
    Occupancy."""
    return _occupancy(inputs, "shared memory")


SMEM_OCCUPANCY = Rule(
    code="PS132", tag="occupancy-limited",
    title="Shared memory per block caps occupancy and latency goes unhidden",
    severity="warning",
    metrics=(*_LAUNCH, M_SMEM_STATIC, M_SMEM_DYNAMIC, M_ELIGIBLE, M_ISSUE_ACTIVE,
             SOL_METRICS["sm_pct"], *MEMORY_PCT_METRICS, *STALL_METRICS, M_OPCODES,
             "launch__cluster_size"),
    check=_check_smem_occupancy,
    fix="Fit {blocks} blocks per SM: cut shared memory per block (one pipeline stage fewer, or a "
        "smaller BK), or raise the carve-out with cudaFuncAttributePreferredSharedMemoryCarveout "
        "and cudaFuncAttributeMaxDynamicSharedMemorySize{tmem}.",
    reference="NCU Profiling Guide: Occupancy; CUDA C++ Programming Guide: Shared Memory "
              "(carve-out)",
    ncu=("TheoreticalOccupancy",),
    thresholds=(("OCCUPANCY_LOW_PCT", OCCUPANCY_LOW_PCT), ("ELIGIBLE_MIN", ELIGIBLE_MIN),
                ("LATENCY_SHARE_MIN", LATENCY_SHARE_MIN)),
)

RULES = (SPILLS, REGISTER_OCCUPANCY, SMEM_OCCUPANCY)
