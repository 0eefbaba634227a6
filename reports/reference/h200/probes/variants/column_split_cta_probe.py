"""Which of the column split's CTAs pay for straddling rows: per-unit %globaltimer probes.
(Written 2026-12-05; not yet run.)

    PYTHONPATH=. python3 PROBES/variants/column_split_cta_probe.py OUT.json   (from a tree
    with column-split.patch applied; `--check` only builds both kernels)

The split's reports (probes/column-split-h200 against -aligned-h200) put its busiest SM 12.4%
above the aligned kernel's and its average SM 7.3%: the straddling rows cost some CTAs far
more than others, which cuBLAS's and Triton's uniform straddling (A at lda 4040) does not
show. This probe says which. hgemm_tma_wgmma_persistent at STREAMK=4 (bf16, 4096^3 and
8192^3), its pieces as they are and with each piece's first column rounded down to 64
(column_split_align_probe.aligned_kernels' edit: the same widths and math, aligned boxes, a
wrong C), compiled from a copy of the kernels with the first consumer thread reading
%globaltimer at each unit's start, after its k loop (last wgmma done, slot released) and
after its store, with the unit's first column and width. Each form runs three launches
after a warm-up; the probes are the last launch's.

Written per CTA and unit: start, math end, end (ns from the first CTA's start), n0, width.
Printed per form: the end of the busiest and the median CTA, whole tiles' and pieces' math
per k tile (medians), and the pieces' math per k tile by n0's offset inside its 64-column
atom (0 = aligned), which is the question: if the cost is per straddling row it does not
depend on the offset; if some offsets (or the last piece, whose boxes run past N) pay more,
PS106's per-request model cannot be made general.
"""

import dataclasses
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from perfscope.kernels import get_spec
from perfscope.kernels.launch import compile_stage, output_array, prepare
from perfscope.kernels.spec import KERNEL_DIR, parse_shape
from perfscope.verify import make_inputs

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[5] / "benchmarks"))
from column_split_align_probe import ANCHOR
from probed_copy import patched, patched_kernel_dir

UNITS = 8   # probe rows per CTA (3-4 tiles and at most 2 pieces at these shapes)
PROBE_DECL = ('extern "C" __device__ unsigned long long ps_probe[160][8][5];\n'
              '__device__ __forceinline__ unsigned long long ps_gtime() { unsigned long long t; '
              'asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }\n')
_START = ("        const auto compute = [&](int tile, int k0, int k1) {\n"
          "            int m0, n0, w;\n            origin(tile, m0, n0, w);\n")
_START_PROBED = ("        int unit_no = 0;\n" + _START.replace(
    "            int m0, n0, w;\n", "            const unsigned long long t_start = ps_gtime();\n"
    "            int m0, n0, w;\n"))
_MATH = ("            wgmma_wait<0>();\n            ring.release(it - 1);\n"
         "            if constexpr (STREAMK != 0 && STREAMK != 4) {\n")
_MATH_PROBED = _MATH.replace("            if constexpr (STREAMK != 0 && STREAMK != 4) {\n",
                             "            const unsigned long long t_math = ps_gtime();\n"
                             "            if constexpr (STREAMK != 0 && STREAMK != 4) {\n")
_END = ("                epi.store(acc, staging, tmap_c, row0, n0, M, N, 1 + half);\n"
        "            }\n        };\n        for_each_pair_unit<CLUSTER, STREAMK>")
_END_PROBED = _END.replace(
    "            }\n        };\n",
    "            }\n"
    "            if (tid == 128 && unit_no < 8) {\n"
    "                auto* q = ps_probe[blockIdx.x][unit_no];\n"
    "                q[0] = t_start; q[1] = t_math; q[2] = ps_gtime();\n"
    "                q[3] = static_cast<unsigned long long>(n0);\n"
    "                q[4] = static_cast<unsigned long long>(w);\n"
    "            }\n"
    "            ++unit_no;\n"
    "        };\n")
SHAPES = ("4096x4096x4096", "8192x8192x8192")


def probed_kernels(aligned: bool) -> Path:
    """A copy of the kernels with the probes, and the pieces aligned when asked."""
    edits = [('#include "tma.cuh"\n', '#include "tma.cuh"\n' + PROBE_DECL),
             (_START, _START_PROBED), (_MATH, _MATH_PROBED), (_END, _END_PROBED)]
    if aligned:
        edits.append((ANCHOR, ANCHOR + "        n0 = n0 / 64 * 64;\n"))
    text = patched((KERNEL_DIR / "hopper.cuh").read_text(), edits)
    return patched_kernel_dir({"hopper.cuh": text}, "cta-probe-")


def summary(rows: list, kt: int) -> dict:
    """Medians and extremes (us) of one form's last launch."""
    units = [u for cta in rows for u in cta if u[0]]
    t0 = min(u[0] for u in units)
    ends = sorted(max(u[2] for u in cta if u[0]) - t0 for cta in rows if any(u[0] for u in cta))
    whole = [(u[1] - u[0]) / 1e3 / kt for u in units if u[4] == 256]
    by_offset = defaultdict(list)
    for u in units:
        if u[4] != 256:
            by_offset[int(u[3]) % 64].append((u[1] - u[0]) / 1e3 / kt)
    med = statistics.median
    return {"busiest_end_us": ends[-1] / 1e3, "median_end_us": med(ends) / 1e3,
            "whole_us_per_k_tile": med(whole),
            "pieces": sum(len(v) for v in by_offset.values()),
            "piece_us_per_k_tile_by_offset": {k: [len(v), med(v), max(v)]
                                              for k, v in sorted(by_offset.items())}}


def main() -> None:
    """Both forms at both shapes, or with --check only their builds (no GPU needed)."""
    base = get_spec("hgemm_tma_wgmma_persistent").with_params(STREAMK=4)
    forms = {name: dataclasses.replace(base, kernel_dir=probed_kernels(name == "aligned"))
             for name in ("split", "aligned")}
    if "--check" in sys.argv:
        for name, spec in forms.items():
            compile_stage(spec, "bf16", "sm_90a")
            print(name, "compiled for sm_90a")
        return
    import cupy as cp

    out: dict = {"cases": {}}
    for name, spec in forms.items():
        for text in SHAPES:
            prep = prepare(spec, "bf16", parse_shape(text))
            a, b = make_inputs(cp, prep.shape, "bf16", seed=1)
            c = output_array(cp, prep)
            buf = cp.ndarray((160, UNITS, 5), dtype=cp.uint64,
                             memptr=prep.raw_module.get_global("ps_probe"))
            for _ in range(4):
                buf[...] = 0
                prep.launch(a, b, c)
            cp.cuda.get_current_stream().synchronize()
            rows = cp.asnumpy(buf[: prep.grid[0]]).tolist()
            s = summary(rows, -(-prep.shape.k // 64))
            key = f"{text}-{name}"
            out["cases"][key] = {"summary": s, "probe": rows}
            print(key, json.dumps(s), flush=True)
    Path(sys.argv[1]).write_text(json.dumps(out))


if __name__ == "__main__":
    main()
