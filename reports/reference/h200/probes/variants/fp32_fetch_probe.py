"""Two FP32 changes to sgemm_stages4, timed against it in the same rounds. (Written 2026-12-05
on a machine without a GPU; not yet run.)

    PYTHONPATH=. python3 reports/reference/h200/probes/variants/fp32_fetch_probe.py OUT.json
    PYTHONPATH=. python3 reports/reference/h200/probes/variants/fp32_fetch_probe.py --sass
    PYTHONPATH=. python3 reports/reference/h200/probes/variants/fp32_fetch_probe.py --evidence

Why (probes/README.md, "FP32: instruction fetch"): sgemm_stages4's k loop is 2,250
instructions (36 KB of code: BK = 16 k steps of 128 FFMAs, fully unrolled), cuBLAS's 1,154.
In the H200 reports its warps stall on no_instruction 2.7% of their samples against 0.8%
for cuBLAS, and the first instruction of each 128-byte line of the loop draws 22 such
samples against 1.1 for the other instructions (cuBLAS: 5.4 against 0.7). The exhaustive
tune's BK = 8 configurations (a loop of cuBLAS's size) ran 0.84 of cuBLAS against 0.93,
but they also halve the k tile and so double the barriers and copies per FFMA; these
variants keep the k tile:

- ``chunk8``: the 16 k steps run as a loop of two passes of 8 (the body half the size,
  the same tile, barrier and copies; one more branch per k tile);
- ``l2hint``: cp.async with ``.L2::128B`` (the 128-byte prefetch hint cuBLAS's own sm80
  kernels and seed 004 use), the loop unchanged;
- ``both``.

Each variant is verified against float64 and timed against the unchanged kernel and
cuBLAS in alternating rounds (speed_over_plain above 1: the variant is faster). With
--sass it compiles the variants here (no GPU) and prints each one's k-loop size, registers
and spills; with --evidence it prints, from the committed reports (no GPU), the samples at
the first instruction of each 128-byte line of code against the others.
"""

import dataclasses
import json
import shutil
import sys
from pathlib import Path

from perfscope.kernels import get_spec
from perfscope.kernels.spec import KERNEL_DIR

STAGE = "sgemm_stages4"
SHAPES = ("4096x4096x4096", "2048x2048x2048", "8192x8192x8192")

LOOP = """#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            if (kk + 1 < BK) {
                ps_load_frags<T, TM, TN, WTR * 4, WTC * 4>(a[(kk + 1) % 2], b[(kk + 1) % 2],
                                                           as + (kk + 1) * AP,
                                                           bs + (kk + 1) * BN);
            } else {"""
CHUNKED = """constexpr int KC = BK > 8 ? 8 : BK;   // probe: k steps per pass of the loop body
#pragma unroll 1
        for (int k0 = 0; k0 < BK; k0 += KC) {
#pragma unroll
        for (int kc = 0; kc < KC; ++kc) {
            const int kk = k0 + kc;
            if (kc + 1 < KC || k0 + KC < BK) {
                ps_load_frags<T, TM, TN, WTR * 4, WTC * 4>(a[(kc + 1) % 2], b[(kc + 1) % 2],
                                                           as + (kk + 1) * AP,
                                                           bs + (kk + 1) * BN);
            } else {"""
FMA = """            ps_fma_tile<T, TM, TN, JOUTER>(acc, a[kk % 2], b[kk % 2]);
        }
        stage = next_stage;"""
FMA_CHUNKED = """            ps_fma_tile<T, TM, TN, JOUTER>(acc, a[kc % 2], b[kc % 2]);
        }
        }
        stage = next_stage;"""
CA = 'asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\\n"'
CG = 'asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\\n"'


def _swap(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, old[:60]
    return text.replace(old, new)


def variant(name: str, root: Path) -> Path:
    """A copy of the kernels with the change(s) of ``name`` made to sgemm.cu."""
    folder = root / name
    shutil.copytree(KERNEL_DIR, folder, dirs_exist_ok=True)
    src = (KERNEL_DIR / "sgemm.cu").read_text()
    if name in ("chunk8", "both"):
        src = _swap(_swap(src, LOOP, CHUNKED), FMA, FMA_CHUNKED)
    if name in ("l2hint", "both"):
        src = _swap(src, CA, CA.replace("cp.async.ca.shared.global", "cp.async.ca.shared.global.L2::128B"))
        src = _swap(src, CG, CG.replace("cp.async.cg.shared.global", "cp.async.cg.shared.global.L2::128B"))
    (folder / "sgemm.cu").write_text(src)
    return folder


NAMES = ("chunk8", "l2hint", "both")


def loop_stats(folder: Path) -> dict:
    """Compile sgemm_stages4 from the kernels in folder (NVRTC, no GPU) and say what its k
    loop became: the instructions its longest backward branch spans, its FFMAs, the copies
    with the L2 prefetch hint, registers and spills."""
    from perfscope.audit import compile_stage, disassemble, find_tool
    from perfscope.sass.loops import loops
    spec = dataclasses.replace(get_spec(STAGE), kernel_dir=folder)
    module = compile_stage(spec, "fp32", spec.archs[0])
    mangled = module.mangled(spec.name_expression("fp32"))
    texts = disassemble(module.cubin_path, find_tool()).kernel(mangled).instructions
    res = module.resources[mangled]
    spans = [loop.last - loop.first for loop in loops(texts)]
    return dict(registers=res.registers, spill_stores=res.spill_stores,
                instructions=len(texts),
                ffma=sum(1 for t in texts if t.split()[0].startswith("FFMA")),
                ldgsts_ltc128b=sum(1 for t in texts if "LDGSTS" in t and ".LTC128B" in t),
                longest_backward_branch=max(spans, default=None))


def sass_report(root: Path) -> None:
    """Each variant's loop_stats beside the unchanged kernel's: the check that the change
    compiled as meant."""
    for name, folder in [("plain", KERNEL_DIR)] + [(n, variant(n, root)) for n in NAMES]:
        print(json.dumps(dict(variant=name, **loop_stats(folder))))


EVIDENCE = ("reports/reference/h200/sgemm_stages4-fp32-4096x4096x4096.ncu-rep.xz",
            "reports/reference/h200/sgemm_pipe-fp32-4096x4096x4096.ncu-rep.xz",
            "reports/reference/h200/cublas_sgemm-fp32-4096x4096x4096.ncu-rep.xz",
            "tests/fixtures/external/torch_fp32_4096.ncu-rep.xz",
            "tests/fixtures/external/triton_fp32_ieee.ncu-rep.xz")


def evidence() -> None:
    """Per report: warp samples, dispatch and no_instruction stall samples per PC at the
    first instruction of each 128-byte line (the PCs whose offset is a multiple of 128)
    against the other PCs, and no_instruction's share of all samples."""
    from perfscope.profile import load
    for path in EVIDENCE:
        prof = load(path)[0]
        samples = prof.correlation.pc_samples()
        reasons = prof.correlation.reason_samples(set(samples))
        base = min(samples)
        sums = {True: [0, 0.0, 0.0, 0.0], False: [0, 0.0, 0.0, 0.0]}
        for pc, n in samples.items():
            acc = sums[(pc - base) % 128 == 0]
            acc[0] += 1
            acc[1] += n
            acc[2] += reasons.get("dispatch_stall", {}).get(pc, 0.0)
            acc[3] += reasons.get("no_instruction", {}).get(pc, 0.0)
        per = {k: [v / max(acc[0], 1) for v in acc[1:]] for k, acc in sums.items()}
        print(json.dumps(dict(
            report=Path(path).name, kernel=prof.name,
            hot_loop=prof.hot_loop.instructions if prof.hot_loop else None,
            line_start_pcs=sums[True][0], other_pcs=sums[False][0],
            samples_per_pc=[round(per[True][0], 1), round(per[False][0], 1)],
            dispatch_per_pc=[round(per[True][1], 1), round(per[False][1], 1)],
            no_instruction_per_pc=[round(per[True][2], 1), round(per[False][2], 1)],
            no_instruction_share=round((sums[True][3] + sums[False][3]) / sum(samples.values()), 4))))


def main() -> None:
    """Time each variant against the unchanged stage and cuBLAS in the same rounds."""
    from perfscope.bench import reference_spec
    from perfscope.kernels.launch import prepare
    from perfscope.kernels.spec import parse_shape
    from perfscope.timing import BenchOptions, time_stage
    from perfscope.verify import verify
    root = Path("/tmp/fp32_fetch")
    if sys.argv[1:] == ["--sass"]:
        sass_report(root)
        return
    if sys.argv[1:] == ["--evidence"]:
        evidence()
        return
    spec = get_spec(STAGE)
    rows = []
    for shape in SHAPES:
        s = parse_shape(shape)
        plain = prepare(spec, "fp32", s)
        ref = prepare(reference_spec("fp32", spec), "fp32", s)
        for name in NAMES:
            new = prepare(dataclasses.replace(spec, kernel_dir=variant(name, root)), "fp32", s)
            if verify(new, 1).verdict != "ok":
                rows.append(dict(shape=shape, dtype="fp32", variant=name, verify="wrong"))
                print(json.dumps(rows[-1]), flush=True)
                continue
            t = time_stage(new, ref, BenchOptions(runs=20, rounds=9, warmup=3), parent=plain)
            row = dict(shape=shape, dtype="fp32", variant=name,
                       speed_over_plain=t.ratio_to_parent.median,
                       vs_cublas=t.ratio_to_reference.median, time_ms=t.time_ms.median)
            print(json.dumps(row), flush=True)
            rows.append(row)
    Path(sys.argv[1]).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
