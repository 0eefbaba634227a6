"""Probe (2026-12-04): hgemm_small_m with each k tile's B read as one contiguous 8 KB piece.

    PYTHONPATH=. python3 reports/reference/h200/probes/variants/small_m_bulk_b.py \
        PATCHED_FUSED_CU OUT.json MxNxK ...

PATCHED_FUSED_CU is fused.cu with ``small-m-bulk-b.patch`` applied: B's TMA box becomes one
cp.async.bulk of 8 KB from the residual pointer, which this script points at B, so each
CTA streams its 1 MiB (at N = K = 8192) in one contiguous run, as if B were stored in
64-column strips; the products are wrong (the bytes are not swizzled), the traffic is the
same. It is timed against the committed kernel with benchmarks/small_m_probe.py's probes
(alternating rounds, L2 read flush), beside fused_check's bulk read at 128 and 112 MiB with
132 or 128 CTAs, 12 x 16 KB or 8 x 8 KB in flight. What it measured led to
hgemm_small_m_packed, which reads real strips through a tensor map.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[5]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import small_m_probe as smp  # noqa: E402

from perfscope.kernels import Shape  # noqa: E402

_operands = smp._operands


def operands_with_b_as_residual(cp, shape, dtype):
    """small_m_probe's operands with the residual pointer at B (the patch reads B there)."""
    a, b, extra, nd = _operands(cp, shape, dtype)
    return a, b, dataclasses.replace(extra, residual=b), nd


def bulk(cp, flush, nbytes: int, ctas: int, stages: int, chunk: int) -> dict:
    """fused_check's bulk read of nbytes on this many CTAs and ring: events and CTA spans."""
    import fused_check as fc
    import numpy as np

    expr = f"bulk_stream<{stages}, {chunk}>"
    fns, probe, _raw = smp._bulk_module(cp, smp.probe_bulk_source(fc.BULK_SOURCE), "probe_bulk.cu",
                                        (expr,))
    fn = fns[expr]
    fn.max_dynamic_shared_size_bytes = stages * chunk
    buf, sink = cp.ones(nbytes // 4, dtype=cp.uint32), cp.zeros(1, dtype=cp.uint32)
    times = [smp._timed_launch(cp, probe, lambda: fn((ctas,), (32,), (
        buf, np.int64(nbytes // chunk), sink), shared_mem=stages * chunk), flush) for _ in range(22)]
    return {"bytes": nbytes, "ctas": ctas, "stages": stages, "chunk": chunk,
            "event_us_median": round(statistics.median(times[2:]), 3),
            "per_cta_us": smp._spans(cp, probe, ctas)}


def main() -> None:
    """The bulk reads, then each shape's two kernels; everything into OUT.json."""
    import cupy as cp

    from perfscope.timing import L2Flush

    smp._operands = operands_with_b_as_residual
    flush = L2Flush(cp, 512 << 20, "read")
    out: dict = {"command": " ".join(sys.argv), "bulk": [], "rows": []}
    for nbytes in (128 << 20, 112 << 20):
        for ctas, stages, chunk in ((132, 12, 16384), (128, 12, 16384), (128, 8, 8192),
                                    (132, 8, 8192), (112, 8, 16384)):
            out["bulk"].append(bulk(cp, flush, nbytes, ctas, stages, chunk))
    sources = {"current": (smp.KERNEL_DIR / "fused.cu").read_text(),
               "against": Path(sys.argv[1]).read_text()}
    for text in sys.argv[3:]:
        m, n, k = (int(x) for x in text.split("x"))
        out["rows"].append(smp.run_shape(cp, sources, Shape(m, n, k), "bf16", flush))
    Path(sys.argv[2]).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
