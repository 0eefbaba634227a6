"""Global and shared memory: coalescing, vector width, reuse, tile size, bank conflicts, stores.

Excess is always judged from the per-instruction actual-against-ideal source counters
(sectors for global, wavefronts for shared), which already account for access width and
active lanes: a float4 copy has no excess, a 32-way conflicting LDS has 31 extra
wavefronts per request. The raw bank-conflict counters are never read here: they count
cp.async writes and the ideal multi-wavefront accesses of wide stores as "conflicts".
What extra traffic costs is weighed by the unit it goes through (perfscope.rules.facts
``pressure``): global traffic by L2 and DRAM, shared traffic by L1 with its stalls.
"""

from __future__ import annotations

from typing import NamedTuple

from perfscope.families import base_opcode
from perfscope.hardware import (
    ELEMENT_BYTES,
    PEAK_FLOP_PER_SM_CLOCK,
    SMEM_BYTES_PER_SM_CLOCK,
    XBAR_TO_L1_SECTORS_PER_SM_CLOCK,
)
from perfscope.manifest import RunManifest
from perfscope.metrics import (
    M_CYCLES,
    M_DRAM_READ,
    M_DRAM_WRITE,
    M_GLOBAL_IDEAL,
    M_GLOBAL_SECTORS,
    M_L1TEX_CYCLES,
    M_L2_READ_REQUESTS,
    M_L2_READ_SECTORS,
    M_L2_SECTORS,
    M_LONG_SCOREBOARD_SAMPLES,
    M_OPCODES,
    M_SHARED_IDEAL,
    M_SHARED_WAVEFRONTS,
    M_XBAR_IN_PCT,
    MEMORY_PCT_METRICS,
    OPCODE_METRICS,
    SECTOR_BYTES,
    SOL_METRICS,
    STALL_METRICS,
    TRAFFIC_METRICS_GLOBAL,
)
from perfscope.profile import KernelProfile
from perfscope.rules.bounds import wgmma_work, work_of
from perfscope.rules.facts import (
    GLOBAL_FIELDS,
    GLOBAL_WAIT_STALLS,
    MIN_EXCESS,
    MIN_SHARE_OF_INSTRUCTIONS,
    MIN_STALL_SHARE,
    SHARED_WAIT_STALLS,
    by_opcode,
    dram_bytes,
    family,
    has_register_roles,
    has_tensor_cores,
    is_gemm_like,
    is_shared_load,
    is_store,
    local_sectors,
    need_opcodes,
    need_reads,
    pressure,
    scalar_ldg_share,
    stall_share,
    total_instructions,
    worst,
)
from perfscope.rules.model import Evidence, Hit, Inputs, NotCollected, Rule, need

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
# The operands are re-read from the caches: the SMs ask for this many times the bytes
# DRAM delivers (a reduction or a copy reads each byte about once).
REREAD_MIN = 4.0
# More shared loads per FFMA than this and registers are not blocked (a 4x4 register tile
# gives 8 loads per 16 FMAs = 0.5; 8x8 gives 0.25).
SMEM_LOADS_PER_FMA_MAX = 0.5
SMEM_LOADS_PER_FMA_TARGET = 0.25
# Tile reuse: a 128 x 256 CTA tile moves (128 + 256) * K elements from L2 for 2*128*256*K
# FLOPs; a tensor-core kernel moving this many times more bytes per FLOP, with L2 busy,
# is paying for a tile too small to reuse its operands.
REFERENCE_TILE = (128, 256)
# ... unless a tile that large leaves fewer tiles than the kernel fills SMs with: then the
# reference is the largest-reuse tile of these sides (each at most the problem's) that still
# gives min(CTAs launched, SMs) tiles. A larger tile split over K could fill them too, but
# its partial sums cost bytes of their own, which the rule does not credit.
TILE_SIDES = (64, 128, 256)
TILE_BYTES_RATIO_MIN = 1.5
L2_BUSY_PCT = 70.0
# ... when the SMs re-read their operands through L2 (this many L2 bytes per DRAM byte);
# a kernel that streams each byte once (a decode GEMM) cannot reuse more with any tile.
L2_REREAD_MIN = 2.0
# TMA box rows are fetched from L2 one 128-byte line per request: an aligned row of 128
# bytes is one request of 4 sectors, a row that starts inside a line two requests (5
# sectors). Below this share of the sectors per request its boxes imply, rows straddle
# lines. Measured on the H200: 0.94-1.13 for every aligned TMA kernel of the reference run
# and the fused folder (3.78-4.51 of 4; cuBLAS 3.98-4.04), 0.74 for the column-split
# probe whose pieces start on multiples of 8 columns (2.95).
STRADDLE_RATIO_MAX = 0.85
LINE_BYTES = 128
LINE_SECTORS = LINE_BYTES // SECTOR_BYTES
# ... read only where TMA carries the L2 reads: other global loads (LDG) at most this share
# of the sectors read, since their requests hold other sector counts.
OTHER_LOADS_SHARE_MAX = 0.10

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
    Why: every extra sector costs L2 and often DRAM bandwidth and latency; strided or
    misaligned lanes are the usual cause.
    Fix: map threadIdx.x to the contiguous dimension, transpose through shared memory,
    keep vector accesses aligned.
    Estimate: excess load sectors / (all global + local sectors) x pressure, the pressure
    being the busier of L2 and DRAM when it is the bound (saturated, or busy with the warps
    waiting on loads), else the share of stall cycles on long scoreboard + LG throttle.
    L1 is not read: it carries shared-memory traffic too. The share is of every sector the
    SMs take in where the L2 -> SM count is larger (TMA's sectors are no LDG's): a kernel
    whose operands come by TMA loads a few pointers by LDG, and their excess says little
    about its time (torch._grouped_mm's GEMM: 10,160 excess sectors of per-group pointers
    and shapes, 0.24 of its LDG sectors and 0.0002 of all it took in; 0.07 before).
    Example:
        before: float a = A[k * lda + row];         // lanes stride by lda
        after:  float a = A[row * lda + k];         // lanes walk the contiguous index
    Source: seed 000 §6.3 row 1; NCU Profiling Guide, Source Counters
    (L2 Theoretical Sectors Global Excessive)."""
    p, loads = _global_loads(inputs)
    ideal = need(p.memory.global_.ideal, M_GLOBAL_IDEAL)
    excess = _sum_excess(loads)
    if not ideal or excess / ideal < MIN_EXCESS:
        return None
    pr = pressure(p, GLOBAL_FIELDS, GLOBAL_WAIT_STALLS)
    if not pr.significant:
        return None
    total = (p.memory.global_.actual or 0.0) + local_sectors(p)
    w = worst(loads)
    ev = [Evidence(f"{M_GLOBAL_SECTORS} excess / ideal (loads)", round(excess / ideal, 3),
                   f">= {MIN_EXCESS}")]
    if w is not None and w.ratio is not None:
        ev.append(Evidence(f"{w.opcode} sectors actual / ideal", round(w.ratio, 2), "> 1"))
    ev += pr.evidence
    into = bytes_into_sms(p)
    if into is not None and into[0] / SECTOR_BYTES > total:
        total = into[0] / SECTOR_BYTES
        ev.append(Evidence(f"excess / every sector the SMs took in ({into[1]})",
                           round(excess / total, 5), "the LDG sectors are part of it"))
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
    reference="NCU Profiling Guide: Source Counters (L2 Theoretical Sectors Global Excessive); "
              "CUDA C++ Best Practices Guide: Coalesced Access to Global Memory",
    ncu=("UncoalescedGlobalAccess",),
    thresholds=(("MIN_EXCESS", MIN_EXCESS), ("MIN_STALL_SHARE", MIN_STALL_SHARE)),
)


def _check_scalar_loads(inputs: Inputs) -> Hit | None:
    """Symptom: a GEMM-like kernel loads global memory with scalar (<= 4-byte) LDGs and
    spends its stall time waiting on them. The loads may well be coalesced (their sectors
    equal the ideal): narrow is not uncoalesced, so this has a tag of its own.
    Why: four 4-byte loads are four LG instructions, queue slots and scoreboard waits
    where one 16-byte LDG.E.128 would do, and fewer bytes are in flight per thread; GEMM
    tiles are contiguous along K or N, so the vector access is possible.
    Fix: float4 / 16-byte vector loads with aligned base pointers and leading dimensions.
    Estimate: (long scoreboard + LG throttle stall share) x LDG share of the data-moving
    instructions (LDG against LDG + LDL/STL + LDGSTS + TMA) x scalar share of LDGs
    x (1 - 1/4). LDGs under 1% of all instructions are no finding.
    Example:
        before: float a = A[i];                           // LDG.E, 4 bytes per lane
        after:  float4 a = *(const float4*)&A[4 * i];     // LDG.E.128, 16 bytes per lane
    Source: seed 002 §3 (float4 loads, alignment); NCU Profiling Guide: Warp Stall
    Reasons (lg_throttle: combine narrow memory operations into wider ones)."""
    p = inputs.profile
    need_opcodes(p)
    ldgs = {op: n for op, n in p.opcodes.with_modifiers.items() if base_opcode(op) == "LDG"}
    ldg = sum(ldgs.values())
    if not ldg or not is_gemm_like(p):
        return None
    scalar = scalar_ldg_share(p)
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
    code="PS102", tag="narrow-loads", title="Scalar global loads where 16-byte vectors fit",
    severity="warning",
    metrics=(*OPCODE_METRICS, *STALL_METRICS, M_DRAM_READ, M_DRAM_WRITE),
    check=_check_scalar_loads,
    fix="Load 16-byte vectors (float4, LDG.E.128): give each thread 4 consecutive elements "
        "along K of A and N of B, keep base pointers and leading dimensions 16-byte aligned "
        "(K % 4 == 0 and N % 4 == 0 for fp32, % 8 for fp16/bf16) and fall back to scalar loads "
        "only at the matrix edges.",
    reference="NCU Profiling Guide: Warp Stall Reasons (lg_throttle); CUDA C++ Programming "
              "Guide: Device Memory Accesses (size and alignment requirement)",
    ncu=("CPIStall/Lg Throttle", "CPIStall/Long Scoreboard"),
    thresholds=(("SCALAR_LOAD_SHARE_MIN", SCALAR_LOAD_SHARE_MIN), ("GLOBAL_WAIT_MIN", GLOBAL_WAIT_MIN),
                ("MIN_SHARE_OF_INSTRUCTIONS", MIN_SHARE_OF_INSTRUCTIONS)),
)


def _check_no_data_reuse(inputs: Inputs) -> Hit | None:
    """Symptom: more than one global load per four FFMAs, the operands re-read from the
    caches (the SMs ask for many times the bytes DRAM delivers): each product reads its
    operands straight from global memory instead of a tile.
    Why: the naive triple loop moves M*N*K operands through L1/L2 instead of M*K + K*N;
    the math waits on loads. A reduction or a copy reads each byte once and is no GEMM.
    Fix: shared-memory tiles plus a register block per thread.
    Estimate: the share of stall cycles spent waiting on global loads (long scoreboard +
    LG throttle), all of which a tile that reuses each element T times cuts by 1 - 1/T.
    Example:
        before: for (k) acc += A[row * K + k] * B[k * N + col];    // 2 LDG per FFMA
        after:  load As, Bs tiles to __shared__; __syncthreads();
                for (k) acc[i][j] += As[k][i] * Bs[k][j];          // reused TILE times
    Source: seed 000 §2.1-2.3; seed 002 §2."""
    p = inputs.profile
    need_opcodes(p)
    fma, ldg = family(p, "ffma"), family(p, "ldg")
    if not fma or ldg / fma <= LOADS_PER_FMA_MAX:
        return None
    requested = need(p.memory.global_.actual, M_GLOBAL_SECTORS) * SECTOR_BYTES
    moved = need(dram_bytes(p), f"{M_DRAM_READ} + {M_DRAM_WRITE}")
    reread = requested / moved if moved else 0.0
    if reread < REREAD_MIN:
        return None
    wait = stall_share(p, GLOBAL_WAIT_STALLS)
    if wait < MIN_STALL_SHARE:
        return None
    tiles = [k for k in ("shared", "ldsm", "ldgsts", "tma") if p.opcodes.has(k)]
    return Hit((
        Evidence("LDG / FFMA instructions", round(ldg / fma, 3), f"> {LOADS_PER_FMA_MAX}"),
        Evidence("global bytes requested / DRAM bytes (re-reads)", round(reread, 1),
                 f">= {REREAD_MIN}"),
        Evidence("shared-memory opcode families used", ", ".join(tiles) or "none", "tiles expected"),
        Evidence("stall share of long_scoreboard + lg_throttle", round(wait, 3),
                 f">= {MIN_STALL_SHARE}"),
    ), wait)


NO_DATA_REUSE = Rule(
    code="PS103", tag="no-data-reuse", title="Operands come from global memory for every FMA",
    severity="warning",
    metrics=(*OPCODE_METRICS, *STALL_METRICS, M_GLOBAL_SECTORS, M_DRAM_READ, M_DRAM_WRITE),
    check=_check_no_data_reuse,
    fix="Stage A and B tiles in shared memory (e.g. 64x64x16 with 256 threads) and let each "
        "thread accumulate a 4x4 or 8x8 block of C in registers, so every global element is "
        "loaded once per tile instead of once per FMA.",
    reference="CUDA C++ Programming Guide: Shared Memory (matrix multiplication example); "
              "CUDA C++ Best Practices Guide: Shared Memory in Matrix Multiplication",
    thresholds=(("LOADS_PER_FMA_MAX", LOADS_PER_FMA_MAX), ("REREAD_MIN", REREAD_MIN),
                ("MIN_STALL_SHARE", MIN_STALL_SHARE)),
)


def _xbar_in_sectors(p: KernelProfile) -> float | None:
    """Sectors the crossbar delivered into the SMs' L1TEX / shared memory: its share of the
    peak rate x that rate x the L1TEX cycles summed over the SMs; None where a metric or the
    rate (by compute capability) is missing."""
    pct, cycles = p.metric(M_XBAR_IN_PCT), p.metric(M_L1TEX_CYCLES)
    rate = XBAR_TO_L1_SECTORS_PER_SM_CLOCK.get(p.identity.compute_capability or "")
    if pct is None or cycles is None or rate is None:
        return None
    return pct / 100 * rate * cycles


# Where the bytes into the SMs come from: the crossbar's own count, else L2's read counter
# (which on the H200 sees about half of what TMA brings: 23.9M of the persistent stage's
# 50.3M sectors at 4096^3, below what its 128 x 256 tiles must read), a lower bound.
CROSSBAR_SOURCE = (f"{M_XBAR_IN_PCT} x {M_L1TEX_CYCLES} x the crossbar's sectors per clock, "
                   "x 32")
L2_SOURCE = f"{M_L2_READ_SECTORS} x 32, a lower bound where TMA loads"


def bytes_into_sms(p: KernelProfile) -> tuple[float, str] | None:
    """Bytes the SMs received from L2 over the kernel (each CTA's tiles, a multicast one in
    every CTA it lands in) and where the figure comes from; None with neither count."""
    measured = _xbar_in_sectors(p)
    if measured is not None:
        return measured * SECTOR_BYTES, CROSSBAR_SOURCE
    sectors = p.metric(M_L2_READ_SECTORS)
    return (sectors * SECTOR_BYTES, L2_SOURCE) if sectors is not None else None


def _reference_tile(p: KernelProfile, manifest: RunManifest | None) -> tuple[int, int, str]:
    """The tile PS104 holds the kernel to, and why it is not 128 x 256 when it is not: no
    side larger than the problem's (a decode GEMM, M = 16, has no rows to reuse), and enough
    tiles to fill the SMs the kernel fills (REFERENCE_TILE's comment). Without a run
    manifest (or one without the shape) the shape is unknown: 128 x 256."""
    if manifest is None or manifest.m <= 0 or manifest.n <= 0:
        return (*REFERENCE_TILE, "")
    m, n = manifest.m, manifest.n
    bm, bn = min(REFERENCE_TILE[0], m), min(REFERENCE_TILE[1], n)
    ctas, sms = p.launch.grid_size, p.identity.sm_count
    if not ctas or not sms:
        return bm, bn, ""

    def tiles(t: tuple[int, int]) -> int:
        return manifest.batch * -(-m // t[0]) * -(-n // t[1])

    fill = min(ctas, sms)
    if tiles((bm, bn)) >= fill:
        return bm, bn, ""
    sides = sorted({(min(a, m), min(b, n)) for a in TILE_SIDES for b in TILE_SIDES})
    filling = [t for t in sides if tiles(t) >= fill]

    def reuse(t: tuple[int, int]) -> tuple[float, int]:
        # FLOPs per byte, a*b/(a+b); ties to the squarer tile.
        return t[0] * t[1] / (t[0] + t[1]), -abs(t[0] - t[1])

    if not filling:
        # No tile fills them without a split over K (the kernel splits, or the problem is
        # that small): the tile that makes the most tiles, not the strictest.
        best = max(sides, key=lambda t: (tiles(t), reuse(t)))
        return best[0], best[1], f": the one that makes the most tiles, {tiles(best)}"
    best = max(filling, key=reuse)
    return best[0], best[1], f": the largest that still makes the {fill} tiles its CTAs fill"


def _check_small_tile(inputs: Inputs) -> Hit | None:
    """Symptom: a tensor-core kernel with L2 busy moves many more bytes from L2 to the SMs
    per FLOP than a 128 x 256 tile would: its CTA tile is too small to reuse its operands.
    Why: a BM x BN tile reads (BM + BN) * K elements for 2 * BM * BN * K FLOPs, so bytes per
    FLOP fall as the tile grows; a 64 x 64 tile moves 2.7x the operand bytes of a 128 x 256
    one, and at tensor-core rates the L2 runs out of bandwidth before the math does.
    Fix: larger CTA tiles (128 x 128 or 128 x 256 per CTA, 2 consumer warpgroups), or
    clusters that share tiles through TMA multicast.
    Estimate: L2 busy fraction x (1 - reference bytes per FLOP / measured bytes per FLOP),
    the L2 time a 128 x 256 tile would not spend. The bytes are counted where they enter the
    SMs (the crossbar into L1TEX: every CTA's tiles, a multicast one in each CTA it lands
    in), so a kernel that multicasts (UTMALDG .MULTICAST executed) is not evaluated: L2
    sends it less than its CTAs take in, by a share no collected counter gives. The count
    gives the H200 reference run's tiles their arithmetic to 1%: 1.00 of the
    reference for 128 x 256, 1.33 for 128 x 128, 2.67 for Triton's 64 x 64; L2's read counter,
    the fallback, read 0.47-0.56 for the 128 x 256 TMA stages and cuBLAS, under what any
    kernel of those tiles must read.
    Example:
        before: BLOCK_M, BLOCK_N = 64, 64        # 0.031 B/FLOP from L2 in bf16
        after:  BLOCK_M, BLOCK_N = 128, 256      # 0.012 B/FLOP
    Source: seed 000 §2.2 (tile size and reuse); NCU Profiling Guide: Memory Workload
    Analysis (L2 throughput)."""
    p = inputs.profile
    need_opcodes(p)
    if not has_tensor_cores(p):
        return None
    l2 = need(p.sol.l2_pct, SOL_METRICS["l2_pct"])
    if l2 < L2_BUSY_PCT:
        return None
    into, source = need(bytes_into_sms(p), f"{M_XBAR_IN_PCT} or {M_L2_READ_SECTORS}")
    if p.opcodes.tma_multicast_share:
        return None     # multicast: L2 sends less than the SMs take in (the docstring)
    moved = need(dram_bytes(p), f"{M_DRAM_READ} + {M_DRAM_WRITE}")
    if moved and into < L2_REREAD_MIN * moved:
        return None     # each byte crosses L2 about once: no tile can reuse it more
    w = work_of(inputs)
    elem = ELEMENT_BYTES.get(w.dtype or "")
    if not w.flops or not elem:
        return None
    measured = into / w.flops
    bm, bn, why = _reference_tile(p, inputs.manifest)
    reference = (bm + bn) * elem / (2 * bm * bn)
    ratio = measured / reference
    if ratio < TILE_BYTES_RATIO_MIN:
        return None
    return Hit((
        Evidence(f"bytes into the SMs per FLOP ({source}, / FLOPs)", round(measured, 4),
                 f">= {TILE_BYTES_RATIO_MIN} x {reference:.4f} (a {bm}x{bn} tile{why})"),
        Evidence(SOL_METRICS["l2_pct"], round(l2, 1), f">= {L2_BUSY_PCT:.0f}"),
        Evidence("FLOPs", w.flops, w.flops_source),
    ), l2 / 100 * (1 - 1 / ratio), (("ratio", f"{ratio:.1f}"),))


SMALL_TILE = Rule(
    code="PS104", tag="small-tile", title="The CTA tile is too small to reuse its operands",
    severity="warning",
    metrics=(M_XBAR_IN_PCT, M_L1TEX_CYCLES, M_L2_READ_SECTORS, SOL_METRICS["l2_pct"],
             *OPCODE_METRICS, M_DRAM_READ, M_DRAM_WRITE),
    check=_check_small_tile,
    fix="Grow the CTA tile: its CTAs take in {ratio}x the bytes per FLOP of a 128x256 tile, "
        "all of them from L2. Use 128x128 or 128x256 tiles (two consumer warpgroups of wgmma "
        "m64nNk16 on sm_90a), or a 2-CTA cluster that multicasts the shared operand with TMA, "
        "so L2 sends it once for both.",
    reference="NCU Profiling Guide: Memory Workload Analysis (L2 throughput); CUDA C++ Best "
              "Practices Guide: Shared Memory in Matrix Multiplication",
    thresholds=(("L2_BUSY_PCT", L2_BUSY_PCT), ("TILE_BYTES_RATIO_MIN", TILE_BYTES_RATIO_MIN),
                ("L2_REREAD_MIN", L2_REREAD_MIN)),
)


def _check_store_inefficiency(inputs: Inputs) -> Hit | None:
    """Symptom: global stores write more sectors than the bytes they carry (C written
    with narrow, scattered per-fragment stores).
    Why: partial-sector writes cost L2 bandwidth and read-modify-write work; the mma
    fragment layout scatters a warp's C values over 8 rows.
    Fix: stage C through shared memory and write whole rows with 16-byte stores or TMA.
    Estimate: excess store sectors / all sectors the kernel moves x memory pressure
    (L2/DRAM when the bound, else the LG throttle + drain stall share). The sectors moved
    are the largest of three counts: the per-instruction global + local sectors; the L2's
    count of sectors the SMs requested (lts__t_sectors_srcunit_tex.sum); and the sectors
    the crossbar delivered into the SMs plus the stores' own (TMA copies are no SASS load
    instruction, so a TMA-fed kernel's operand traffic shows only in the last two, and on
    the H200 the L2's count sees as little as half of it: 25.0M of the persistent stage's
    50.3M delivered sectors at 4096^3). The crossbar's count is left out where TMA loads
    multicast (it counts a multicast tile in every CTA). A TMA-fed kernel with neither count
    gets no estimate rather than one inflated by the missing loads.
    Example:
        before: C[r * N + c] = acc[i];              // 4-byte STG per fragment element
        after:  stage the tile in __shared__; then
                *(uint4*)&C[r * N + c4] = tile[r][c4];   // STG.E.128 whole rows
    Source: seed 004 §4 (hgemm_bcf_dbf_rw); NCU Profiling Guide: Source Counters."""
    p = inputs.profile
    ops = by_opcode(p.memory.global_, "global sectors")
    stores = [o for o in ops if is_store(o)]
    ideal = sum(o.ideal for o in stores)
    excess = _sum_excess(stores)
    if not ideal or excess / ideal < MIN_EXCESS:
        return None
    pr = pressure(p, GLOBAL_FIELDS, ("lg_throttle", "drain"))
    if not pr.significant:
        return None
    w = worst(stores)
    evidence = [
        Evidence(f"{M_GLOBAL_SECTORS} excess / ideal (stores)", round(excess / ideal, 3),
                 f">= {MIN_EXCESS}"),
        Evidence(f"{w.opcode} sectors actual / ideal", round(w.ratio or 0.0, 2), "> 1"),
        *pr.evidence,
    ]
    moved = _sectors_moved(p, sum(o.actual for o in stores))
    if moved is None:
        return Hit(tuple(evidence), None)
    total, counted = moved
    if counted is not None:
        evidence.append(counted)
    return Hit(tuple(evidence), excess / total * pr.value)


def _sectors_moved(p: KernelProfile, store_sectors: float) -> tuple[float, Evidence | None] | None:
    """All 32-byte sectors the kernel moves between the SMs and L2, and the evidence of the
    count taken where it is not the per-instruction one; None for a TMA-fed kernel with
    neither the L2's count nor the crossbar's (its loads are in no per-instruction count).
    The crossbar counts a multicast tile once in every CTA it lands in, more than L2 moved,
    so a kernel that multicasts is sized by the other two counts."""
    per_instruction = (p.memory.global_.actual or 0.0) + local_sectors(p)
    l2 = p.metric(M_L2_SECTORS)
    multicast = p.opcodes.tma_multicast_share
    xbar = _xbar_in_sectors(p) if not multicast else None
    if l2 is None and xbar is None and p.opcodes.has("tma"):
        return None
    counts = [(per_instruction, None)]
    if l2 is not None:
        counts.append((l2, Evidence(f"{M_L2_SECTORS} (SM traffic to L2, TMA included)", round(l2),
                                    f"> {per_instruction:.0f} per-instruction sectors")))
    if xbar is not None:
        into = xbar + store_sectors
        counts.append((into, Evidence(f"sectors into the SMs ({M_XBAR_IN_PCT} x "
                                      f"{M_L1TEX_CYCLES} x the crossbar's rate) + the stores'",
                                      round(into), f"> {max(per_instruction, l2 or 0.0):.0f}, "
                                      "the other counts")))
    return max(counts, key=lambda c: c[0])


STORE_INEFFICIENCY = Rule(
    code="PS105", tag="store-inefficiency", title="C is written with narrow, scattered stores",
    severity="optimization",
    metrics=(*TRAFFIC_METRICS_GLOBAL, *_GLOBAL_PRESSURE, M_L2_SECTORS, M_XBAR_IN_PCT,
             M_L1TEX_CYCLES, M_OPCODES),
    check=_check_store_inefficiency,
    fix="Write C through shared memory: stage each warp's accumulator fragments in a swizzled "
        "shared tile (stmatrix where available), then store whole rows with 16-byte "
        "STG.E.128, or one TMA store (UTMASTG) per tile on sm_90a.",
    reference="NCU Profiling Guide: Source Counters; PTX ISA: stmatrix, cp.async.bulk.tensor",
    ncu=("UncoalescedGlobalAccess",),
    thresholds=(("MIN_EXCESS", MIN_EXCESS), ("MIN_STALL_SHARE", MIN_STALL_SHARE)),
)


def _tma_rows(inputs: Inputs, per_request: float) -> tuple[int, str]:
    """The bytes of the narrowest TMA box row the run read (up to a line), and the boxes;
    with the boxes unknown, a line when the requests carry more than 2 sectors (rows of 64
    bytes or fewer cannot: such a row is one request of at most 2 sectors, or 2 of 3)."""
    if inputs.context.reads is None and per_request > 2:
        return LINE_BYTES, ("unknown (no tensor map recorded); over 2 sectors a request "
                            "means rows wider than 64 B, taken as a line")
    reads = need_reads(inputs)      # at 2 or fewer, narrow rows and split ones look alike
    if not reads:
        raise NotCollected("the operands' TMA boxes (the run manifest names none)")
    row = min(min(r.box_row_bytes, LINE_BYTES) for r in reads)
    if row < 2 * SECTOR_BYTES:
        raise NotCollected(f"a TMA box row of at least {2 * SECTOR_BYTES} bytes (the narrowest "
                           f"is {row} B, too few sectors to tell a straddling row)")
    return row, "; ".join(f"{r.operand} {r.box_rows} x {r.box_row_bytes} B" for r in reads)


def _check_misaligned_tma(inputs: Inputs) -> Hit | None:
    """Symptom: a kernel that reads its operands by TMA gets fewer sectors per L2 request
    than its boxes' rows hold: box rows start inside a 128-byte line, so each is fetched as
    two requests.
    Why: TMA asks L2 for a box row one line at a time. A row of 128 bytes that starts on a
    line is one request of 4 sectors; one that starts 16 or 32 bytes into a line is two
    requests and 5 sectors, so the k loop's operands take more L2 requests to arrive. Box
    coordinates not on a multiple of the line (a piece of N that starts on a multiple of 8
    columns, not 64), or a leading dimension that is not a multiple of 128 bytes, do this.
    What it costs depends on whether the main loop then waits for its operands: the
    column-split probe with its pieces' first columns rounded down to 64 (the same widths
    and math) ran 1.153x faster at 4096^3 (H100); cuBLAS's nvjet with A's rows 8,080 bytes
    apart made twice the requests of the same GEMM at 8,192 and ran 1.004-1.021x slower.
    Fix: start every box on a line: cut pieces of an N-major operand at multiples of
    64 bf16 columns (its 128-byte swizzle atom), keep the weight K-major (N x K) where
    pieces must be narrower, pad leading dimensions to a multiple of 128 bytes.
    Without the boxes (cuBLAS passes its maps through a pointer; a program's are recorded
    only with `profile --tensor-maps`) the rule clears a kernel whose requests carry
    STRADDLE_RATIO_MAX of a line or more, takes rows of a line where they carry over 2
    sectors (narrower rows cannot), and is not evaluated at 2 or fewer.
    Estimate: the main loop's operand waits (long-scoreboard samples at its PCs over all
    samples: a warp-specialised kernel's consumers at the full barrier, not its producer
    waiting for a free slot) times the share of the L2 read requests the straddling rows
    add (a row of e sectors, split, is two requests of e + 1: from R requests and S
    sectors, (e R - S) / (e - 1) rows split). Measured: 0.079 on the split's H100 report
    where aligning saved 0.136 (its pieces' own k loops, run in the last round only, lie
    outside the main loop), 0.017 on cuBLAS's at lda 4040 where padding saved 0.004-0.024.
    All long-scoreboard stalls instead of the main loop's said 0.180 and 0.120. On the
    H200 the split's pair says 0.075 where aligning saved 0.107 by events (0.115 under ncu).
    All three have producer and consumer roles (setmaxnreg). Triton's TMA matmul has none
    (its warps load and multiply alike): with A's rows 8,080 bytes apart it made twice the
    requests and waited for operands in 0.34 of its samples against 0.19 aligned, with its
    tensor pipe as busy (82.5% against 83.0%), and ran only 1.022-1.026x slower (H200):
    waits x requests would say 0.20. Why waits cost time in one kernel and not another is
    not isolated (the split's pieces lost 11-13% where cuBLAS lost 0.4-2.4%), so the
    estimate is given only where it was measured to hold, kernels with roles; without
    them the finding has none.
    Example:
        before: n0 = 8 * (j * units8 / per_row);    // pieces 224-232 columns, any multiple of 8
        after:  n0 = 64 * (j * units64 / per_row);  // pieces on the 128-byte swizzle atom
    Source: seed 000 §6.3 row 1 (coalescing, at the L2's line); NCU Profiling Guide: Memory
    Workload Analysis (L2 sectors and requests); CUDA C++ Programming Guide: Asynchronous
    Data Copies using the Tensor Memory Accelerator."""
    p = inputs.profile
    need_opcodes(p)
    if not p.opcodes.executed.get("UTMALDG"):
        return None     # no tensor-map loads (TMA stores or 1D bulk copies alone are not this)
    sectors = need(p.metric(M_L2_READ_SECTORS), M_L2_READ_SECTORS)
    requests = need(p.metric(M_L2_READ_REQUESTS), M_L2_READ_REQUESTS)
    if not sectors or not requests:
        return None
    other = sum(o.actual for o in by_opcode(p.memory.global_, "global sectors") if not is_store(o))
    if other > OTHER_LOADS_SHARE_MAX * sectors:
        raise NotCollected(f"L2 reads carried by TMA alone (global loads read {other / sectors:.0%} "
                           "of the sectors, in requests of their own size)")
    per_request = sectors / requests
    if inputs.context.reads is None and per_request >= STRADDLE_RATIO_MAX * LINE_SECTORS:
        return None     # whatever its boxes, requests that full leave no rows to straddle
    row, boxes = _tma_rows(inputs, per_request)
    per_row = row / SECTOR_BYTES
    if per_request / per_row >= STRADDLE_RATIO_MAX:
        return None
    split = max(0.0, (per_row * requests - sectors) / (per_row - 1))
    added = min(1.0, split / requests)
    waits = need(p.hot_loop.operand_waits if p.hot_loop else None,
                 f"the main loop's per-PC stall samples ({M_LONG_SCOREBOARD_SAMPLES})")
    ev = [Evidence(f"{M_L2_READ_SECTORS} / {M_L2_READ_REQUESTS}", round(per_request, 2),
                   f"< {STRADDLE_RATIO_MAX * per_row:.2f} ({STRADDLE_RATIO_MAX} x the {per_row:g} "
                   f"sectors of a {row}-byte box row; boxes {boxes})"),
          Evidence("L2 read requests the straddling rows add / all", round(added, 3), "-"),
          Evidence("long_scoreboard samples in the main loop / all samples (its warps waiting "
                   "for operands)", round(waits, 3), "-")]
    estimate: float | None = waits * added
    if not has_register_roles(p):
        # The estimate held on kernels with producer and consumer roles and said 8x too much
        # on one without (Triton's TMA matmul, the docstring): not estimated there.
        estimate = None
        ev.append(Evidence("register roles (setmaxnreg) in the SASS", "none",
                           "with roles estimated, as measured; without, not estimated"))
    return Hit(tuple(ev), estimate, fix_args=(("row", str(row)),))


MISALIGNED_TMA = Rule(
    code="PS106", tag="misaligned-tma", title="TMA box rows straddle 128-byte lines",
    severity="warning",
    metrics=(M_L2_READ_SECTORS, M_L2_READ_REQUESTS, *OPCODE_METRICS, *TRAFFIC_METRICS_GLOBAL,
             M_LONG_SCOREBOARD_SAMPLES),
    check=_check_misaligned_tma,
    fix="Start every TMA box row on a 128-byte line: box coordinates along the contiguous "
        "dimension on multiples of 128 bytes (64 columns of a 16-bit N-major operand, the "
        "swizzle atom: cut pieces of N there, or keep the weight K-major so narrower pieces "
        "start their own lines) and leading dimensions padded to a multiple of 128 bytes; "
        "each {row}-byte row is then one L2 request instead of two.",
    reference="NCU Profiling Guide: Memory Workload Analysis (L2 sectors and requests); CUDA "
              "C++ Programming Guide: Asynchronous Data Copies using the Tensor Memory "
              "Accelerator",
    thresholds=(("STRADDLE_RATIO_MAX", STRADDLE_RATIO_MAX),
                ("OTHER_LOADS_SHARE_MAX", OTHER_LOADS_SHARE_MAX)),
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
          *pr.evidence)
    return ev, gain, w


def _check_bank_conflicts_loads(inputs: Inputs) -> Hit | None:
    """Symptom: shared-memory loads (LDS, LDSM, wgmma operand reads) take more wavefronts
    than ideal: bank conflicts.
    Why: each conflict replays the access; the shared pipe and the warps waiting on it
    (MIO throttle, short scoreboard) slow down.
    Fix: XOR swizzle for ldmatrix tiles; transpose or pad an FP32 A tile.
    Estimate: excess load wavefronts / all shared wavefronts x pressure (L1 throughput when
    it is the bound: saturated, or busy with 40% of the stalls on the shared pipe; else the
    MIO throttle + short scoreboard stall share).
    Example:
        before: __shared__ float As[BK][BM];        // column reads hit one bank
        after:  __shared__ float As[BK][BM + 1];    // padded: 32 lanes, 32 banks
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
    reference="NCU Profiling Guide: Memory Workload Analysis, Shared Memory (bank conflicts); "
              "CUDA C++ Programming Guide: Shared Memory (bank conflicts)",
    ncu=("SharedMemoryConflicts/Load", "UncoalescedSharedAccess"),
    thresholds=(("MIN_EXCESS", MIN_EXCESS), ("MIN_STALL_SHARE", MIN_STALL_SHARE)),
)


def _check_bank_conflicts_stores(inputs: Inputs) -> Hit | None:
    """Symptom: shared-memory stores (STS, STSM) take more wavefronts than ideal.
    Why: conflicting stores replay like conflicting loads; with the raw counters this is
    easy to misjudge (cuBLAS's nvjet shows 130k raw store "conflicts" at ideal wavefronts),
    so only per-instruction excess counts.
    Fix: pad or swizzle the stored tile so a warp's 32 lanes hit 32 banks per wavefront.
    Estimate: excess store wavefronts / all shared wavefronts x shared pressure (as PS110).
    Example:
        before: tile[lane % 8][lane / 8 * 4] = v;          // 4 lanes per bank
        after:  tile[r][c ^ ((r % 8) * 4)] = v;            // XOR swizzle: one lane per bank
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
    reference="NCU Profiling Guide: Memory Workload Analysis, Shared Memory (bank conflicts); "
              "CUDA C++ Programming Guide: Shared Memory (bank conflicts)",
    ncu=("SharedMemoryConflicts/Store",),
    thresholds=(("MIN_EXCESS", MIN_EXCESS), ("MIN_STALL_SHARE", MIN_STALL_SHARE)),
)


def _check_uncoalesced_shared(inputs: Inputs) -> Hit | None:
    """Symptom: cp.async (LDGSTS) writes into shared memory take more wavefronts than
    ideal.
    Why: a cp.async write is not a bank conflict on a load: it comes from the layout the
    copy writes (narrow copies, or a swizzle applied only on the read side). It is often a
    deliberate trade that costs little (cuBLAS's SGEMM writes at 3x ideal, est. 0.02: info);
    where the copies' wavefronts keep L1TEX saturated it is the bound, and its estimate makes
    it the warning (Triton's TF32 matmul on a row-major B: 16x ideal, L1TEX 90%, est. 0.67).
    Fix: 16-byte cp.async whose 8-lane groups fill whole 128-byte rows, or TMA.
    Estimate: excess LDGSTS wavefronts / all shared wavefronts x shared pressure (as PS110).
    Example:
        before: cp.async.ca.shared.global [s + 4 * lane], [g + 4 * lane], 4;
        after:  cp.async.cg.shared.global [s + swz(16 * lane)], [g + 16 * lane], 16;
    Source: seed 004 §2 (uncoalesced shared access from cp.async + swizzle); NCU
    UncoalescedSharedAccess rule."""
    got = _shared_excess(inputs, lambda o: o.kind == "async-copy")
    if got is None:
        return None
    ev, gain, w = got
    return Hit(ev, gain, (("opcode", w.opcode),))


UNCOALESCED_SHARED = Rule(
    code="PS112", tag="uncoalesced-shared", title="cp.async writes to shared memory take extra wavefronts",
    severity="warning",
    metrics=(*_SHARED, *_SHARED_PRESSURE),
    check=_check_uncoalesced_shared,
    fix="Make {opcode} write whole 128-byte shared rows per 8 lanes: 16-byte cp.async with the "
        "same XOR swizzle on the write side as on the ldmatrix read side, or move the copy to "
        "TMA (cp.async.bulk.tensor with a 128B swizzle, sm_90a), which writes shared memory "
        "without per-lane wavefronts.",
    reference="NCU Profiling Guide: Source Counters (L1 Wavefronts Shared Excessive); PTX ISA: "
              "cp.async, cp.async.bulk.tensor",
    ncu=("UncoalescedSharedAccess",),
    thresholds=(("MIN_EXCESS", MIN_EXCESS), ("MIN_STALL_SHARE", MIN_STALL_SHARE)),
)


def _check_smem_bandwidth(inputs: Inputs) -> Hit | None:
    """Symptom: an FFMA kernel issues more than one shared load per two FMAs and waits on
    the shared pipe (MIO throttle, short scoreboard).
    Why: without a register block every FMA needs fresh operands from shared memory; the
    LSU/MIO pipe, not the FMA pipe, sets the pace, and the loads take issue slots.
    Fix: register blocking (each thread a TMxTN tile of C), wide shared loads.
    Estimate: 1 - (1 - w r) (1 - s r): w the MIO throttle + short scoreboard stall share,
    s the shared loads' share of issued instructions, r = 1 - 0.25 / loads per FMA the part
    of them an 8x8 register tile removes (the waits and the issue slots both go).
    Example:
        before: for (k) acc += As[k][ty] * Bs[k][tx];           // 2 LDS per FFMA
        after:  a[0..7] = As[k][8*ty..]; b[0..7] = Bs[k][8*tx..];
                for (i, j) acc[i][j] += a[i] * b[j];            // 16 LDS per 64 FFMA
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
    removed = 1 - SMEM_LOADS_PER_FMA_TARGET / per_fma
    share = loads / total_instructions(p)
    return Hit((
        Evidence("shared load instructions / FFMA", round(per_fma, 3), f"> {SMEM_LOADS_PER_FMA_MAX}"),
        Evidence("stall share of mio_throttle + short_scoreboard", round(wait, 3), f">= {MIN_STALL_SHARE}"),
        Evidence("shared loads / all issued instructions", round(share, 3), "-"),
    ), 1 - (1 - wait * removed) * (1 - share * removed))


SMEM_BANDWIDTH = Rule(
    code="PS113", tag="smem-bandwidth", title="Shared loads feed too few FMAs (no register blocking)",
    severity="warning",
    metrics=(*OPCODE_METRICS, *STALL_METRICS),
    check=_check_smem_bandwidth,
    fix="Block registers: let each thread accumulate a 4x4 (or 8x8) tile of C so one shared "
        "load of A feeds TN FMAs and one of B feeds TM, and read the fragments as float4 "
        "(LDS.128); watch the register count for spills (ptxas -v).",
    reference="CUDA C++ Best Practices Guide: Shared Memory in Matrix Multiplication; NCU "
              "Profiling Guide: Warp Stall Reasons (mio_throttle)",
    ncu=("CPIStall/Mio Throttle", "CPIStall/Short Scoreboard"),
    thresholds=(("SMEM_LOADS_PER_FMA_MAX", SMEM_LOADS_PER_FMA_MAX),
                ("SMEM_LOADS_PER_FMA_TARGET", SMEM_LOADS_PER_FMA_TARGET),
                ("MIN_STALL_SHARE", MIN_STALL_SHARE)),
)

# PS114: a wgmma kernel whose shared-memory traffic at the tensor peak exceeds the banks'
# rate runs at most SMEM_ROOF of that peak; it fires below WGMMA_SMEM_ROOF_MAX when the
# kernel runs within AT_ROOF of its roof (the roof, not latency, sets its pace).
WGMMA_SMEM_ROOF_MAX = 0.75
AT_ROOF = 0.85
# PS115: a roof at or above this share of the peak holds nothing back (the best wgmma
# kernels keep the tensor pipe 90% busy: hardware.TENSOR_PIPE_PRACTICAL).
SMEM_ROOF_BINDS = 0.95
WIDEST_WGMMA_N = 256
# Operand bytes per element and the peak each instruction family is held to.
_GMMA_KIND = {"HGMMA": (2, "tensor16"), "QGMMA": (1, "tensor8")}


class _Wgmma(NamedTuple):
    """One executed wgmma shape: its label, M x N x K, operand element bytes, and over all
    its executions the FLOPs, the shared operand bytes and the SM clocks of tensor work at
    its family's peak."""

    label: str
    rows: int
    cols: int
    depth: int
    elem: int
    flops: float
    operand_bytes: float
    clocks: float


def _smem_roof(operand: float, tma: float) -> float:
    """The share of the tensor peak shared memory lets through: its bytes per clock over
    what the operands and the incoming tiles need at that peak."""
    return min(1.0, SMEM_BYTES_PER_SM_CLOCK / (operand + tma))


def _incoming_bytes(inputs: Inputs, flops: float, elem: int) -> tuple[float, str]:
    """Bytes brought into shared memory over the kernel, and where the figure comes from:
    measured at the crossbar where the report holds it; else the larger of the run
    manifest's tile (A's arriving rows, AROWS, and B per k step) and L2's read count."""
    p = inputs.profile
    into, source = need(bytes_into_sms(p), f"{M_XBAR_IN_PCT} or {M_L2_READ_SECTORS}")
    tile = _manifest_tile(inputs)
    if source == L2_SOURCE and tile is not None:
        bm, bn, arows = tile
        into = max(into, (arows + bn) * elem / (2 * bm * bn) * flops)
        source = f"the manifest's BM x BN tile per k step, else {L2_SOURCE}"
    return into, source


def _manifest_tile(inputs: Inputs) -> tuple[int, int, int] | None:
    """(BM, BN, the rows of A that arrive) of the CTA tile where the run manifest names it
    (hgemm_small_m's AROWS: a thin M's tile pads the rest with zeros once)."""
    params = inputs.manifest.params if inputs.manifest is not None else {}
    if "BM" in params and "BN" in params:
        bm = int(params["BM"])
        return bm, int(params["BN"]), int(params.get("AROWS", bm))
    return None


def _check_wgmma_smem_roof(inputs: Inputs) -> Hit | None:
    """Symptom: a wgmma kernel's tensor math runs at (or near) the rate shared memory's
    bandwidth allows, and that rate is well under the tensor peak: its wgmma instructions
    are narrow (m64n64) or its tiles bring many bytes into shared memory per FLOP.
    Why: wgmma.m64nNk16 with both operands in shared memory reads (64 + N) x 16 elements
    for 64 x N x 16 x 2 FLOPs, and every byte the tiles bring in (TMA, cp.async) is written
    into the same banks, which serve 128 bytes per SM clock. At 4096 FLOP per clock (bf16)
    an n64 wgmma alone needs 128 B/clock, n128 96, n256 80; with a 128 x 64 tile's 24 KB per
    k tile landing beside it, shared memory caps the tensor pipe near 0.6 of its peak. (On
    the H200 the model is a little pessimistic: those tiles ran at 0.59 against a roof of
    0.57.)
    Fix: more columns per wgmma (m64n128 / m64n256) and fewer bytes in per FLOP (larger
    tiles, or a cluster that multicasts the shared operand); where the wider tile leaves
    SMs idle, split K (over the grid when a cluster cannot hold the splits).
    Estimate: 1 - roof / roof', roof' the same kernel's roof with wgmmas of twice the N (up
    to 256) at the same incoming bytes per FLOP: the tensor time a wider instruction saves.
    Example:
        before: HGMMA.64x64x16   128 + 96 B/clock at peak -> roof 0.57 (hgemm_small_m, 128x64 tiles)
        after:  HGMMA.64x128x16   96 + 64 B/clock at peak -> roof 0.80 (128x128 tiles, K split in two)
    Source: seed 000 §4 (wgmma from shared memory, tile shape); PTX ISA: wgmma.mma_async
    (shared-memory matrix descriptors); measured on the H200 (fused/README.md, GSPLIT: the
    128x64 tiles' tensor pipe 61% busy under ncu, 1.05 of cublas+gelu against 0.95 with
    128x128)."""
    roof = _smem_roof_state(inputs)
    if roof is None or roof.roof >= WGMMA_SMEM_ROOF_MAX or roof.achieved < AT_ROOF * roof.roof:
        return None
    d = roof.dominant
    wider = min(WIDEST_WGMMA_N, 2 * d.cols)
    if wider <= d.cols:
        return None
    # The dominant shape's operand bytes at twice its N, over its own FLOPs; the others as
    # they are.
    saved = d.flops * d.elem * (1 / d.cols - 1 / wider) / 2
    roof_wider = _smem_roof(roof.operand - saved / roof.clocks, roof.incoming)
    return Hit(roof.evidence(f"< {WGMMA_SMEM_ROOF_MAX}"), 1 - roof.roof / roof_wider,
               (("shape", d.label), ("roof", f"{roof.roof:.2f}"), ("wider", str(wider)),
                ("roof_wider", f"{roof_wider:.2f}")))


class _SmemRoof(NamedTuple):
    """A wgmma kernel against its shared-memory roof: the shape with the most FLOPs, the
    operand and incoming bytes per SM clock at the tensor peak (and where the incoming
    figure comes from), the roof, the tensor work's SM clocks, and the share achieved."""

    dominant: _Wgmma
    operand: float
    incoming: float
    source: str
    roof: float
    clocks: float
    achieved: float

    def evidence(self, roof_threshold: str) -> tuple[Evidence, ...]:
        d = self.dominant
        return (
            Evidence("wgmma shape (most FLOPs)", d.label, f"{(d.rows + d.cols) * d.depth * d.elem} "
                     f"B of shared operands per {d.rows * d.cols * d.depth * 2} FLOP"),
            Evidence("shared operand bytes per SM clock at the tensor peak", round(self.operand, 1),
                     "the wgmma shapes at their peak FLOP per clock"),
            Evidence("bytes into shared memory per SM clock at the peak", round(self.incoming, 1),
                     f"{self.source}: written into the same banks"),
            Evidence("shared-memory roof (share of the tensor peak)", round(self.roof, 3),
                     f"{SMEM_BYTES_PER_SM_CLOCK} B/clock / (operands + incoming); {roof_threshold}"),
            Evidence("achieved share of the tensor peak per elapsed cycle", round(self.achieved, 3),
                     f">= {AT_ROOF} x roof"),
        )


def _smem_roof_state(inputs: Inputs) -> _SmemRoof | None:
    """The kernel's wgmma work against the roof shared memory sets; None without wgmma."""
    p = inputs.profile
    need_opcodes(p)
    cc = p.identity.compute_capability or ""
    # Per wgmma shape: its FLOPs, its shared operand bytes, and its SM clocks of tensor work
    # at its own family's peak (a warpgroup instruction is counted once per warp: four per
    # wgmma, as in sass_flops), so HGMMA and QGMMA mix by time, not by FLOPs.
    shapes = []
    for op, n in p.opcodes.with_modifiers.items():
        w = wgmma_work(op, n)
        family_ = base_opcode(op)
        per = PEAK_FLOP_PER_SM_CLOCK.get(cc, {}).get(_GMMA_KIND.get(family_, (0, ""))[1])
        if w is None or n <= 0 or per is None:
            continue
        elem = _GMMA_KIND[family_][0]
        shapes.append(_Wgmma(op.split(".F32")[0], w.rows, w.cols, w.depth, elem, w.flops,
                             w.instructions * (w.rows + w.cols) * w.depth * elem, w.flops / per))
    if not shapes:
        return None
    cycles = need(p.identity.cycles, M_CYCLES)
    sms = need(p.identity.sm_count, "device__attribute_multiprocessor_count")
    clocks = sum(sh.clocks for sh in shapes)      # SM clocks of tensor work at the peak
    flops = sum(sh.flops for sh in shapes)
    if not cycles or not sms or not clocks:
        return None
    operand = sum(sh.operand_bytes for sh in shapes) / clocks   # B per SM clock at the peak
    dominant = max(shapes, key=lambda sh: sh.flops)
    incoming, source = _incoming_bytes(inputs, flops, dominant.elem)
    tma = incoming / clocks
    return _SmemRoof(dominant, operand, tma, source, _smem_roof(operand, tma), clocks,
                     clocks / (cycles * sms))


_WGMMA_SMEM_METRICS = (*OPCODE_METRICS, M_XBAR_IN_PCT, M_L1TEX_CYCLES, M_L2_READ_SECTORS,
                       M_CYCLES)
_WGMMA_SMEM_REFERENCE = ("PTX ISA: wgmma.mma_async (matrix descriptors in shared memory); CUDA "
                         "C++ Programming Guide: Shared Memory (banks)")

WGMMA_SMEM_ROOF = Rule(
    code="PS114", tag="smem-bandwidth",
    title="Shared memory caps the tensor pipe: narrow wgmma or too many bytes in per FLOP",
    severity="warning",
    metrics=_WGMMA_SMEM_METRICS,
    check=_check_wgmma_smem_roof,
    fix="Shared memory lets {shape} run at {roof} of the tensor peak at most. Give each wgmma "
        "more columns (m64n{wider}: roof {roof_wider}) and bring fewer bytes in per FLOP "
        "(larger tiles, or a cluster that multicasts the shared operand); if the wider tile "
        "leaves SMs idle, split K, over the grid where a cluster cannot hold the splits.",
    reference=_WGMMA_SMEM_REFERENCE,
    ncu=("HighPipeUtilization",),
    thresholds=(("WGMMA_SMEM_ROOF_MAX", WGMMA_SMEM_ROOF_MAX), ("AT_ROOF", AT_ROOF),
                ("SMEM_BYTES_PER_SM_CLOCK", SMEM_BYTES_PER_SM_CLOCK)),
)

def _check_at_smem_roof(inputs: Inputs) -> Hit | None:
    """Symptom: a wgmma kernel's tensor math runs at the rate shared memory's bandwidth
    allows (within 85% of it, or past it), where that roof lies between 0.75 and 0.95 of
    the tensor peak: PS114's model, above the share at which PS114 calls the roof a fault
    and below the 0.90 the best kernels keep the pipe busy.
    Why: it says what holds the kernel, which the headroom alone does not. m64n128 wgmmas
    with 128 x 256 tiles arriving need 96 + 48 B per SM clock at the peak, of the 128 the
    banks serve: a roof of 0.89, where cuBLAS's bf16 GEMM at 4096^3 runs (0.89 of the peak
    per elapsed cycle); hgemm_small_m's 128 x 128 pairs at M = 256, and cuBLAS's kernel
    there, run at the roof of 0.80 that 64 B per clock arriving leave.
    Fix: the roof is the wgmma shape's and the tile's: a wider wgmma (m64n256) or fewer
    bytes in per FLOP (larger tiles, multicast in a cluster) raises it, and only a kernel
    built so can pass it; whether that pays depends on what the wider tile costs elsewhere
    (at 256 x N, 128 x 256 pairs measured 3-12% slower than the 128 x 128 ones on the H200
    and an H100: fused/small-m-wide*.json), so this is information.
    Estimate: none: the roof is a property of the kernel's design, not a gap one change
    closes; PS114 estimates what a wider wgmma buys where the roof is low.
    Example:
        before: HGMMA.64x128x16 with 128 x 128 tiles at 256 x 8192^2: roof 0.80, runs 0.77
        after:  HGMMA.64x256x16 with 128 x 256 tiles: roof 1.0 (and fewer CTAs to fill the SMs)
    Source: seed 000 §4 (wgmma from shared memory, tile shape); PTX ISA: wgmma.mma_async."""
    roof = _smem_roof_state(inputs)
    if roof is None or not WGMMA_SMEM_ROOF_MAX <= roof.roof < SMEM_ROOF_BINDS:
        return None
    if roof.achieved < AT_ROOF * roof.roof:
        return None
    return Hit(roof.evidence(f">= {WGMMA_SMEM_ROOF_MAX} (PS114's below)"), None)


AT_SMEM_ROOF = Rule(
    code="PS115", tag="smem-bandwidth",
    title="The tensor pipe runs at the roof shared memory sets for its wgmma and tiles",
    severity="info",
    metrics=_WGMMA_SMEM_METRICS,
    check=_check_at_smem_roof,
    fix="Only a wider wgmma or fewer bytes in per FLOP (larger tiles, multicast) raises the "
        "roof the evidence gives; time such a change before adopting it.",
    reference=_WGMMA_SMEM_REFERENCE,
    thresholds=(("WGMMA_SMEM_ROOF_MAX", WGMMA_SMEM_ROOF_MAX), ("AT_ROOF", AT_ROOF),
                ("SMEM_ROOF_BINDS", SMEM_ROOF_BINDS),
                ("SMEM_BYTES_PER_SM_CLOCK", SMEM_BYTES_PER_SM_CLOCK)),
)

RULES = (UNCOALESCED_GLOBAL, SCALAR_LOADS, NO_DATA_REUSE, SMALL_TILE, STORE_INEFFICIENCY,
         BANK_CONFLICTS_LOADS, BANK_CONFLICTS_STORES, UNCOALESCED_SHARED, SMEM_BANDWIDTH,
         WGMMA_SMEM_ROOF, AT_SMEM_ROOF)
