"""Capture the external validation set under Nsight Compute: one report per workload.

    PYTHONPATH=. python3 benchmarks/external/capture.py --out DIR [--only NAME...] [--skip-timing]
                                                         [--deadline SECONDS] [--dry-run]

Run on the GPU machine. For each group of workloads (Triton; PyTorch/cuBLAS BF16; the
PyTorch matmul + GELU pair; PyTorch FP32; cuBLASLt through nvmath-python; see
workloads.py) ONE ncu process runs
``workloads.py run --nvtx NAME...`` with the full section set, kernel replay, caches
flushed between passes, clocks as found, source imported, and one ``--nvtx-include NAME/``
per workload, so exactly the launches inside each workload's NVTX range are profiled.
Groups are separate processes so that cuBLAS's large modules stay out of the Triton
reports, and PyTorch's GELU and cuBLAS's SGEMM modules out of the BF16 cuBLAS ones (a
report split from a combined one keeps every module the combined one held).

The combined report is then split by NVTX range the way ``perfscope profile`` splits
its own: ``perfscope.ncu.raw_csv`` reads the raw page, ``perfscope.profiling.
ranges_by_launch`` names the owner of every launch, and ``perfscope.ncu.export_launches``
copies each workload's contiguous launches into a report of its own, which is compressed
to ``NAME.ncu-rep.xz`` (lzma preset 9). The combined reports stay in a temporary folder
and are deleted. ``workloads.py time`` then writes ``timing.json`` (correctness and
event-timed ratio to cuBLAS, in a process of its own, outside ncu).

DIR receives ``capture.json`` (per workload: report file and size, launches with kernel
names, labels, passes and seconds, the group's ncu wall time and exact command),
``timing.json`` and ``external.tar``: an uncompressed tar of every ``.xz``, both JSON
files and the ncu logs, the one file to copy back (the device returns at most 8 files).
The loose ``.xz`` files are removed from DIR once the tar holds them (``--keep-loose``
keeps them). A tar over 16 MiB is cut into ``external.tar.part-NN`` pieces.

A workload that fails is recorded with its error and the others go on; ``--deadline``
bounds the whole run, so the JSON and the tar are written before the caller's limit.
This process never imports torch, triton, nvmath or CuPy: it only reads reports.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import lzma
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import workloads as wl  # noqa: E402

from perfscope import ncu as ncu_mod  # noqa: E402
from perfscope import profiling  # noqa: E402
from perfscope.errors import PerfscopeError  # noqa: E402

WORKLOADS_PY = HERE / "workloads.py"
# Beyond --set full: cluster geometry (the nvjet kernels run 2-CTA clusters) and the L2
# sectors the SMs requested, TMA copies included (perfscope's PS105 reads it).
METRICS = ("launch__cluster_dim_x", "launch__cluster_dim_y", "launch__cluster_dim_z",
           "launch__cluster_size", "lts__t_sectors_srcunit_tex.sum")
CSV_METRICS = ("gpu__time_duration.sum",)
TAR_PIECE_BYTES = 15 << 20      # under the device's 16 MiB a file
XZ_PRESET = 9
_STATUS_RE = re.compile(rf"^{re.escape(wl.STATUS_PREFIX)} (\S+) (ok|skipped|error)(?:: (.*))?$", re.M)


def ncu_options(output: Path, names: Sequence[str]) -> ncu_mod.NcuOptions:
    return ncu_mod.NcuOptions(output=output, full_set=True, metrics=METRICS,
                              nvtx_include=tuple(f"{n}/" for n in names), replay_mode="kernel",
                              cache_control="all", clock_control="none", import_source=True)


def child_command(names: Sequence[str]) -> list[str]:
    return [sys.executable, str(WORKLOADS_PY), "run", "--nvtx", *names]


# ------------------------------------------------------------------ splitting (pure)


@dataclass(frozen=True)
class Launch:
    index: int                  # in the combined report
    kernel: str
    duration_ns: float | None
    owner: str | None


def launches_from_csv(csv_text: str, names: Sequence[str]) -> list[Launch]:
    """Every launch of the raw page with its kernel name, duration and owning workload."""
    owners = profiling.ranges_by_launch(csv_text, list(names))
    rows = list(csv.reader(io.StringIO(csv_text)))
    if len(rows) < 2:
        return []
    header, units = rows[0], rows[1]
    name_col = header.index("Kernel Name") if "Kernel Name" in header else None
    dur_col = header.index(CSV_METRICS[0]) if CSV_METRICS[0] in header else None
    # The raw page scales units for reading (ns, us, ms) unless asked for base units.
    unit = units[dur_col].strip().lower() if dur_col is not None and dur_col < len(units) else ""
    scale = _NS_PER.get(unit)
    out = []
    for i, (row, owner) in enumerate(zip(rows[2:], owners, strict=False)):
        kernel = row[name_col] if name_col is not None and name_col < len(row) else "?"
        try:
            dur = float(row[dur_col].replace(",", "")) * scale if dur_col is not None and scale else None
        except (ValueError, IndexError):
            dur = None
        out.append(Launch(i, kernel, dur, owner))
    return out


_NS_PER = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6,
           "s": 1e9, "second": 1e9}


def spans(owners: Sequence[str | None]) -> dict[str, tuple[int, int]]:
    """name -> (first launch, count); a workload's launches must be contiguous."""
    return profiling.launch_spans(owners, "the combined report")


def label_launches(w: wl.Workload, kernels: Sequence[str]) -> list[str]:
    """What each launch of a workload is: its declared labels when the count matches."""
    if len(kernels) == len(w.launches):
        return list(w.launches)
    labels = []
    for k in kernels:
        low = k.lower()
        if "gelu" in low:
            labels.append("gelu_tanh elementwise")
        elif "reduce" in low or "splitk" in low or "split_k" in low:
            labels.append("split-K reduction")
        elif any(s in low for s in ("gemm", "nvjet", "xmma", "cutlass", "matmul", "sm90", "sm80")):
            labels.append("gemm")
        else:
            labels.append("other")
    return labels


# ------------------------------------------------------------------------- running


@dataclass
class GroupResult:
    group: str
    names: list[str]
    argv: list[str]
    wall_seconds: float | None = None
    failure: str | None = None
    statuses: dict[str, tuple[str, str]] = field(default_factory=dict)
    launches: list[Launch] = field(default_factory=list)
    passes: list[tuple[str, int | None, float]] = field(default_factory=list)
    reports: dict[str, dict[str, Any]] = field(default_factory=dict)
    split_error: str | None = None
    log: Path | None = None


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


def compress(src: Path, dst: Path) -> None:
    tmp = dst.with_name(dst.name + ".part")
    with open(src, "rb") as fin, lzma.open(tmp, "wb", preset=XZ_PRESET) as fout:
        shutil.copyfileobj(fin, fout, 1 << 20)
    os.replace(tmp, dst)


def capture_group(ncu: str, group: str, ws: list[wl.Workload], staging: Path, out: Path,
                  timeout: float) -> GroupResult:
    names = [w.name for w in ws]
    opts = ncu_options(staging / group, names)
    command = child_command(names)
    res = GroupResult(group, names, ncu_mod.build_argv(ncu, opts, command))
    print(f"\n== {group}: {len(names)} workloads, ncu over one process (timeout {timeout:.0f} s)", flush=True)
    print("   " + shlex.join(res.argv), flush=True)
    last = [time.monotonic()]

    def on_progress(ev: ncu_mod.Progress) -> None:
        if ev.done:
            now = time.monotonic()
            res.passes.append((ev.kernel, ev.passes, round(now - last[0], 2)))
            last[0] = now
            print(f"   [{group}] {ev.kernel[:70]}: {ev.passes if ev.passes is not None else '?'} passes, "
                  f"{res.passes[-1][2]:.1f} s", flush=True)
        elif ev.percent == 0:
            last[0] = time.monotonic()

    t0 = time.monotonic()
    try:
        run = ncu_mod.execute(ncu, opts, command, timeout=timeout, on_progress=on_progress)
    except PerfscopeError as exc:
        res.wall_seconds = round(time.monotonic() - t0, 1)
        res.failure = str(exc)
        print(f"   {group}: {exc}", flush=True)
        return res
    res.wall_seconds = round(time.monotonic() - t0, 1)
    res.log = staging / f"{group}.ncu.log"
    res.log.write_text(run.output)
    res.statuses = {m.group(1): (m.group(2), m.group(3) or "") for m in _STATUS_RE.finditer(run.output)}
    if run.failure is not None:
        res.failure = str(run.failure)
    if run.report is None:
        print(f"   {group}: no report ({res.failure})", flush=True)
        return res
    try:
        res.launches = launches_from_csv(ncu_mod.raw_csv(ncu, run.report, CSV_METRICS), names)
        found = spans([ln.owner for ln in res.launches])
    except PerfscopeError as exc:
        res.split_error = str(exc)
        print(f"   {group}: cannot split the report: {exc}", flush=True)
        return res

    one_import = threading.Lock()   # one `ncu --import` at a time; the xz work runs in parallel

    def split_one(name: str) -> tuple[str, dict[str, Any]]:
        first, count = found[name]
        target = staging / f"{name}.ncu-rep"
        if len(found) == 1 and count == len(res.launches):
            shutil.copyfile(run.report, target)
        else:
            with one_import:
                ncu_mod.export_launches(ncu, run.report, first, count, target)
        xz = out / f"{name}.ncu-rep.xz"
        compress(target, xz)
        info = {"report": xz.name, "size_bytes": xz.stat().st_size,
                "raw_size_bytes": target.stat().st_size, "first_launch": first, "launch_count": count}
        target.unlink()
        return name, info

    with ThreadPoolExecutor(max_workers=min(8, max(1, len(found)))) as pool:
        futures = {n: pool.submit(split_one, n) for n in found}
        for n, fut in futures.items():
            try:
                name, info = fut.result()
                res.reports[name] = info
            except Exception as exc:  # one failed split must not lose the others
                res.reports[n] = {"error": f"{type(exc).__name__}: {exc}"}
    run.report.unlink(missing_ok=True)
    return res


def run_timing(names: list[str], out: Path, staging: Path, timeout: float) -> dict[str, Any]:
    """workloads.py time in a process of its own; its output goes to the console and a log."""
    target = out / "timing.json"
    cmd = [sys.executable, str(WORKLOADS_PY), "time", "--out", str(target), *names]
    print(f"\n== timing: {shlex.join(cmd)} (timeout {timeout:.0f} s)", flush=True)
    log = staging / "timing.log"
    t0 = time.monotonic()
    rc: int | None = None
    with open(log, "w") as logf:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                stdin=subprocess.DEVNULL)
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                sys.stdout.write(line)
                logf.write(line)
                if time.monotonic() - t0 > timeout:
                    proc.kill()
                    logf.write(f"\n(timing stopped after {timeout:.0f} s)\n")
                    break
            rc = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    info: dict[str, Any] = {"command": shlex.join(cmd), "returncode": rc,
                            "wall_seconds": round(time.monotonic() - t0, 1), "log": log.name}
    if target.exists():
        try:
            info["doc"] = json.loads(target.read_text())
        except ValueError as exc:
            info["error"] = f"timing.json is not JSON ({exc})"
    else:
        info["error"] = "workloads.py time wrote no timing.json"
    return info


def workload_record(w: wl.Workload, res: GroupResult | None) -> dict[str, Any]:
    rec: dict[str, Any] = {**w.describe()}
    if res is None:
        rec.update(status="not run", detail="the deadline passed before its group ran")
        return rec
    mine = [ln for ln in res.launches if ln.owner == w.name]
    if w.name in res.statuses:
        status, detail = res.statuses[w.name]
    elif mine:   # its status line was lost in ncu's output, but its kernels were captured
        status, detail = "ok", "no status line in ncu's output; its launches are in the report"
    else:
        status, detail = "error", res.failure or "the child never reached it"
    rec.update(status=status, detail=detail, ncu_wall_seconds=res.wall_seconds,
               ncu_command=shlex.join(res.argv))
    # ncu's pass counter ticks once per profiled launch, in report order.
    by_index = res.passes if len(res.passes) == len(res.launches) else []
    labels = label_launches(w, [ln.kernel for ln in mine])
    rec["launches"] = [{"index": ln.index, "kernel": ln.kernel, "label": lab,
                        "duration_ns": ln.duration_ns,
                        "passes": by_index[ln.index][1] if by_index else None,
                        "seconds": by_index[ln.index][2] if by_index else None}
                       for ln, lab in zip(mine, labels, strict=True)]
    rec["passes"] = (sum(x["passes"] or 0 for x in rec["launches"]) if by_index and mine else None)
    rec["profile_seconds"] = (round(sum(x["seconds"] or 0 for x in rec["launches"]), 2)
                              if by_index and mine else None)
    rep = res.reports.get(w.name)
    if rep:
        rec.update(rep)
    if status == "ok" and not mine:
        rec["error"] = res.split_error or res.failure or "ncu captured no kernel in this workload's range"
    return rec


def write_tar(out: Path, members: list[Path], keep_loose: bool) -> list[Path]:
    tar_path = out / "external.tar"
    tmp = out / "external.tar.part"
    with tarfile.open(tmp, "w") as tar:
        for m in members:
            if m.exists():
                tar.add(m, arcname=m.name)
    os.replace(tmp, tar_path)
    size = tar_path.stat().st_size
    pieces = [tar_path]
    if size > TAR_PIECE_BYTES:
        pieces = []
        with open(tar_path, "rb") as f:
            for i in range(0, size, TAR_PIECE_BYTES):
                piece = out / f"external.tar.part-{i // TAR_PIECE_BYTES:02d}"
                piece.write_bytes(f.read(TAR_PIECE_BYTES))
                pieces.append(piece)
        tar_path.unlink()
        print(f"external.tar is {size / 2**20:.1f} MiB, over one returned file's limit: cut into "
              f"{len(pieces)} pieces (cat external.tar.part-* > external.tar)")
    if not keep_loose:
        for m in members:
            if m.suffix == ".xz" and m.parent == out:
                m.unlink(missing_ok=True)
    return pieces


def print_table(records: dict[str, dict[str, Any]], timing: dict[str, Any] | None) -> None:
    rows = (timing or {}).get("workloads", {})
    print(f"\n{'workload':24s} {'group':10s} {'status':8s} {'launches':>8s} {'passes':>6s} {'report KB':>9s} "
          f"{'ratio':>6s} {'correct':8s} detail")
    for name, r in records.items():
        t = rows.get(name, {})
        ratio = f"{t['ratio']:.2f}" if t.get("ratio") is not None else "-"
        size = f"{r['size_bytes'] / 1024:.0f}" if r.get("size_bytes") else "-"
        detail = r.get("error") or r.get("detail") or t.get("error") or ""
        kernels = ", ".join(f"{x['label']}: {x['kernel'][:40]}" for x in r.get("launches", []))
        print(f"{name:24s} {r['group']:10s} {r['status']:8s} {len(r.get('launches', [])):8d} "
              f"{r.get('passes') if r.get('passes') is not None else '-':>6} {size:>9s} {ratio:>6s} "
              f"{t.get('verdict', '-'):8s} {(detail or kernels)[:90]}")


def self_test(groups: list[tuple[str, list[wl.Workload]]]) -> None:
    """The split on a synthetic raw page shaped like ncu's (what --dry-run checks)."""
    names = [w.name for _, ws in groups for w in ws]
    lines = ['"ID","Process ID","thread Domain:Push/Pop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg",'
             '"Kernel Name","gpu__time_duration.sum"', '"","","","","ns"']
    i = 0
    for name in names:
        w = wl.BY_NAME[name]
        for label in w.launches:
            lines.append(f'"{i}","1","1  ""<default domain>:{name}:none:none:none:none:none:none"" ",'
                         f'"{label.split()[0]}_kernel","{1000 + i}"')
            i += 1
    launches = launches_from_csv("\n".join(lines) + "\n", names)
    found = spans([ln.owner for ln in launches])
    assert [ln.owner for ln in launches] == [n for n in names for _ in wl.BY_NAME[n].launches]
    assert set(found) == set(names), (found, names)
    for name, (first, count) in found.items():
        assert count == len(wl.BY_NAME[name].launches)
        print(f"   {name:24s} launches [{first}, {first + count}) -> ncu --import COMBINED "
              f"--launch-skip {first} --launch-count {count} --export {name}.ncu-rep")
    try:
        spans(["a", "b", "a"])
    except PerfscopeError:
        pass
    else:
        raise AssertionError("interleaved launches were not refused")
    print(f"   split self-test passed: {len(launches)} launches, {len(found)} workloads")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--only", nargs="+", metavar="NAME", help="these workloads only")
    ap.add_argument("--skip-timing", action="store_true")
    ap.add_argument("--dry-run", action="store_true", help="print the commands and test the split")
    ap.add_argument("--keep-loose", action="store_true", help="keep the .xz files beside the tar")
    ap.add_argument("--ncu", help="ncu executable (default: perfscope's search)")
    ap.add_argument("--deadline", type=float, default=500.0,
                    help="seconds for everything; later steps are skipped past it (default 500)")
    ap.add_argument("--group-timeout", type=float, default=240.0)
    ap.add_argument("--timing-timeout", type=float, default=200.0)
    args = ap.parse_args()
    deadline = Deadline(args.deadline)
    chosen = wl.select(args.only)
    groups = [(g, [w for w in chosen if w.group == g]) for g in wl.GROUPS]
    groups = [(g, ws) for g, ws in groups if ws]
    try:
        ncu = args.ncu or ncu_mod.find_ncu()
    except PerfscopeError as exc:
        if not args.dry_run:
            print(f"error: {exc}")
            return 2
        ncu = "ncu"

    if args.dry_run:
        staging = Path(tempfile.gettempdir()) / "external-capture-STAGING"
        for g, ws in groups:
            print(f"== {g}:")
            print("   " + shlex.join(ncu_mod.build_argv(ncu, ncu_options(staging / g, [w.name for w in ws]),
                                                         child_command([w.name for w in ws]))))
        if not args.skip_timing:
            print("== timing:\n   " + shlex.join([sys.executable, str(WORKLOADS_PY), "time", "--out",
                                                  str(args.out / "timing.json"), *[w.name for w in chosen]]))
        print("== split:")
        self_test(groups)
        return 0

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    try:
        version = ".".join(map(str, ncu_mod.ncu_version(ncu)))
    except PerfscopeError as exc:
        print(f"error: {exc}")
        return 2
    staging = Path(tempfile.mkdtemp(prefix="external-capture-"))
    results: dict[str, GroupResult] = {}
    timing: dict[str, Any] | None = None
    t_start = time.monotonic()
    try:
        for g, ws in groups:
            left = deadline.left()
            if left < 30:
                print(f"\n== {g}: skipped, {left:.0f} s left before the deadline")
                continue
            results[g] = capture_group(ncu, g, ws, staging, out, min(args.group_timeout, left - 20))
        left = deadline.left()
        if not args.skip_timing and left >= 30:
            timing = run_timing([w.name for w in chosen], out, staging,
                                min(args.timing_timeout, left - 15))
        elif not args.skip_timing:
            timing = {"error": f"skipped, {left:.0f} s left before the deadline"}

        records = {w.name: workload_record(w, results.get(w.group)) for w in chosen}
        doc = {"schema": "perfscope.external-capture/1",
               "command": "PYTHONPATH=. python3 " + shlex.join(sys.argv),
               "time": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
               "ncu": {"path": ncu, "version": version},
               "options": {"set": "full", "replay_mode": "kernel", "cache_control": "all",
                           "clock_control": "none", "import_source": True, "metrics": list(METRICS),
                           "note": "ncu exported to NAME.part.ncu-rep and renamed when done "
                                   "(perfscope.ncu.execute); the command below names the final file"},
               "groups": {g: {"workloads": r.names, "ncu_command": shlex.join(r.argv),
                              "wall_seconds": r.wall_seconds, "failure": r.failure,
                              "split_error": r.split_error, "log": r.log.name if r.log else None,
                              "kernels_profiled": len(r.launches),
                              "passes": [{"kernel": k, "passes": p, "seconds": s} for k, p, s in r.passes]}
                          for g, r in results.items()},
               "timing": {k: v for k, v in (timing or {}).items() if k != "doc"} or None,
               "workloads": records,
               "wall_seconds": round(time.monotonic() - t_start, 1)}
        (out / "capture.json").write_text(json.dumps(doc, indent=1) + "\n")
        members = [out / r["report"] for r in records.values() if r.get("report")]
        members += [out / "capture.json", out / "timing.json"]
        members += sorted(staging.glob("*.log"))
        pieces = write_tar(out, members, args.keep_loose)
        print_table(records, (timing or {}).get("doc"))
        for p in pieces:
            print(f"{p}: {p.stat().st_size / 2**20:.2f} MiB")
        print(f"total {doc['wall_seconds']:.0f} s")
        bad = [n for n, r in records.items() if r["status"] == "error" or r.get("error")
               or (r["status"] == "ok" and not r.get("report"))]
        return 1 if bad else 0
    finally:
        shutil.rmtree(staging, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
