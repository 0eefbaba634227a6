"""The register-bank model `ffma_bank_probe.py` measured, against each report's FFMAs held
at dispatch.

    PYTHONPATH=. python3 PROBES/variants/fma_bank_model.py

For every FFMA loop captured (the FFMA-order probes, the FP32 ladder, cuBLAS's SGEMM,
Triton's IEEE fp32 matmul), the loop's FFMAs in address order with the register-file
reads each needs after the operand reuse cache (modelled per operand slot, or per slot and
bank: register number mod 2), and the issue cycles an FFMA loses if each bank serves one
read a cycle: per FFMA (its own reads alone), or over blocks of 2, 4 or 8 FFMAs (reads
balanced within a block). Printed: each model's Pearson correlation with the share of
samples the loop's FFMAs are held at dispatch (`HotLoop.ffma_dispatch.share`, PS133's
reading), and the best model's figure per kernel.
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from pathlib import Path

from perfscope.audit import ReportAuditOptions, audit_report
from perfscope.profile import load

PROBES = Path(__file__).resolve().parents[1]
REFERENCE = PROBES.parent
ROOT = REFERENCE.parents[2]
FFMA = re.compile(r"\bFFMA(?:\.\S+)? R\d+, (-?R\d+|RZ)(\.reuse)?, (-?R\d+|RZ)(\.reuse)?, "
                  r"(-?R\d+|RZ)(\.reuse)?")


def reports() -> dict[str, Path]:
    """The FFMA loops with per-PC samples: name -> report."""
    out = {f"JOUTER {j}": PROBES / f"sgemm_stages4@JOUTER={j}-fp32-4096x4096x4096-h100.ncu-rep.xz"
           for j in (2, 4, 5, 7, 9, 10, 11, 13)}
    out["JOUTER 0"] = PROBES / "sgemm_stages4-fp32-4096x4096x4096-fma-order-h100.ncu-rep.xz"
    for stage in ("sgemm_stages4", "sgemm_dyn", "sgemm_fma_order", "sgemm_tile8x16",
                  "sgemm_tile128x256", "sgemm_pipe", "sgemm_warptile", "sgemm_float4",
                  "sgemm_reg8x8", "cublas_sgemm"):
        out[stage] = REFERENCE / f"{stage}-fp32-4096x4096x4096.ncu-rep.xz"
    out["triton_fp32_ieee"] = ROOT / "tests" / "fixtures" / "external" / "triton_fp32_ieee.ncu-rep.xz"
    return out


def bank_reads(texts: list[str], per_bank: bool) -> list[tuple[int, int]]:
    """Per FFMA (other instructions clear the cache), the reads from bank 0 and bank 1."""
    cache: dict[tuple[int, int], int | None] = {}
    out = []
    for text in texts:
        m = FFMA.search(text)
        if not m:
            cache.clear()
            continue
        regs = [None if g.lstrip("-") == "RZ" else int(g.lstrip("-")[1:]) for g in m.group(1, 3, 5)]
        flags = [bool(g) for g in m.group(2, 4, 6)]
        keys = [(j, (r or 0) % 2 if per_bank else 0) for j, r in enumerate(regs)]
        reads = {r for r, k in zip(regs, keys, strict=True) if r is not None and cache.get(k) != r}
        for r, f, k in zip(regs, flags, keys, strict=True):
            if r is not None:
                cache[k] = r if f else None
        banks = Counter(r % 2 for r in reads)
        out.append((banks[0], banks[1]))
    return out


def lost_cycles(reads: list[tuple[int, int]], block: int) -> float:
    """Issue cycles lost per FFMA when each bank serves one read a cycle within a block."""
    total = 0
    for s in range(0, len(reads), block):
        part = reads[s:s + block]
        total += max(len(part), sum(a for a, _ in part), sum(b for _, b in part))
    return total / len(reads) - 1


def main() -> None:
    """Print the models' correlations and the best one per kernel."""
    rows = []
    for name, path in reports().items():
        (kp,) = load(path)
        (audit,) = audit_report(path, options=ReportAuditOptions(listing=True))
        texts = [r.sass for r in audit.listing.rows]
        models = {f"{'slot+bank' if pb else 'slot'}, blocks of {b}": lost_cycles(bank_reads(texts, pb), b)
                  for pb in (False, True) for b in (1, 2, 4, 8)}
        rows.append((name, kp.hot_loop.ffma_dispatch.share, models))
    shares = [r[1] for r in rows]
    corr = {m: statistics.correlation(shares, [r[2][m] for r in rows]) for m in rows[0][2]}
    for m, c in corr.items():
        print(f"{m:24s} r = {c:.2f}")
    best = max(corr, key=corr.get)
    print(f"\n{'kernel':20s} held at dispatch   {best}: cycles lost per FFMA")
    for name, share, models in sorted(rows, key=lambda r: r[1]):
        print(f"{name:20s} {share:17.3f}   {models[best]:.3f}")


if __name__ == "__main__":
    main()
