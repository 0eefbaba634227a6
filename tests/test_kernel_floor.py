"""benchmarks/kernel_floor.py on the committed capture (no GPU): the line it fits and the
constant the rules take from it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROBES = ROOT / "reports" / "reference" / "h200" / "probes"
sys.path.insert(0, str(ROOT / "benchmarks"))

import kernel_floor  # noqa: E402

from perfscope.hardware import KERNEL_FIXED_NS  # noqa: E402


def test_the_line_through_exact_points_is_found():
    line = kernel_floor.fit([(64e6, 2.0 + 64e6 / 4.48e6), (128e6, 2.0 + 128e6 / 4.48e6),
                             (256e6, 2.0 + 256e6 / 4.48e6)])
    assert line.intercept_us == pytest.approx(2.0) and line.rate_gbps == pytest.approx(4480)
    with pytest.raises(ValueError):
        kernel_floor.fit([(1.0, 1.0)])


def test_the_committed_capture_gives_the_committed_line():
    """The H200 capture's 19 launches: the read stream's line crosses zero bytes at 4.41 us,
    and the shortest launch that reads DRAM lasts no less than the fixed time the rules use."""
    doc = kernel_floor.from_report(PROBES / "kernel-floor-h200.ncu-rep.xz")
    events = json.loads((PROBES / "kernel-floor-h200-events.json").read_text())
    assert len(doc["rows"]) == 19
    assert doc["fit"] == pytest.approx(events["from_report"]["fit"])
    assert doc["fit"]["intercept_us"] == pytest.approx(4.41, abs=0.01)
    reads = [r["us"] for r in doc["rows"] if r["kernel"] == kernel_floor.STREAM_KERNEL]
    assert min(reads) * 1e3 >= KERNEL_FIXED_NS["9.0"]
    assert events["environment"]["gpu"] == "NVIDIA H200"
