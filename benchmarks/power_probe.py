"""Is a GEMM held by the power cap? The same kernel's cycles and clock, on random and on zero inputs.

    PYTHONPATH=. python3 benchmarks/power_probe.py --out PROBE.json [--rounds 6] [--runs 20]
        [--shape MxNxK ...] [--config NAME ...]

hgemm_tma_wgmma_persistent at 4096^3 (bf16 and fp16; --shape for others), in two
configurations the tune store ranked about equal on 2026-12-02 (STAGES 3 BOXES 4 and STAGES
4 BOXES 2) and in the deferred-store configuration it ranks best since ("tuned"; --config
picks among them), compiled from a
copy of hopper.cuh in a temporary folder (KernelSpec.kernel_dir) with one probe added: the
first consumer thread of each CTA reads clock64 (the SM's cycles) and %globaltimer (ns) at
the kernel's start and end. Each configuration is verified against float64, then timed by
CUDA events (20 launches a batch, the L2 flushed before each, as bench does) on random
inputs (bench's standard normal) and on all-zero inputs, in alternating rounds. Per case:
the median event time, the median CTA's cycles and its clock (cycles over its nanoseconds:
the clock the multiprocessor ran at) from the last launch of each batch, and NVML's reading.

The cycles a kernel needs do not depend on its data; its power does. Where the same cycles
take less time on zeros, the clock was held by the power cap, not by the work, and a change
that saves cycles buys time only as far as it saves energy: the two configurations show
how far (PS171 in perfscope/rules/clock.py cites this file). Each row also gives the
TFLOP/s of each batch's last launch (the one the probe holds) as a fraction of the dense
BF16/FP16 peak at the clock that launch ran at (4096 FLOP per clock per SM: 989.4 TFLOP/s
at 1830 MHz on 132 SMs), median over the batches: the figure issue 20 holds the Hopper
stage to, where NVML's reading between batches would put the peak at 1980 MHz.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from probed_copy import patched, probed_kernel_dir

from perfscope.errors import PerfscopeError
from perfscope.hardware import PEAK_FLOP_PER_SM_CLOCK
from perfscope.kernels import Shape, get_spec
from perfscope.kernels.spec import KERNEL_DIR, parse_shape

SHAPE = Shape(4096, 4096, 4096)
DTYPES = ("bf16", "fp16")
CONFIGS = {"STAGES=3 BOXES=4": dict(STAGES=3, GROUP=4, BOXES=4, STREAMK=0),
           "STAGES=4 BOXES=2": dict(STAGES=4, GROUP=4, BOXES=2, STREAMK=0),
           "tuned": dict(STAGES=4, GROUP=16, BOXES=1, STREAMK=0, DEFER=1)}
MAX_CTAS = 160
# The dense 16-bit tensor rate per SM clock (989.4 TFLOP/s at 1830 MHz on 132 SMs).
DENSE_FLOP_PER_CLOCK_PER_SM = PEAK_FLOP_PER_SM_CLOCK["9.0"]["tensor16"]
FLUSH_BYTES = 512 << 20

_DECL_AT = "// ------------------------------------------------------------------ persistent body\n"
_DECL = ('extern "C" { __device__ unsigned long long ps_clk[160][4]; }\n'
         "__device__ __forceinline__ unsigned long long ps_ns() {\n"
         '    unsigned long long t;\n    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));\n'
         "    return t;\n}\n")
_START_AT = "    }\n\n    if (wg == 0) {\n        setmaxnreg_dec<40>();\n"
_START = ("    }\n"
          "    if (tid == 128) { ps_clk[blockIdx.x][0] = clock64(); ps_clk[blockIdx.x][2] = ps_ns(); }\n\n"
          "    if (wg == 0) {\n        setmaxnreg_dec<40>();\n")
_END_AT = "        if (tid % 128 == 0) tma::store_wait_all();\n    }\n    // No CTA of a pair"
_END = ("        if (tid % 128 == 0) tma::store_wait_all();\n"
        "        if (tid == 128) { ps_clk[blockIdx.x][1] = clock64(); ps_clk[blockIdx.x][3] = ps_ns(); }\n"
        "    }\n    // No CTA of a pair")


def probed_header(text: str) -> str:
    """hopper.cuh with the start and end probes; a ValueError names an anchor not there once."""
    return patched(text, ((_DECL_AT, _DECL_AT + _DECL), (_START_AT, _START), (_END_AT, _END)))


def probed_folder() -> Path:
    return probed_kernel_dir(probed_header((KERNEL_DIR / "hopper.cuh").read_text()), "power-probe-")


def per_cta(probe) -> tuple[float, float]:
    """(median CTA's cycles, median CTA's MHz) of one launch's probe rows."""
    cycles = [float(r[1] - r[0]) for r in probe]
    mhz = [float(r[1] - r[0]) / float(r[3] - r[2]) * 1e3 for r in probe]
    return statistics.median(cycles), statistics.median(mhz)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--shape", action="append", default=[], help="MxNxK (repeatable; default "
                    f"{SHAPE})")
    ap.add_argument("--config", action="append", default=[], choices=sorted(CONFIGS),
                    help="a configuration to probe (repeatable; default all)")
    args = ap.parse_args(argv)
    try:
        shapes = [parse_shape(s) for s in args.shape] or [SHAPE]
    except PerfscopeError as exc:
        print(f"power_probe: {exc}", file=sys.stderr)
        return 2
    configs = {k: CONFIGS[k] for k in (args.config or CONFIGS)}
    import cupy as cp

    from perfscope import verify
    from perfscope.environment import ClockReader, collect_environment
    from perfscope.kernels.launch import prepare
    from perfscope.timing import L2Flush

    folder = probed_folder()
    base = dataclasses.replace(get_spec("hgemm_tma_wgmma_persistent"), kernel_dir=folder)
    env = collect_environment(cp)
    flush, nvml = L2Flush(cp, FLUSH_BYTES, "read"), ClockReader()
    rows = []
    sms = env.sm_count or 132
    for shape, dtype in [(s, d) for s in shapes for d in DTYPES]:
        preps = {}
        for name, params in configs.items():
            prep = prepare(base.with_params(**params), dtype, shape)
            v = verify.verify(prep, 1)
            if v.verdict != "ok":
                print(f"{dtype} {shape} {name}: verification {v.verdict}; not timed")
                continue
            preps[name] = prep
        a, b = verify.make_inputs(cp, shape, dtype, 7)
        inputs = {"random": (a, b), "zeros": (cp.zeros_like(a), cp.zeros_like(b))}
        c = cp.empty((shape.m, shape.n), dtype=a.dtype)
        got: dict[tuple[str, str], dict[str, list[float]]] = {}
        for rnd in range(args.rounds):
            order = list(preps.items()) if rnd % 2 == 0 else list(preps.items())[::-1]
            for name, prep in order:
                probe = cp.ndarray((MAX_CTAS, 4), dtype=cp.uint64,
                                   memptr=prep.raw_module.get_global("ps_clk"))
                for kind, (x, y) in inputs.items():
                    for _ in range(3):
                        prep.launch(x, y, c)
                    events = [(cp.cuda.Event(), cp.cuda.Event()) for _ in range(args.runs)]
                    for start, end in events:
                        flush()
                        start.record()
                        prep.launch(x, y, c)
                        end.record()
                    mhz = nvml.sm_mhz()
                    events[-1][1].synchronize()
                    cycles, clock = per_cta(cp.asnumpy(probe[: prep.grid[0]]).tolist())
                    r = got.setdefault((name, kind), {"ms": [], "cycles": [], "mhz": [], "nvml": [],
                                                      "last_of_peak": []})
                    r["ms"] += [cp.cuda.get_elapsed_time(s, e) for s, e in events]
                    # The probe holds the batch's last launch: its own time against the peak
                    # at its own clock (the card heats up within a batch).
                    r["last_of_peak"].append(shape.flops / (r["ms"][-1] * 1e-3) / 1e12
                                             / (sms * DENSE_FLOP_PER_CLOCK_PER_SM * clock * 1e-6))
                    r["cycles"].append(cycles)
                    r["mhz"].append(clock)
                    if mhz is not None:
                        r["nvml"].append(float(mhz))
        for (name, kind), r in got.items():
            ms = statistics.median(r["ms"])
            tflops = shape.flops / (ms * 1e-3) / 1e12
            kernel_mhz = statistics.median(r["mhz"])
            row = {"dtype": dtype, "shape": str(shape), "config": name, "inputs": kind,
                   "ms_median": ms, "tflops": tflops,
                   "of_peak_at_kernel_clock": statistics.median(r["last_of_peak"]),
                   "cta_cycles_median": statistics.median(r["cycles"]),
                   "in_kernel_mhz_median": kernel_mhz,
                   "nvml_mhz_median": statistics.median(r["nvml"]) if r["nvml"] else None,
                   "batches": len(r["cycles"])}
            rows.append(row)
            print(f"{dtype} {name:17s} {kind:6s} {ms * 1e3:7.1f} us {row['tflops']:6.1f} TFLOP/s "
                  f"{row['cta_cycles_median']:9.0f} cycles {row['in_kernel_mhz_median']:6.0f} MHz "
                  f"(NVML {row['nvml_mhz_median']}), {row['of_peak_at_kernel_clock']:.3f} of "
                  "peak at that clock", flush=True)
    doc = {"schema": "perfscope.power-probe/1", "stage": "hgemm_tma_wgmma_persistent",
           "configs": configs, "environment": dataclasses.asdict(env), "rows": rows,
           "flush_bytes": FLUSH_BYTES, "runs": args.runs,
           "rounds": args.rounds, "command": "PYTHONPATH=. python3 benchmarks/power_probe.py "
           + " ".join(argv if argv is not None else sys.argv[1:]),
           "time": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
