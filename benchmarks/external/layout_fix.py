"""Time the fixes PS107 and PS108 name against the calls they fix: the layout, measured.

    PYTHONPATH=. python3 benchmarks/external/layout_fix.py --out FILE.json [--rounds 5] [--runs 20]

Two pairs, each checked against float64 and then timed with CUDA events in alternating
rounds, by workloads.py's own batch (a 256 MiB write before every timed call, so L2 starts
cold; layout-fix-h100.json was made by a copy of it that synchronised after each call):

- ``unaligned_rows``: torch.matmul at 4095^3 bf16 (rows 8,190 bytes apart: the external
  set's torch_odd_4095) against the same product with K and N padded with zeros to 4096
  (A stored 4095 x 4096, B 4096 x 4096, C 4095 x 4096; the result's first 4095 columns).
- ``operand_layout``: torch._int_mm at 4096^3 with B[K][N] (torch_int8_4096) against the
  same product with B stored K-major once (bt = b.t().contiguous(), passed as bt.t()).

Each row has both times, ``saving`` = 1 - fixed / before (what PS107 / PS108 estimate from
the report of the call before: 0.79 and 0.91 on the H100 capture of 2026-12-06) and the
rounds. Needs PyTorch and a GPU; nothing else of perfscope.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import workloads as wl  # noqa: E402  (the external set's timing: flush, queue-ahead, events)

SEED = 20261206


def _timed(torch, fn, flush, runs: int) -> float:
    """Median ms of `runs` calls, each after writing the flush buffer (workloads.py's batch)."""
    times, _ = wl._timed_batch(torch, fn, flush, runs)
    return statistics.median(times)


def _unaligned(torch):
    g = torch.Generator(device="cuda").manual_seed(SEED)
    n = 4095
    a = torch.randn(n, n, device="cuda", generator=g).to(torch.bfloat16)
    b = torch.randn(n, n, device="cuda", generator=g).to(torch.bfloat16)
    ap = torch.zeros(n, 4096, device="cuda", dtype=torch.bfloat16)
    bp = torch.zeros(4096, 4096, device="cuda", dtype=torch.bfloat16)
    ap[:, :n] = a
    bp[:n, :n] = b
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    cp = torch.empty(n, 4096, device="cuda", dtype=torch.bfloat16)
    exact = a.double() @ b.double()
    return (lambda: torch.matmul(a, b, out=c), lambda: torch.matmul(ap, bp, out=cp),
            lambda: c.double(), lambda: cp[:, :n].double(), exact, 1e-2)


def _operand(torch):
    g = torch.Generator(device="cuda").manual_seed(SEED)
    n = 4096
    a = torch.randint(-16, 17, (n, n), device="cuda", generator=g, dtype=torch.int8)
    b = torch.randint(-16, 17, (n, n), device="cuda", generator=g, dtype=torch.int8)
    bt = b.t().contiguous()
    c = torch.empty(n, n, device="cuda", dtype=torch.int32)
    c2 = torch.empty_like(c)
    exact = a.double() @ b.double()
    return (lambda: torch._int_mm(a, b, out=c), lambda: torch._int_mm(a, bt.t(), out=c2),
            lambda: c.double(), lambda: c2.double(), exact, 1e-9)


PAIRS = {"unaligned_rows": _unaligned, "operand_layout": _operand}


def run_pair(torch, name: str, rounds: int, runs: int) -> dict:
    before, fixed, got_before, got_fixed, exact, tol = PAIRS[name](torch)
    errs = []
    for fn, got in ((before, got_before), (fixed, got_fixed)):
        fn()
        torch.cuda.synchronize()
        errs.append(float(torch.linalg.norm(got() - exact) / torch.linalg.norm(exact)))
    row = {"pair": name, "rel_error_before": errs[0], "rel_error_fixed": errs[1],
           "tolerance": tol, "verdict": "ok" if max(errs) <= tol else "WRONG"}
    if row["verdict"] != "ok":
        return row
    flush = torch.empty(wl.FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    for fn in (before, fixed):
        for _ in range(3):
            fn()
    t_before, t_fixed = [], []
    for r in range(rounds):
        pair = ((before, t_before), (fixed, t_fixed))
        for fn, out in (pair if r % 2 == 0 else pair[::-1]):
            out.append(_timed(torch, fn, flush, runs))
    b, f = statistics.median(t_before), statistics.median(t_fixed)
    row.update(ms_before=b, ms_fixed=f, saving=round(1 - f / b, 4),
               rounds_before=t_before, rounds_fixed=t_fixed)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.runs < 1:
        print("layout_fix: --rounds and --runs must be at least 1", file=sys.stderr)
        return 2
    try:
        import torch
    except ImportError:
        print("layout_fix: needs PyTorch and a GPU, and this machine has no PyTorch", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("layout_fix: PyTorch sees no CUDA device", file=sys.stderr)
        return 2
    rows = []
    for name in PAIRS:
        try:
            rows.append(run_pair(torch, name, args.rounds, args.runs))
        except (RuntimeError, TypeError) as exc:     # an API this PyTorch lacks: recorded
            rows.append({"pair": name, "verdict": "error", "detail": str(exc).splitlines()[0]})
    for r in rows:
        print(f"{r['pair']:16s} {r['verdict']:5s} before {r.get('ms_before', float('nan')):.3f} ms "
              f"fixed {r.get('ms_fixed', float('nan')):.3f} ms saving {r.get('saving')}")
    doc = {"schema": "perfscope.layout-fix/1", "gpu": torch.cuda.get_device_name(),
           "torch": torch.__version__, "cuda": torch.version.cuda, "rows": rows,
           "command": "PYTHONPATH=. python3 benchmarks/external/layout_fix.py "
           + " ".join(argv if argv is not None else sys.argv[1:]),
           "time": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0 if all(r["verdict"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
