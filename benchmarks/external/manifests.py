"""Write a run manifest beside each external capture, from the timing measured on the H200.

    python3 benchmarks/external/manifests.py [tests/fixtures/external]

What `perfscope profile --shape --dtype --time` records for a program's kernel, made from
``timing.json`` (benchmarks/external/workloads.py time): the workload's GEMM shape and
element type, its correctness against a float64 reference, and its event-timed speed with
the ratio to cuBLAS at the same shape (median over alternating rounds). The rules use the
ratio to bound their estimates; a workload at cuBLAS's speed (cuBLAS itself) gets no
warning. Runs on the CPU; rerun after a new capture.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from perfscope.manifest import (  # noqa: E402
    OK,
    WRONG,
    Environment,
    RunManifest,
    Spread,
    Timing,
    Verification,
)


def manifest_for(w: dict, method: dict, env: dict, created: str) -> RunManifest:
    ok = w.get("verdict") == "ok"
    verification = Verification(OK if ok else WRONG, w.get("rel_error"), w.get("tolerance"),
                                detail="" if ok else str(w.get("detail", "")))
    timing = None
    if ok and w.get("ms_median"):
        flops = 2.0 * int(w.get("batch", 1)) * w["m"] * w["n"] * w["k"]
        clock = w.get("sm_clock_mhz") or {}

        def tflops(ms: float) -> float:
            return flops / (ms * 1e-3) / 1e12

        ratios = [float(r) for r in w.get("ratio_rounds", [])] or [float(w["ratio"])]
        timing = Timing(
            runs_per_round=int(w.get("runs", method["runs"])), rounds=int(w.get("rounds", method["rounds"])),
            warmup=3, l2_flush_bytes=int(method["flush_bytes"]),
            time_ms=Spread(w["ms_min"], w["ms_median"], w["ms_max"]),
            tflops=Spread(tflops(w["ms_max"]), tflops(w["ms_median"]), tflops(w["ms_min"])),
            reference=method["reference"],
            reference_time_ms=Spread.of([w["ref_ms_median"]]),
            reference_tflops=Spread.of([tflops(w["ref_ms_median"])]),
            ratio_to_reference=Spread.of(ratios), round_ratios=tuple(ratios),
            sm_clock_mhz=Spread(clock["min"], clock["median"], clock["max"]) if clock else None)
    params = {k: int(v) for k, v in (w.get("config") or {}).items() if isinstance(v, int)}
    environment = Environment(
        gpu=env.get("gpu", ""), compute_capability=env.get("compute_capability", ""),
        sm_count=int(env.get("sm_count", 0)), driver=env.get("driver", ""),
        cuda_driver=env.get("torch_cuda", ""), cuda_runtime=env.get("torch_cuda", ""), nvrtc="",
        cupy=env.get("cupy", ""), cublas=str(env.get("cublaslt", "")), cuda_bindings="",
        ml_dtypes="", python=env.get("python", ""),
        extra={k: str(env[k]) for k in ("torch", "triton", "nvmath", "nvidia_smi") if k in env})
    layout = {"layout": w["layout"]} if w.get("layout") else {}
    # A grouped GEMM has no one shape (each group its own B): left unknown, 0x0x0, so the
    # roofline comes from its counters.
    m, n, k = (0, 0, 0) if int(w.get("groups", 1)) > 1 else (int(w["m"]), int(w["n"]), int(w["k"]))
    return RunManifest(stage=w["name"], family="external", dtype=w["dtype"], m=m, n=n, k=k,
                       batch=int(w.get("batch", 1)), params=params, verification=verification,
                       timing=timing, environment=environment, created=created, **layout)


def main() -> int:
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "tests" / "fixtures" / "external"
    data = json.loads((folder / "timing.json").read_text())
    written = 0
    for name, w in sorted(data["workloads"].items()):
        report = folder / f"{name}.ncu-rep.xz"
        if not report.is_file() or "m" not in w:
            continue
        # A workload merged from a partial capture carries its own run's machine and time.
        run = w.get("run") or {}
        m = manifest_for(w, data["method"], run.get("environment") or data.get("environment", {}),
                         run.get("time") or data.get("time", ""))
        (folder / f"{name}.json").write_text(json.dumps(m.to_dict(), indent=1) + "\n")
        written += 1
    print(f"wrote {written} run manifests into {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
