"""Regenerate the committed reference run on the H200: one command, run on the GPU machine.

    PYTHONPATH=. python3 benchmarks/reference_run.py [--out reports/reference/h200]
                                                     [--compare-full] [--skip-bench] [--skip-tune]

Each phase also runs alone (a device call is limited to 10 minutes): ``--profile-only``,
``--bench-only``, ``--tune-only``, and ``--full-only`` (the ``--compare-full`` half of
``profile_cost.json``).

1. ``perfscope profile all`` at 4096^3 in every dtype each stage takes: one ncu process
   over the whole ladder and the cuBLAS references, clocks as found, perfscope's
   collection set; one report and one run manifest per stage. Then ``large/``: the stages
   whose change acts only from some number of rounds of tiles (``KernelSpec.min_rounds``)
   and their parents, profiled at 8192^3, where it acts (``--profile-only`` remakes it too).
2. ``benchmarks/bench_h200.py``: every stage verified on every issue-3 shape
   (``check.json``), then event-timed against cuBLAS at 4096^3 (``bench.json``), and the
   Hopper stages with their parent at 8192^3 (``bench-8192.json``), the FP32 stages at
   2048^3 and 8192^3 (``bench-fp32.json``); then ``benchmarks/hmma_ceiling.py``, the
   mma.sync roof of the hgemm ladder measured in the same run (``hmma_ceiling.json``).
3. Every report compressed to ``.ncu-rep.xz``; ``profile_cost.json`` holds the passes
   and wall time per stage (and, with ``--compare-full``, the same for ``--set full``);
   ``README.md`` the GPU, clocks, versions and this command.
4. ``benchmarks/tune_h200.py`` into ``tune/``: the issue-18 sweep of
   hgemm_tma_wgmma_persistent over 8 shapes in bf16 and fp16 (the store, its JSON
   export, results.json, tune.md, tune.html); ``PERFSCOPE_CACHE=build/tune-cache`` with
   ``benchmarks/tune_precompile.py`` run beforehand makes its compiles free.
5. ``index.html``: the HTML diagnosis report of the folder (``perfscope report``), with
   the tuning section when ``tune/results.json`` is there.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import logging
import lzma
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

# The report reader before numpy (perfscope.bench -> perfscope.timing imports it): the Nsight
# Compute install's ncu_report, which the GPU machine reads reports with, crashed this
# script's write_index at its first metric unit with numpy's extension loaded before it
# (2026-12-05, bisected on an H100; see perfscope/reader.py).
from perfscope.reader import load_reader_first  # noqa: E402

load_reader_first()

from bench_h200 import LARGE_SHAPE  # noqa: E402
from calibrate import LARGE_DIR  # noqa: E402

from perfscope import ncu as ncu_mod  # noqa: E402
from perfscope import profiling  # noqa: E402
from perfscope.locations import LOAD_WORKERS_ENV  # noqa: E402

log = logging.getLogger("reference_run")
SHAPE = "4096x4096x4096"
# LARGE_DIR: the stages whose change acts only from some number of tile rounds, and their
# parents, profiled at bench_h200.py's LARGE_SHAPE, where it acts and where it times them
# into bench-8192.json; calibrate.py holds the two together.


class PassCounter:
    """Collects ncu's pass counts and the time each kernel took to profile."""

    def __init__(self) -> None:
        self.rows: list[dict] = []
        self._start = time.monotonic()

    def __call__(self, event: ncu_mod.Progress) -> None:
        if event.done:
            now = time.monotonic()
            self.rows.append({"kernel": event.kernel, "passes": event.passes,
                              "seconds": round(now - self._start, 2)})
            self._start = now


def profile(out: Path, full: bool) -> dict:
    counter = PassCounter()
    opts = ncu_mod.NcuOptions(full_set=full)
    req = profiling.ProfileRequest(stages=("all",), shape=SHAPE, out=out, ncu=opts)
    t0 = time.monotonic()
    results = profiling.profile_stages(req, counter).results
    wall = time.monotonic() - t0
    for r in results:
        print(f"  {r.stem:48s} {r.verdict:8s} {r.detail}")
    return {"set": "full" if full else "perfscope", "wall_seconds": round(wall, 1),
            "kernels": counter.rows, "total_passes": sum(k["passes"] or 0 for k in counter.rows),
            "failed": [r.stem for r in results if r.failed]}


def large_stages() -> tuple[str, ...]:
    """The ladder stages whose change acts only from some number of rounds of tiles
    (KernelSpec.min_rounds: at 4096^3 they run their parent's path), each after its parent."""
    from perfscope.kernels.registry import REGISTRY

    names: list[str] = []
    for spec in REGISTRY:
        if spec.min_rounds and not spec.variant:
            names += [n for n in (spec.parent, spec.name) if n and n not in names]
    return tuple(names)


def large_request(out: Path) -> profiling.ProfileRequest:
    """large/'s profiles: large_stages() at LARGE_SHAPE, in every dtype they all take (named
    stages with no dtype would run in their first one only), so that benchmarks/calibrate.py
    holds their step against bench-8192.json where it acts."""
    from perfscope.kernels import get_spec

    specs = [get_spec(name) for name in large_stages()]
    dtypes = tuple(d for d in specs[0].dtypes if all(d in s.dtypes for s in specs)) if specs else ()
    return profiling.ProfileRequest(stages=large_stages(), dtypes=dtypes, shape=LARGE_SHAPE,
                                    out=out / LARGE_DIR, ncu=ncu_mod.NcuOptions())


def profile_large(out: Path) -> list[str]:
    """large/ profiled and compressed; the stems that failed."""
    req = large_request(out)
    results = profiling.profile_stages(req, PassCounter()).results
    for r in results:
        print(f"  {LARGE_DIR}/{r.stem:42s} {r.verdict:8s} {r.detail}")
    compress(req.out)
    return [r.stem for r in results if r.failed]


def profile_only(out: Path, cost_file: Path) -> int:
    """New reports and manifests; bench.json, check.json and other cost runs are kept."""
    for old in [*out.glob("*.ncu-rep.xz"), *out.glob("*-*x*x*.json")]:
        old.unlink()
    cost = json.loads(cost_file.read_text()) if cost_file.exists() else {"shape": SHAPE, "runs": []}
    run = profile(out, full=False)
    failed_large = profile_large(out)
    cost["runs"] = [run, *(r for r in cost["runs"] if r["set"] != "perfscope")]
    cost_file.write_text(json.dumps(cost, indent=1) + "\n")
    compress(out)
    write_index(out)
    print_cost(cost)
    return 1 if run["failed"] or failed_large else 0


def print_cost(cost: dict) -> None:
    """Passes and seconds per kernel for each collection set side by side, then totals."""
    runs = cost["runs"]
    print(f"{'kernel':40s}" + "".join(f"{r['set'] + ' passes':>18s}{'s':>8s}" for r in runs))
    for i, row in enumerate(runs[0]["kernels"]):
        cells = []
        for r in runs:
            k = r["kernels"][i] if i < len(r["kernels"]) else {}
            cells.append(f"{k.get('passes') if k.get('passes') is not None else '?':>18}"
                         f"{k.get('seconds', ''):>8}")
        print(f"{row['kernel'][:40]:40s}" + "".join(cells))
    for r in runs:
        print(f"{r['set']:10s} set: {r['total_passes']} passes, {r['wall_seconds']} s "
              f"for {len(r['kernels'])} kernels")


def run_bench(out: Path) -> None:
    """bench.json and check.json, in a process of their own (no report reader loaded)."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_h200.py"), "--out",
                           str(out / "bench.json"), "--sweep", str(out / "check.json")],
                          cwd=ROOT, check=False)
    if done.returncode != 0:
        log.error("the bench step exited with %d; bench.json may be missing or partial",
                  done.returncode)


def run_ceiling(out: Path) -> None:
    """hmma_ceiling.json: the mma.sync roof the hgemm ladder is held to, measured in the same
    run as its ratios (issue 20), in a process of its own (it launches with CuPy)."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "hmma_ceiling.py"),
                           "--json", str(out / "hmma_ceiling.json")], cwd=ROOT, check=False)
    if done.returncode != 0:
        log.error("the HMMA ceiling step exited with %d; hmma_ceiling.json may be missing",
                  done.returncode)


def run_tune(out: Path) -> int:
    """tune/ from benchmarks/tune_h200.py, in a process of its own (it times with CuPy)."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "tune_h200.py"), "--out",
                           str(out / "tune")], cwd=ROOT, check=False)
    if done.returncode != 0:
        log.error("the tune step exited with %d; tune/ may be partial (--tune-only after "
                  "tune_h200.py --resume finishes it)", done.returncode)
    return done.returncode


# What other commands write into the folder; a full run keeps it (and names it in README.md).
KEPT: dict[str, str] = {
    "tune": "`tune/`: the issue-18 sweep (`--tune-only`, or `benchmarks/tune_h200.py`): the store, "
            "its xz export, results.json, tune.md and tune.html.",
    "fused": "`fused/`: issue 19's fused stages: `fused_check.json.xz`/`.log` "
             "(`benchmarks/fused_check.py`), `bench-fused.json` (`benchmarks/bench_fused.py`, "
             "against the `cublas+gelu` group), the reports of a fused stage and its group "
             "(`perfscope profile hgemm_small_m cublas+gelu ...`), and its own `index.html`.",
    "programs": "`programs/`: the any-program acceptance run (`benchmarks/programs_acceptance.sh`).",
    "gpu-tests": "`gpu-tests/gpu_tests.txt`: the gpu-marked tests on the tree of this run "
                 "(`python3 -m pytest -q -m gpu tests/FILE.py`, one file per process).",
    "calibration.json": "`calibration.json`: `python3 benchmarks/calibrate.py` (no GPU): every "
                        "ladder step's predicted saving against the one bench.json measured, "
                        "large/'s against bench-8192.json, and the fused stages' against "
                        "fused/bench-fused.json.",
    "sustained_clock.json": "`sustained_clock.json`: `PYTHONPATH=. python3 "
                            "benchmarks/sustained_clock.py`: GEMMs run back to back for 2 s while "
                            "NVML is sampled (the card at its power cap).",
    "l2_flush.json": "`l2_flush.json`: `PYTHONPATH=. python3 benchmarks/l2_flush.py`: the same "
                     "launches timed after a 512 MiB write, a read (bench's flush) and a spin "
                     "kernel: what a write flush's dirty lines add to the timed kernel.",
    "wgmma_ceiling.json": "`wgmma_ceiling.json`: `PYTHONPATH=. python3 benchmarks/wgmma_ceiling.py "
                          "--json wgmma_ceiling.json`: the persistent stage's wgmma k-tile step "
                          "with no memory traffic, its FLOP per SM cycle and the clock it ran at.",
    "power_probe.json": "`power_probe.json`: `PYTHONPATH=. python3 benchmarks/power_probe.py --out "
                        "power_probe.json`: the persistent stage's cycles and in-kernel clock on "
                        "random and on all-zero inputs (PS171's evidence).",
    "power-probe-tuned.json": "`power-probe-tuned.json`: `PYTHONPATH=. python3 "
                              "benchmarks/power_probe.py --out power-probe-tuned.json --config "
                              "tuned --shape 4096x4096x4096 --shape 8192x8192x8192`: the tuned "
                              "persistent stage's share of the dense peak at its in-kernel clock.",
    "energy-per-launch.json": "`energy-per-launch.json`: `PYTHONPATH=. python3 "
                              "benchmarks/energy_per_launch.py --out energy-per-launch.json`: "
                              "stages and cuBLAS back to back at the power cap, alternating: time, "
                              "NVML energy and clock per launch.",
    "bench_clock.json": "`bench_clock.json`: `PYTHONPATH=. python3 benchmarks/bench_clock.py`: "
                        "the SM clock while bench-style launches run, read by a probe warp on "
                        "every SM before, during and after each launch (NVML reads 1980 MHz; "
                        "the probe during the GEMMs about 1.6 GHz).",
}


def clear_generated(out: Path) -> None:
    """Remove what this run regenerates; keep what other commands wrote there (KEPT)."""
    out.mkdir(parents=True, exist_ok=True)
    for entry in out.iterdir():
        if entry.name in KEPT:
            continue
        if entry.is_dir():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def kept_lines(out: Path) -> list[str]:
    """README lines for what other commands wrote into the folder, as far as it is there."""
    present = [text for name, text in KEPT.items() if (out / name).exists()]
    return ["", "Also in this folder, written by other commands (a full run keeps them):", "",
            *(f"- {text}" for text in present)] if present else []


def compress(out: Path) -> None:
    for rep in sorted(out.glob("*.ncu-rep")):
        with open(rep, "rb") as src, lzma.open(f"{rep}.xz", "wb", preset=9) as dst:
            shutil.copyfileobj(src, dst)
        rep.unlink()


def write_index(out: Path) -> None:
    """index.html of the folder, from its compressed reports, manifests and bench.json.

    The same function regenerates it in tests/test_report_html.py, which requires the
    committed page byte for byte; a report that cannot be built is logged, not fatal: the
    profiles and timings above are the run's real product.
    """
    from perfscope.errors import PerfscopeError
    from perfscope.render.html import (
        FP8_DIR,
        FUSED_DIR,
        fp8_page,
        fused_page,
        reference_page,
        write_atomic,
    )

    try:
        write_atomic(out / "index.html", reference_page(out))
    except PerfscopeError as exc:
        log.error("index.html not written: %s", exc)
    for name, page in ((FUSED_DIR, fused_page), (FP8_DIR, fp8_page)):
        sub = out / name
        if sub.is_dir() and any(p.name.endswith(".ncu-rep.xz") for p in sub.iterdir()):
            try:
                write_atomic(sub / "index.html", page(sub))
            except PerfscopeError as exc:
                log.error("%s/index.html not written: %s", name, exc)


def large_clock_lines(out: Path) -> list[str]:
    """The SM clock range bench-8192.json recorded: it sinks under load at that size, and
    a reader of its ratios should know both sides ran under the same clocks."""
    path = out / "bench-8192.json"
    if not path.is_file():
        return []
    clocks = [c for m in json.loads(path.read_text())["manifests"]
              if (c := (m.get("timing") or {}).get("sm_clock_mhz"))]
    if not clocks:
        return []
    low = min(c["min"] for c in clocks) / 1000
    high = max(c["max"] for c in clocks) / 1000
    return ["", f"At 8192^3 (`bench-8192.json`) the SM clock read {low:.2f}-{high:.2f} GHz "
            "while timing (recorded per round); the ratios there come from alternating rounds "
            "of the stage and cuBLAS, so both ran under the same clocks."]


def environment_lines() -> list[str]:
    def sh(cmd: list[str]) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout.strip()
        except OSError:
            return "not available"

    return [
        "- GPU: " + sh(["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.max.sm,"
                        "clocks.mem,power.limit", "--format=csv,noheader"]),
        "- ncu: " + sh([ncu_mod.find_ncu(), "--version"]).splitlines()[-1],
        "- nvcc: " + (sh(["nvcc", "--version"]).splitlines() or ["?"])[-1],
        "- Python: " + sys.version.split()[0],
    ]


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    # write_index ended in a segmentation fault on the H200 machine on 2026-12-05 (03:05,
    # 03:08, and 11:45 with this handler: the reader's first metric unit read with
    # matplotlib's extensions loaded; the charts are now drawn in a worker process,
    # perfscope.render.plots), and again on an H100 machine at 14:06 without matplotlib,
    # numpy's extension loaded before the reader: the imports above now load it first.
    # Kept so that any other fault prints where it was.
    faulthandler.enable()
    # A guarded entry point: its pages may read the folders' reports in worker processes
    # (perfscope.loadpool; a worker the reader crashes leaves its reports to this process).
    # write_index on 2 cores: 12.4 s and 0.44 GB against 18.9 s and 1.2 GB, the same pages.
    os.environ.setdefault(LOAD_WORKERS_ENV, "auto")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "reference" / "h200")
    ap.add_argument("--compare-full", action="store_true",
                    help="also profile the ladder with --set full (for profile_cost.json)")
    ap.add_argument("--skip-bench", action="store_true")
    ap.add_argument("--bench-only", action="store_true",
                    help="keep the folder's reports; rerun only the bench step and index.html")
    ap.add_argument("--profile-only", action="store_true",
                    help="keep bench.json and check.json; rerun the profiles and index.html")
    ap.add_argument("--full-only", action="store_true",
                    help="keep everything; profile the ladder again with --set full into a "
                         "temporary folder and replace the full-set run in profile_cost.json")
    ap.add_argument("--skip-tune", action="store_true")
    ap.add_argument("--tune-only", action="store_true",
                    help="keep everything else; rerun the tuning sweep into tune/ and index.html")
    args = ap.parse_args()
    out: Path = args.out
    cost_file = out / "profile_cost.json"
    if args.bench_only:
        run_bench(out)
        run_ceiling(out)
        write_index(out)
        return 0
    if args.profile_only:
        return profile_only(out, cost_file)
    if args.full_only:
        cost = json.loads(cost_file.read_text())
        with tempfile.TemporaryDirectory() as tmp:
            full = profile(Path(tmp), full=True)
        cost["runs"] = [r for r in cost["runs"] if r["set"] != "full"] + [full]
        cost_file.write_text(json.dumps(cost, indent=1) + "\n")
        print_cost(cost)
        return 1 if full["failed"] else 0
    if args.tune_only:
        rc = run_tune(out)
        write_index(out)
        return rc
    clear_generated(out)
    cost = {"shape": SHAPE, "runs": [profile(out, full=False)]}
    cost_file.write_text(json.dumps(cost, indent=1) + "\n")
    failed_large = profile_large(out)
    if not args.skip_bench:
        run_bench(out)
        run_ceiling(out)
    if not args.skip_tune:
        run_tune(out)
    compress(out)
    command = "PYTHONPATH=. python3 benchmarks/reference_run.py" + (
        " --compare-full" if args.compare_full else "")
    readme = ["# Reference run (NVIDIA H200)", "", f"Regenerated by `{command}` on the H200 "
              f"machine, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.", "",
              *environment_lines(), "",
              "Clocks were left as found (`--clock-control none`); each report holds the SM "
              "clock measured during its kernel, and bench.json the clock while timing.", "",
              "Files: `<stage>-<dtype>-4096x4096x4096.ncu-rep.xz` (one kernel each; the "
              "cuBLAS references are `cublas_*`), the run manifest beside each as `.json`, "
              "`bench.json` (event-timed TFLOP/s and ratio to cuBLAS), `bench-8192.json` "
              "(the Hopper stages and their parent again at 8192^3), `bench-fp32.json` (the FP32 "
              "stages at 2048^3 and 8192^3), `hmma_ceiling.json` (the mma.sync roof, "
              "benchmarks/hmma_ceiling.py), `check.json` (every "
              "stage on every issue-3 shape), `profile_cost.json` (ncu passes and wall time "
              f"per stage), `{LARGE_DIR}/` (the stages whose change acts only from "
              f"KernelSpec.min_rounds rounds of tiles, with their parents, at {LARGE_SHAPE}: "
              "benchmarks/calibrate.py holds their step against bench-8192.json).",
              *large_clock_lines(out), *kept_lines(out)]
    (out / "README.md").write_text("\n".join(readme) + "\n")
    write_index(out)
    if args.compare_full:
        # Last, so a slow full-set run cannot cost the reference artifacts above.
        with tempfile.TemporaryDirectory() as tmp:
            cost["runs"].append(profile(Path(tmp), full=True))
        cost_file.write_text(json.dumps(cost, indent=1) + "\n")
    print_cost(cost)
    return 1 if cost["runs"][0]["failed"] or failed_large else 0


if __name__ == "__main__":
    sys.exit(main())
