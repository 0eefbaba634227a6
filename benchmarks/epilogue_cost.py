"""What hgemm_fused_bias_act's epilogue costs against the persistent body it shares, part by part.

    PYTHONPATH=. python3 benchmarks/epilogue_cost.py [--shape 4096x4096x4096] [--dtype bf16 ...]
        [--rounds 10] [--out FILE]

hgemm_tma_wgmma_persistent at its defaults (the same body, tile order and ring as
hgemm_fused_bias_act's defaults, with a plain store) against hgemm_fused_bias_act built from
patched copies of fused.cu (benchmarks/probed_copy.py), all timed in alternating rounds in
one process with the L2 read flush, and cuBLAS + the elementwise pass (cublas+gelu):

- ``none``: the epilogue compiled out, the plain store only (C wrong by design, not verified);
- ``constant``: + a constant per column instead of the bias, no loads (C wrong by design);
- ``bias-loaded``: + the bias, its pairs read where they are used, between the tiles with the
  tensor pipe idle (fused.cu before its HeldBias);
- ``bias-held``: + the bias held in registers from halfway through each tile's k loop (as
  committed), ACT=0;
- ``gelu-loaded``, ``gelu-held``: the same two with GELU (ACT=1, the stage's default).

Each row prints the variant's time over the plain stage's (its median over the rounds'
ratios, min-max) and its ratio to cublas+gelu. The variants that compute C are verified
against float64 first; a WRONG one is reported and not timed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from probed_copy import patched, patched_kernel_dir  # noqa: E402

from perfscope import bench, verify  # noqa: E402
from perfscope.environment import collect_environment  # noqa: E402
from perfscope.kernels import get_spec, parse_shape  # noqa: E402
from perfscope.kernels.launch import prepare  # noqa: E402
from perfscope.kernels.spec import KERNEL_DIR  # noqa: E402
from perfscope.manifest import OK  # noqa: E402
from perfscope.timing import BenchOptions, _Timer  # noqa: E402

log = logging.getLogger("epilogue_cost")
PLAIN, FUSED = "hgemm_tma_wgmma_persistent", "hgemm_fused_bias_act"

# Anchors in the committed fused.cu (BiasActEpilogue); each must stand exactly once.
_HELD = "    HeldBias<T, BN, !RESIDUAL> held;\n\n    __device__ __forceinline__ BiasActEpilogue("
_LOAD = "        if constexpr (!DEFER) held.load(kt, kt_prefetch, bias, n0, N);\n"
_APPLY = ("        apply_epilogue_held<T, ACT, RESIDUAL, BN>(acc, held, bias, residual, row0, n0, M, N);\n"
          "        hop::store_tile_staged<T, BN, BOXES>(acc, staging, tmap_c, row0, n0, bar_id);")
_STORE = "        hop::store_tile_staged<T, BN, BOXES>(acc, staging, tmap_c, row0, n0, bar_id);"
_CONSTANT = ("#pragma unroll\n        for (int j = 0; j < BN / 2; ++j) acc[j] += 0.25f * (j % 3);\n"
             + _STORE)
_LOADED = "    HeldBias<T, BN, false> held;\n\n    __device__ __forceinline__ BiasActEpilogue("
# name -> (replacements in fused.cu, ACT, verified)
VARIANTS: dict[str, tuple[tuple[tuple[str, str], ...], int, bool]] = {
    "none": (((_LOAD, ""), (_APPLY, _STORE)), 0, False),
    "constant": (((_LOAD, ""), (_APPLY, _CONSTANT)), 0, False),
    "bias-loaded": (((_HELD, _LOADED),), 0, True),
    "bias-held": ((), 0, True),
    "gelu-loaded": (((_HELD, _LOADED),), 1, True),
    "gelu-held": ((), 1, True),
}


def _variant_dir(replacements: tuple[tuple[str, str], ...]) -> Path:
    if not replacements:
        return KERNEL_DIR
    text = patched((KERNEL_DIR / "fused.cu").read_text(), replacements)
    return patched_kernel_dir({"fused.cu": text}, "epilogue-cost-")


def run(shape_text: str, dtype: str, rounds: int) -> dict:
    import cupy

    shape = parse_shape(shape_text)
    items, names, verdicts = [], [], {}
    plain = prepare(get_spec(PLAIN), dtype, shape)
    items.append(plain)
    names.append("plain")
    for name, (repl, act, checked) in VARIANTS.items():
        (job,) = bench.plan([FUSED], [dtype], shape, {"ACT": act})
        spec = dataclasses.replace(job.spec, kernel_dir=_variant_dir(repl))
        prep = prepare(spec, dtype, shape)
        verdicts[name] = verify.verify(prep, 1).verdict if checked else "not verified (by design)"
        log.info("%s %s %s: %s", shape_text, dtype, name, verdicts[name])
        if verdicts[name] in (OK, "not verified (by design)"):
            items.append(prep)
            names.append(name)
    ref = prepare(bench.reference_spec(dtype, get_spec(FUSED)), dtype, shape)
    items.append(ref)
    names.append("cublas+gelu")
    opts = BenchOptions(runs=20, rounds=rounds)
    timer = _Timer(cupy, ref, opts)
    extra = timer.extra

    def launch(fn, prep):
        # The plain stage takes no bias or residual operands.
        timer.extra = extra if prep.epilogue is not None else None
        try:
            return fn(prep)
        finally:
            timer.extra = extra

    for prep in items:
        launch(timer.warm, prep)
    times: dict[str, list[float]] = {n: [] for n in names}
    clocks: list[float] = []
    n = len(items)
    for r in range(rounds):
        for i in list(range(n))[r % n:] + list(range(n))[:r % n]:
            batch = launch(timer.batch, items[i])
            times[names[i]].append(statistics.median(batch.times_ms))
            clocks.extend(batch.clocks)
    rows = []
    for name in names[1:-1]:
        over = [a / p for a, p in zip(times[name], times["plain"], strict=True)]
        vs_ref = [g / a for a, g in zip(times[name], times["cublas+gelu"], strict=True)]
        rows.append({"variant": name, "verdict": verdicts[name],
                     "ms": round(statistics.median(times[name]), 5),
                     "time_over_plain": [round(statistics.median(over), 4), round(min(over), 4),
                                         round(max(over), 4)],
                     "ratio_to_cublas_gelu": round(statistics.median(vs_ref), 4)})
    return {"shape": shape_text, "dtype": dtype, "rounds": rounds,
            "plain_ms": round(statistics.median(times["plain"]), 5),
            "cublas_gelu_ms": round(statistics.median(times["cublas+gelu"]), 5),
            "sm_clock_mhz": ({"median": statistics.median(clocks), "min": min(clocks),
                              "max": max(clocks), "source": "nvml"} if clocks else None),
            "variants": rows,
            "not_timed": {k: v for k, v in verdicts.items() if k not in names}}


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", action="append", default=None)
    ap.add_argument("--dtype", action="append", default=None)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    results = [run(s, d, args.rounds) for s in (args.shape or ["4096x4096x4096"])
               for d in (args.dtype or ["bf16", "fp16"])]
    for res in results:
        print(f"{res['dtype']} {res['shape']}: plain {res['plain_ms']:.4f} ms, "
              f"cublas+gelu {res['cublas_gelu_ms']:.4f} ms")
        for row in res["variants"]:
            lo, hi = row["time_over_plain"][1:]
            print(f"  {row['variant']:12s} {row['time_over_plain'][0]:.4f}x the plain stage's time "
                  f"({lo:.4f}-{hi:.4f}), {row['ratio_to_cublas_gelu']:.3f}x cublas+gelu")
    if args.out:
        doc = {"schema": "perfscope.epilogue-cost/1", "command": "PYTHONPATH=. python3 "
               + " ".join(sys.argv), "environment": dataclasses.asdict(collect_environment()),
               "results": results}
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
