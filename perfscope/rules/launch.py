"""Shape and launch: wave quantisation and tiles that overhang the problem.

Seed 000 §6.3's "performance swings when the shape changes" has two measurable causes:
the last wave of CTAs leaves SMs idle, and edge tiles compute on padding.
"""

from __future__ import annotations

import math

from perfscope.rules.facts import tail_idle
from perfscope.rules.model import Evidence, Hit, Inputs, NotCollected, Rule, need

# -- thresholds --
# Idle SM time in the last wave above this share of the launch.
TAIL_IDLE_MIN = 0.10
# Padding computed by edge tiles above this share of the tiles' work.
TILE_WASTE_MIN = 0.05
# Manifest parameter names that give a stage's CTA tile (BM x BN, or a square TILE).
TILE_PARAMS = (("BM", "BN"), ("TILE", "TILE"))


def _check_tail(inputs: Inputs) -> Hit | None:
    """Symptom: the grid is not a whole number of waves (CTAs the GPU holds at once): the
    last, partial wave leaves SMs idle, or the whole grid is smaller than one wave.
    Why: with equal CTA times the launch takes ceil(waves) wave times for waves of work;
    a shape change that adds a sliver of a wave costs a whole one (seed 000 §6.3 row 3).
    Fix: tile size, split-K/stream-K or a persistent grid matched to the CTA slots.
    Estimate: 1 - waves / ceil(waves), the idle share of SM time.
    Source: seed 000 §6.3 row 3, §5.1; NCU Profiling Guide: Launch Statistics (waves per SM,
    tail effect)."""
    p = inputs.profile
    waves = need(p.launch.waves_per_sm, "launch__waves_per_multiprocessor")
    idle = tail_idle(waves)
    if idle < TAIL_IDLE_MIN:
        return None
    grid = p.launch.grid_size
    slots = round(grid / waves) if grid and waves else None
    ev = [Evidence("launch__waves_per_multiprocessor", round(waves, 3), "whole waves"),
          Evidence("idle share of the last wave (1 - waves / ceil(waves))", round(idle, 3),
                   f">= {TAIL_IDLE_MIN}")]
    if inputs.manifest is not None:
        ev.append(Evidence("problem shape (run manifest)", inputs.manifest.shape, "-"))
    return Hit(tuple(ev), idle, (("slots", str(slots) if slots else "the CTA slots"),))


TAIL = Rule(
    code="PS150", tag="tail-effect", title="The last wave of CTAs leaves SMs idle",
    severity="optimization",
    metrics=("launch__waves_per_multiprocessor", "launch__grid_size"),
    check=_check_tail,
    fix="Make the CTA count a multiple of the {slots} CTAs one wave holds: pick the tile size per "
        "shape (a configuration search), split K (split-K / stream-K) for small grids, or launch "
        "a persistent grid of exactly one wave that loops over tiles.",
    reference="seed 000 §6.3 row 3; NCU Profiling Guide: Launch Statistics",
    ncu=("LaunchConfiguration/Tail",),
)


def _tile(params) -> tuple[int, int]:
    for a, b in TILE_PARAMS:
        if a in params and b in params:
            return int(params[a]), int(params[b])
    raise NotCollected("the CTA tile (BM/BN or TILE) in the run manifest's parameters")


def _check_tile_waste(inputs: Inputs) -> Hit | None:
    """Symptom: M or N is not a multiple of the CTA tile, so edge tiles compute padding.
    Why: an edge CTA costs a full tile's time for a sliver of output; shapes like
    1000x2000x500 swing in speed against 1024-multiples (seed 000 §6.3 row 3, §6.2).
    Fix: a tile chosen per shape, or a smaller-tile kernel for the edges.
    Estimate: 1 - M*N / (ceil(M/BM)*BM * ceil(N/BN)*BN), the padded share of the work.
    Source: seed 000 §6.3 row 3, §5.1 (configuration search), §6.2 (edge shapes)."""
    m = inputs.need_manifest()
    bm, bn = _tile(m.params or {})
    padded = math.ceil(m.m / bm) * bm * math.ceil(m.n / bn) * bn
    waste = 1 - m.m * m.n / padded
    if waste < TILE_WASTE_MIN:
        return None
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
        "one {tile} tile for all), or cover the edge with a smaller-tile launch.",
    reference="seed 000 §6.3 row 3, §5.1",
)

RULES = (TAIL, TILE_WASTE)
