"""hgemm_small_m's tile shape at M = 128 and 256, measured, before small_m_for's choice changes.

    PYTHONPATH=. python3 benchmarks/small_m_tiles.py [--multicast | --pairs | --decode | --gsplit
        | --wide | --thin | --nvjet | --deep] [--out FILE]

The question it answers: at M = 256 the host takes BM 256 x BN 128 where N is 8192 or
more (four m64n128 fragments per CTA, so wgmma reads B from shared memory four times per k
step), else BM 128 x BN 64; would BM 128 x BN 256 (the persistent stage's m64n256 per
consumer, split-K 2 over 128 CTAs at N = 8192), which reads each B byte twice per k step
and A half as often, or BM 128 x BN 128 do better? Each configuration is verified against
float64 and timed against cublas+gelu in alternating rounds in this one process (bench's
path), bf16, bias + GELU.

Answer on the H200 (2026-12-01, fused/small-m-tiles.json): no. The host's choice is the
fastest of the five at each of the six shapes (M = 256: 0.95, 0.94, 1.04 and 1.08 of
cublas+gelu at N x K = 8192², 4096 x 14336, 14336 x 4096, 4096²; M = 128: 1.01 and 1.07),
and 128 x 256 is slower than the host's choice everywhere (0.72-0.94). The M = 256 gap is not the
tile; see the note in fused/README.md. (Re-run on 2026-12-02 at 07:50 UTC, after the host
began pairing tile rows: the host's choice is still the fastest, or within 1%, at each.)

``--pairs`` asks the next question: two 128-row tiles whose CTAs share B (MPAIR=2) against
the 256-row tile and against unpaired 128 x 64 tiles, at M = 256 (and 192) over K, bf16 and
fp16. Answer (2026-12-02, fused/small-m-pairs.json): paired 128 x 128 tiles 1.02-1.15x the
256-row tile's speed at N = 8192; paired 128 x 64 tiles 1.03-1.06x unpaired at K = 14336,
1.01-1.03x at 8192, 0.96-0.97x at 4096 (fused_specs.small_m_pairs holds the thresholds).

``--decode`` asks it of the M <= 64 shapes, where the host takes 64 columns (128 at
N = 14336) and splits K over clusters to fill the SMs: do wider tiles, split more ways, read
B faster? A 64-column tile reads 128 contiguous bytes of each of B's rows per k tile; 128
and 256 columns read 256 and 512.

``--thin``, ``--nvjet`` and ``--deep`` ask why cuBLASLt leads at M = 256 (256x4096x4096,
256x8192x8192). Answers (2026-12-04, fused/README.md): 64-row tiles four deep read B four
times (0.68-0.93 of cublas+gelu, small-m-thin.json); cuBLASLt's own patterns (64 x 128 tiles
in pairs sharing B, 128 x 128 pairs sharing A) run 0.82-0.94 in this kernel at its default
rings (small-m-nvjet.json), and the 64 x 128 pairs match the host's tiles, no more, at 8
stages (small-m-deep.json).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from perfscope import bench
from perfscope.kernels import Shape

log = logging.getLogger("small_m_tiles")
# None: the host's own choice (fused_specs.small_m_for).
CONFIGS = (None, {"BM": 128, "BN": 256}, {"BM": 128, "BN": 128}, {"BM": 256, "BN": 128},
           {"BM": 128, "BN": 64})
SHAPES = ((256, 8192, 8192), (256, 4096, 14336), (256, 14336, 4096), (256, 4096, 4096),
          (128, 8192, 8192), (128, 4096, 14336))
# --multicast: the host's tile with A loaded once per pair of N tiles (MCAST=2) or per CTA,
# at issue 19's small-M shapes and M = 128, in both dtypes.
MULTICAST_CONFIGS = ({"MCAST": 1}, {"MCAST": 2})
MULTICAST_SHAPES = tuple((m, n, k) for m in (16, 64, 128, 256)
                         for n, k in ((4096, 4096), (8192, 8192), (14336, 4096), (4096, 14336)))
# --pairs: at M > 128, two 128-row tiles whose CTAs share B (MPAIR=2: each loads every
# other B atom for both, so B crosses L2 once per pair as with one 256-row tile, but
# without its split-K reduction), against the host's choice, the 256-row tile and the
# 128 x 64 tiles unpaired, over K at N = 4096 and 8192 (fused_specs.small_m_pairs).
PAIR_CONFIGS = (None, {"BM": 256, "BN": 128, "MPAIR": 1}, {"BM": 128, "BN": 128, "MPAIR": 2},
                {"BM": 128, "BN": 64, "MPAIR": 1}, {"BM": 128, "BN": 64, "MPAIR": 2})
PAIR_SHAPES = ((256, 4096, 4096), (256, 8192, 8192), (256, 14336, 4096), (256, 4096, 14336),
               (256, 4096, 8192), (256, 8192, 4096), (192, 8192, 8192))
# --decode: at issue 19's M <= 64 shapes, the host's choice against each width (split-K
# fills the SMs: split_count), bf16 and fp16.
DECODE_CONFIGS = (None, {"BN": 64}, {"BN": 128}, {"BN": 256})
DECODE_SHAPES = tuple((m, n, k) for m in (16, 64)
                      for n, k in ((4096, 4096), (8192, 8192), (14336, 4096), (4096, 14336)))
# --gsplit: split-K over the grid's z (GSPLIT, partials through the stream-K workspace)
# where the host split over a cluster or could not split a pair, against the host's choice
# before GSPLIT (None where that is still the host's; at M = 256 and N = 4096 it was the
# paired 128 x 64 tile, and is now the paired 128 x 128 one with GSPLIT=2).
_PAIR128 = {"BM": 128, "BN": 128, "MPAIR": 2}
_PAIR64 = {"BM": 128, "BN": 64, "MPAIR": 2}
GSPLIT_CASES = (
    ((256, 4096, 14336), (_PAIR64, {**_PAIR128, "GSPLIT": 2}, {"BM": 128, "BN": 128, "GSPLIT": 2})),
    ((256, 4096, 8192), (_PAIR64, {**_PAIR128, "GSPLIT": 2})),
    ((256, 4096, 4096), (None, {**_PAIR128, "GSPLIT": 2})),
    ((128, 4096, 14336), (None, {"BM": 128, "BN": 128, "GSPLIT": 4}, {"BM": 128, "GSPLIT": 2})),
    ((16, 4096, 14336), (None, {"GSPLIT": 2})),
    ((64, 4096, 14336), (None, {"GSPLIT": 2})),
    ((16, 4096, 4096), (None, {"GSPLIT": 2})),
    ((64, 4096, 4096), (None, {"GSPLIT": 2})),
)
# --wide: paired 128 x 256 tiles (m64n256 per consumer), split over the grid where the pairs
# alone leave SMs idle, against the host's choice at the M = 256 shapes.
_PAIR256 = {"BM": 128, "BN": 256, "MPAIR": 2}
WIDE_CASES = (
    ((256, 8192, 8192), (None, {**_PAIR256, "GSPLIT": 2})),
    ((256, 4096, 14336), (None, {**_PAIR256, "GSPLIT": 4})),
    ((256, 14336, 4096), (None, _PAIR256)),
)

# --thin: at M = 256, 64-row tiles (one consumer warpgroup, m64nBN per k16 step) four tile
# rows deep, so the wgmma is n128 or n256 rather than the 128 x 64 tile's n64 (whose wgmma
# operands alone fill shared memory's 128 B/clock: PS114's roof 0.57) while the grid still
# covers the SMs: 64 x 128 tiles unsplit, 64 x 256 unsplit at N = 8192 and split over the
# grid at N = 4096.
_THIN128 = {"BM": 64, "BN": 128}
_THIN256 = {"BM": 64, "BN": 256}
THIN_CASES = (
    ((256, 4096, 4096), (None, _THIN128, {**_THIN256, "GSPLIT": 2})),
    ((256, 8192, 8192), (None, _THIN256, {**_THIN256, "STAGES": 5})),
    ((256, 4096, 14336), (None, _THIN128, {**_THIN256, "GSPLIT": 2})),
)

# --nvjet: the tile patterns cuBLASLt's GELU_BIAS kernels use where they lead at M = 256
# (ncu on the H200, 2026-12-04; cuBLASLt runs C^T = B^T A^T, so its names' tiles are N x M):
# at 256x4096x4096 nvjet_sm90_tst_128x64_64x8_1x2 is 64 x 128 tiles whose pairs of M tiles
# share B (MPAIR=2 at BM 64); at 256x8192x8192 nvjet_sm90_tst_128x128_64x6_2x1 is 128 x 128
# tiles whose pairs of N tiles share A (MCAST=2); against the host's choice, with m64n256
# pairs as well.
_PAIR_THIN128 = {"BM": 64, "BN": 128, "MPAIR": 2}
_PAIR_THIN256 = {"BM": 64, "BN": 256, "MPAIR": 2}
NVJET_CASES = (
    ((256, 4096, 4096), (None, _PAIR_THIN128, {**_PAIR_THIN256, "GSPLIT": 2},
                         {"BM": 128, "BN": 64, "MCAST": 2, "MPAIR": 1})),
    ((256, 8192, 8192), (None, {"BM": 128, "BN": 128, "MCAST": 2, "MPAIR": 1}, _PAIR_THIN256)),
    ((256, 4096, 14336), (None, _PAIR_THIN128, {**_PAIR_THIN256, "GSPLIT": 2})),
)

# --deep: the paired tiles' ring one or two slots deeper (a pair refills a slot only when
# both CTAs have read it, so a deeper ring is slack for that lock step), against the host's.
DEEP_CASES = (
    ((256, 4096, 4096), (None, {"BM": 128, "BN": 64, "STAGES": 9},
                         {**_PAIR_THIN128, "STAGES": 8}, {**_PAIR_THIN128, "STAGES": 9})),
    ((256, 8192, 8192), (None, {"BM": 128, "BN": 128, "MPAIR": 2, "STAGES": 7},
                         {**_PAIR_THIN256, "STAGES": 5})),
    ((256, 4096, 14336), (None, {"BM": 128, "BN": 128, "MPAIR": 2, "GSPLIT": 2, "STAGES": 7},
                          {**_PAIR_THIN128, "STAGES": 9})),
    ((256, 14336, 4096), (None, {"BM": 128, "BN": 128, "MPAIR": 2, "STAGES": 7})),
)


# The modes besides the default "tiles": each a flag, what it times instead, and its jobs
# as (shape, configurations) cases over bf16 and fp16, or as configurations x shapes.
MODES = {
    "multicast": "time MCAST=1 against MCAST=2 instead of the tile shapes",
    "pairs": "time M-tile pairs sharing B (MPAIR=2) at M = 256 instead",
    "decode": "time the tile widths at M <= 64 instead",
    "gsplit": "time split-K over the grid (GSPLIT) against the host's choice instead",
    "wide": "time paired 128 x 256 tiles at M = 256 against the host's choice instead",
    "thin": "time 64-row tiles of 128 / 256 columns at M = 256 against the host's choice "
            "instead",
    "nvjet": "time cuBLASLt's tile patterns at M = 256 against the host's choice instead",
    "deep": "time the M = 256 tiles with a deeper ring against the host's instead",
}
CASES = {"gsplit": GSPLIT_CASES, "wide": WIDE_CASES, "thin": THIN_CASES, "nvjet": NVJET_CASES,
         "deep": DEEP_CASES}
GRIDS = {"multicast": (MULTICAST_CONFIGS, MULTICAST_SHAPES, ["bf16", "fp16"]),
         "pairs": (PAIR_CONFIGS, PAIR_SHAPES, ["bf16", "fp16"]),
         "decode": (DECODE_CONFIGS, DECODE_SHAPES, ["bf16", "fp16"]),
         "tiles": (CONFIGS, SHAPES, ["bf16"])}


def plan_jobs(mode: str) -> list:
    """Every job of one mode ("tiles" or one of MODES), in order."""
    if mode in CASES:
        return [job for (m, n, k), cfgs in CASES[mode] for cfg in cfgs
                for job in bench.plan(["hgemm_small_m"], ["bf16", "fp16"], Shape(m, n, k), cfg)]
    configs, shapes, dtypes = GRIDS[mode]
    jobs = []
    for m, n, k in shapes:
        for cfg in configs:
            jobs += bench.plan(["hgemm_small_m"], dtypes, Shape(m, n, k), cfg)
    return jobs


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="default reports/reference/h200/fused/"
                    "small-m-tiles.json (small-m-MODE.json with a mode)")
    modes = ap.add_mutually_exclusive_group()
    for name, what in MODES.items():
        modes.add_argument(f"--{name}", action="store_true", help=what)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    mode = next((name for name in MODES if getattr(args, name)), "tiles")
    out = args.out or Path("reports/reference/h200/fused") / f"small-m-{mode}.json"
    jobs = plan_jobs(mode)
    done = []
    try:
        for man in bench.run_jobs(jobs, bench.BenchOptions(runs=args.runs, rounds=args.rounds)):
            done.append(man)
            t = man.timing
            ratio = t.ratio_to_reference.median if t and t.ratio_to_reference else None
            log.info("%s %dx%dx%d BM=%s BN=%s STAGES=%s MCAST=%s MPAIR=%s GSPLIT=%s %s ratio "
                     "to %s: %s",
                     man.dtype, man.m, man.n, man.k, man.params.get("BM"), man.params.get("BN"),
                     man.params.get("STAGES"), man.params.get("MCAST"), man.params.get("MPAIR"),
                     man.params.get("GSPLIT"),
                     man.verification.verdict, t.reference if t else None,
                     f"{ratio:.3f}" if ratio is not None else "-")
    finally:
        if done:
            bench.write_bench_json(out, done, "PYTHONPATH=. python3 " + " ".join(sys.argv))
    return 1 if bench.failed(done) else 0


if __name__ == "__main__":
    sys.exit(main())
