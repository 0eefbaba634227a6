"""Time to generate the HTML report (and the Markdown summary) for a whole ladder, no GPU.

    python benchmarks/report_time.py [PATH...] [--bench FILE] [--repeat N]

Default: the reference run folder when it holds reports, else every H200 fixture with the
reference bench.json. "Cold" starts with an empty decompression cache (every .xz is
decompressed); "warm" reuses it, as every later report of the same files does. Each run
is the whole of ``perfscope report``: load, rules, diffs, source views, plots, template.
Times are CPU seconds of this process (time.process_time), the measure the targets name.

Targets (issue 17, the 27-kernel reference run on this 2-core machine): the page built in
at most 3 s of CPU warm, at most 600 KB, and the Markdown comment under 65,000
characters; diagnose alone (load + rules) is printed beside them, its own bar is 3 s.
The run has grown since (30 kernels: hgemm_ring, sgemm_tile8x16), so the page's two bars
are held per kernel, 600 KB / 27 and 3 s / 27 (what a kernel may cost the page did not
move); the comment's bar is GitHub's, absolute. The default paths are the reference run's
ladder, the reports directly in its folder, as on its page (fused/ has a page of its own).
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
REFERENCE = ROOT / "reports" / "reference" / "h200"
FIXTURES = ROOT / "tests" / "fixtures" / "h200"
BAR_SECONDS = 10.0            # cold, wall clock (issue 7)
CPU_SECONDS = 3.0             # warm, CPU (issue 17), for ISSUE_KERNELS kernels
PAGE_BYTES = 600_000          # likewise
ISSUE_KERNELS = 27            # the reference run issue 17 set its bars on
COMMENT_CHARS = 65_000

log = logging.getLogger("report_time")


def once(paths: list[Path], bench: Path | None) -> tuple[float, float, int, int, int, float]:
    """(collect s, render s, kernels, HTML bytes, Markdown characters, CPU s) of one full
    generation; the first two are wall-clock seconds."""
    from perfscope.render import render
    from perfscope.render.html import render_html
    from perfscope.review import collect

    c0 = time.process_time()
    t0 = time.perf_counter()
    rep = collect(paths, bench=bench)
    t1 = time.perf_counter()
    page = render_html(rep)
    md = render(rep, "markdown")
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, len(rep.entries), len(page.encode()), len(md), time.process_time() - c0


def diagnose_cpu(paths: list[Path]) -> float:
    """CPU seconds of diagnose alone (load + rules, no page) over paths."""
    from perfscope.diagnosis import diagnose

    c0 = time.process_time()
    diagnose(paths)
    return time.process_time() - c0


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*", type=Path)
    ap.add_argument("--bench", type=Path, default=None)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    paths = args.paths
    bench = args.bench
    with tempfile.TemporaryDirectory() as cache:
        os.environ["PERFSCOPE_CACHE"] = cache
        import perfscope.render.html  # noqa: F401 - import time is not generation time
        from perfscope.review import folder_reports

        if not paths:
            # The ladder, as the reference page reads it; else the fixtures.
            paths = folder_reports(REFERENCE) if any(REFERENCE.glob("*.ncu-rep.xz")) else [FIXTURES]
            bench = bench or REFERENCE / "bench.json"

        cold = once(paths, bench)
        warm = [once(paths, bench) for _ in range(args.repeat)]
        diag = [diagnose_cpu(paths) for _ in range(args.repeat)]
    total_cold = cold[0] + cold[1]
    totals = [w[0] + w[1] for w in warm]
    cpu = [w[5] for w in warm]
    shown = [str(p.relative_to(ROOT) if p.is_relative_to(ROOT) else p) for p in paths]
    where = ", ".join(shown) if len(shown) <= 3 else f"{len(shown)} reports in {Path(shown[0]).parent}"
    log.info("report of %s: %d kernels, %.0f kB of HTML, Markdown %d characters, %d CPU cores",
             where,
             cold[2], cold[3] / 1e3, cold[4], os.cpu_count() or 0)
    log.info("cold (xz decompressed): %.2f s (load + rules + diffs %.2f s, source views + plots + "
             "page %.2f s)", total_cold, cold[0], cold[1])
    log.info("warm, median of %d: %.2f s wall (load + rules + diffs %.2f s, page %.2f s), "
             "%.2f s CPU (min %.2f, max %.2f)", len(totals), statistics.median(totals),
             statistics.median(w[0] for w in warm), statistics.median(w[1] for w in warm),
             statistics.median(cpu), min(cpu), max(cpu))
    log.info("diagnose alone (load + rules), median of %d: %.2f s CPU", len(diag),
             statistics.median(diag))
    kernels = max(cold[2], 1)
    cpu_bar = CPU_SECONDS * max(kernels, ISSUE_KERNELS) / ISSUE_KERNELS
    page_bar = PAGE_BYTES * max(kernels, ISSUE_KERNELS) / ISSUE_KERNELS
    log.info("per kernel: %.1f kB of HTML (bar %.1f), %.3f s CPU warm (bar %.3f)",
             cold[3] / kernels / 1e3, PAGE_BYTES / ISSUE_KERNELS / 1e3,
             statistics.median(cpu) / kernels, CPU_SECONDS / ISSUE_KERNELS)
    checks = [(f"under {BAR_SECONDS:.0f} s cold", total_cold < BAR_SECONDS),
              (f"at most {cpu_bar:.2f} s CPU warm ({CPU_SECONDS:.0f} s per {ISSUE_KERNELS} kernels)",
               statistics.median(cpu) <= cpu_bar),
              (f"page at most {page_bar / 1e3:.0f} kB ({PAGE_BYTES / 1e3:.0f} kB per "
               f"{ISSUE_KERNELS} kernels)", cold[3] <= page_bar),
              (f"comment under {COMMENT_CHARS:,} characters", cold[4] < COMMENT_CHARS)]
    for name, ok in checks:
        log.info("bar: %s: %s", name, "yes" if ok else "NO")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
