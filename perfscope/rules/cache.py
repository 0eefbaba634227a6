"""L2: locality across CTAs (grid swizzle) and the persisting carve-out.

A launch attribute that has the same value on every launch judged together is the
machine's setting, not the kernel's choice (the H200 here runs every launch of every
program with an 11.25 MiB persisting carve-out): it is reported once, by the loader, and
never as a kernel finding.
"""

from __future__ import annotations

from perfscope.metrics import M_DRAM_READ, M_DRAM_WRITE, M_L2_HIT, M_PERSISTING, OPCODE_METRICS, SOL_METRICS
from perfscope.rules.bounds import work_of
from perfscope.rules.facts import dram_bytes, is_gemm_like, need_opcodes
from perfscope.rules.model import Evidence, Hit, Inputs, Rule, need

# -- thresholds --
# A GEMM re-reads every A and B tile from many CTAs; under this L2 hit rate they miss.
L2_HIT_MIN = 60.0
# ... and the misses matter when DRAM runs at least this busy. Below it they cost little
# time: the persistent stage at 4096^3 (DRAM 20% busy, at the power cap) read 58 MB less
# with its k order and ran at most 0.3% faster at its tuned configuration (H200,
# 2026-12-04, reports/reference/h200/probes/k-order*.jsonl).
DRAM_PCT_MIN = 40.0
# ... and DRAM carries at least this many times the compulsory bytes (re-reads a better
# tile order would keep in L2; a decode GEMM streams its weight once and is not this).
DRAM_REREAD_MIN = 1.5
# The hit rate a rasterised GEMM grid reaches (cuBLAS's kernels: 75-91% on the H200).
L2_HIT_TARGET = 80.0
_METRICS = (M_L2_HIT, SOL_METRICS["dram_pct"], M_PERSISTING, M_DRAM_READ, M_DRAM_WRITE,
            *OPCODE_METRICS)


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


def _kernel_carve_out(inputs: Inputs) -> float | None:
    """The persisting carve-out when it is the kernel's own setting (it differs from the
    machine's), else None."""
    carve = inputs.profile.metric(M_PERSISTING)
    machine = inputs.context.machine.get(M_PERSISTING)
    if carve is None or carve <= 0 or (machine is not None and carve == machine):
        return None
    return carve


def _check_no_swizzle(inputs: Inputs) -> Hit | None:
    """Symptom: a GEMM-like kernel hits L2 under 60% while DRAM runs at 40% or more and
    carries 1.5x or more its compulsory bytes (the run manifest's shape): operands are
    fetched from DRAM again and again.
    Why: CTAs launched in row order walk all of B before reusing it, so their tiles fall
    out of L2 between uses; grouping CTAs (grid swizzle) keeps the shared rows of A and
    columns of B resident. A kernel that streams its bytes once (a decode GEMM) has no
    re-reads to save and is not this.
    Fix: rasterise the grid in groups.
    Estimate: DRAM fraction x the DRAM traffic a hit rate of 80% would remove,
    dram% x (1 - (1 - 0.8) / (1 - hit)).
    Example:
        before: tile = (blockIdx.y, blockIdx.x)                  // row-major walk over C
        after:  g = bid / (GROUP * tiles_n); tile_m = g * GROUP + bid % GROUP; ...
    Source: seed 004 §1 (grid swizzle); seed 000 §3.2; NCU Profiling Guide: Memory
    Workload Analysis (L2 hit rate)."""
    got = _low_hits(inputs)
    if got is None or _kernel_carve_out(inputs) is not None:
        return None
    w = work_of(inputs)
    inputs.need_manifest()
    moved = need(dram_bytes(inputs.profile), f"{M_DRAM_READ} + {M_DRAM_WRITE}")
    if not w.bytes or moved / w.bytes < DRAM_REREAD_MIN:
        return None
    return Hit((*got[0], Evidence("DRAM bytes / compulsory bytes", round(moved / w.bytes, 2),
                                  f">= {DRAM_REREAD_MIN}")), got[1])


NO_GRID_SWIZZLE = Rule(
    code="PS160", tag="l2-locality", title="Low L2 hit rate with DRAM busy: CTAs do not share tiles in L2",
    severity="warning",
    metrics=_METRICS,
    check=_check_no_swizzle,
    fix="Rasterise the grid in groups (grid swizzle): map blockIdx to tiles so GROUP (e.g. 8) "
        "consecutive CTAs cover a column of tile rows and share the same A rows and B columns "
        "while they are in L2; on sm_90 a cluster with TMA multicast shares them further.",
    reference="NCU Profiling Guide: Memory Workload Analysis (L2 hit rate); CUTLASS: threadblock "
              "swizzle",
    thresholds=(("L2_HIT_MIN", L2_HIT_MIN), ("DRAM_PCT_MIN", DRAM_PCT_MIN),
                ("DRAM_REREAD_MIN", DRAM_REREAD_MIN), ("L2_HIT_TARGET", L2_HIT_TARGET)),
)


def _check_persisting_misuse(inputs: Inputs) -> Hit | None:
    """Symptom: the kernel's launch sets a persisting L2 carve-out of its own (a value
    other launches judged with it do not share), yet a GEMM-like kernel hits L2 under 60%
    with DRAM at 40% or more.
    Why: the carve-out takes L2 away from normal accesses; with the wrong data marked
    persisting (or a stale window) the hot tiles are evicted. The report shows the
    carve-out, not the access-policy window: check it. A carve-out every launch shares is
    the machine's (cudaLimitPersistingL2CacheSize set for the device) and is reported once
    as a machine setting.
    Fix: narrow or drop the window, mark streaming data streaming, reset persisting lines.
    Estimate: as PS160, dram% x (1 - (1 - 0.8) / (1 - hit)).
    Example:
        before: attr.accessPolicyWindow = {A, bytes(A) + bytes(B), 1.0, persisting, ...};
        after:  attr.accessPolicyWindow = {B, bytes(B), 0.6, persisting, streaming};
    Source: seed 000 §3.2, §6.1 trap 4; CUDA C++ Programming Guide: L2 cache access management."""
    got = _low_hits(inputs)
    need(inputs.profile.metric(M_PERSISTING), M_PERSISTING)
    carve = _kernel_carve_out(inputs)
    if got is None or carve is None:
        return None
    return Hit((*got[0], Evidence(M_PERSISTING, carve, "> 0 bytes and not the machine's setting")),
               got[1])


PERSISTING_MISUSE = Rule(
    code="PS161", tag="l2-locality", title="Persisting L2 carve-out set while L2 hits are low",
    severity="warning",
    metrics=_METRICS,
    check=_check_persisting_misuse,
    fix="Give persisting L2 only to data reused across CTAs: narrow the cudaAccessPolicyWindow "
        "(base_ptr, num_bytes, hitRatio) to that operand, mark one-pass data "
        "cudaAccessPropertyStreaming, and call cudaCtxResetPersistingL2Cache() or set "
        "cudaLimitPersistingL2CacheSize to 0 when no window is needed.",
    reference="CUDA C++ Programming Guide: L2 Cache Access Management (persisting accesses)",
    thresholds=(("L2_HIT_MIN", L2_HIT_MIN), ("DRAM_PCT_MIN", DRAM_PCT_MIN)),
)

RULES = (NO_GRID_SWIZZLE, PERSISTING_MISUSE)
