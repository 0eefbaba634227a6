"""Regenerate reports/reference/h200/calibration.json from the committed reference run.

    python3 benchmarks/calibrate.py [--out reports/reference/h200]

Every ladder step: the parent's estimates for the findings the child's change addresses,
against the saving bench.json measured (no GPU needed). Run it after the reference run:
reference_run.py keeps calibration.json as this command's (its KEPT list) and does not
rewrite it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perfscope.calibration import calibrate, merge  # noqa: E402
from perfscope.diagnosis import default_catalogue, diagnose  # noqa: E402
from perfscope.manifest import BenchFile  # noqa: E402
from perfscope.reader import REPORT_SUFFIXES  # noqa: E402

# The reference run's folder of the ladder steps that act only at its large shape, held
# against bench-8192.json (benchmarks/reference_run.py profiles it).
LARGE_DIR = "large"


def _timed_reports(out: Path) -> list[Path]:
    """The reports the reference run's bench files time: its own (4096^3) and large/'s.
    Not probes/ (single questions, some on another card, at the ladder's own stage names and
    shapes), fp8/ or gpu-tests/: a step reads the run's reports or none."""
    own = sorted(p for p in out.iterdir() if p.is_file() and p.name.endswith(REPORT_SUFFIXES))
    return own + ([out / LARGE_DIR] if (out / LARGE_DIR).is_dir() else [])


def write_calibration(out: Path) -> Path:
    """calibration.json of the reference run in out: its ladder (reports and bench.json),
    where the folder has them its ladder at 8192^3 (large/'s reports and bench-8192.json),
    and its fused stages (fused/ and fused/bench-fused.json)."""
    cat = default_catalogue()
    records = diagnose(_timed_reports(out), catalogue=cat)
    tables = [calibrate(records, BenchFile.read(out / "bench.json"), cat, source="bench.json")]
    if (out / LARGE_DIR).is_dir() and (out / "bench-8192.json").is_file():
        tables.append(calibrate(records, BenchFile.read(out / "bench-8192.json"), cat,
                                source="bench-8192.json"))
    fused = out / "fused"
    if (fused / "bench-fused.json").is_file():
        tables.append(calibrate(diagnose([fused], catalogue=cat),
                                BenchFile.read(fused / "bench-fused.json"), cat,
                                source="fused/bench-fused.json"))
    merge(*tables).write(out / "calibration.json")
    return out / "calibration.json"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "reference" / "h200")
    path = write_calibration(ap.parse_args().out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
