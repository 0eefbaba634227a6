"""Memory-bound work judged by bandwidth: the DRAM roofline of the bytes it must move.

A decode GEMM (M of 16-64 against an 8192 x 8192 weight) or an elementwise epilogue does
few FLOPs per byte: its time is set by DRAM, and "low SM throughput" says nothing about
it. What says something is the bandwidth its compulsory bytes achieve against what DRAM
delivers in practice (a device-to-device copy reaches 0.89 of the peak on the H200), and,
where the stage's tensor maps are known, the shape of the pieces the stream is read in.
"""

from __future__ import annotations

from perfscope.hardware import DRAM_PRACTICAL_SHARE
from perfscope.metrics import M_DRAM_READ, M_DRAM_WRITE, M_DURATION, SECTOR_BYTES, SOL_METRICS
from perfscope.rules.bounds import dram_peak, fixed_time_ns, headroom, work_of
from perfscope.rules.facts import MIN_EXCESS, gemm_or_other, need_reads
from perfscope.rules.model import Evidence, Hit, Inputs, NotCollected, Rule, need

# -- thresholds --
# Below this share of its floor (the launch's fixed time, KERNEL_FIXED_NS, plus its bytes at
# the practical DRAM rate) there is bandwidth worth a finding. cuBLAS's decode GEMMs (nvjet,
# M = 16 and 64 against an 8192 x 8192 weight, 128-130 MiB) run at 0.94-0.98 of it on the
# H200 (tests/fixtures/external, the reference run's cublas+gelu group; 0.89-0.91 of the
# rate alone); the committed launches that fire are those that fired below 0.85 of the rate
# alone (hgemm_small_m with its 12-stage ring at 64 x 8192^2, 0.925, did not, and does not).
DRAM_SHARE_MIN = 0.92
# A transfer whose bytes at the practical DRAM rate take less than a launch's fixed time
# (KERNEL_FIXED_NS; 2 us where the chip's is unmeasured) is set by that time and its round
# trips, PS173's, not by bandwidth. PyTorch's layer norm of 2 MiB (8.2 us, 0.43 of its floor)
# would have a bandwidth finding without it, but so would cuBLAS's split-K reduction at
# 256 x 4096 x 14336 (2.46 us of bytes, 0.69 of its floor under ncu), which reads the
# partials its GEMM just wrote: cold, as ncu flushes the caches before each kernel, where a
# program finds them in L2.
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
    replays: those rules name the cause), and it runs at less than 92% of its floor: a
    launch's fixed time (PS173's) plus its compulsory bytes at what DRAM delivers in
    practice (cuBLAS's decode GEMMs run at 94-98% of it), where there are bytes enough for
    bandwidth to matter (at that rate, at least a launch's fixed time of them: a shorter
    transfer's time is PS173's fixed time and latency).
    Why: a memory-bound kernel is judged by bandwidth: too few bytes in flight per SM
    (few loads outstanding, a grid too small to cover the SMs, a split that leaves some
    SMs idle) leaves DRAM under-used; the math units' low throughput is no finding.
    Fix: more bytes in flight (16-byte loads, several loads per thread before first use, a
    TMA ring deep enough to cover DRAM's latency, but no deeper: past that, queued bytes only
    lengthen DRAM's queue), fewer dependent round trips (a normalisation that reads its row
    again after reducing it waits twice), longer runs of contiguous bytes per load, a grid that covers every
    SM (split-K for thin M), a short ramp and tail where the kernel lasts tens of
    microseconds (the first loads issued before any other set-up, the epilogue's operands
    loaded before the stream), and fused epilogues so intermediates skip the round trip.
    The evidence gives the shared memory per SM, the most a TMA ring can hold in flight.
    Estimate: 1 - (F + bytes / (0.89 x DRAM peak)) / t: the time beyond the floor, which
    more bytes in flight could save (the compulsory bytes from the manifest's shape, else
    the DRAM bytes measured). The launch's fixed time F (2.5 us on sm_90) is no bandwidth
    and is left to PS173: at 64 x 4096^2 (a 32 MiB weight, 13.5 us) it is 19% of the
    kernel, which the rate alone counted here.
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
    w = room.work
    bw = need(dram_peak(p), f"{M_DRAM_READ} and its % of peak")
    t = room.t_ns
    # The headroom's DRAM time and floor (it bounds by DRAM here: the bytes take longer).
    t_bytes = room.t_bytes_practical_ns
    fixed = fixed_time_ns(p)
    if t_bytes < (fixed or DRAM_MIN_STREAM_NS):
        return None     # too few bytes for bandwidth to set the time
    fixed = fixed or 0.0     # unmeasured for the chip: the floor is its bytes
    share = need(room.t_floor_ns, "the work's bytes and the DRAM peak") / t
    if share >= DRAM_SHARE_MIN:
        return None
    how = gemm_or_other(p, _GEMM_HOW, _STREAM_HOW)
    evidence = [
        Evidence(f"bytes / time ({w.bytes_source}) / practical DRAM rate",
                 round(t_bytes / t, 3), f"{DRAM_PRACTICAL_SHARE} x {bw / 1e12:.2f} TB/s"),
        Evidence("(launch's fixed time + bytes at that rate) / time", round(share, 3),
                 f"< {DRAM_SHARE_MIN}; fixed time {fixed / 1e3:.1f} us"
                 + ("" if fixed else " (not measured for this chip)")),
        Evidence(SOL_METRICS["dram_pct"], round(p.sol.dram_pct or 0.0, 1), "-"),
    ]
    per_sm = _shared_bytes_per_sm(p)
    if per_sm is not None:
        evidence.append(Evidence("shared memory per SM, the most a TMA ring holds in flight "
                                 "(blocks resident x dynamic bytes per block)", per_sm, "-"))
    return Hit(tuple(evidence), max(0.0, 1 - share), fix_args=(("how", how),))


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
               "first is used, fewer dependent round trips to memory (a reduction's operands kept "
               "in registers or shared memory for the pass that uses them, not read again), and "
               "a grid that covers every SM")
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


# -- the launch's fixed time (PS173) --
# The fixed time is worth a finding when it is at least this share of the kernel's: at a
# 32 MiB decode weight (13 us on the H200) it is 19%; at 128 MiB (35 us) 7%, left out.
FIXED_SHARE_MIN = 0.15


def _check_fixed_time(inputs: Inputs) -> Hit | None:
    """Symptom: the kernel is so short that a launch's fixed time (2.5 us under ncu on
    sm_90: the shortest a kernel that reads DRAM lasts) is 15% or more of its duration,
    and more than its work needs: the larger of its FLOPs at the math peak and its bytes
    at the practical DRAM rate leaves that much of the duration free.
    Why: every launch pays to start its CTAs, to wait one round trip to DRAM before its
    first bytes arrive, and to drain at its end (on the H200 an empty kernel lasts 1.5 us
    under ncu, a read of 256 KiB 2.5 us, and a read stream's line through 64 MiB to 1 GiB
    crosses zero bytes at 4.4 us: benchmarks/kernel_floor.py). A kernel of 1-8 MiB moves its
    bytes in a fraction of that, so no change inside it (more bytes in flight, wider loads)
    shortens what it costs: cublas+gelu's bias pass at M = 64 reads and writes 1 MiB, 0.5 us
    at the rate, in 2.7 us.
    Fix: pay the fixed time once for several kernels: fuse an elementwise or normalisation
    pass into the kernel that produces its input (the GEMM's epilogue: hgemm_fused_bias_act)
    or the one that reads its output; launch GEMMs that read the same input as one (Q, K and
    V; gate and up projections, their weights side by side); and where launches must stay
    apart, let each start while the one before drains (programmatic dependent launch, inside
    a CUDA graph).
    Estimate: min(F, t - t_work) / t, F the fixed time and t_work the larger of the FLOPs at
    the peak and the bytes at the practical DRAM rate: what merging the launch into another
    saves at least (the bytes' round trip through DRAM that fusion also saves is not
    counted). It lies outside PS170's bandwidth gap, which starts at this floor, and adds to
    it: 0.21 and 0.19 of hgemm_small_m at 64 x 4096^2.
    Example:
        before: cuBLAS GEMM, then a bias + GELU pass of 1 MiB: 2.7 us, 0.5 us of it bytes
        after:  the bias and GELU in the GEMM's epilogue (hgemm_fused_bias_act): no launch
    Source: seed 000 §7.1 (fused epilogues, inference shapes); CUDA C++ Programming Guide:
    Programmatic Dependent Launch and Synchronization, CUDA Graphs; benchmarks/kernel_floor.py."""
    p = inputs.profile
    fixed = fixed_time_ns(p)
    if fixed is None:
        raise NotCollected("a launch's fixed time on this chip (measured for compute "
                           "capability 9.0: hardware.KERNEL_FIXED_NS)")
    t = need(p.sol.duration_ns, M_DURATION)
    room = need(headroom(inputs), "the kernel's roofline (its FLOPs and bytes)")
    parts = []
    if room.t_math_ns is not None:
        parts.append((room.t_math_ns, "FLOPs at the math peak"))
    if room.t_bytes_ns is not None:
        parts.append((room.t_bytes_practical_ns, "bytes at the practical DRAM rate"))
    t_work, what = max(parts)       # headroom() has one at least
    share = min(fixed, t - t_work) / t
    if share < FIXED_SHARE_MIN:
        return None
    how = gemm_or_other(p, _GEMM_MERGE, _PASS_MERGE)
    return Hit((
        Evidence(f"kernel duration ({M_DURATION}, us)", round(t / 1e3, 2), "-"),
        Evidence(f"its work: {what} (us)", round(t_work / 1e3, 2), f"{room.work.bytes_source}"
                 if what.startswith("bytes") else f"{room.work.flops_source}"),
        Evidence("a launch's fixed time on this chip (us)", round(fixed / 1e3, 2),
                 "the shortest kernel that reads DRAM, under ncu"),
        Evidence("min(fixed time, duration - work) / duration", round(share, 3),
                 f">= {FIXED_SHARE_MIN}"),
    ), share, fix_args=(("how", how),))


_PASS_MERGE = ("fuse it into the kernel that produces its input (a GEMM's epilogue) or the one "
               "that reads its output")
_GEMM_MERGE = ("launch it as one with the GEMMs that read the same input (Q, K and V; gate and "
               "up projections, their weights side by side), or fuse the pass after it into "
               "its epilogue")


FIXED_TIME = Rule(
    code="PS173", tag="fixed-time", title="The kernel is short: a launch's fixed time is much of it",
    severity="optimization",
    metrics=(M_DURATION, M_DRAM_READ, M_DRAM_WRITE),
    check=_check_fixed_time,
    fix="Pay the launch's fixed time once for more work: {how}; where launches stay apart, "
        "let each start while the one before drains (programmatic dependent launch in a "
        "CUDA graph).",
    reference="CUDA C++ Programming Guide: Programmatic Dependent Launch and Synchronization; "
              "CUDA Graphs",
    thresholds=(("FIXED_SHARE_MIN", FIXED_SHARE_MIN),),
)


# -- short runs (PS172) --
# A box row of at most this many contiguous bytes is a short run. Measured at 128 bytes (a
# 64-column box of a 16-bit row-major weight, the widest the 128-byte swizzle allows); two
# such boxes side by side read 256, which no measurement separates from 128 yet.
SHORT_RUN_BYTES = 256
# An operand with less than this share of the work's compulsory bytes is not a stream: at
# M = 16, A's 16 rows are 0.2% of them, read by every CTA and served by L2.
STREAMED_SHARE = 0.1
# The operands streamed in short runs must carry at least this share of the bytes.
SHORT_RUN_SHARE = 0.5
# What short runs cost a stream, as a share of it: the saving of the step that packs the
# weight (hgemm_small_m -> hgemm_small_m_packed, B's 64 x 64 boxes as 8 KB contiguous pieces)
# over the stream's share of the kernel's time. Measured on the H200 on 2026-12-05 head to
# head at ten M <= 64 shapes and dtypes (probes/packed-vs-small-m.jsonl, kernel_ab, 7
# rounds): savings of -0.1% to 4.0%, per unit of stream 0.006-0.047, median 0.012, mean
# 0.019 (the stream's share taken as in the committed reports: 0.88 at the 112-128 MiB
# weights, 0.58 at 32 MiB); and in bench-fused.json's rounds 1.0%, 0.6% and -0.4% at the three shapes with
# reports. 0.015 lies between the median and the mean. The first figure, 0.05, came from one
# probe kernel (probes/small-m-bulk-b.json, 2026-12-04: each k tile's 8 KB read as one
# piece, 1.031-1.063x at M = 16) and over-stated the real step three- to fivefold.
SHORT_RUN_LOSS = 0.015


def _short_runs(inputs: Inputs, work_bytes: float):
    """The operands the run streamed in short runs, and their share of the compulsory bytes."""
    reads = need_reads(inputs)
    short = tuple(r for r in reads if r.run_bytes <= SHORT_RUN_BYTES < r.row_bytes
                  and r.bytes >= STREAMED_SHARE * work_bytes)
    # At most all of them: a program's map may span more than the work reads of it.
    return short, min(1.0, sum(r.bytes for r in short) / work_bytes)


def _check_short_runs(inputs: Inputs) -> Hit | None:
    """Symptom: memory-bound work (its bytes at the DRAM peak take longer than its FLOPs at
    the math peak) reads the operands that carry most of its bytes in TMA boxes whose rows
    are short runs (at most 256 contiguous bytes, the next row far away), and its bytes move
    below the practical DRAM rate.
    Why: a box of 64 rows of 128 bytes, 16 KB apart, is 64 separate pieces of DRAM, and the
    CTAs that read the neighbouring columns of the same rows reach them at other times; read
    as one contiguous piece, the same bytes streamed faster (measured, not modelled: 5% of
    hgemm_small_m's stream phase on the H200). The rate alone (PS170) cannot tell this apart
    from a ring too shallow; the boxes the stage was launched with can.
    Fix: store the operand so each box is contiguous: a weight does not change between calls,
    so pack it once when the model is loaded into strips one box wide, all k rows of a strip
    after one another (hgemm_small_m_packed: each 64 x 64 box is 8 KB of contiguous memory);
    where the layout is fixed, a tile wider along the contiguous dimension makes longer runs.
    Estimate: the measured loss (1.5% of the stream, SHORT_RUN_LOSS: what packing the weight
    saved at ten decode shapes, 0-4% of the kernel's time) times the short-run operands'
    share of the compulsory bytes times the stream's share of the kernel's time (its bytes
    at the practical DRAM rate over its duration), never more than the gap to that rate: 1.3%
    at 16 x 8192^2, where the step saved 0.8-1.0%. So the finding is information, not a
    warning: a one-time repack buys about a percent, more at some shapes (4.0% at
    16 x 4096 x 14336). A program's kernel (its maps recorded by `profile --tensor-maps`)
    gets the same transfer, which no measurement of such a kernel has checked yet.
    Example:
        before: hgemm_small_m, 16 x 8192^2: B in 64 x 128-byte boxes, rows 16 KB apart
        after:  hgemm_small_m_packed: B in 64-column strips, 8 KB boxes (1.008-1.010x)
    Source: seed 000 §7.1 (inference shapes); CUDA Driver API: cuTensorMapEncodeTiled;
    reports/reference/h200/probes/README.md ("the decode stream loses on its access
    pattern")."""
    room = need(headroom(inputs), "the kernel's roofline (its FLOPs and bytes)")
    need(room.t_math_ns, "the work's FLOPs (run manifest, or MMA/FFMA counts in the SASS)")
    need(room.t_bytes_ns, "the work's bytes (run manifest, or the DRAM bytes measured)")
    if room.t_bytes_ns <= room.t_math_ns:
        return None
    w = work_of(inputs)
    need(w.bytes, "the work's bytes (run manifest, or the DRAM bytes measured)")
    short, share = _short_runs(inputs, w.bytes)
    if share < SHORT_RUN_SHARE:
        return None
    p = inputs.profile
    bw = need(dram_peak(p), f"{M_DRAM_READ} and its % of peak")
    t = need(p.sol.duration_ns, "gpu__time_duration.sum")
    # The bytes' time at the practical rate over the kernel's: the stream's share of its time.
    achieved = w.bytes / (DRAM_PRACTICAL_SHARE * bw) / (t * 1e-9)
    if achieved >= 1.0:
        return None
    evidence = [Evidence(f"{r.operand}'s contiguous bytes per box row ({r.describe()})",
                         r.run_bytes, f"<= {SHORT_RUN_BYTES}") for r in short]
    evidence += [
        Evidence("short-run operands' share of the compulsory bytes", round(share, 3),
                 f">= {SHORT_RUN_SHARE}"),
        Evidence(f"bytes / time ({w.bytes_source}) / practical DRAM rate", round(achieved, 3),
                 f"< 1 of {DRAM_PRACTICAL_SHARE} x {bw / 1e12:.2f} TB/s"),
    ]
    gain = min(1 - achieved, SHORT_RUN_LOSS * share * achieved)
    return Hit(tuple(evidence), gain, fix_args=(("what", "; ".join(r.describe() for r in short)),))


SHORT_RUNS = Rule(
    code="PS172", tag="short-runs", title="The stream reads its operand in short runs far apart",
    severity="optimization",
    metrics=(M_DRAM_READ, SOL_METRICS["dram_pct"]),
    check=_check_short_runs,
    fix="Read each box as one contiguous piece ({what}): store the operand in strips one box "
        "wide, a strip's rows one after another (a weight once, when the model is loaded: "
        "hgemm_small_m_packed), or widen the tile along the contiguous dimension where the "
        "layout is fixed.",
    reference="CUDA Driver API: cuTensorMapEncodeTiled; CUDA C++ Programming Guide: Tensor "
              "Memory Access",
    thresholds=(("SHORT_RUN_BYTES", SHORT_RUN_BYTES), ("STREAMED_SHARE", STREAMED_SHARE),
                ("SHORT_RUN_SHARE", SHORT_RUN_SHARE), ("SHORT_RUN_LOSS", SHORT_RUN_LOSS)),
)

RULES = (DRAM_BOUND, SHORT_RUNS, FIXED_TIME)
