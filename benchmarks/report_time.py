"""Time to generate the HTML report (and the Markdown summary) for a whole ladder, no GPU.

    python benchmarks/report_time.py [PATH...] [--bench FILE] [--repeat N]

Default: the reference run folder when it holds reports, else every H200 fixture with the
reference bench.json. "Cold" starts with an empty decompression cache (every .xz is
decompressed); "warm" reuses it, as every later report of the same files does. Each run
is the whole of ``perfscope report``: load, rules, diffs, plots, template. The bar from
issue 7 is under 10 s on a 2-core machine.
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
BAR_SECONDS = 10.0

log = logging.getLogger("report_time")


def once(paths: list[Path], bench: Path | None) -> tuple[float, float, int, int]:
    """(collect seconds, render seconds, kernels, HTML bytes) of one full generation."""
    from perfscope.render import render
    from perfscope.render.html import render_html
    from perfscope.review import collect

    t0 = time.perf_counter()
    rep = collect(paths, bench=bench)
    t1 = time.perf_counter()
    page = render_html(rep)
    render(rep, "markdown")
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, len(rep.entries), len(page.encode())


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*", type=Path)
    ap.add_argument("--bench", type=Path, default=None)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    paths = args.paths
    bench = args.bench
    if not paths:
        if any(REFERENCE.glob("*.ncu-rep.xz")):
            paths = [REFERENCE]
        else:
            paths, bench = [FIXTURES], bench or REFERENCE / "bench.json"
    with tempfile.TemporaryDirectory() as cache:
        os.environ["PERFSCOPE_CACHE"] = cache
        import perfscope.render.html  # noqa: F401 - import time is not generation time

        cold = once(paths, bench)
        warm = [once(paths, bench) for _ in range(args.repeat)]
    total_cold = cold[0] + cold[1]
    totals = [c + r for c, r, _, _ in warm]
    log.info("report of %s: %d kernels, %.0f kB of HTML, %d CPU cores",
             ", ".join(str(p.relative_to(ROOT) if p.is_relative_to(ROOT) else p) for p in paths),
             cold[2], cold[3] / 1e3, os.cpu_count() or 0)
    log.info("cold (xz decompressed): %.2f s (load + rules + diffs %.2f s, plots + page %.2f s)",
             total_cold, cold[0], cold[1])
    log.info("warm, median of %d: %.2f s (min %.2f, max %.2f)", len(totals),
             statistics.median(totals), min(totals), max(totals))
    within = total_cold < BAR_SECONDS
    log.info("bar: under %.0f s cold: %s", BAR_SECONDS, "yes" if within else "NO")
    return 0 if within else 1


if __name__ == "__main__":
    sys.exit(main())
