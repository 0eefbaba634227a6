"""FFMA register-bank reads: a stage's loop compiled here, or a report's hot loop with its samples.

    PYTHONPATH=. python3 PROBES/variants/fma_bank_reads.py sgemm_stages4 sgemm_stages4:JOUTER=2
    PYTHONPATH=. python3 PROBES/variants/fma_bank_reads.py PROBES/../sgemm_dyn-fp32-4096x4096x4096.ncu-rep.xz

For each FFMA, the source registers the register file must supply: those the operand
reuse cache does not. The cache is modelled with one entry per operand slot and register
bank (register number mod 2): a source flagged ``.reuse`` is kept for its slot and bank, a
source read without the flag clears that entry, and a write to a kept register clears it.
(With one entry per slot, cuBLAS's SGEMM, which alternates two B registers of different
banks in one slot, each flagged, would hit 0.44 times an FFMA instead of 1.24 and put
two reads in one bank on 0.77 of its FFMAs instead of 0.26.) An FFMA whose remaining reads
fall two (or three) in one bank is counted as such; for a report, each class's mean
dispatch-stall samples per FFMA are printed beside it. A probe, not a rule: whether those
FFMAs cost the time their stall samples suggest is what `fma-order.patch` is to measure.
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict
from pathlib import Path

from perfscope.audit import ReportAuditOptions, audit_report, audit_stage

FFMA = re.compile(r"\bFFMA(?:\.\S+)? R(\d+), (-?R\d+(?:\.reuse)?), (-?R\d+(?:\.reuse)?), "
                  r"(-?R\d+(?:\.reuse)?)")
BANKS = 2


def bank_reads(texts):
    """Per instruction text: None for a non-FFMA, else the most register-file reads of the
    FFMA that fall in one bank (0-3) after the reuse cache."""
    cache: dict[tuple[int, int], int | None] = {}
    out = []
    for text in texts:
        m = FFMA.search(text)
        if not m:
            cache.clear()          # the model does not follow the cache across other opcodes
            out.append(None)
            continue
        srcs = [s.lstrip("-") for s in m.groups()[1:]]
        regs = [int(re.match(r"R(\d+)", s).group(1)) for s in srcs]
        flags = [s.endswith(".reuse") for s in srcs]
        reads = {r for j, r in enumerate(regs) if cache.get((j, r % BANKS)) != r}
        for j, r in enumerate(regs):
            cache[(j, r % BANKS)] = r if flags[j] else None
        dst = int(m.group(1))
        for key, kept in list(cache.items()):
            if kept == dst:
                cache[key] = None
        per_bank = defaultdict(int)
        for r in reads:
            per_bank[r % BANKS] += 1
        out.append(max(per_bank.values(), default=0))
    return out


def _summary(classes, dispatch=None) -> str:
    n = sum(1 for c in classes if c is not None)
    parts = []
    for k in (1, 2, 3):
        idx = [i for i, c in enumerate(classes) if c is not None and min(c, 3) == k]
        if not idx:
            continue
        text = f"{k} in a bank {len(idx) / n:.3f}"
        if dispatch is not None:
            text += f" ({sum(dispatch[i] for i in idx) / len(idx):.1f} dispatch samples each)"
        parts.append(text)
    return f"{n} FFMA: " + ", ".join(parts)


def _bursts(texts) -> str:
    """The loop's LDS (first to last FFMA) and those in runs of 4 or more with no FFMA
    between: what PS129 reads from a report, here from the compiled SASS."""
    ops = [(t.split()[1] if t.split()[0].startswith("@") else t.split()[0]).split(".")[0]
           for t in texts if t.split()]
    first, last = ops.index("FFMA"), len(ops) - 1 - ops[::-1].index("FFMA")
    runs, run = [], 0
    for o in ops[first:last + 1]:
        if o == "FFMA":
            runs.append(run)
            run = 0
        elif o == "LDS":
            run += 1
    return f"{sum(runs)} LDS in the loop, {sum(r for r in runs if r >= 4)} in bursts of 4+"


def main(args: list[str]) -> int:
    """Print each argument's FFMA classes: a stage (NAME[:K=V,...]) or a report."""
    for arg in args:
        if arg.endswith((".ncu-rep", ".ncu-rep.xz")):
            for a in audit_report(Path(arg), options=ReportAuditOptions(listing=True)):
                rows = a.listing.rows
                dispatch = [dict(r.reasons).get("dispatch_stall", 0) for r in rows]
                print(f"{Path(arg).name}: {_summary(bank_reads([r.sass for r in rows]), dispatch)}")
        else:
            name, _, given = arg.partition(":")
            params = {k: int(v) for k, v in (p.split("=") for p in given.split(",") if p)}
            a = audit_stage(name, params=params or None)
            print(f"{arg}: {a.resources.registers} registers, "
                  f"{_summary(bank_reads(a.sass.instructions))}, {_bursts(a.sass.instructions)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
