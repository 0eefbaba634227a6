"""Derived facts several rules share, with the thresholds that make them significant.

Each helper raises NotCollected when the report lacks what it reads, so a rule built on
it is "not evaluated" rather than judged on a zero that was never measured.

A unit counts as what bounds a kernel only when the counters say so twice: its
throughput is high AND either it is near its peak (its own traffic says so) or the warps
spend a large share of their stalls waiting on it (its throttle stalls say so). A busy
L1 alone proves little: it carries shared-memory traffic and global traffic at once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple

from perfscope.families import base_opcode
from perfscope.metrics import (
    M_DRAM_READ,
    M_DRAM_WRITE,
    M_FMA_PIPE,
    M_OPCODES,
    M_TENSOR_PIPE,
    SECTOR_BYTES,
    SOL_METRICS,
)
from perfscope.profile import KernelProfile, OpcodeTraffic, Traffic
from perfscope.rules.bounds import dram_bytes_moved, sass_flops, work_of
from perfscope.rules.model import Evidence, Inputs, NotCollected, need
from perfscope.stage import OperandRead

# A unit running at this share of its peak may be what bounds the kernel ...
BUSY_PCT = 60.0
# ... and is at its limit, whatever the stalls say, from this share on.
SATURATED_PCT = 80.0
# A busy unit is the bound when at least this share of stall cycles waits on it.
CONFIRM_SHARE = 0.40
# Throttle stalls (lg/mio/tex) above this share mean a memory pipe is saturated.
THROTTLE_CONFIRM = 0.10
# A few percent of stall time is no finding.
MIN_STALL_SHARE = 0.05
# Under 5% extra wavefronts or traffic is no finding.
MIN_EXCESS = 0.05
# Fewer issued instructions than this are noise for an instruction-mix judgement.
MIN_SHARE_OF_INSTRUCTIONS = 0.01
# Issue slots busier than this: the schedulers have work, latency is already hidden.
ISSUE_ACTIVE_MAX = 60.0
# A GEMM does many FLOPs per byte it moves from DRAM, even naively (the caches reuse its
# operands: sgemm_naive does 9.3); a reduction or an elementwise kernel does few.
GEMM_INTENSITY_MIN = 8.0

# Stalls that go away with more warps to switch to (latency), as opposed to throughput
# stalls (mio/lg/math throttles) that more warps would only deepen.
LATENCY_STALLS = ("long_scoreboard", "short_scoreboard", "wait", "barrier")
GLOBAL_WAIT_STALLS = ("long_scoreboard", "lg_throttle")
SHARED_WAIT_STALLS = ("mio_throttle", "short_scoreboard")
THROTTLE_STALLS = ("lg_throttle", "mio_throttle", "tex_throttle")
# The units global-memory traffic is judged by: L1 also carries shared memory, so it
# does not say whether global traffic is what fills it.
GLOBAL_FIELDS = ("l2_pct", "dram_pct")

TENSOR_FAMILIES = ("hmma", "gmma", "utcmma")
MATH_FAMILIES = ("ffma", *TENSOR_FAMILIES)


def pct(x: float) -> str:
    """A 0..1 share as a percentage with one decimal."""
    return f"{100 * x:.1f}%"


def stall_share(p: KernelProfile, reasons: Iterable[str]) -> float:
    """The listed reasons' part of the warps' stall cycles (0..1), the waits of warps parked
    until the kernel ends left out (KernelProfile.parked: a clustered kernel's spare producer
    warps at its exit barrier, whose fence and barrier waits are no wait of the work)."""
    need(p.stalls.total_cycles_per_issue, "warp stall reasons (WarpStateStats)")
    cycles = p.working_stall_cycles()
    total = sum(cycles.values())
    wanted = set(reasons)
    part = sum(v for r, v in cycles.items() if r in wanted)
    return part / total if total else 0.0


class Pressure(NamedTuple):
    """How much a unit's traffic costs the kernel, the evidence for it, and whether the unit is the bound."""

    value: float          # 0..1: how much of the kernel's time the unit's traffic decides
    evidence: tuple[Evidence, ...]
    bound: bool           # the unit itself is the bound

    @property
    def significant(self) -> bool:
        """Whether it is worth a finding: the unit is the bound, or the stalls waiting on it count."""
        return self.bound or self.value >= MIN_STALL_SHARE


def pressure(p: KernelProfile, sol_fields: Iterable[str], stalls: Iterable[str]) -> Pressure:
    """How much extra traffic through a unit costs: its busy fraction when it is the
    bound (saturated, or busy with the stalls waiting on it), else the share of stall
    cycles spent waiting on it."""
    stalls = tuple(stalls)
    share = stall_share(p, stalls)
    waiting = Evidence(f"stall share of {' + '.join(stalls)}", round(share, 3),
                       f">= {CONFIRM_SHARE} confirms a busy unit")
    busiest = None
    for name in sol_fields:
        v = getattr(p.sol, name)
        if v is not None and (busiest is None or v > busiest[1]):
            busiest = (name, v)
    if busiest is not None and (busiest[1] >= SATURATED_PCT
                                or (busiest[1] >= BUSY_PCT and share >= CONFIRM_SHARE)):
        return Pressure(busiest[1] / 100.0,
                        (Evidence(SOL_METRICS[busiest[0]], round(busiest[1], 1),
                                  f">= {SATURATED_PCT:.0f}, or >= {BUSY_PCT:.0f} with the stalls "
                                  "waiting on it: the unit is the bound"), waiting), True)
    return Pressure(share, (waiting,), False)


def saturated_unit(p: KernelProfile) -> tuple[str, float] | None:
    """What already bounds the kernel, confirmed twice, or None: full issue slots, a busy
    math pipe, or a memory unit that is saturated or throttles the warps."""
    issue = need(p.stalls.issue_active_pct, "issue activity (SchedulerStats)")
    if issue >= ISSUE_ACTIVE_MAX:
        return "issue slots", issue
    pipes = [v for v in (p.metric(M_TENSOR_PIPE), p.metric(M_FMA_PIPE)) if v is not None]
    if pipes and max(pipes) >= BUSY_PCT:
        return "math pipe", max(pipes)
    if not pipes:
        # Without pipe counters the SM throughput stands in (it includes the pipes).
        sm = need(p.sol.sm_pct, SOL_METRICS["sm_pct"])
        if sm >= BUSY_PCT:
            return "SM", sm
    throttle = stall_share(p, THROTTLE_STALLS)
    for name in ("l2_pct", "dram_pct", "l1tex_pct"):
        v = getattr(p.sol, name)
        if v is None:
            continue
        near_peak = v >= SATURATED_PCT and (name != "l1tex_pct" or _waits_on_l1tex(p))
        if near_peak or (v >= BUSY_PCT and throttle >= THROTTLE_CONFIRM):
            return name.removesuffix("_pct"), v
    return None


def scalar_ldg_share(p: KernelProfile) -> float | None:
    """Global loads (LDG) no wider than 4 bytes over all LDGs executed; None without LDGs."""
    ldgs = {op: n for op, n in p.opcodes.with_modifiers.items() if base_opcode(op) == "LDG"}
    total = sum(ldgs.values())
    if not total:
        return None
    wide = sum(n for op, n in ldgs.items() if any(m in ("64", "128") for m in op.split(".")[1:]))
    return 1 - wide / total


def _waits_on_l1tex(p: KernelProfile) -> bool:
    """Whether the warps' waits are on the L1TEX unit's own loads: long_scoreboard is
    CONFIRM_SHARE of the stalls or more in a kernel that copies through L1 (LDG, LDGSTS)
    with no TMA and no warp roles (where those stalls are barrier waits instead). An L1TEX
    busy from a tensor kernel's shared-memory operand reads alone (cuBLAS: 73%) is not."""
    return (not p.opcodes.has("tma") and not is_warp_specialised(p)
            and stall_share(p, ("long_scoreboard",)) >= CONFIRM_SHARE)


def need_reads(inputs: Inputs) -> tuple[OperandRead, ...]:
    """How the run read its operands by TMA, or NotCollected."""
    if inputs.context.reads is None:
        raise NotCollected("the operands' TMA boxes (a report does not hold a tensor map: "
                           "perfscope plans its own stages' from their run manifest, and "
                           "`perfscope profile --tensor-maps -- COMMAND` records a program's)")
    return inputs.context.reads


def need_opcodes(p: KernelProfile) -> None:
    """NotCollected unless the report has the executed opcode histogram."""
    if not p.opcodes.executed:
        raise NotCollected(f"the executed opcode histogram ({M_OPCODES})")


def family(p: KernelProfile, key: str) -> float:
    """Executed instructions of one family (a perfscope.sass key), 0 when none ran."""
    return p.opcodes.families.get(key, 0.0)


def total_instructions(p: KernelProfile) -> float:
    """Every executed warp-level instruction; NotCollected without the opcode histogram."""
    need_opcodes(p)
    return p.opcodes.total or 0.0


def has_tensor_cores(p: KernelProfile) -> bool:
    """Whether the kernel runs any tensor-core MMA (mma.sync, wgmma or tcgen05)."""
    return any(p.opcodes.has(k) for k in TENSOR_FAMILIES)


def dram_bytes(p: KernelProfile) -> float | None:
    """Bytes read from and written to DRAM, None unless both were collected."""
    read, write = p.metric(M_DRAM_READ), p.metric(M_DRAM_WRITE)
    return read + write if read is not None and write is not None else None


def gemm_or_other(p: KernelProfile, gemm: str, other: str) -> str:
    """A fix's wording for a GEMM or for any other kernel; both, named, when the report has
    no opcode histogram to tell which the kernel is."""
    try:
        return gemm if is_gemm_like(p) else other
    except NotCollected:
        return f"for a GEMM, {gemm}; for other kernels, {other}"


def is_gemm_like(p: KernelProfile) -> bool:
    """A matrix product: tensor-core MMAs, or FMAs that are a visible part of the mix and
    many FLOPs per DRAM byte (a reduction or an elementwise op does few)."""
    total = total_instructions(p)
    if total <= 0:
        return False
    if has_tensor_cores(p):
        return True
    if family(p, "ffma") / total < MIN_SHARE_OF_INSTRUCTIONS:
        return False
    # The stores' bytes count where the L2 still held them at the end: PyTorch's softmax of
    # 2 MiB (probes/kernel-floor-h200) writes 2 MiB that DRAM counts none of, and its exp's
    # FFMAs do 14 FLOP per byte DRAM counts, 7 per byte it moves.
    moved, flops = dram_bytes_moved(p), sass_flops(p)
    if not moved or not flops:
        return True
    return flops / moved >= GEMM_INTENSITY_MIN


def is_async_mma(p: KernelProfile) -> bool:
    """The math runs on wgmma (HGMMA) or tcgen05 (UTC*MMA): asynchronous warpgroup MMA."""
    return p.opcodes.has("gmma") or p.opcodes.has("utcmma")


def is_warp_specialised(p: KernelProfile) -> bool:
    """A pipeline of roles by its structure: TMA copies, asynchronous MMA, mbarrier waits
    (SYNCS) and several warpgroups (or register reallocation, or clusters), with or
    without setmaxnreg. One CTA per SM and barrier waits are its design, not defects.
    Judged by instructions and launch shape, never by the kernel's name."""
    ops = p.opcodes
    if not (ops.has("tma") and is_async_mma(p) and ops.executed.get("SYNCS", 0.0) > 0):
        return False
    warpgroups = (p.launch.block_size or 0) // 128
    return warpgroups >= 2 or ops.has("setmaxreg") or (p.launch.cluster_size or 1) > 1


def has_register_roles(p: KernelProfile) -> bool:
    """Producer and consumer warps told apart by setmaxnreg (registers moved to the
    consumers): stricter than is_warp_specialised, which also takes a cooperative kernel
    whose warpgroups load and multiply alike (Triton's TMA matmul)."""
    return p.opcodes.has("setmaxreg")


def compute_capability(p: KernelProfile) -> tuple[int, int]:
    """The device's compute capability as (major, minor)."""
    cc = need(p.identity.compute_capability, "the compute capability (device attributes)")
    major, minor = cc.split(".")
    return int(major), int(minor)


def arch_target(cc: tuple[int, int]) -> str:
    """The arch-specific compile target whose features (wgmma, tcgen05) the fix needs."""
    return f"sm_{cc[0]}{cc[1]}a"


def is_store(o: OpcodeTraffic) -> bool:
    """Whether the instruction stores, whatever memory its generic ST lands in."""
    return o.kind == "store" or base_opcode(o.opcode) == "ST"


def is_shared_load(o: OpcodeTraffic) -> bool:
    """Whether the instruction reads shared memory: a load, a generic LD, or a wgmma reading its operands."""
    # wgmma reads its shared operands itself; generic LD may land in shared memory.
    return o.kind == "load" or base_opcode(o.opcode) in ("LD", "HGMMA", "QGMMA", "IGMMA", "BGMMA")


def by_opcode(t: Traffic, what: str) -> tuple[OpcodeTraffic, ...]:
    """The per-instruction split, or NotCollected when only the aggregate was captured."""
    need(t.actual, f"{what} (SourceCounters)")
    if t.actual and not t.by_opcode:
        raise NotCollected(f"the per-instruction split of {what} (SourceCounters)")
    return t.by_opcode


def local_sectors(p: KernelProfile) -> float:
    """32-byte sectors of local-memory (spill) traffic, 0 when none was collected."""
    b = p.memory.local_bytes
    return (b or 0.0) / SECTOR_BYTES


def worst(ops: Iterable[OpcodeTraffic]) -> OpcodeTraffic | None:
    """The opcode with the most excess traffic, None when none has any."""
    ops = [o for o in ops if o.excess > 0]
    return max(ops, key=lambda o: o.excess) if ops else None


def tail_idle(waves: float) -> float:
    """Share of SM time idle in the last, partial wave (all CTAs taking equal time)."""
    if waves <= 0:
        return 0.0
    full = math.ceil(waves - 1e-9)
    return 1.0 - waves / full


def achieved_flops(inputs: Inputs) -> float | None:
    """FLOP/s the kernel ran at under ncu: the work (manifest, else SASS) over its time."""
    t = inputs.profile.sol.duration_ns
    w = work_of(inputs)
    return w.flops / (t * 1e-9) if w.flops and t else None
