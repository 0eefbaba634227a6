"""The persistent stage on fewer CTAs that share its tiles evenly, against itself on every SM.

    PYTHONPATH=. python3 benchmarks/balanced_grid_probe.py [--out FILE.jsonl] [--rounds N]

At 4096^3 the persistent stage's 512 tiles of 128 x 256 make 3.88 rounds on the H200's 132
SMs: four rounds of time, the last with 16 SMs idle. 128 CTAs take the same four rounds,
every CTA four tiles, and leave 4 SMs idle throughout instead. With no power cap the two
take the same time; at the cap (the tensor GEMMs run at 1.5-1.6 GHz of 1.98: PS171) the
question is whether 4 SMs idle for the whole launch buy a higher clock for the other 128,
where 16 idle for the last quarter do not (the power governor reacts over milliseconds, a
launch takes 175 us). Each case is verified against float64 at its grid, then timed in
alternating rounds with its every-SM self (the parent side) and cuBLAS (the reference),
as bench times a ladder step (CUDA events, read flush, 20 launches a round). One JSON line
per case: the ratio to cuBLAS and to the full grid (above 1: the balanced grid is faster),
and NVML's clock samples.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perfscope.bench import reference_spec  # noqa: E402
from perfscope.kernels import get_spec  # noqa: E402
from perfscope.kernels.launch import prepare  # noqa: E402
from perfscope.kernels.spec import parse_shape  # noqa: E402
from perfscope.kernels.tensormap import balanced_grid  # noqa: E402
from perfscope.timing import BenchOptions, time_stage  # noqa: E402
from perfscope.verify import verify  # noqa: E402

STAGE = "hgemm_tma_wgmma_persistent"
# The stage's defaults, and the tune store's best at 4096^3 (probes/tune-persistent.md).
CONFIGS = {"default": {}, "tuned": {"STAGES": 4, "GROUP": 16, "BOXES": 1, "DEFER": 1}}
SHAPES = ("4096x4096x4096", "8192x8192x8192")
# The grid is hgemm_tma_wgmma_balanced's (kernels/tensormap.py's balanced_grid), applied here
# to the persistent stage's own prepared launch at any configuration.


def with_grid(prep, ctas: int):
    """The same prepared launch on ``ctas`` CTAs (the kernel strides its tiles by gridDim.x)."""
    tm = prep.tensormap
    (_, block, smem) = tm.geometry
    launcher = dataclasses.replace(tm, geometry=((ctas, 1, 1), block, smem), _maps={})
    return dataclasses.replace(prep, grid=(ctas, 1, 1), tensormap=launcher)


def spread(t) -> dict | None:
    return None if t is None else {k: round(v, 4) for k, v in dataclasses.asdict(t).items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--shape", action="append", default=None)
    ap.add_argument("--dtype", action="append", default=None)
    ap.add_argument("--config", action="append", default=None, choices=sorted(CONFIGS))
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    opts = BenchOptions(runs=20, rounds=args.rounds, warmup=3)
    rows = []
    for shape_text in args.shape or SHAPES:
        shape = parse_shape(shape_text)
        for dtype in args.dtype or ("bf16", "fp16"):
            ref = prepare(reference_spec(dtype), dtype, shape)
            for name in args.config or sorted(CONFIGS):
                spec = get_spec(STAGE)
                spec = spec.with_params(**CONFIGS[name]) if CONFIGS[name] else spec
                full = prepare(spec, dtype, shape)
                tiles = -(-shape.m // spec.param_dict["BM"]) * -(-shape.n // spec.param_dict["BN"])
                ctas = balanced_grid(tiles, full.grid[0])
                row = {"stage": STAGE, "config": name, "params": spec.param_dict,
                       "shape": shape_text, "dtype": dtype, "tiles": tiles,
                       "full_ctas": full.grid[0], "balanced_ctas": ctas}
                if ctas == full.grid[0]:
                    row["note"] = "the full grid is already balanced"
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    continue
                bal = with_grid(full, ctas)
                row["verify"] = [verify(bal, 1).verdict, verify(full, 1).verdict]
                if row["verify"] == ["ok", "ok"]:
                    t = time_stage(bal, ref, opts, parent=full)
                    row.update(vs_reference=spread(t.ratio_to_reference),
                               vs_full_grid=spread(t.ratio_to_parent),
                               round_ratios_reference=list(t.round_ratios),
                               round_ratios_full=list(t.parent_round_ratios),
                               time_ms=spread(t.time_ms), reference=ref.spec.name,
                               reference_time_ms=spread(t.reference_time_ms),
                               sm_clock_mhz=spread(t.sm_clock_mhz))
                rows.append(row)
                print(json.dumps(row), flush=True)
    if args.out is not None:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
