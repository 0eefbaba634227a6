"""benchmarks/balanced_grid_probe.py's grid, and what its committed H100 run and reports say
(no GPU): the persistent stage on the fewest CTAs that take its tiles in the same rounds."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROBES = ROOT / "reports" / "reference" / "h200" / "probes"
sys.path.insert(0, str(ROOT / "benchmarks"))

import balanced_grid_probe as probe  # noqa: E402


def test_the_probe_launches_the_balanced_stage_s_grid():
    # The grid itself: tests/test_hopper.py (tensormap.balanced_grid).
    assert probe.balanced_grid(512, 132) == 128 and probe.balanced_grid(2048, 132) == 128


def _rows():
    return [json.loads(line) for line in
            (PROBES / "balanced-grid-h100.jsonl").read_text().splitlines()]


def test_the_committed_run_is_verified_and_faster_at_4096_cubed_in_every_row():
    rows = _rows()
    assert {r["run"] for r in rows} == {1, 2} and len(rows) == 16
    assert all(r["verify"] == ["ok", "ok"] and r["balanced_ctas"] == 128 for r in rows)
    at4096 = [r for r in rows if r["shape"] == "4096x4096x4096"]
    assert len(at4096) == 8
    # probes/README.md: 1.008-1.016x the full grid, every round above 1.006.
    assert all(1.008 <= r["vs_full_grid"]["median"] <= 1.016 for r in at4096)
    assert all(min(r["round_ratios_full"]) > 1.006 for r in at4096)
    tuned = [r for r in at4096 if r["config"] == "tuned"]
    assert all(r["vs_reference"]["median"] > 1.028 for r in tuned)


def test_the_h200_pays_less_but_never_loses_in_the_median():
    rows = [json.loads(line) for line in
            (PROBES / "balanced-grid-h200.jsonl").read_text().splitlines()]
    assert {r["gpu"] for r in rows} == {"NVIDIA H200"} and len(rows) == 4
    assert all(r["verify"] == ["ok", "ok"] and r["balanced_ctas"] == 128 for r in rows)
    # probes/README.md: 1.003-1.006x the full grid, every round above 0.999.
    assert all(1.002 <= r["vs_full_grid"]["median"] <= 1.007 for r in rows)
    assert all(min(r["round_ratios_full"]) > 0.999 for r in rows)


def test_the_reports_show_the_same_cycles_at_a_higher_clock():
    from perfscope.diagnosis import diagnose

    def one(form: str, dtype: str):
        [record] = diagnose([PROBES / f"balanced-grid-{form}-{dtype}-h100.ncu-rep.xz"])
        return record.profile

    for dtype in ("bf16", "fp16"):
        full, even = one("tuned", dtype), one("balanced", dtype)
        assert (full.launch.grid_size, even.launch.grid_size) == (132, 128)
        busiest = [p.metric("sm__cycles_active.max") for p in (full, even)]
        assert busiest[1] == pytest.approx(busiest[0], rel=0.003)
        clock = [p.metric("gpc__cycles_elapsed.avg.per_second") for p in (full, even)]
        assert clock[1] > clock[0] * 1.005
