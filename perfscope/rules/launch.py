"""Shape and launch: wave quantisation, grids too small for the chip, tiles that overhang.

Performance that swings when the shape changes has four measurable causes: the last
wave of CTAs leaves SMs idle, a grid of fewer CTAs than SMs leaves some idle all along, the
CTAs of a one-wave (persistent) grid get unequal shares of the tiles, and edge tiles
compute on padding.
"""

from __future__ import annotations

import math

from perfscope.manifest import RunManifest
from perfscope.metrics import (
    M_GRID_SIZE,
    M_SM_ACTIVE_AVG,
    M_SM_ACTIVE_MAX,
    M_SM_ACTIVE_MIN,
    M_SM_COUNT,
    M_WAVES,
)
from perfscope.rules.bounds import headroom
from perfscope.rules.facts import gemm_or_other, tail_idle
from perfscope.rules.model import Evidence, Hit, Inputs, NotCollected, Rule, need

# -- thresholds --
# Idle SM time in the last wave above this share of the launch.
TAIL_IDLE_MIN = 0.10
# A grid under this share of one wave, and of CTAs under this share of the SM count,
# leaves SMs idle for the whole launch.
SMALL_GRID_MAX = 0.90
# A launch of this many threads or fewer in all has no parallel work to give other SMs (one
# warp's lanes): a setup kernel, such as the one torch._grouped_mm launches before its GEMM
# (1 CTA of 8 threads, 3.0 us against a 2.1 us empty launch), whose cost is its launch
# (PS173's), not its grid.
SMALL_WORK_THREADS = 32
# Within one wave: SM time idle while the busiest SM works, above this share of it.
SM_IMBALANCE_MIN = 0.03
# Exactly one wave: a CTA on every SM slot at once (a persistent grid), to this tolerance.
ONE_WAVE_TOLERANCE = 1e-6
# What a CTA pays for the cut pieces of a shared last round beyond their own k iterations,
# in k tiles of math: their fp32 partials written and read, and the wait for them
# (hgemm_tma_wgmma_streamk on the H200, the first tail split's spares: about 6).
STREAMK_PIECE_KTILES = 6
# Padding computed by edge tiles above this share of the tiles' work.
TILE_WASTE_MIN = 0.05
# Manifest parameter names that give a stage's CTA tile (BM x BN, or a square TILE).
TILE_PARAMS = (("BM", "BN"), ("TILE", "TILE"))


def _check_tail(inputs: Inputs) -> Hit | None:
    """Symptom: the grid is one wave or more of CTAs but not a whole number of waves: the
    last, partial wave leaves SMs idle.
    Why: with equal CTA times the launch takes ceil(waves) wave times for waves of work;
    a shape change that adds a sliver of a wave costs a whole one.
    Fix: tile size, split-K/stream-K or a persistent grid matched to the CTA slots.
    Not where memory-bound work runs at its floor (a launch's fixed time plus its bytes at
    the practical DRAM rate): the last wave's CTAs keep DRAM as busy as a full wave's, and
    the idle SMs cost nothing (perfscope's read stream of 1 GiB on the H200, 1.33 waves of
    3 CTAs per SM, at 0.92 of the DRAM peak: past its floor).
    Estimate: 1 - waves / ceil(waves), the idle share of SM time; for memory-bound work no
    more than its gap to that floor, 1 - floor / t.
    Example:
        before: grid = ceil(M/128) * ceil(N/128) = 1056 CTAs   // 4.0 + 0.0 waves of 264
        after:  grid = #SMs; persistent CTAs loop over the 1056 tiles
    Source: seed 000 §6.3 row 3, §5.1; NCU Profiling Guide: Launch Statistics (waves per SM,
    tail effect)."""
    p = inputs.profile
    waves = need(p.launch.waves_per_sm, M_WAVES)
    if waves < 1:
        return None     # a grid of less than one wave is PS152's
    idle = tail_idle(waves)
    if idle < TAIL_IDLE_MIN:
        return None
    grid = p.launch.grid_size
    slots = round(grid / waves) if grid and waves else None
    ev = [Evidence(M_WAVES, round(waves, 3), "whole waves"),
          Evidence("idle share of the last wave (1 - waves / ceil(waves))", round(idle, 3),
                   f">= {TAIL_IDLE_MIN}")]
    gap = _floor_gap(inputs, ev, TAIL_IDLE_MIN)
    if gap is not None and gap < TAIL_IDLE_MIN:
        return None     # DRAM stays busy through the last wave: its floor says so
    if inputs.manifest is not None and inputs.manifest.shape_known:
        ev.append(Evidence("problem shape (run manifest)", inputs.manifest.shape, "-"))
    # The engine holds the idle share to memory-bound work's gap to its floor.
    return Hit(tuple(ev), idle, (("slots", str(slots) if slots else "the CTA slots"),))


TAIL = Rule(
    code="PS150", tag="tail-effect", title="The last wave of CTAs leaves SMs idle",
    severity="optimization",
    metrics=(M_WAVES, M_GRID_SIZE),
    check=_check_tail,
    fix="Make the CTA count a multiple of the {slots} CTAs one wave holds: pick the tile size per "
        "shape (a configuration search), split K (split-K / stream-K) for small grids, or launch "
        "a persistent grid of exactly one wave that loops over tiles.",
    reference="NCU Profiling Guide: Launch Statistics (waves per SM, tail effect)",
    ncu=("LaunchConfiguration/Tail",),
    thresholds=(("TAIL_IDLE_MIN", TAIL_IDLE_MIN),),
)


def _floor_gap(inputs: Inputs, ev: list[Evidence], least: float) -> float | None:
    """Memory-bound work's gap to its floor (a launch's fixed time plus its bytes at the
    practical DRAM rate: Headroom.floor_fraction, the gap the engine caps every finding's
    estimate at), put in the evidence; None for other work. Idle SMs cost such work only
    what keeps DRAM from that floor: below `least` the rule is silent."""
    room = headroom(inputs)
    gap = room.floor_fraction if room is not None else None
    if gap is None:
        return None
    ev.append(Evidence("memory-bound: 1 - (fixed time + bytes at the practical DRAM rate) / "
                       "duration, the most idle SMs cost it", round(gap, 3), f"> {least}"))
    return gap


def _check_small_grid(inputs: Inputs) -> Hit | None:
    """Symptom: the grid has fewer CTAs than the GPU has SMs: some SMs get no CTA at all
    for the whole launch (an inference shape with few output tiles and no split-K, or a
    small elementwise grid).
    Why: a GEMM with M = 16..64 against an 8192 x 8192 weight has few M x N tiles; unless K
    is split across CTAs, the idle SMs cannot help stream the weight. A grid of more CTAs
    than SMs under one wave of *slots* (several CTAs fit per SM) leaves no SM idle: that is
    occupancy, not this.
    Fix: split-K or stream-K so every SM gets work, or a smaller N tile; for a kernel that
    is no GEMM, more and smaller CTAs (at least one per SM).
    Not for a launch of one warp's threads or fewer in all (SMALL_WORK_THREADS): it has no
    parallel work to spread, and its launch is what it costs (PS173).
    Estimate: 1 - CTAs / SMs, the share of SMs without a CTA (all CTAs equal, each SM's
    time set by its own CTA); for memory-bound work no more than its gap to its floor (a
    launch's fixed time plus its bytes at the practical DRAM rate): hgemm_small_m's 112
    CTAs at 16 x 14336 x 4096 stream at 0.94 of it, so 0.06, where the idle SMs alone said
    0.15.
    Example:
        before: grid = ceil(N/256) = 32 CTAs on 132 SMs
        after:  grid = 32 x 4 (split K in 4, a reduction of the fp32 partials)
    Source: seed 000 §7.1 (inference shapes); NCU Profiling Guide: Launch Statistics."""
    p = inputs.profile
    waves = need(p.launch.waves_per_sm, M_WAVES)
    if waves >= SMALL_GRID_MAX:
        return None
    ctas = need(p.launch.grid_size, M_GRID_SIZE)
    sms = need(p.identity.sm_count, M_SM_COUNT)
    if not sms or ctas >= SMALL_GRID_MAX * sms:
        return None     # every SM has a CTA: fewer warps per SM is occupancy, not idle SMs
    block = p.identity.block
    if block and ctas * math.prod(block) <= SMALL_WORK_THREADS:
        return None     # a warp's work or less: nothing to spread over more SMs
    how = gemm_or_other(p, SMALL_GRID_GEMM, SMALL_GRID_OTHER)
    ev = [Evidence(M_GRID_SIZE, ctas, f"< {SMALL_GRID_MAX} x {sms} SMs ({M_SM_COUNT})"),
          Evidence(M_WAVES, round(waves, 3), f"< {SMALL_GRID_MAX}")]
    gap = _floor_gap(inputs, ev, 0)
    if gap is not None and gap <= 0:
        return None     # the CTAs it has keep DRAM at its floor
    # The engine holds the idle share to memory-bound work's gap to its floor.
    return Hit(tuple(ev), 1 - ctas / sms, fix_args=(("how", how),))


SMALL_GRID_GEMM = ("split K across CTAs (split-K with an fp32 reduction, or stream-K), or use a "
                   "smaller N tile so the grid covers all the SMs")
SMALL_GRID_OTHER = ("launch at least one CTA per SM: more, smaller CTAs (a grid-stride loop over a "
                    "grid of a multiple of the SM count)")

SMALL_GRID = Rule(
    code="PS152", tag="small-grid", title="The grid has fewer CTAs than SMs: SMs stay idle",
    severity="warning",
    metrics=(M_WAVES, M_GRID_SIZE, M_SM_COUNT),
    check=_check_small_grid,
    fix="Give every SM work: {how}.",
    reference="NCU Profiling Guide: Launch Statistics (waves per SM)",
    thresholds=(("SMALL_GRID_MAX", SMALL_GRID_MAX), ("SMALL_WORK_THREADS", SMALL_WORK_THREADS)),
)


def _check_uneven_sms(inputs: Inputs) -> Hit | None:
    """Symptom: the grid is one wave (a persistent grid: one CTA per SM looping over the
    tiles), yet the SMs are active for unequal times: the average SM idles for part of the
    time the busiest one works.
    Why: T tiles on P persistent CTAs give ceil(T/P) tiles to some CTAs and floor(T/P) to
    the rest (512 tiles of 128 x 256 on 132 CTAs: 3.88 rounds, 16 CTAs idle for the whole
    last round); the launch lasts as long as its busiest SM. PS150 counts the same idle for
    grids of several waves, and a grid under one wave leaves whole SMs without a CTA (PS152):
    this rule reads only grids of exactly one wave, where every SM has work.
    Fix: split the last, partial round of tiles by k iterations across all CTAs (stream-K),
    or a tile shape whose tile count is a multiple of the CTA count, or, where the clock sits
    at the power cap (PS171), launch the fewest CTAs that take the tiles in the same rounds
    (ceil(T / ceil(T/P))): no CTA gets less work, but the SMs then idle for the whole launch,
    and the others run at the clock their own power allows instead of the full chip's (512
    tiles on 128 CTAs instead of 132: on an H100 the same cycles at a 0.7-1.3% higher clock,
    1.008-1.016x faster; on the H200 1.001-1.006x, hgemm_tma_wgmma_balanced's step, which
    the idle share, 0.031, overstated: it counts idle cycles and the grid buys clock; see
    reports/reference/h200/probes/README.md). Where the run manifest
    gives the tile, the finding says how finely: r tiles on P CTAs cut into fewer than
    ceil(P / (P - r)) equal pieces each, or shared within clusters of fewer CTAs, leave some
    CTA a whole tile (split_pieces: 9 at 4096^3 in 128 x 256 tiles on 132 CTAs, 3 at
    8192^3), so halves and 2-CTA pairs shorten nothing there. Unless the SMs' spread
    has the other shape: the idlest SM close to the average and the busiest far above it
    (the busiest's excess over the average larger than the idlest's shortfall below it).
    Then every SM works nearly to the end and a few run on: the shares are equal in count
    but not in cost, as when a split hands some CTAs cut pieces whose fp32 partials cost
    more than their k iterations (the persistent stage's tail split at 4096^3 on the H200:
    its spares ran 8 pieces each, and the busiest SM 10% longer than without the split).
    The fix is the opposite one: take work off the longest CTAs, split fewer tiles or none.
    Estimate: 1 - avg / max of the SMs' active cycles, the time saved if every SM finished
    with the average one, less, where the run manifest gives the rounds, the tile's k depth
    and K, what sharing the last round costs the busiest CTA: STREAMK_PIECE_KTILES k tiles
    over its ceil(rounds) x ceil(K / BK) (the 8192^3 stream-K step on the H200: 0.032 - 0.003
    = 0.029 predicted, 0.023-0.024 saved; at 4096^3 0.034 - 0.023 = 0.011, where it saved
    nothing and the balanced grid 0.001-0.006). Without them the idle share alone, an upper
    bound. The idle share is the finding's cost, what `diff` holds against another kernel's:
    two kernels idle alike whatever a split would give back of it.
    Example:
        before: for (tile = blockIdx.x; tile < tiles; tile += gridDim.x) gemm_tile(tile);
        after:  whole rounds as before; the last tiles % gridDim.x tiles' k iterations shared
                evenly, each cut tile's fp32 partials added by the CTA holding its first k
    Source: seed 000 §5.1, §6.3 row 3 (tail effects); NCU Profiling Guide: Launch
    Statistics (waves), Compute Workload Analysis (SM active cycles)."""
    p = inputs.profile
    waves = need(p.launch.waves_per_sm, M_WAVES)
    if abs(waves - 1.0) > ONE_WAVE_TOLERANCE:
        return None     # several waves: PS150's; less than one leaves SMs without a CTA
    avg = need(p.metric(M_SM_ACTIVE_AVG), M_SM_ACTIVE_AVG)
    busiest = need(p.metric(M_SM_ACTIVE_MAX), M_SM_ACTIVE_MAX)
    if busiest <= 0:
        return None
    idle = 1 - avg / busiest
    if idle < SM_IMBALANCE_MIN:
        return None
    ev = [Evidence(M_SM_ACTIVE_MAX, round(busiest), "the busiest SM"),
          Evidence(M_SM_ACTIVE_AVG, round(avg), "the average SM"),
          Evidence("idle share while the busiest SM works (1 - avg / max)", round(idle, 3),
                   f">= {SM_IMBALANCE_MIN}")]
    idlest = p.metric(M_SM_ACTIVE_MIN)
    how = IDLE_AT_END
    if idlest is not None:
        ev.append(Evidence(M_SM_ACTIVE_MIN, round(idlest), "the idlest SM"))
        if busiest - avg > avg - idlest:
            how = STRAGGLERS
            ev.append(Evidence("busiest SM above the average / idlest below it",
                               round((busiest - avg) / max(avg - idlest, 1.0), 2),
                               "> 1: a few SMs run on"))
    rounds = _tile_rounds(inputs)
    gain = idle
    if rounds is not None:
        ev.append(Evidence("rounds of tiles over the CTAs (run manifest)", round(rounds, 2),
                           "a whole number"))
        k_tiles = _k_tiles(inputs.manifest)
        if k_tiles and how == IDLE_AT_END:
            cost = STREAMK_PIECE_KTILES / (math.ceil(rounds) * k_tiles)
            gain = max(0.0, idle - cost)
            ev.append(Evidence("what sharing the last round costs the busiest CTA "
                               f"({STREAMK_PIECE_KTILES} k tiles of its ceil(rounds) x "
                               f"{k_tiles})", round(cost, 4), "subtracted from the idle share"))
        grid = inputs.profile.launch.grid_size or 0     # known: the rounds need it
        tiles = round(rounds * grid)
        pieces = split_pieces(tiles, grid)
        if pieces is not None and how == IDLE_AT_END:
            rest = tiles % grid
            ev.append(Evidence("equal pieces per last-round tile before that round shortens",
                               pieces, f"ceil({grid} CTAs / {grid - rest} it leaves idle)"))
            how += SPLIT_PIECES.format(rest=rest, ctas=grid, pieces=pieces)
    return Hit(tuple(ev), gain, (("how", how),), cost=idle if gain != idle else None)


def _k_tiles(m: RunManifest | None) -> int | None:
    """k tiles per output tile: ceil(K / BK) from the run manifest, None without BK or K."""
    bk = (m.params or {}).get("BK") if m is not None else None
    return math.ceil(m.k / int(bk)) if bk and m.k > 0 else None


def split_pieces(tiles: int, ctas: int) -> int | None:
    """The fewest equal pieces each tile of the last, partial round must be cut into (by
    rows, columns or k) before that round takes less than a whole tile's time: with r tiles
    on P CTAs, s pieces each leave the busiest CTA ceil(r s / P) pieces, fewer than s only
    when s >= P / (P - r). The same number bounds a split kept inside clusters: clusters of
    c CTAs shorten the round only if none holds c of its tiles, c >= P / (P - r). None when
    the tiles make whole rounds."""
    rest = tiles % ctas
    if rest == 0 or tiles < ctas:
        return None
    return math.ceil(ctas / (ctas - rest))


IDLE_AT_END = (
    "Share the last, partial round of tiles among all CTAs by k iterations (stream-K, each cut "
    "tile's fp32 partials added by one CTA); it pays when the tiles make many rounds (on the "
    "H200 from about 8: below that the cut pieces cost more than the idle SMs, each measured "
    "at about 6 k tiles of math beyond its own). Or pick a tile shape whose tile count is a "
    "multiple of the CTA count. At the power cap (PS171), ceil(tiles / rounds) CTAs take the "
    "same rounds at a higher clock (128 CTAs for 512 tiles: 1.008-1.016x on an H100, "
    "1.001-1.006x on the H200).")
# Appended to IDLE_AT_END where the run manifest gives the rounds. Why: the tempting fixes
# for a last round of r tiles on P CTAs (cut each tile in two, or share tiles within a
# cluster) shorten nothing until the pieces number P / (P - r): 9 at 4096^3 on 132 CTAs
# (116 tail tiles), so 64-column pieces (4 a tile, the finest an N-major B's swizzle atom
# allows) leave the round as long as it was.
SPLIT_PIECES = (
    " Here the last round holds {rest} tiles for {ctas} CTAs: cut into fewer than {pieces} "
    "equal pieces each (by columns, rows or k), or shared only within clusters of fewer than "
    "{pieces} CTAs, some CTA still gets a whole tile's work and the round is no shorter; only "
    "k iterations shared over all CTAs (stream-K) or {pieces} pieces or more shorten it.")
STRAGGLERS = (
    "Every SM works nearly to the end and a few run on past it: the CTAs' shares are equal in "
    "count but not in cost. If the kernel splits tiles (stream-K, split-K), the CTAs with cut "
    "pieces pay for each piece beyond its k iterations (on the H200 about 6 k tiles of math, "
    "with its 128 KB of fp32 partials to write and read): take work off them, split fewer "
    "tiles, or none when the tiles make few rounds. Else look for tiles that cost more than "
    "others (edge tiles, uneven k).")


def _tile_rounds(inputs: Inputs) -> float | None:
    """Tiles per CTA of the grid, when the manifest gives the tile and the report the grid."""
    return tile_rounds(inputs.manifest, inputs.profile.launch.grid_size)


def tile_rounds(m: RunManifest | None, grid: int | None) -> float | None:
    """Tiles per CTA of a grid of `grid` CTAs: the manifest's tile over its shape (None when
    either is not known). The calibration reads it too (a stage's change may act only from
    some number of rounds, StageInfo.min_rounds)."""
    if m is None or not grid:
        return None
    try:
        bm, bn = _tile(m.params or {})
    except NotCollected:
        return None
    return m.batch * math.ceil(m.m / bm) * math.ceil(m.n / bn) / grid


UNEVEN_SMS = Rule(
    code="PS153", tag="tail-effect", title="Persistent CTAs get unequal shares: SMs idle at the end",
    severity="optimization",
    metrics=(M_WAVES, M_SM_ACTIVE_AVG, M_SM_ACTIVE_MAX, M_SM_ACTIVE_MIN),
    check=_check_uneven_sms,
    fix="{how}",
    reference="Stream-K (Osama et al., PPoPP 2023); NCU Profiling Guide: Launch Statistics",
    thresholds=(("SM_IMBALANCE_MIN", SM_IMBALANCE_MIN),),
)


def _tile(params) -> tuple[int, int]:
    for a, b in TILE_PARAMS:
        if a in params and b in params:
            return int(params[a]), int(params[b])
    raise NotCollected("the CTA tile (BM/BN or TILE) in the run manifest's parameters")


def _check_tile_waste(inputs: Inputs) -> Hit | None:
    """Symptom: M or N is not a multiple of the CTA tile, so edge tiles compute padding.
    Why: an edge CTA costs a full tile's time for a sliver of output; shapes like
    1000x2000x500 swing in speed against 1024-multiples.
    Not where the work stays memory-bound with the padding counted (its FLOPs over the
    unpadded share still take less time at the math peak than its bytes at the DRAM peak):
    there the padded MMAs run under the stream and cost no time (hgemm_small_m's M = 16
    padded to 64 rows against a 128 MiB weight: 9 us of padded math under a 28 us stream).
    Fix: a tile chosen per shape, or a smaller-tile kernel for the edges.
    Estimate: 1 - M*N / (ceil(M/BM)*BM * ceil(N/BN)*BN), the padded share of the work.
    Example:
        before: M = N = 4100 on 128 x 128 tiles: 33 x 33 tiles, 5.8% padding
        after:  M = N = 4100 on 128 x 64 + an edge kernel, or a tile that divides the shape
    Source: seed 000 §6.3 row 3, §5.1 (configuration search), §6.2 (edge shapes)."""
    m = inputs.need_manifest()
    bm, bn = _tile(m.params or {})
    padded = math.ceil(m.m / bm) * bm * math.ceil(m.n / bn) * bn
    waste = 1 - m.m * m.n / padded
    if waste < TILE_WASTE_MIN:
        return None
    room = headroom(inputs)
    if room is not None and room.t_math_ns and room.t_bytes_ns and \
            room.t_math_ns / (1 - waste) <= room.t_bytes_ns:
        return None     # the padded MMAs run under the DRAM stream
    return Hit((
        Evidence("problem shape M x N (run manifest)", f"{m.m}x{m.n}", f"multiples of {bm}x{bn}"),
        Evidence("padded share of the tiles' work", round(waste, 3), f">= {TILE_WASTE_MIN}"),
    ), waste, (("tile", f"{bm}x{bn}"),))


TILE_WASTE = Rule(
    code="PS151", tag="tail-effect", title="CTA tiles overhang the problem shape",
    severity="optimization",
    metrics=(),
    check=_check_tile_waste,
    fix="Choose a tile that divides M and N for this shape (search BM/BN per shape instead of "
        "one {tile} tile for all: perfscope tune), or cover the edge with a smaller-tile launch.",
    reference="NCU Profiling Guide: Launch Statistics; CUTLASS: tile size selection",
    thresholds=(("TILE_WASTE_MIN", TILE_WASTE_MIN),),
)

RULES = (TAIL, SMALL_GRID, UNEVEN_SMS, TILE_WASTE)
