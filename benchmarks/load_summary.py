"""Time to load and summarise the 24-launch capture (interpreter start excluded).

    python benchmarks/load_summary.py [REPORT]

"Cold" starts with an empty decompression cache (the .xz is decompressed); "warm" reads
the cached plain report, as every later diagnose of the same file does. Summarise means
what `perfscope diagnose` computes before printing: every view and the summary rows.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

DEFAULT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "h200" / "many_launches.ncu-rep.xz"


def once(path: Path) -> tuple[float, int]:
    from perfscope.profile import load
    from perfscope.render.summary import sections

    t0 = time.perf_counter()
    profiles = load(path)
    for kp in profiles:
        sections(kp)
    return time.perf_counter() - t0, len(profiles)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", nargs="?", type=Path, default=DEFAULT)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        os.environ["PERFSCOPE_CACHE"] = cache
        import perfscope.profile  # noqa: F401 - import cost is not load cost

        cold, n = once(args.report)
        warm = [once(args.report)[0] for _ in range(args.repeat)]
    print(f"{args.report.name}: {n} kernel launches")
    print(f"cold (xz decompressed, first disassembly): {cold:.3f} s")
    print(f"warm (cached), median of {len(warm)}: {statistics.median(warm):.3f} s "
          f"(min {min(warm):.3f}, max {max(warm):.3f})")


if __name__ == "__main__":
    main()
