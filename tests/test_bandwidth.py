"""The small-M panels of the fused page, from the committed fused check (real H200 timings)."""

from __future__ import annotations

import dataclasses
import json
import lzma
import re
from pathlib import Path

import pytest

from perfscope.bandwidth import SMALL_M_MAX, read_panels, row_panel
from perfscope.errors import PerfscopeError

FUSED = Path(__file__).resolve().parent.parent / "reports" / "reference" / "h200" / "fused"
CHECK = FUSED / "fused_check.json.xz"


def _copy_gbps() -> float:
    """The copy bandwidth the committed check measured in its own run."""
    with lzma.open(CHECK) as f:
        return json.load(f)["copy_bandwidth"]["gbps"]


def test_every_small_m_shape_of_the_check_is_a_panel():
    panels = read_panels(CHECK)
    # M of 16, 64 and 256 against four weights, in both dtypes; M = 4096 is no small-M shape.
    assert len(panels) == 3 * 4 * 2
    assert {p.m for p in panels} == {16, 64, 256} and all(p.m <= SMALL_M_MAX for p in panels)
    for p in panels:
        assert p.copy_gbps == pytest.approx(_copy_gbps())   # measured in the same run
        assert 4000 < p.copy_gbps < 4800                     # the H200's HBM3e
        # The plain read of the same weight, timed the same way: below the copy's rate.
        assert p.stream_gbps is not None and 0.4 * p.copy_gbps < p.stream_gbps < p.copy_gbps
        for c in p.points:
            if c.gbps is not None:
                assert c.share_of_copy == pytest.approx(c.gbps / p.copy_gbps)
                assert c.share_of_stream == pytest.approx(c.gbps / p.stream_gbps)


def test_the_decode_shape_is_judged_against_copy_bandwidth():
    (p,) = [p for p in read_panels(CHECK) if (p.dtype, p.m, p.n, p.k) == ("bf16", 64, 8192, 8192)]
    best = p.best_fused
    assert best is not None and best.kind == "fused" and best.label.startswith("hgemm_small_m")
    # Far from issue 19's 90%: the page shows where the small-M stage stands.
    assert 0.3 < best.share_of_copy < 0.9
    labels = {c.label for c in p.points}
    assert {"cublas+elementwise", "cuBLASLt GELU_BIAS (nvmath)"} <= labels


def test_the_read_bounds_the_speedup_a_kernel_timed_so_reaches():
    """At every small-M shape of the committed check, a kernel at the same-size read's rate
    would be 1.16-1.70x cuBLAS + the elementwise pass (so issue 19's 1.10 is within reach
    everywhere), and the fastest fused stage stays under that bound."""
    panels = read_panels(CHECK)
    for p in panels:
        bound = p.stream_bound()
        assert bound is not None and 1.15 < bound < 1.75, (p.title, bound)
        unfused = next(c for c in p.points if c.label == "cublas+elementwise")
        assert p.best_fused.gbps / unfused.gbps < bound
    (decode,) = [p for p in panels if (p.dtype, p.m, p.n, p.k) == ("bf16", 16, 8192, 8192)]
    assert decode.stream_bound() == pytest.approx(1.16, abs=0.01)
    # A candidate the check did not time, or a check without the read: no bound.
    assert decode.stream_bound("no such candidate") is None
    assert dataclasses.replace(decode, stream_gbps=None).stream_bound() is None


def test_a_wrong_baseline_bounds_nothing():
    """A baseline the check timed but flagged wrong has no speed, so no bound against it
    (fused_check times a library that disagrees and says so)."""
    with lzma.open(CHECK) as f:
        row = next(r for r in json.load(f)["timing"] if r["m"] == 16)
    assert row_panel(row, None).stream_bound() is not None
    row["candidates"]["cublas+elementwise"]["verdict"] = "WRONG"
    panel = row_panel(row, None)
    assert panel.stream_bound() is None and panel.copy_gbps is None
    assert all(c.share_of_copy is None for c in panel.points)


def test_a_stage_that_takes_b_packed_is_shown_apart_from_the_row_major_best():
    """hgemm_small_m_packed takes B packed once (a changed input contract): the panel's best
    stays the fastest stage that reads B as the references do, and the packed one is marked
    in the table, on the committed check's own rows (2026-12-05: the packed stage measured)."""
    from perfscope.render.html import _bandwidth_views

    with lzma.open(CHECK) as f:
        doc = json.load(f)
    row = next(r for r in doc["timing"] if (r["dtype"], r["m"], r["n"], r["k"]) == ("bf16", 16, 8192, 8192))
    assert row["candidates"]["hgemm_small_m_packed"]["weight"] == "strips64"
    panel = row_panel(row, doc["copy_bandwidth"]["gbps"])
    assert not panel.best_fused.packed and panel.best_fused.label != "hgemm_small_m_packed"
    assert panel.best_packed.label == "hgemm_small_m_packed" and panel.best_packed.packed
    # Without the packed candidate the row has no packed best and the same row-major best.
    plain_row = {**row, "candidates": {k: v for k, v in row["candidates"].items()
                                       if k != "hgemm_small_m_packed"}}
    plain_panel = row_panel(plain_row, doc["copy_bandwidth"]["gbps"])
    assert plain_panel.best_packed is None and plain_panel.best_fused == panel.best_fused
    (view,) = [v for v in _bandwidth_views(read_panels(CHECK)) if v["dtype"] == "bf16"]
    (marked,) = [r for r in view["rows"] if r["label"] == "hgemm_small_m_packed (B packed once)"
                 and r["shape"] == "16x8192x8192"]
    assert marked["kind"] == "fused" and not marked["best"] and marked["share"] != "-"
    # Its own lighter bar under the shape's row-major one, the figure's layout intact.
    svg = str(view["svg"])
    assert "16x8192x8192 B packed" in svg and "hgemm_small_m_packed" in svg
    panels = [plain_panel if q.title == plain_panel.title else q for q in read_panels(CHECK)]
    (plain,) = [v for v in _bandwidth_views(panels) if v["dtype"] == "bf16"]
    assert "16x8192x8192 B packed" not in str(plain["svg"])


def test_bad_input_is_one_sentence(tmp_path):
    with pytest.raises(PerfscopeError, match="cannot read the fused check"):
        read_panels(tmp_path / "missing.json")
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"schema": "perfscope.bench/1"}))
    with pytest.raises(PerfscopeError, match="is not a fused check"):
        read_panels(other)
    nocopy = tmp_path / "nocopy.json"
    nocopy.write_text(json.dumps({"schema": "perfscope.fused_check/1", "timing": []}))
    with pytest.raises(PerfscopeError, match="no copy bandwidth"):
        read_panels(nocopy)


def test_the_fused_page_draws_the_panels():
    page = (FUSED / "index.html").read_text()
    assert 'id="bandwidth"' in page and "Small-M shapes by bandwidth" in page
    assert "% of copy, hgemm_small_m" in page and f"(copy {_copy_gbps():,.0f} GB/s)" in page
    assert "<th class=\"num\">of read</th>" in page
    # The fastest other candidate and the read-rate bound, moved from the bar notes to the table.
    assert '<span class="badge">best other</span>' in page
    assert "at the read's rate</th>" in page
    assert re.search(r'<td class="num">1\.\d\dx</td></tr>', page)


def test_report_on_the_fused_folder_finds_the_check_beside_the_reports(tmp_path):
    from typer.testing import CliRunner

    from perfscope.cli import app

    for name in ("hgemm_small_m@BN=64,STAGES=12-bf16-64x8192x8192.ncu-rep.xz",
                 "hgemm_small_m@BN=64,STAGES=12-bf16-64x8192x8192.json", "fused_check.json.xz"):
        (tmp_path / name).write_bytes((FUSED / name).read_bytes())
    page = tmp_path / "page.html"
    result = CliRunner().invoke(app, ["report", str(tmp_path), "--html", str(page)])
    assert result.exit_code == 0, result.output
    text = page.read_text()
    assert 'id="bandwidth"' in text and "From fused_check.json.xz" in text
    # A broken check beside the reports: one sentence, exit 2, the page left as it was.
    (tmp_path / "fused_check.json.xz").write_bytes(b"not xz")
    result = CliRunner().invoke(app, ["report", str(tmp_path), "--html", str(page)])
    assert result.exit_code == 2
    assert "cannot read the fused check" in result.output and "Traceback" not in result.output
    assert page.read_text() == text
