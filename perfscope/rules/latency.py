"""Latency: warps waiting on loads or barriers that a deeper pipeline would hide."""

from __future__ import annotations

from perfscope.metrics import (
    M_ISSUE_ACTIVE,
    M_OPCODES,
    M_SPILL_INST,
    MEMORY_FIELDS,
    MEMORY_PCT_METRICS,
    SOL_METRICS,
    STALL_METRICS,
)
from perfscope.rules.facts import (
    BUSY_PCT,
    ISSUE_ACTIVE_MAX,
    is_async_mma,
    is_gemm_like,
    is_warp_specialised,
    need_opcodes,
    stall_share,
    total_instructions,
)
from perfscope.rules.model import Evidence, Hit, Inputs, Rule, need

# -- thresholds --
# Long-scoreboard waits above this share of stall time: loads are not overlapped.
LONG_SCOREBOARD_MIN = 0.30
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

_COMMON = (*STALL_METRICS, SOL_METRICS["sm_pct"], *MEMORY_PCT_METRICS, M_ISSUE_ACTIVE)


def _idle_and_busy(p) -> tuple[float, bool]:
    """Idle issue fraction, and whether some unit is already the bound."""
    issue = need(p.stalls.issue_active_pct, M_ISSUE_ACTIVE)
    sm = need(p.sol.sm_pct, SOL_METRICS["sm_pct"])
    mem = max((v for f in MEMORY_FIELDS if (v := getattr(p.sol, f)) is not None), default=None)
    mem = need(mem, "memory throughput (SpeedOfLight)")
    return 1 - issue / 100, issue >= ISSUE_ACTIVE_MAX or sm >= BUSY_PCT or mem >= BUSY_PCT


def _check_loads_not_overlapped(inputs: Inputs) -> Hit | None:
    """Symptom: warps spend most stall time on long scoreboard (waiting for global/L1TEX
    data) while no unit is busy and the schedulers idle: loads are not overlapped with math.
    Why: a single-buffered tile loop exposes the full memory latency every K step; more
    stages in flight hide it (seed 000 §3.1, §6.3 row 2, §6.1 trap 2). A bandwidth-bound
    kernel (a unit >= 60%) is excluded: it needs less traffic, not more overlap; so is a
    spilling one (PS130).
    Fix: a 3-4 stage cp.async ring or TMA with mbarriers.
    Estimate: long-scoreboard stall share x idle issue fraction (1 - issue active).
    Source: seed 000 §3.1-3.2, §6.1 trap 2, §6.3 row 2; seed 002 §4."""
    p = inputs.profile
    share = stall_share(p, ("long_scoreboard",))
    if share < LONG_SCOREBOARD_MIN or not is_gemm_like(p):
        return None
    idle, busy = _idle_and_busy(p)
    if busy:
        return None
    total = total_instructions(p)
    spills = p.memory.spill_instructions or 0.0
    if total and spills / total >= SPILL_SHARE_MAX:
        return None
    return Hit((
        Evidence("stall share of long_scoreboard", round(share, 3), f">= {LONG_SCOREBOARD_MIN}"),
        Evidence(M_ISSUE_ACTIVE, round(100 * (1 - idle), 1), f"< {ISSUE_ACTIVE_MAX:.0f}"),
        Evidence("busiest unit (SpeedOfLight)", round(max(p.sol.sm_pct or 0, *(
            getattr(p.sol, f) or 0 for f in MEMORY_FIELDS)), 1), f"< {BUSY_PCT:.0f}"),
    ), share * idle)


LOADS_NOT_OVERLAPPED = Rule(
    code="PS120", tag="latency-exposed", title="Warps wait on loads that are not overlapped with math",
    severity="warning",
    metrics=(*_COMMON, M_SPILL_INST, M_OPCODES),
    check=_check_loads_not_overlapped,
    fix="Overlap the next K tile's loads with this tile's math: a 3-4 stage cp.async ring "
        "(commit_group per stage, wait_group STAGES-2) on sm_80+, or TMA loads completing on "
        "per-stage mbarriers on sm_90a; at the least, double-buffer the shared tiles.",
    reference="seed 000 §3.1-3.2, §6.1 trap 2, §6.3 row 2; seed 002 §4",
    ncu=("CPIStall/Long Scoreboard",),
)


def _check_barrier_bound(inputs: Inputs) -> Hit | None:
    """Symptom: warps spend a large share of stall time at CTA barriers while the
    schedulers idle and no unit is busy.
    Why: load -> __syncthreads -> compute -> __syncthreads serialises copy and math; with a
    double buffer one barrier per K tile suffices and the copy runs under the math
    (seed 004 §3). A wgmma kernel that waits for its own MMAs (wait_group 0) and then a CTA
    barrier before each slot is refilled drains the tensor pipe every K tile the same way;
    for it the idle measure is the SM throughput (the tensor pipe), not issue slots, which
    an asynchronous MMA leaves idle by design. Warp-specialised TMA kernels (recognised by
    USETMAXREG/clusters, TMA, wgmma/tcgen05 and SYNCS) wait at barriers by design and are
    excluded.
    Fix: double-buffer; with TMA use per-stage mbarriers instead of CTA barriers, keep one
    wgmma group in flight and give the copies to a producer warpgroup.
    Estimate: barrier stall share x idle fraction (1 - issue active; 1 - SM % for wgmma).
    Source: seed 004 §3 (hgemm_bcf_dbf); seed 000 §3.1, §4."""
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
    idle, busy = _idle_and_busy(p)
    if busy:
        return None
    return Hit((
        Evidence("stall share of barrier", round(share, 3), f">= {BARRIER_MIN}"),
        Evidence(M_ISSUE_ACTIVE, round(100 * (1 - idle), 1), f"< {ISSUE_ACTIVE_MAX:.0f}"),
    ), share * idle)


BARRIER_BOUND = Rule(
    code="PS121", tag="latency-exposed", title="Warps wait at barriers around a synchronous tile loop",
    severity="warning",
    metrics=(*_COMMON, M_OPCODES),
    check=_check_barrier_bound,
    fix="Double-buffer the shared tiles so tile k+1's cp.async (or TMA) is in flight during tile "
        "k's math and one __syncthreads() per K tile suffices; with TMA, wait on per-stage "
        "mbarriers instead of CTA-wide barriers; with wgmma, keep one group in flight "
        "(wgmma.wait_group 1), free each slot with an mbarrier arrive and let a producer "
        "warpgroup issue the copies (warp specialisation).",
    reference="seed 004 §3; seed 000 §3.1, §4",
    ncu=("CPIStall/Barrier",),
)

RULES = (LOADS_NOT_OVERLAPPED, BARRIER_BOUND)
