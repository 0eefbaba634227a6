"""How fast wgmma m64nNk16 (SS, B N-major, 128B swizzle) runs at N = 128..256, no memory traffic.

    PYTHONPATH=. python3 PROBES/variants/wgmma_width.py OUT.json   (from a tree with
    column-split.patch applied, which adds hop::WgmmaPart)

benchmarks/wgmma_ceiling.py's k-tile loop (two warpgroups, four wgmmas per trip from one
ring slot) with wgmma m64nNk16 on the first N/2 registers of a 128-register accumulator,
against the ceiling's own m64n256k16 loop; two rounds. cycles_per_iter is one trip of the
loop on the multiprocessor (clock64), per_iter_over_n the same per column of N.
"""

import json
import statistics
import sys
from pathlib import Path

ROOT = Path.cwd()
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import cupy as cp  # noqa: E402
import wgmma_ceiling as wc  # noqa: E402

from perfscope.build import CompileRequest, compile_cubin  # noqa: E402
from perfscope.kernels.spec import KERNEL_DIR  # noqa: E402

EDITS = (
    ("    constexpr int MI = 256 / N;   // m64 fragments per warpgroup: the same FLOPs per trip\n"
     "    float acc[MI][N / 2];", "    constexpr int MI = 1;\n    float acc[MI][128];"),
    ("                hop::Wgmma<T, N>::mma(acc[mi], S::a_desc(slot, MI == 1 ? wg % 2 : mi, k),",
     "                hop::WgmmaPart<T, N>::mma(acc[mi], S::a_desc(slot, wg % 2, k),"),
    ("for (int j = 0; j < N / 2; ++j) acc[mi][j] = 0.f;",
     "for (int j = 0; j < 128; ++j) acc[mi][j] = 0.f;"),
)
SOURCE = wc.SOURCE
for old, new in EDITS:
    SOURCE = SOURCE.replace(old, new)
assert "WgmmaPart" in SOURCE and "acc[MI][128]" in SOURCE
WIDTHS = [128, 160, 192, 200, 224, 232, 240, 248]
FULL = "wgmma_loop<__nv_bfloat16, 2, 256>"


def build(source: str, name: str, exprs: tuple[str, ...]):
    """The module of `source` for sm_90a, hopper.cuh from perfscope/kernels."""
    return compile_cubin(CompileRequest(source=source, source_name=name, name_expressions=exprs,
                                        arch="sm_90a", include_dir=KERNEL_DIR))


def main() -> None:
    """Time every width twice, the full-width loop first in each round."""
    exprs = tuple(f"wgmma_loop<__nv_bfloat16, 2, {n}>" for n in WIDTHS)
    part, full = build(SOURCE, "wgmma_width.cu", exprs), build(wc.SOURCE, "wgmma_ceiling.cu", (FULL,))
    raw_part, raw_full = cp.RawModule(path=str(part.cubin_path)), cp.RawModule(path=str(full.cubin_path))
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    rows, iters = [], 1 << 16
    cases = [(256, raw_full.get_function(full.mangled(FULL)))]
    cases += [(n, raw_part.get_function(part.mangled(e))) for n, e in zip(WIDTHS, exprs, strict=True)]
    for rnd in range(2):
        for n, fn in cases:
            fn.max_dynamic_shared_size_bytes = wc.SMEM_BYTES
            times, _, cycles, mhz = wc.time_loop(cp, fn, sms, 256, iters, 5, 2)
            per = cycles / iters   # one trip: both warpgroups' four wgmmas
            row = dict(round=rnd, n=n, cycles_per_iter=per, per_iter_over_n=per / n,
                       ms=statistics.median(times), mhz=mhz)
            print(json.dumps(row), flush=True)
            rows.append(row)
    Path(sys.argv[1]).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
