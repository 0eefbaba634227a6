"""Where hgemm_small_m's time goes: per-CTA %globaltimer probes against a bulk read.

    PYTHONPATH=. python3 benchmarks/small_m_probe.py [--against-source OLD_FUSED_CU]
                                                     [--dtype bf16] [--out FILE.json]

Builds hgemm_small_m from fused.cu with six probes added (every CTA's start, its first
ring of loads issued, its first k tile landed, its last k tile done, its epilogue's start,
its end: `%globaltimer`, ns, resolution about 0.25 us on the H200) and times it as bench
does (read flush before each launch, CUDA events), beside fused_check's bulk read of the
same bytes with the same probes at its start and end. The events minus the span from the
first CTA's start to the last one's end is what the launch costs outside the CTAs.

With ``--against-source`` (a fused.cu of another revision, e.g. ``git show
c04db22:perfscope/kernels/fused.cu > old.cu``; the probes' anchors hold from c04db22 on)
the two kernels run in alternating rounds in one process on the same operands, and the
script reports the time ratio and whether their outputs are bit-identical. GPU only; the
probe patch itself (``patch_probes``) is tested on the CPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import re
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from perfscope.build import CompileRequest, compile_cubin  # noqa: E402
from perfscope.kernels import Shape, get_spec  # noqa: E402
from perfscope.kernels.fused_specs import small_m_for  # noqa: E402
from perfscope.kernels.spec import KERNEL_DIR  # noqa: E402

log = logging.getLogger("small_m_probe")

SHAPES = ((16, 8192, 8192), (16, 4096, 4096), (64, 4096, 14336), (16, 14336, 4096),
          (64, 4096, 4096), (64, 8192, 8192), (256, 8192, 8192), (256, 4096, 4096))
PHASES = ("start", "first loads issued", "first k tile landed", "last k tile done",
          "epilogue start", "end")
SLOTS = 2048   # probe rows per phase: CTAs of one launch
PROBE_DECL = r"""
__device__ unsigned long long ps_probe[6][2048];
__device__ __forceinline__ unsigned long long ps_gtime() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
"""
# (pattern, replacement) pairs; each pattern must match exactly once. Alternatives in one
# pattern cover fused.cu before and after the early ring (c04db22 and later).
_PATCHES = (
    (r"(template <typename T, int BM, int BN, int BK, int STAGES, int ACT, int RESIDUAL, "
     r"int AROWS,\n\s+int MCAST>\n__global__)", PROBE_DECL + r"\1"),
    (r"(    const int nk = KT \* static_cast<int>\(rank \+ 1\) / static_cast<int>\(splits\) "
     r"- kt0;\n)",
     r"\1    const int ps_cta = blockIdx.y * gridDim.x + blockIdx.x;\n"
     r"    if (tid == 0) ps_probe[0][ps_cta] = ps_gtime();\n"),
    (r"(        for \(int i = 0; i < early; \+\+i\) issue\(i\);\n|"
     r"            // Slot s, round r >= 1 waits for the consumers' \(r-1\)-th release of it\.\n)",
     r"\1            ps_probe[1][ps_cta] = ps_gtime();\n"),
    (r"(            wgmma_wait<1>\(\);   // the group before this one has read its slot: free it\n)",
     r"\1            if (i == 0 && ct == 0) ps_probe[2][ps_cta] = ps_gtime();\n"),
    (r"(        wgmma_wait<0>\(\);\n)(        // Every consumer's wgmmas are done with the ring)",
     r"\1        if (ct == 0) ps_probe[3][ps_cta] = ps_gtime();\n\2"),
    (r"(        if \(rank == 0\) \{\n#pragma unroll\n            for \(int mi = 0; mi < MI; \+\+mi\) "
     r"\{\n                const int f = c \* MI \+ mi;)",
     r"        if (ct == 0) ps_probe[4][ps_cta] = ps_gtime();\n\1"),
    (r"(            if \(tid % 128 == 0\) tma::store_wait_\w+(?:<0>)?\(\);\n        \}\n)"
     r"(    \}\n\}\n\n// =+ fused stage 3)",
     r"\1        if (ct == 0) ps_probe[5][ps_cta] = ps_gtime();\n\2"),
)


def patch_probes(source: str) -> str:
    """fused.cu with hgemm_small_m's six probes; a ValueError names an anchor that is not
    there exactly once."""
    for pattern, repl in _PATCHES:
        found = len(re.findall(pattern, source))
        if found != 1:
            raise ValueError(f"probe anchor found {found} times, not once: {pattern[:60]}...")
        source = re.sub(pattern, repl, source)
    return source


def probe_bulk_source(bulk_source: str) -> str:
    """fused_check's bulk read with a probe at each CTA's start and end."""
    head = "bulk_stream(const unsigned char* src, long long chunks, unsigned* out) {\n"
    tail = "    if (acc == 0x9E3779B9u) out[0] = acc;\n}"
    for part in (head, tail, '#include "tma.cuh"\n'):
        if bulk_source.count(part) != 1:
            raise ValueError(f"bulk read anchor not found once: {part.strip()[:40]}")
    start = "    if (threadIdx.x == 0) ps_probe[0][blockIdx.x] = ps_gtime();\n"
    return (bulk_source.replace(head, head + start)
            .replace(tail, "    ps_probe[5][blockIdx.x] = ps_gtime();\n" + tail)
            .replace('#include "tma.cuh"\n', '#include "tma.cuh"\n' + PROBE_DECL))


def _phases(cp, probe, ctas: int) -> dict[str, dict[str, float]]:
    """Each phase's min / median / max over the CTAs, us after the first CTA's start."""
    import numpy as np

    p = cp.asnumpy(probe)[:, :ctas].astype(np.float64)
    t0 = p[0].min()
    return {name: {"min": round(float((row.min() - t0) / 1e3), 3),
                   "median": round(float((np.median(row) - t0) / 1e3), 3),
                   "max": round(float((row.max() - t0) / 1e3), 3)}
            for name, row in zip(PHASES, p, strict=True) if row.any()}


class Probed:
    """hgemm_small_m built from a probed source, launched as perfscope launches it."""

    def __init__(self, cp, source: str, shape: Shape, dtype: str, tmp: Path) -> None:
        from perfscope.kernels.launch import prepare

        self.spec = small_m_for(get_spec("hgemm_small_m"), shape)
        base = prepare(self.spec, dtype, shape)
        for header in ("hopper.cuh", "tma.cuh", "activation.cuh"):
            (tmp / header).write_text((KERNEL_DIR / header).read_text())
        expr = self.spec.name_expression(dtype)
        mod = compile_cubin(CompileRequest(patch_probes(source), "fused.cu", (expr,), "sm_90a",
                                           self.spec.flags, tmp))
        self.raw = cp.RawModule(path=str(mod.cubin_path))
        fn = self.raw.get_function(mod.mangled(expr))
        fn.max_dynamic_shared_size_bytes = base.dynamic_smem
        launcher = dataclasses.replace(base.tensormap, function=fn.kernel.ptr, _maps={})
        self.prep = dataclasses.replace(base, function=fn, raw_module=self.raw, tensormap=launcher)
        self.probe = cp.ndarray((6, SLOTS), dtype=cp.uint64, memptr=self.raw.get_global("ps_probe"))
        self.ctas = self.prep.grid[0] * self.prep.grid[1] * self.prep.grid[2]


def run_shape(cp, sources: dict[str, str], shape: Shape, dtype: str, flush) -> dict:
    """Both (or the one) probed kernels on one shape: alternating rounds of 10 launches, the
    first round a warm-up; the probes of each one's last launch."""
    import ml_dtypes
    import numpy as np

    from perfscope.kernels.epilogue import EpilogueOperands

    nd = ml_dtypes.bfloat16 if dtype == "bf16" else np.float16
    rng = np.random.default_rng(19)
    a = cp.asarray((rng.standard_normal((shape.m, shape.k)) / 64).astype(np.float32)).astype(nd)
    b = cp.asarray(rng.standard_normal((shape.k, shape.n)).astype(np.float32)).astype(nd)
    extra = EpilogueOperands(cp.asarray(rng.standard_normal(shape.n).astype(np.float32)).astype(nd))
    ev0, ev1 = cp.cuda.Event(), cp.cuda.Event()
    with tempfile.TemporaryDirectory() as d:
        kernels = {}
        for key, src in sources.items():
            (Path(d) / key).mkdir()
            kernels[key] = Probed(cp, src, shape, dtype, Path(d) / key)
        outs = {key: cp.zeros((shape.m, shape.n), dtype=nd) for key in kernels}
        times: dict[str, list[float]] = {key: [] for key in kernels}
        order = list(kernels)
        for rnd in range(6):
            for key in (order if rnd % 2 == 0 else order[::-1]):
                k = kernels[key]
                for _ in range(10):
                    k.probe.fill(0)
                    flush()
                    ev0.record()
                    k.prep.launch(a, b, outs[key], extra)
                    ev1.record()
                    ev1.synchronize()
                    if rnd > 0:
                        times[key].append(cp.cuda.get_elapsed_time(ev0, ev1) * 1e3)
        row = {"shape": f"{shape.m}x{shape.n}x{shape.k}", "dtype": dtype,
               "params": kernels[order[0]].spec.param_dict, "grid": list(kernels[order[0]].prep.grid)}
        for key, k in kernels.items():
            row[key] = {"event_us_median": round(statistics.median(times[key]), 3),
                        "phases_us": _phases(cp, k.probe, k.ctas)}
        if "against" in kernels:
            row["time_ratio"] = round(row["current"]["event_us_median"]
                                      / row["against"]["event_us_median"], 4)
            row["bit_identical"] = bool(cp.all(outs["current"].view(cp.uint16)
                                               == outs["against"].view(cp.uint16)))
    return row


def run_bulk(cp, nbytes: int, flush) -> dict:
    """fused_check's bulk read of nbytes with start and end probes (12 launches, 2 warm-up)."""
    import fused_check as fc
    import numpy as np

    mod = compile_cubin(CompileRequest(probe_bulk_source(fc.BULK_SOURCE), "probe_bulk.cu",
                                       (fc.BULK_EXPR,), "sm_90a", (), KERNEL_DIR))
    raw = cp.RawModule(path=str(mod.cubin_path))
    fn = raw.get_function(mod.mangled(fc.BULK_EXPR))
    smem = fc.BULK_STAGES * fc.BULK_CHUNK
    fn.max_dynamic_shared_size_bytes = smem
    buf, sink = cp.ones(nbytes // 4, dtype=cp.uint32), cp.zeros(1, dtype=cp.uint32)
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    probe = cp.ndarray((6, SLOTS), dtype=cp.uint64, memptr=raw.get_global("ps_probe"))
    ev0, ev1 = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for _ in range(12):
        probe.fill(0)
        flush()
        ev0.record()
        fn((sms,), (32,), (buf, np.int64(nbytes // fc.BULK_CHUNK), sink), shared_mem=smem)
        ev1.record()
        ev1.synchronize()
        times.append(cp.cuda.get_elapsed_time(ev0, ev1) * 1e3)
    return {"bytes": nbytes, "event_us_median": round(statistics.median(times[2:]), 3),
            "phases_us": _phases(cp, probe, sms)}


def _line(key: str, r: dict) -> str:
    ph = r["phases_us"]
    span = ph["end"]["max"]
    return (f"  {key:8s} events {r['event_us_median']:7.2f} us, CTA span {span:6.2f} us; "
            + ", ".join(f"{name} {v['median']:.2f}" for name, v in ph.items() if name != "start"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against-source", type=Path, help="a fused.cu to compare with")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    ap.add_argument("--out", type=Path, help="write the rows as JSON")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    sources = {"current": (KERNEL_DIR / "fused.cu").read_text()}
    if args.against_source is not None:
        try:
            sources["against"] = args.against_source.read_text()
        except OSError as exc:
            print(f"small_m_probe: cannot read {args.against_source}: {exc}", file=sys.stderr)
            return 2
    try:
        for src in sources.values():
            patch_probes(src)
    except ValueError as exc:
        print(f"small_m_probe: {exc}", file=sys.stderr)
        return 2
    import cupy as cp

    from perfscope.timing import L2Flush

    flush = L2Flush(cp, 512 << 20, "read")
    doc = {"schema": "perfscope.small-m-probe/1", "command": " ".join(sys.argv),
           "phases": PHASES, "bulk": [], "rows": []}
    for nbytes in (32 << 20, 128 << 20):
        r = run_bulk(cp, nbytes, flush)
        doc["bulk"].append(r)
        print(f"bulk read {nbytes >> 20} MiB:")
        print(_line("read", r))
    for m, n, k in SHAPES:
        row = run_shape(cp, sources, Shape(m, n, k), args.dtype, flush)
        doc["rows"].append(row)
        extra = (f": current/against time {row['time_ratio']:.3f}, bit-identical "
                 f"{row['bit_identical']}") if "time_ratio" in row else ""
        print(f"hgemm_small_m {args.dtype} {row['shape']} grid {row['grid']}{extra}")
        for key in sources:
            print(_line(key, row[key]))
    ratios = [r["time_ratio"] for r in doc["rows"] if "time_ratio" in r]
    if ratios:
        doc["time_ratio_median"] = round(statistics.median(ratios), 4)
        print(f"current/against time: median {doc['time_ratio_median']:.3f}, "
              f"{min(ratios):.3f}-{max(ratios):.3f} over {len(ratios)} shapes")
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
