"""Where hgemm_small_m's time goes: per-CTA %globaltimer probes against a bulk read.

    PYTHONPATH=. python3 benchmarks/small_m_probe.py [--against-source OLD_FUSED_CU] [--launch-paths | --ramp]
                                                     [--dtype bf16] [--out FILE.json]

Builds hgemm_small_m from fused.cu with six probes added (every CTA's start, its first
ring of loads issued, its first k tile landed, its last k tile done, its epilogue's start,
its end: `%globaltimer`, ns, resolution about 0.25 us on the H200) and times it as bench
does (read flush before each launch, CUDA events), beside fused_check's bulk read of the
same bytes with the same probes at its start and end. Each phase is reported over the CTAs
(min / median / max after the first CTA's start), and each CTA's own spans between them
(ramp, stream, reduction, epilogue: ``per_cta_us``). The events minus the span from the
first CTA's start to the last one's end is what the launch costs outside the CTAs;
``--launch-paths`` (instead of the rest) times that for the same bulk read launched four ways (cupy's
cuLaunchKernel; perfscope's cuLaunchKernelEx; with three __grid_constant__ tensor maps; with
256 threads) beside hgemm_small_m at 16x8192x8192, in interleaved repeats. ``--ramp``
(instead of the rest) takes the first microsecond apart: clock64 in the producer thread at
its start, after the barriers' init and fence, after the tensor maps' prefetch, after the
first k tile's loads are issued and after the whole first ring's, and in the first consumer
thread once the first k tile has landed (the same SM's counter, so cycle-exact), with
%globaltimer at the start and at the landing for the clock.

``--param K=V`` pins a template parameter over the host's choice; ``--param PACKED=1``
probes hgemm_small_m_packed instead (B packed into its strips once, before the launches).

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
from perfscope.errors import PerfscopeError  # noqa: E402
from perfscope.kernels import Shape, get_spec  # noqa: E402
from perfscope.kernels.fused_specs import SMALL_M_PACKED, small_m_for  # noqa: E402
from perfscope.kernels.spec import KERNEL_DIR, parse_params, parse_shape  # noqa: E402

log = logging.getLogger("small_m_probe")

SHAPES = ((16, 8192, 8192), (16, 4096, 4096), (64, 4096, 14336), (16, 14336, 4096),
          (64, 4096, 4096), (64, 8192, 8192), (256, 8192, 8192), (256, 4096, 4096))
PHASES = ("start", "first loads issued", "first k tile landed", "last k tile done",
          "epilogue start", "end")
SLOTS = 2048   # probe rows per phase: CTAs of one launch
_GTIME = r"""
__device__ __forceinline__ unsigned long long ps_gtime() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
"""
PROBE_DECL = "\n__device__ unsigned long long ps_probe[6][2048];" + _GTIME
# (pattern, replacement) pairs; each pattern must match exactly once. Alternatives in one
# pattern cover fused.cu before and after the early ring (c04db22 and later).
_PATCHES = (
    (r"(template <typename T, int BM, int BN, int BK, int STAGES, int ACT, int RESIDUAL, "
     r"int AROWS,\n\s+int MCAST(?:, int MPAIR)?(?:, int GSPLIT)?(?:, int PACKED = 0)?>\n"
     r"__global__)", PROBE_DECL + r"\1"),
    (r"(    const int nk = KT \* static_cast<int>\(rank \+ 1\) / static_cast<int>\(splits\) "
     r"- kt0;\n|    const int nk = KT \* \(part \+ 1\) / parts - kt0;\n)",
     r"\1    const int ps_cta = blockIdx.y * gridDim.x + blockIdx.x;\n"
     r"    if (tid == 0) ps_probe[0][ps_cta] = ps_gtime();\n"),
    (r"(        for \(int i = 0; i < early; \+\+i\) issue\(i(?:, OWN)?\);\n|"
     r"            // Slot s, round r >= 1 waits for the consumers' \(r-1\)-th release of it\.\n)",
     r"\1            ps_probe[1][ps_cta] = ps_gtime();\n"),
    (r"(            wgmma_wait<1>\(\);   // the group before this one has read its slot: free it\n)",
     r"\1            if (i == 0 && ct == 0) ps_probe[2][ps_cta] = ps_gtime();\n"),
    (r"(        wgmma_wait<0>\(\);\n)(        // Every consumer's wgmmas are done with the ring)",
     r"\1        if (ct == 0) ps_probe[3][ps_cta] = ps_gtime();\n\2"),
    (r"(        if \(rank == 0\) \{\n#pragma unroll\n            for \(int mi = 0; mi < MI; \+\+mi\) "
     r"\{\n                const int f = c \* MI \+ mi;|"
     r"        // The owned units: bias / activation / residual)",
     r"        if (ct == 0) ps_probe[4][ps_cta] = ps_gtime();\n\1"),
    (r"((?:            )?        if \(tid % 128 == 0\) tma::store_wait_\w+(?:<0>)?\(\);\n(?:        \}\n)?"
     r"(?:        //[^\n]*\n)*(?:        if \(splits == 1 && ctas > 1\)[^\n]*\n)?"
     r"(?:        if \(push\)[^\n]*\n)?)"
     r"(    \}\n\}\n\n// =+ fused stage 3)",
     r"\1        if (ct == 0) ps_probe[5][ps_cta] = ps_gtime();\n\2"),
)


def _patched(source: str, patches, what: str) -> str:
    """source with each (pattern, replacement) applied; a ValueError names an anchor that
    is not there exactly once."""
    for pattern, repl in patches:
        found = len(re.findall(pattern, source))
        if found != 1:
            raise ValueError(f"{what} anchor found {found} times, not once: {pattern[:60]}...")
        source = re.sub(pattern, repl, source)
    return source


def patch_probes(source: str) -> str:
    """fused.cu with hgemm_small_m's six probes; a ValueError names an anchor that is not
    there exactly once."""
    return _patched(source, _PATCHES, "probe")


RAMP_STEPS = ("barriers initialised", "tensor maps prefetched", "first k tile issued",
              "first ring issued", "first k tile landed")
RAMP_DECL = "\n__device__ unsigned long long ps_ramp[8][2048];" + _GTIME
# Rows of ps_ramp: 0 the producer's start, 1-4 RAMP_STEPS[:4] (clock64), 5 the landing
# (clock64, first consumer thread), 6 and 7 %globaltimer at the start and at the landing.
_RAMP_PATCHES = (
    (_PATCHES[0][0], RAMP_DECL + r"\1"),
    (_PATCHES[1][0],
     r"\1    const int ps_cta = blockIdx.y * gridDim.x + blockIdx.x;\n"
     r"    if (tid == 0) { ps_ramp[0][ps_cta] = clock64(); ps_ramp[6][ps_cta] = ps_gtime(); }\n"),
    (r"(        tma::mbar_init_fence\(\);\n)(        tma::prefetch_tmap\(&tmap_a\);\n"
     r"        tma::prefetch_tmap\(&tmap_b\);\n        tma::prefetch_tmap\(&tmap_c\);\n)"
     r"        for \(int i = 0; i < early; \+\+i\) issue\(i\);\n",
     r"\1        ps_ramp[1][ps_cta] = clock64();\n\2        ps_ramp[2][ps_cta] = clock64();\n"
     r"        for (int i = 0; i < early; ++i) {\n            issue(i);\n"
     r"            if (i == 0) ps_ramp[3][ps_cta] = clock64();\n        }\n"
     r"        ps_ramp[4][ps_cta] = clock64();\n"),
    (_PATCHES[3][0],
     r"\1            if (i == 0 && ct == 0) { ps_ramp[5][ps_cta] = clock64(); "
     r"ps_ramp[7][ps_cta] = ps_gtime(); }\n"),
)


def patch_ramp(source: str) -> str:
    """fused.cu with hgemm_small_m's ramp probes (--ramp); a ValueError names an anchor
    that is not there exactly once."""
    return _patched(source, _RAMP_PATCHES, "ramp")


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


_BULK_HEAD = ("template <int STAGES, int CHUNK>\n__global__ void __launch_bounds__(32, 1)\n"
              "bulk_stream(const unsigned char* src, long long chunks, unsigned* out) {\n")
_TM_HEAD = ("template <int STAGES, int CHUNK, int THREADS>\n__global__ void __launch_bounds__(THREADS, 1)\n"
            "bulk_tm(const __grid_constant__ TensorMap2D ta, const __grid_constant__ TensorMap2D tb,\n"
            "        const __grid_constant__ TensorMap2D tc, const unsigned char* src, long long chunks,\n"
            "        unsigned* out) {\n")


def launch_variants_source(bulk_source: str) -> str:
    """The probed bulk read and a copy of it, bulk_tm<STAGES, CHUNK, THREADS>, that also takes
    three tensor maps as __grid_constant__ parameters (unused) and THREADS threads of which
    one works: what a tensor-map stage's launch adds, without its work."""
    probed = probe_bulk_source(bulk_source)
    if probed.count(_BULK_HEAD) != 1:
        raise ValueError("bulk read kernel header not found once")
    kernel = probed[probed.index(_BULK_HEAD):]
    return probed + "\n" + kernel.replace(_BULK_HEAD, _TM_HEAD)


def _phases(cp, probe, ctas: int) -> dict[str, dict[str, float]]:
    """Each phase's min / median / max over the CTAs, us after the first CTA's start."""
    import numpy as np

    p = cp.asnumpy(probe)[:, :ctas].astype(np.float64)
    t0 = p[0].min()
    return {name: {"min": round(float((row.min() - t0) / 1e3), 3),
                   "median": round(float((np.median(row) - t0) / 1e3), 3),
                   "max": round(float((row.max() - t0) / 1e3), 3)}
            for name, row in zip(PHASES, p, strict=True) if row.any()}


# Per CTA, the time between two of its own probes: (name, from phase, to phase).
SPANS = (("ramp", "start", "first k tile landed"),
         ("stream", "first k tile landed", "last k tile done"),
         ("reduction", "last k tile done", "epilogue start"),
         ("epilogue", "epilogue start", "end"),
         ("whole", "start", "end"))


def _spans(cp, probe, ctas: int) -> dict[str, dict[str, float]]:
    """Each SPANS span's min / median / max over the CTAs, us, where the CTAs recorded both
    of its phases: a CTA's own durations, which the phases' medians (each over all CTAs)
    do not give."""
    import numpy as np

    p = cp.asnumpy(probe)[:, :ctas].astype(np.float64)
    rows = {name: row for name, row in zip(PHASES, p, strict=True) if row.any()}
    out = {}
    for name, a, b in SPANS:
        if a not in rows or b not in rows:
            continue
        # Only the CTAs that recorded both ends (a split's part that skips the epilogue
        # records no epilogue start).
        both = (rows[a] > 0) & (rows[b] > 0)
        if not both.any():
            continue
        d = (rows[b][both] - rows[a][both]) / 1e3
        out[name] = {"min": round(float(d.min()), 3), "median": round(float(np.median(d)), 3),
                     "max": round(float(d.max()), 3)}
    return out


class Probed:
    """hgemm_small_m built from a probed source, launched as perfscope launches it
    (hgemm_small_m_packed where ``PACKED=1`` is pinned: B from its strips, ``weight``)."""

    def __init__(self, cp, source: str, shape: Shape, dtype: str, tmp: Path,
                 pinned: dict[str, int] | None = None, ramp: bool = False) -> None:
        from perfscope.kernels.launch import prepare

        pinned = pinned or {}
        stage = SMALL_M_PACKED if pinned.get("PACKED") else "hgemm_small_m"
        self.spec = small_m_for(get_spec(stage).with_params(**pinned), shape, pinned)
        base = prepare(self.spec, dtype, shape)
        for header in ("hopper.cuh", "tma.cuh", "activation.cuh"):
            (tmp / header).write_text((KERNEL_DIR / header).read_text())
        expr = self.spec.name_expression(dtype)
        patched = patch_ramp(source) if ramp else patch_probes(source)
        mod = compile_cubin(CompileRequest(patched, "fused.cu", (expr,), "sm_90a",
                                           self.spec.flags, tmp))
        self.raw = cp.RawModule(path=str(mod.cubin_path))
        fn = self.raw.get_function(mod.mangled(expr))
        fn.max_dynamic_shared_size_bytes = base.dynamic_smem
        launcher = dataclasses.replace(base.tensormap, function=fn.kernel.ptr, _maps={})
        self.prep = dataclasses.replace(base, function=fn, raw_module=self.raw, tensormap=launcher)
        self.probe = (cp.ndarray((8, SLOTS), dtype=cp.uint64, memptr=self.raw.get_global("ps_ramp"))
                      if ramp else
                      cp.ndarray((6, SLOTS), dtype=cp.uint64, memptr=self.raw.get_global("ps_probe")))
        self.ctas = self.prep.grid[0] * self.prep.grid[1] * self.prep.grid[2]

    def weight(self, b):
        """B as this kernel takes it (packed once for hgemm_small_m_packed)."""
        return self.prep.weight(b)


def _operands(cp, shape: Shape, dtype: str):
    """Seeded (19) A / 64, B and a bias for the shape on the GPU, and their element type."""
    import ml_dtypes
    import numpy as np

    from perfscope.kernels.epilogue import EpilogueOperands

    nd = ml_dtypes.bfloat16 if dtype == "bf16" else np.float16
    rng = np.random.default_rng(19)
    a = cp.asarray((rng.standard_normal((shape.m, shape.k)) / 64).astype(np.float32)).astype(nd)
    b = cp.asarray(rng.standard_normal((shape.k, shape.n)).astype(np.float32)).astype(nd)
    extra = EpilogueOperands(cp.asarray(rng.standard_normal(shape.n).astype(np.float32)).astype(nd))
    return a, b, extra, nd


def _timed_launch(cp, probe, launch, flush) -> float:
    """One launch after the L2 flush, its probes cleared first: its CUDA-event time, us."""
    ev0, ev1 = cp.cuda.Event(), cp.cuda.Event()
    probe.fill(0)
    flush()
    ev0.record()
    launch()
    ev1.record()
    ev1.synchronize()
    return cp.cuda.get_elapsed_time(ev0, ev1) * 1e3


def _bulk_module(cp, source: str, name: str, exprs: tuple[str, ...]):
    """The probed bulk read's kernels of `source` (name -> function, their ring's dynamic
    shared memory allowed), the module's probe array and the module."""
    import fused_check as fc

    mod = compile_cubin(CompileRequest(source, name, exprs, "sm_90a", (), KERNEL_DIR))
    raw = cp.RawModule(path=str(mod.cubin_path))
    fns = {e: raw.get_function(mod.mangled(e)) for e in exprs}
    for fn in fns.values():
        fn.max_dynamic_shared_size_bytes = fc.BULK_STAGES * fc.BULK_CHUNK
    # The module too: the caller holds it while it uses the probe array, the module's global.
    return fns, cp.ndarray((6, SLOTS), dtype=cp.uint64, memptr=raw.get_global("ps_probe")), raw


def run_shape(cp, sources: dict[str, str], shape: Shape, dtype: str, flush,
              pinned: dict[str, int] | None = None) -> dict:
    """Both (or the one) probed kernels on one shape (the host's configuration, with `pinned`
    parameters over it): alternating rounds of 10 launches, the first round a warm-up; the
    probes of each one's last launch."""
    a, b, extra, nd = _operands(cp, shape, dtype)
    with tempfile.TemporaryDirectory() as d:
        kernels = {}
        for key, src in sources.items():
            (Path(d) / key).mkdir()
            kernels[key] = Probed(cp, src, shape, dtype, Path(d) / key, pinned)
        outs = {key: cp.zeros((shape.m, shape.n), dtype=nd) for key in kernels}
        weights = {key: k.weight(b) for key, k in kernels.items()}
        times: dict[str, list[float]] = {key: [] for key in kernels}
        order = list(kernels)
        for rnd in range(6):
            for key in (order if rnd % 2 == 0 else order[::-1]):
                k = kernels[key]
                for _ in range(10):
                    t = _timed_launch(cp, k.probe,
                                      lambda k=k, key=key: k.prep.launch(a, weights[key], outs[key],
                                                                         extra), flush)
                    if rnd > 0:
                        times[key].append(t)
        row = {"shape": f"{shape.m}x{shape.n}x{shape.k}", "dtype": dtype,
               "params": kernels[order[0]].spec.param_dict, "grid": list(kernels[order[0]].prep.grid)}
        for key, k in kernels.items():
            row[key] = {"event_us_median": round(statistics.median(times[key]), 3),
                        "phases_us": _phases(cp, k.probe, k.ctas),
                        "per_cta_us": _spans(cp, k.probe, k.ctas)}
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

    fns, probe, _raw = _bulk_module(cp, probe_bulk_source(fc.BULK_SOURCE), "probe_bulk.cu",
                                    (fc.BULK_EXPR,))
    fn = fns[fc.BULK_EXPR]
    smem = fc.BULK_STAGES * fc.BULK_CHUNK
    buf, sink = cp.ones(nbytes // 4, dtype=cp.uint32), cp.zeros(1, dtype=cp.uint32)
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    times = [_timed_launch(cp, probe, lambda: fn((sms,), (32,), (buf, np.int64(nbytes // fc.BULK_CHUNK),
                                                                 sink), shared_mem=smem), flush)
             for _ in range(12)]
    return {"bytes": nbytes, "event_us_median": round(statistics.median(times[2:]), 3),
            "phases_us": _phases(cp, probe, sms), "per_cta_us": _spans(cp, probe, sms)}


def _outside(cp, probe, launch, flush, runs: int = 10) -> dict:
    """Events minus the CTAs' span (first start to last end) of `runs` launches after 4
    warm-up ones, us: what the launch costs outside its CTAs."""
    import numpy as np

    out = []
    for i in range(runs + 4):
        t = _timed_launch(cp, probe, launch, flush)
        if i >= 4:
            p = cp.asnumpy(probe).astype(np.float64)
            p = p[:, p[0] > 0]
            out.append(t - (p[5].max() - p[0].min()) / 1e3)
    return {"median": round(statistics.median(out), 3), "min": round(min(out), 3),
            "max": round(max(out), 3)}


def run_ramp(cp, shape: Shape, dtype: str, flush, pinned: dict[str, int] | None = None,
             launches: int = 12) -> dict:
    """hgemm_small_m's first microsecond at one shape: per step, the median over CTAs and
    launches (the first two launches a warm-up) of its cycles since the step before, and
    the clock the CTAs ran at (cycles over ns from start to landing)."""
    import numpy as np

    a, b, extra, nd = _operands(cp, shape, dtype)
    c = cp.zeros((shape.m, shape.n), dtype=nd)
    with tempfile.TemporaryDirectory() as d:
        k = Probed(cp, (KERNEL_DIR / "fused.cu").read_text(), shape, dtype, Path(d), pinned,
                   ramp=True)
        b = k.weight(b)
        steps: list[np.ndarray] = []
        mhz, stagger, events = [], [], []
        for i in range(launches):
            t = _timed_launch(cp, k.probe, lambda: k.prep.launch(a, b, c, extra), flush)
            if i < 2:
                continue
            p = cp.asnumpy(k.probe)[:, :k.ctas].astype(np.float64)
            steps.append(np.diff(p[:6], axis=0))
            mhz.append(np.median((p[5] - p[0]) / (p[7] - p[6]) * 1e3))
            stagger.append(float(np.median(p[6] - p[6].min())) / 1e3)
            events.append(t)
        cycles = np.concatenate(steps, axis=1)
    clock = statistics.median(mhz)
    rows = {name: {"cycles_median": float(np.median(cycles[j])),
                   "cycles_p90": float(np.percentile(cycles[j], 90)),
                   "us_median": round(float(np.median(cycles[j])) / clock, 3)}
            for j, name in enumerate(RAMP_STEPS)}
    return {"shape": f"{shape.m}x{shape.n}x{shape.k}", "dtype": dtype, "params": k.spec.param_dict,
            "grid": list(k.prep.grid), "event_us_median": round(statistics.median(events), 3),
            "clock_mhz_median": round(clock, 1),
            "start_after_first_cta_us_median": round(statistics.median(stagger), 3),
            "steps": rows}


def run_launch_paths(cp, flush, repeats: int = 2) -> list[dict]:
    """The same 128 MiB bulk read launched by cupy (cuLaunchKernel), by perfscope's
    cuLaunchKernelEx, with three tensor-map parameters, with 256 threads, and
    hgemm_small_m at 16x8192x8192 as perfscope launches it; `repeats` interleaved rounds."""
    import ctypes

    import fused_check as fc
    import numpy as np

    from perfscope.kernels.maps import plan_maps
    from perfscope.kernels.tensormap import Driver

    tm32 = f"bulk_tm<{fc.BULK_STAGES}, {fc.BULK_CHUNK}, 32>"
    tm256 = f"bulk_tm<{fc.BULK_STAGES}, {fc.BULK_CHUNK}, 256>"
    exprs = (fc.BULK_EXPR, tm32, tm256)
    fns, probe, _raw = _bulk_module(cp, launch_variants_source(fc.BULK_SOURCE), "probe_launch.cu",
                                    exprs)
    smem = fc.BULK_STAGES * fc.BULK_CHUNK
    nbytes = 128 << 20
    chunks = nbytes // fc.BULK_CHUNK
    buf, sink = cp.ones(nbytes // 4, dtype=cp.uint32), cp.zeros(1, dtype=cp.uint32)
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    shape = Shape(16, 8192, 8192)
    a, b, extra, bf = _operands(cp, shape, "bf16")
    c = cp.zeros((shape.m, shape.n), dtype=bf)
    drv = Driver()
    spec = small_m_for(get_spec("hgemm_small_m"), shape)
    maps = [drv.encode(p, x.data.ptr) for p, x in zip(plan_maps(spec, "bf16", shape), (a, b, c),
                                                      strict=True)]
    plain = [ctypes.c_void_p(buf.data.ptr), ctypes.c_longlong(chunks), ctypes.c_void_p(sink.data.ptr)]
    stream = cp.cuda.get_current_stream().ptr

    def ex(expr: str, threads: int, args: list):
        return lambda: drv.launch(fns[expr].kernel.ptr, ((sms, 1, 1), (threads, 1, 1), smem),
                                  stream, args)

    with tempfile.TemporaryDirectory() as d:
        small_m = Probed(cp, (KERNEL_DIR / "fused.cu").read_text(), shape, "bf16", Path(d))
        variants = (
            ("bulk read, cupy's cuLaunchKernel", probe,
             lambda: fns[fc.BULK_EXPR]((sms,), (32,), (buf, np.int64(chunks), sink), shared_mem=smem)),
            ("bulk read, cuLaunchKernelEx", probe, ex(fc.BULK_EXPR, 32, plain)),
            ("bulk read, cuLaunchKernelEx + 3 tensor maps", probe, ex(tm32, 32, [*maps, *plain])),
            ("bulk read, cuLaunchKernelEx + 3 tensor maps, 256 threads", probe,
             ex(tm256, 256, [*maps, *plain])),
            ("hgemm_small_m 16x8192x8192", small_m.probe,
             lambda: small_m.prep.launch(a, b, c, extra)),
        )
        rows = []
        for rep in range(repeats):
            for name, pr, launch in variants:
                rows.append({"variant": name, "repeat": rep,
                             "outside_us": _outside(cp, pr, launch, flush)})
    return rows


def _line(key: str, r: dict) -> str:
    ph = r["phases_us"]
    span = ph["end"]["max"]
    per = r.get("per_cta_us") or {}
    return (f"  {key:8s} events {r['event_us_median']:7.2f} us, CTA span {span:6.2f} us; "
            + ", ".join(f"{name} {v['median']:.2f}" for name, v in ph.items() if name != "start")
            + ("\n           per CTA (median, max): " if per else "")
            + ", ".join(f"{name} {v['median']:.2f} ({v['max']:.2f})" for name, v in per.items()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against-source", type=Path, help="a fused.cu to compare with")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    ap.add_argument("--out", type=Path, help="write the rows as JSON")
    ap.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                    help="pin a template parameter over the host's choice (repeatable)")
    ap.add_argument("--shape", action="append", default=[], metavar="MxNxK",
                    help="probe these shapes instead of the default set (repeatable)")
    ap.add_argument("--launch-paths", action="store_true",
                    help="only time what the launch costs outside the CTAs, launched four ways")
    ap.add_argument("--ramp", action="store_true",
                    help="only take each CTA's first microsecond apart, in cycles")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    try:
        pinned = parse_params(args.param)
        shapes = [parse_shape(s) for s in args.shape] or [Shape(*s) for s in SHAPES]
    except PerfscopeError as exc:
        print(f"small_m_probe: {exc}", file=sys.stderr)
        return 2
    # The probes index CTAs by x and y; a split over the grid's z would share their rows.
    split = [s for s in shapes if small_m_for(get_spec("hgemm_small_m").with_params(**pinned), s,
                                              pinned).param_dict.get("GSPLIT", 1) > 1]
    if split:
        print(f"small_m_probe: hgemm_small_m splits K over the grid at {split[0]} (GSPLIT), whose "
              "CTAs the probes cannot tell apart; pin --param GSPLIT=1 or take another shape",
              file=sys.stderr)
        return 2
    sources = {"current": (KERNEL_DIR / "fused.cu").read_text()}
    if args.against_source is not None:
        try:
            sources["against"] = args.against_source.read_text()
        except OSError as exc:
            print(f"small_m_probe: cannot read {args.against_source}: {exc}", file=sys.stderr)
            return 2
    try:
        for src in sources.values():
            patch_ramp(src) if args.ramp else patch_probes(src)
    except ValueError as exc:
        print(f"small_m_probe: {exc}", file=sys.stderr)
        return 2
    import cupy as cp

    from perfscope.timing import L2Flush

    flush = L2Flush(cp, 512 << 20, "read")
    doc = {"schema": "perfscope.small-m-probe/1", "command": " ".join(sys.argv),
           "phases": PHASES, "bulk": [], "rows": []}
    if args.ramp:
        doc["ramp_steps"] = RAMP_STEPS
        doc["ramp"] = [run_ramp(cp, shape, args.dtype, flush, pinned) for shape in shapes]
        for r in doc["ramp"]:
            print(f"hgemm_small_m {args.dtype} {r['shape']} grid {r['grid']}: events "
                  f"{r['event_us_median']:.2f} us, {r['clock_mhz_median']:.0f} MHz, CTAs start "
                  f"{r['start_after_first_cta_us_median']:.2f} us after the first (median)")
            for name, v in r["steps"].items():
                print(f"  {name:24s} {v['cycles_median']:8.0f} cycles (p90 {v['cycles_p90']:6.0f}) "
                      f"{v['us_median']:6.3f} us")
        if args.out:
            args.out.write_text(json.dumps(doc, indent=1) + "\n")
        return 0
    if args.launch_paths:
        doc["launch_paths"] = run_launch_paths(cp, flush)
        for r in doc["launch_paths"]:
            o = r["outside_us"]
            print(f"  {r['variant']:58s} events - CTA span {o['median']:5.2f} us "
                  f"({o['min']:.2f}-{o['max']:.2f})")
        if args.out:
            args.out.write_text(json.dumps(doc, indent=1) + "\n")
        return 0
    for nbytes in (32 << 20, 128 << 20):
        r = run_bulk(cp, nbytes, flush)
        doc["bulk"].append(r)
        print(f"bulk read {nbytes >> 20} MiB:")
        print(_line("read", r))
    for shape in shapes:
        row = run_shape(cp, sources, shape, args.dtype, flush, pinned)
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
