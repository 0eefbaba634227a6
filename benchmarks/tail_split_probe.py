"""Where the tail split's time goes: %globaltimer probes per CTA and unit of work.

    PYTHONPATH=. python3 benchmarks/tail_split_probe.py --out PROBE.json [--cost-k-tiles 2]

hgemm_tma_wgmma_persistent (bf16, GROUP 16, BOXES 4, STAGES 3) at STREAMK 0 and 3, at
4096^3, 1024x8192x8192 and 6144^3, compiled from a copy of hopper.cuh in a temporary folder
with probes added and SK_PARTIAL_K_TILES set to ``--cost-k-tiles`` (2, the first version's
charge, makes the 512- and 256-tile shapes split; the committed kernel charges 6 and does
not split them). The first consumer warpgroup's first thread reads %globaltimer (ns) at each
unit's start, after its k loop (last wgmma done, slot released), after its partial's write or
the fixup (wait for the spare's flag, load and add), and after its C store, with the unit's
tile and k range: at most 40 units per CTA. Each case is verified against float64 three
times; the probes are those of the last launch. The JSON holds, per case, the grid and the
raw probes; the summary printed gives the median math time per k tile of whole tiles, the
spares' piece math and partial-write times, and the tail tiles' fixup times.

What it found on the H200 (2026-12-02 05:09 UTC, driver 580.159.04, NVRTC 13.0, clocks as
found; `reports/reference/h200/tune/tail-split-probe.json.xz`): a k tile of math takes
0.65-0.67 us in whole tiles and in 5-k-tile pieces alike, and a CTA's units follow each other
within 0.13-0.24 us, but writing a piece's two 64 x 256 fp32 partials (128 KB, coalesced
plain stores, then the fence and flag) takes 3.2-3.3 us, five k tiles' time; the tail tile's
CTA then waits 3.8-4.0 us (median; 17-28 us for the last spare's pieces) in its fixup.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import lzma
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from probed_copy import patched, probed_kernel_dir

from perfscope import verify
from perfscope.kernels import Shape, get_spec
from perfscope.kernels.launch import prepare
from perfscope.kernels.spec import KERNEL_DIR

SHAPES = (Shape(4096, 4096, 4096), Shape(1024, 8192, 8192), Shape(6144, 6144, 6144))
UNITS = 40   # probe rows per CTA
PROBE_DECL = ('extern "C" __device__ unsigned long long ps_probe[160][40][6];\n'
              '__device__ __forceinline__ unsigned long long ps_gtime() { unsigned long long t; '
              'asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }\n')
_UNIT_START = ("        int it = 0;\n        const auto compute = [&](int tile, int k0, int k1) {\n"
               "            int tm, tn;\n")
_UNIT_START_PROBED = (
    "        int it = 0;\n        int unit_no = 0;\n"
    "        const auto compute = [&](int tile, int k0, int k1) {\n"
    "            const unsigned long long t_start = ps_gtime();\n"
    "            unsigned long long t_math = 0, t_split = 0;\n"
    "            const auto rec = [&](unsigned long long t_end) {\n"
    "                if (tid == 128 && unit_no < 40) {\n"
    "                    auto* q = ps_probe[blockIdx.x][unit_no];\n"
    "                    q[0] = t_start; q[1] = t_math; q[2] = t_split; q[3] = t_end;\n"
    "                    q[4] = tile; q[5] = k0 * 1000 + k1;\n"
    "                }\n"
    "                ++unit_no;\n"
    "            };\n"
    "            int tm, tn;\n")
_FIXUP = ("            if constexpr (STREAMK != 0) {\n"
          "                if (k0 != 0) {   // another CTA finishes this tile\n"
          "                    sk.write(acc, sk.slot(tile), half, 1 + half);\n")
_STORE = ("            if constexpr (DEFER) {\n                epi.pack(acc, words, row0, n0, M, N);\n"
          "                words_row0 = row0;\n                words_n0 = n0;\n"
          "                next_box = 0;\n            } else {\n"
          "                epi.store(acc, staging, tmap_c, row0, n0, M, N, 1 + half);\n"
          "            }\n")
_UNIT_END = ("            wgmma_wait<0>();\n            ring.release(it - 1);\n" + _FIXUP
             + "                    return;\n                }\n"
             "                if (k1 != KT) sk.fixup(acc, tile, half, 1 + half);\n            }\n"
             + _STORE)
# The deferred store (DEFER 1) records its unit's end once the tile is packed: its boxes leave
# during the next unit's first k tiles, inside that unit's math time.
_UNIT_END_PROBED = ("            wgmma_wait<0>();\n            ring.release(it - 1);\n"
                    "            t_math = ps_gtime();\n" + _FIXUP
                    + "                    t_split = ps_gtime();\n                    rec(t_split);\n"
                    "                    return;\n                }\n"
                    "                if (k1 != KT) sk.fixup(acc, tile, half, 1 + half);\n            }\n"
                    "            t_split = ps_gtime();\n"
                    + _STORE + "            rec(ps_gtime());\n")


def probed_header(text: str, cost: int) -> str:
    """hopper.cuh with the probes and the cut piece charged ``cost`` k tiles; a ValueError
    names an anchor that is not there exactly once."""
    charge = "constexpr int SK_PARTIAL_K_TILES = 6;"
    return patched(text, ((charge, f"constexpr int SK_PARTIAL_K_TILES = {cost};"),
                          ('#include "tma.cuh"\n', '#include "tma.cuh"\n' + PROBE_DECL),
                          (_UNIT_START, _UNIT_START_PROBED), (_UNIT_END, _UNIT_END_PROBED)))


def summary(probe: list, k_tiles: int) -> dict:
    """Medians (us) of a case's units: whole tiles' math per k tile and store, the gap between
    a CTA's units, the spares' pieces (math, partial write) and the tail tiles' fixups."""
    units = [u for cta in probe for u in cta if u[0]]
    t0 = min(u[0] for u in units)
    whole, pieces, tails, gaps = [], [], [], []
    for cta in probe:
        done = [u for u in cta if u[0]]
        gaps += [(b[0] - a[3]) / 1e3 for a, b in itertools.pairwise(done)]
    for u in units:
        k0, k1 = divmod(int(u[5]), 1000)
        math, split, store = (u[1] - u[0]) / 1e3, (u[2] - u[1]) / 1e3, (u[3] - u[2]) / 1e3
        if k0 != 0:
            pieces.append((math / (k1 - k0), split))
        elif k1 != k_tiles:
            tails.append(split)
        else:
            whole.append((math / k_tiles, store))
    med = statistics.median
    out = {"end_us": max(u[3] - t0 for u in units) / 1e3,
           "whole_tile_us_per_k_tile": med(w[0] for w in whole),
           "whole_tile_store_us": med(w[1] for w in whole),
           "gap_between_units_us": med(gaps) if gaps else None}
    if pieces:
        out |= {"pieces": len(pieces), "piece_us_per_k_tile": med(p[0] for p in pieces),
                "partial_write_us": med(p[1] for p in pieces)}
    if tails:
        out |= {"tail_fixup_us_median": med(tails), "tail_fixup_us_max": max(tails)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="the JSON (.xz: compressed)")
    ap.add_argument("--cost-k-tiles", type=int, default=2)
    args = ap.parse_args(argv)
    import cupy as cp

    folder = probed_kernel_dir(probed_header((KERNEL_DIR / "hopper.cuh").read_text(),
                                             args.cost_k_tiles), "tail-split-probe-")

    # The stage compiled from the probed copy (KernelSpec.kernel_dir), launched as bench does.
    base = dataclasses.replace(get_spec("hgemm_tma_wgmma_persistent"), kernel_dir=folder)
    base = base.with_params(GROUP=16, BOXES=4, STAGES=3)
    doc = {"cost_k_tiles": args.cost_k_tiles, "params": dict(base.param_dict), "cases": {}}
    for shape in SHAPES:
        for streamk in (0, 3):
            prep = prepare(base.with_params(STREAMK=streamk), "bf16", shape)
            buf = cp.ndarray((160, UNITS, 6), dtype=cp.uint64,
                             memptr=prep.raw_module.get_global("ps_probe"))
            for seed in (1, 2, 3):
                buf[...] = 0
                v = verify.verify(prep, seed)
            probe = cp.asnumpy(buf[: prep.grid[0]]).tolist()
            s = summary(probe, -(-shape.k // 64))
            doc["cases"][f"{shape}-STREAMK{streamk}"] = {"verdict": v.verdict, "grid": list(prep.grid),
                                                         "summary": s, "probe": probe}
            print(f"{shape} STREAMK={streamk} {v.verdict}: " + json.dumps(
                {k: round(x, 3) if isinstance(x, float) else x for k, x in s.items()}), flush=True)
    text = json.dumps(doc)
    if args.out.suffix == ".xz":
        args.out.write_bytes(lzma.compress(text.encode()))
    else:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
