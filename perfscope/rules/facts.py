"""Derived facts several rules share, with the thresholds that make them significant.

Each helper raises NotCollected when the report lacks what it reads, so a rule built on
it is "not evaluated" rather than judged on a zero that was never measured.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple

from perfscope.families import base_opcode
from perfscope.metrics import (
    M_OPCODES,
    SECTOR_BYTES,
    SOL_METRICS,
)
from perfscope.profile import KernelProfile, OpcodeTraffic, Traffic
from perfscope.rules.model import Evidence, NotCollected, need

# A unit running at this share of its peak is what bounds the kernel: extra traffic
# through it costs time in proportion. Below it, extra traffic only costs through the
# stalls it causes.
BUSY_PCT = 60.0
# "A few percent of stall time is no finding" (issue 5).
MIN_STALL_SHARE = 0.05
# "Under 5% extra wavefronts or traffic is no finding" (issue 5).
MIN_EXCESS = 0.05
# An estimated cost under 1% of the kernel's time is too small to be a finding; under 3%
# it is shown, but only as info.
MIN_GAIN = 0.01
MINOR_GAIN = 0.03
# Fewer issued instructions than this are noise for an instruction-mix judgement.
MIN_SHARE_OF_INSTRUCTIONS = 0.01
# Issue slots busier than this: the schedulers have work, latency is already hidden.
ISSUE_ACTIVE_MAX = 60.0

# Stalls that go away with more warps to switch to (latency), as opposed to throughput
# stalls (mio/lg/math throttles) that more warps would only deepen.
LATENCY_STALLS = ("long_scoreboard", "short_scoreboard", "wait", "barrier")
GLOBAL_WAIT_STALLS = ("long_scoreboard", "lg_throttle")
SHARED_WAIT_STALLS = ("mio_throttle", "short_scoreboard")

TENSOR_FAMILIES = ("hmma", "gmma", "utcmma")
MATH_FAMILIES = ("ffma", *TENSOR_FAMILIES)


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def stall_share(p: KernelProfile, reasons: Iterable[str]) -> float:
    """The listed reasons' part of all warp stall cycles (0..1)."""
    total = need(p.stalls.total_cycles_per_issue, "warp stall reasons (WarpStateStats)")
    wanted = set(reasons)
    part = sum(s.cycles_per_issue or 0.0 for s in p.stalls.reasons if s.reason in wanted)
    return part / total if total else 0.0


class Pressure(NamedTuple):
    value: float          # 0..1: how much of the kernel's time the unit's traffic decides
    evidence: Evidence
    bound: bool           # the unit itself is the bound (>= BUSY_PCT)

    @property
    def significant(self) -> bool:
        return self.bound or self.value >= MIN_STALL_SHARE


def pressure(p: KernelProfile, sol_fields: Iterable[str], stalls: Iterable[str]) -> Pressure:
    """How much extra traffic through a unit costs: its busy fraction when it is the
    bound (>= BUSY_PCT), else the share of stall cycles spent waiting on it."""
    stalls = tuple(stalls)
    busiest = None
    for name in sol_fields:
        v = getattr(p.sol, name)
        if v is not None and (busiest is None or v > busiest[1]):
            busiest = (name, v)
    if busiest is not None and busiest[1] >= BUSY_PCT:
        return Pressure(busiest[1] / 100.0,
                        Evidence(SOL_METRICS[busiest[0]], round(busiest[1], 1),
                                 f">= {BUSY_PCT:.0f} (the unit is the bound)"), True)
    share = stall_share(p, stalls)
    return Pressure(share, Evidence(f"stall share of {' + '.join(stalls)}", round(share, 3),
                                    f">= {MIN_STALL_SHARE}"), False)


def need_opcodes(p: KernelProfile) -> None:
    if not p.opcodes.executed:
        raise NotCollected(f"the executed opcode histogram ({M_OPCODES})")


def family(p: KernelProfile, key: str) -> float:
    return p.opcodes.families.get(key, 0.0)


def total_instructions(p: KernelProfile) -> float:
    need_opcodes(p)
    return p.opcodes.total or 0.0


def is_gemm_like(p: KernelProfile) -> bool:
    """Math instructions are a visible part of the mix: data reuse is expected."""
    total = total_instructions(p)
    return total > 0 and sum(family(p, k) for k in MATH_FAMILIES) / total >= MIN_SHARE_OF_INSTRUCTIONS


def has_tensor_cores(p: KernelProfile) -> bool:
    return any(p.opcodes.has(k) for k in TENSOR_FAMILIES)


def is_async_mma(p: KernelProfile) -> bool:
    """The math runs on wgmma (HGMMA) or tcgen05 (UTC*MMA): asynchronous warpgroup MMA."""
    return p.opcodes.has("gmma") or p.opcodes.has("utcmma")


def is_warp_specialised(p: KernelProfile) -> bool:
    """A TMA-fed wgmma/tcgen05 kernel with mbarriers and either register reallocation
    (setmaxnreg) or clusters: one CTA per SM is its design, not a defect. Judged by
    instructions and cluster size, never by the kernel's name."""
    ops = p.opcodes
    tma_mma = ops.has("tma") and is_async_mma(p)
    mbarriers = ops.executed.get("SYNCS", 0.0) > 0
    return tma_mma and mbarriers and (ops.has("setmaxreg") or (p.launch.cluster_size or 1) > 1)


def compute_capability(p: KernelProfile) -> tuple[int, int]:
    cc = need(p.identity.compute_capability, "the compute capability (device attributes)")
    major, minor = cc.split(".")
    return int(major), int(minor)


def arch_target(cc: tuple[int, int]) -> str:
    """The arch-specific compile target whose features (wgmma, tcgen05) the fix needs."""
    return f"sm_{cc[0]}{cc[1]}a"


def is_store(o: OpcodeTraffic) -> bool:
    return o.kind == "store" or base_opcode(o.opcode) == "ST"


def is_shared_load(o: OpcodeTraffic) -> bool:
    # wgmma reads its shared operands itself; generic LD may land in shared memory.
    return o.kind == "load" or base_opcode(o.opcode) in ("LD", "HGMMA", "QGMMA", "IGMMA", "BGMMA")


def by_opcode(t: Traffic, what: str) -> tuple[OpcodeTraffic, ...]:
    """The per-instruction split, or NotCollected when only the aggregate was captured."""
    need(t.actual, f"{what} (SourceCounters)")
    if t.actual and not t.by_opcode:
        raise NotCollected(f"the per-instruction split of {what} (SourceCounters)")
    return t.by_opcode


def local_sectors(p: KernelProfile) -> float:
    b = p.memory.local_bytes
    return (b or 0.0) / SECTOR_BYTES


def worst(ops: Iterable[OpcodeTraffic]) -> OpcodeTraffic | None:
    ops = [o for o in ops if o.excess > 0]
    return max(ops, key=lambda o: o.excess) if ops else None


def tail_idle(waves: float) -> float:
    """Share of SM time idle in the last, partial wave (all CTAs taking equal time)."""
    if waves <= 0:
        return 0.0
    full = math.ceil(waves - 1e-9)
    return 1.0 - waves / full


def ratio_to_reference(inputs) -> float | None:
    """Stage TFLOP/s over cuBLAS TFLOP/s, median of rounds, from the manifest if timed."""
    m = inputs.manifest
    timing = getattr(m, "timing", None) if m is not None else None
    spread = getattr(timing, "ratio_to_reference", None) if timing is not None else None
    return getattr(spread, "median", None)


def gap_to_reference(inputs) -> tuple[float | None, tuple[Evidence, ...]]:
    r = ratio_to_reference(inputs)
    if r is None or r <= 0:
        return None, ()
    gap = max(0.0, 1.0 - r)
    return gap, (Evidence("TFLOP/s ratio to cuBLAS (run manifest)", round(r, 3), "< 1"),)
