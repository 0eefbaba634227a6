"""L2: locality across CTAs (grid swizzle) and the persisting carve-out."""

from __future__ import annotations

from perfscope.metrics import (
    M_L2_HIT,
    M_PERSISTING,
    OPCODE_METRICS,
    SOL_METRICS,
)
from perfscope.rules.facts import (
    is_gemm_like,
    need_opcodes,
)
from perfscope.rules.model import Evidence, Hit, Inputs, Rule, need

# -- thresholds --
# A GEMM re-reads every A and B tile from many CTAs; under this L2 hit rate they miss.
L2_HIT_MIN = 60.0
# ... and the misses matter when DRAM runs at least this busy.
DRAM_PCT_MIN = 40.0
# The hit rate a rasterised GEMM grid reaches (cuBLAS's kernels: 75-91% on the H200).
L2_HIT_TARGET = 80.0
_METRICS = (M_L2_HIT, SOL_METRICS["dram_pct"], M_PERSISTING, *OPCODE_METRICS)


def _low_hits(inputs: Inputs) -> tuple[tuple[Evidence, ...], float] | None:
    p = inputs.profile
    hit = need(p.memory.l2_hit_rate_pct, M_L2_HIT)
    dram = need(p.sol.dram_pct, SOL_METRICS["dram_pct"])
    need_opcodes(p)
    if hit >= L2_HIT_MIN or dram < DRAM_PCT_MIN or not is_gemm_like(p):
        return None
    saved = 1 - (100 - L2_HIT_TARGET) / (100 - hit) if hit < 100 else 0.0
    return ((Evidence(M_L2_HIT, round(hit, 1), f"< {L2_HIT_MIN:.0f}"),
             Evidence(SOL_METRICS["dram_pct"], round(dram, 1), f">= {DRAM_PCT_MIN:.0f}")),
            dram / 100 * max(0.0, saved))


def _persisting(inputs: Inputs) -> float | None:
    return inputs.profile.metric(M_PERSISTING)


def _check_no_swizzle(inputs: Inputs) -> Hit | None:
    """Symptom: a GEMM-like kernel (math in its mix) hits L2 under 60% while DRAM runs at
    40% or more, with no persisting carve-out set (PS161 covers that case).
    Why: CTAs launched in row order walk all of B before reusing it, so their tiles fall
    out of L2 between uses; grouping CTAs (grid swizzle) keeps the shared rows of A and
    columns of B resident (seed 004 §1).
    Fix: rasterise the grid in groups.
    Estimate: DRAM fraction x the DRAM traffic a hit rate of 80% would remove,
    dram% x (1 - (1 - 0.8) / (1 - hit)).
    Source: seed 004 §1 (grid swizzle); seed 000 §3.2; NCU Profiling Guide: Memory
    Workload Analysis (L2 hit rate)."""
    got = _low_hits(inputs)
    carve = _persisting(inputs)
    if got is None or (carve is not None and carve > 0):
        return None
    return Hit(got[0], got[1])


NO_GRID_SWIZZLE = Rule(
    code="PS160", tag="l2-locality", title="Low L2 hit rate with DRAM busy: CTAs do not share tiles in L2",
    severity="warning",
    metrics=_METRICS,
    check=_check_no_swizzle,
    fix="Rasterise the grid in groups (grid swizzle): map blockIdx to tiles so GROUP (e.g. 8) "
        "consecutive CTAs cover a column of tile rows and share the same A rows and B columns "
        "while they are in L2; on sm_90 a cluster with TMA multicast shares them further.",
    reference="seed 004 §1; seed 000 §3.2",
)


def _check_persisting_misuse(inputs: Inputs) -> Hit | None:
    """Symptom: a persisting L2 carve-out is set for the launch, yet a GEMM-like kernel
    hits L2 under 60% with DRAM at 40% or more.
    Why: the carve-out takes L2 away from normal accesses; with the wrong data marked
    persisting (or a stale window) the hot tiles are evicted (seed 000 §3.2, §6.1 trap 4).
    The report shows the carve-out, not the access-policy window: check it.
    Fix: narrow or drop the window, mark streaming data streaming, reset persisting lines.
    Estimate: as PS160, dram% x (1 - (1 - 0.8) / (1 - hit)).
    Source: seed 000 §3.2, §6.1 trap 4; CUDA Programming Guide: L2 cache access management."""
    got = _low_hits(inputs)
    carve = need(_persisting(inputs), M_PERSISTING)
    if got is None or carve <= 0:
        return None
    return Hit((*got[0], Evidence(M_PERSISTING, carve, "> 0 bytes")), got[1])


PERSISTING_MISUSE = Rule(
    code="PS161", tag="l2-locality", title="Persisting L2 carve-out set while L2 hits are low",
    severity="warning",
    metrics=_METRICS,
    check=_check_persisting_misuse,
    fix="Give persisting L2 only to data reused across CTAs: narrow the cudaAccessPolicyWindow "
        "(base_ptr, num_bytes, hitRatio) to that operand, mark one-pass data "
        "cudaAccessPropertyStreaming, and call cudaCtxResetPersistingL2Cache() or set "
        "cudaLimitPersistingL2CacheSize to 0 when no window is needed.",
    reference="seed 000 §3.2, §6.1 trap 4; CUDA Programming Guide: L2 access management",
)

RULES = (NO_GRID_SWIZZLE, PERSISTING_MISUSE)
