"""Memory-bound work judged by bandwidth: the DRAM roofline of the bytes it must move.

A decode GEMM (M of 16-64 against an 8192 x 8192 weight) or an elementwise epilogue does
few FLOPs per byte: its time is set by DRAM, and "low SM throughput" says nothing about
it. What says something is the bandwidth its compulsory bytes achieve against what DRAM
delivers in practice (a device-to-device copy reaches 0.89 of the peak on the H200).
"""

from __future__ import annotations

from perfscope.hardware import DRAM_PRACTICAL_SHARE
from perfscope.metrics import M_DRAM_READ, M_DRAM_WRITE, SECTOR_BYTES, SOL_METRICS
from perfscope.rules.bounds import dram_peak, headroom, work_of
from perfscope.rules.facts import MIN_EXCESS, gemm_or_other
from perfscope.rules.model import Evidence, Hit, Inputs, Rule, need

# -- thresholds --
# Below this share of the practical DRAM rate there is bandwidth worth a finding. cuBLAS's
# decode GEMMs (nvjet, M = 16 and 64 against an 8192 x 8192 weight, 128-130 MiB) reach
# 0.89-0.91 of it on the H200 (tests/fixtures/external, the reference run's cublas+gelu
# group); a smaller transfer pays more for its ramp-up and last wave, which this margin
# leaves to it.
DRAM_SHARE_MIN = 0.85
# Below this time for its bytes at the practical DRAM rate, a transfer is set by latency
# (about 1 us per DRAM round trip under load on the H200) and the launch's ramp, not by
# bandwidth: cublas+gelu's elementwise pass at M = 64 moves 1 MiB (0.25 us at the rate)
# in 2.7 us, which no amount of bytes in flight would change.
DRAM_MIN_STREAM_NS = 2000.0


def _traffic_has_a_cause(p) -> bool:
    """Excess global sectors, spills or shared-memory replays: the rules that name the
    cause own the lost bandwidth, and "more bytes in flight" would be the wrong advice."""
    g, s = p.memory.global_, p.memory.shared
    need(g.actual, "global sectors (SourceCounters)")
    need(s.actual, "shared wavefronts (SourceCounters)")
    if g.excess is not None and g.ideal and g.excess / g.ideal >= MIN_EXCESS:
        return True
    if s.excess is not None and s.ideal and s.excess / s.ideal >= MIN_EXCESS:
        return True
    local = p.memory.local_bytes or 0.0
    return bool(g.actual) and local / SECTOR_BYTES >= MIN_EXCESS * g.actual


def _check_dram_bound(inputs: Inputs) -> Hit | None:
    """Symptom: the work is memory-bound (its bytes at the DRAM peak take longer than its
    FLOPs at the math peak), its traffic is clean (no excess sectors, spills or shared
    replays: those rules name the cause), and its compulsory bytes move at less than 85%
    of what DRAM delivers in practice (cuBLAS's decode GEMMs reach 89-91%), where there
    are bytes enough for bandwidth to matter (2 us of them at that rate).
    Why: a memory-bound kernel is judged by bandwidth: too few bytes in flight per SM
    (few loads outstanding, a grid too small to cover the SMs, a split that leaves some
    SMs idle) leaves DRAM under-used; the math units' low throughput is no finding.
    Fix: more bytes in flight (16-byte loads, several loads per thread before first use, a
    TMA ring deep enough to cover DRAM's latency, but no deeper: past that, queued bytes only
    lengthen DRAM's queue), longer runs of contiguous bytes per load, a grid that covers every
    SM (split-K for thin M), a short ramp and tail where the kernel lasts tens of
    microseconds (the first loads issued before any other set-up, the epilogue's operands
    loaded before the stream), and fused epilogues so intermediates skip the round trip.
    The evidence gives the shared memory per SM, the most a TMA ring can hold in flight.
    Estimate: 1 - achieved bytes/s / (0.89 x DRAM peak), the time the same bytes need at the
    practical DRAM rate (the compulsory bytes from the manifest's shape, else the DRAM
    bytes measured).
    Example:
        before: y = x @ W (M = 16): 128 CTAs, 2 TMA stages: 0.64 of copy bandwidth
        after:  split-K over all 132 SMs, 6 stages in flight: >= 0.90 of copy bandwidth
    Source: seed 000 §7.1 (inference shapes); NCU Profiling Guide: Memory Workload Analysis
    (DRAM throughput); benchmarks/copy_bandwidth.py."""
    p = inputs.profile
    room = need(headroom(inputs), "the kernel's roofline (its FLOPs and bytes)")
    need(room.t_math_ns, "the work's FLOPs (run manifest, or MMA/FFMA counts in the SASS)")
    need(room.t_bytes_ns, "the work's bytes (run manifest, or the DRAM bytes measured)")
    if room.t_bytes_ns <= room.t_math_ns:
        return None
    if _traffic_has_a_cause(p):
        return None
    w = work_of(inputs)
    bw = need(dram_peak(p), f"{M_DRAM_READ} and its % of peak")
    t = need(p.sol.duration_ns, "gpu__time_duration.sum")
    if not w.bytes:
        return None
    if w.bytes / (DRAM_PRACTICAL_SHARE * bw) * 1e9 < DRAM_MIN_STREAM_NS:
        return None     # too few bytes for bandwidth to set the time
    achieved = w.bytes / (t * 1e-9) / (DRAM_PRACTICAL_SHARE * bw)
    if achieved >= DRAM_SHARE_MIN:
        return None
    how = gemm_or_other(p, _GEMM_HOW, _STREAM_HOW)
    evidence = [
        Evidence(f"bytes / time ({w.bytes_source}) / practical DRAM rate", round(achieved, 3),
                 f"< {DRAM_SHARE_MIN} of {DRAM_PRACTICAL_SHARE} x {bw / 1e12:.2f} TB/s"),
        Evidence(SOL_METRICS["dram_pct"], round(p.sol.dram_pct or 0.0, 1), "-"),
    ]
    per_sm = _shared_bytes_per_sm(p)
    if per_sm is not None:
        evidence.append(Evidence("shared memory per SM, the most a TMA ring holds in flight "
                                 "(blocks resident x dynamic bytes per block)", per_sm, "-"))
    return Hit(tuple(evidence), max(0.0, 1 - achieved), fix_args=(("how", how),))


def _shared_bytes_per_sm(p) -> int | None:
    """Dynamic shared memory per SM of a kernel that loads by TMA: bytes per block times the
    blocks an SM holds (the grid's share of the SMs, at most what occupancy allows); None
    where there is no TMA or the launch's figures were not collected."""
    ln, sms = p.launch, p.identity.sm_count
    if not (p.opcodes.has("tma") and ln.shared_dynamic_bytes and ln.grid_size and sms):
        return None
    blocks = -(-ln.grid_size // sms)
    limit = min(ln.occupancy_limits.values()) if ln.occupancy_limits else None
    if limit:
        blocks = min(blocks, int(limit))
    return int(ln.shared_dynamic_bytes * max(blocks, 1))


_STREAM_HOW = ("16-byte vector loads or TMA boxes, several outstanding loads per thread before the "
               "first is used, and a grid that covers every SM")
_GEMM_HOW = ("a TMA ring deep enough to cover DRAM's latency and no deeper (hgemm_small_m's "
             "12-stage ring, 96 KB of B per SM, measured 4% slower than its 8-stage one: "
             "queued bytes past the latency only lengthen DRAM's queue), longer contiguous runs "
             "per load (boxes wide along the weight's contiguous dimension), a grid over every "
             "SM (split-K for thin M), a short ramp and tail (the first ring of loads issued "
             "before anything else, the epilogue's operands in registers before the stream: "
             "in hgemm_small_m these saved 2-7% of a 15-55 us kernel), and the elementwise "
             "work that follows fused into the epilogue so its bytes never make a round trip")


DRAM_BOUND = Rule(
    code="PS170", tag="dram-bound", title="Memory-bound work moves its bytes below the DRAM rate",
    severity="warning",
    metrics=(M_DRAM_READ, M_DRAM_WRITE, "dram__bytes_read.sum.pct_of_peak_sustained_elapsed",
             SOL_METRICS["dram_pct"]),
    check=_check_dram_bound,
    fix="Reach the DRAM rate: {how}.",
    reference="NCU Profiling Guide: Memory Workload Analysis (DRAM throughput); CUDA C++ Best "
              "Practices Guide: Memory Optimizations",
    thresholds=(("DRAM_SHARE_MIN", DRAM_SHARE_MIN), ("DRAM_PRACTICAL_SHARE", DRAM_PRACTICAL_SHARE)),
)

RULES = (DRAM_BOUND,)
