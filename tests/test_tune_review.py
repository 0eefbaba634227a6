"""The review page's Tuning section: tune results found beside the reports, or named, and shown.

The results are ``tests/fixtures/tune/results.json``, a real ``benchmarks/tune_h200.py
--dry`` document (its README names the command); the report is a committed H200 capture.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import report
from typer.testing import CliRunner

from perfscope.cli import app
from perfscope.documents import TUNE_SCHEMA, TuneDocument
from perfscope.errors import PerfscopeError
from perfscope.render.html import render_html
from perfscope.render.jsondoc import tune_document
from perfscope.review import collect

RESULTS = Path(__file__).parent / "fixtures" / "tune" / "results.json"
STAGE = "hgemm_tma_wgmma_persistent"
runner = CliRunner()


def _run_folder(tmp_path: Path, with_tune: bool = True) -> Path:
    """A run's folder as the reference run lays it out: a report, and tune/results.json."""
    folder = tmp_path / "run"
    folder.mkdir()
    shutil.copy(report("smem_transpose"), folder)
    if with_tune:
        (folder / "tune").mkdir()
        shutil.copy(RESULTS, folder / "tune" / "results.json")
    return folder


def test_fixture_reads_back_equal():
    data = json.loads(RESULTS.read_text())
    assert data["schema"] == TUNE_SCHEMA
    doc = TuneDocument.read(RESULTS)
    assert [(r.stage, r.dtype, r.shape) for r in doc.results] == [(STAGE, "bf16", "256x256x256")]
    assert doc.results[0].best is not None and len(doc.results[0].pruned) == 15
    # What the reader leaves out is derived, and the document derives the same.
    assert doc.stats.compile_speedup == data["stats"]["compile_speedup"]
    assert [list(g.values()) for g in data["geomeans"]] == [list(g) for g in doc.geomeans()]
    assert TuneDocument.from_dict(tune_document(doc)) == doc
    assert RESULTS.stat().st_size < 50_000


def test_folder_with_tune_results_gets_the_section(tmp_path):
    rev = collect([_run_folder(tmp_path)])
    assert rev.tune == TuneDocument.read(RESULTS)
    page = render_html(rev)
    assert page.count('id="tuning"') == 1
    assert STAGE in page and "256x256x256" in page


def test_report_file_finds_the_tune_folder_beside_it(tmp_path):
    folder = _run_folder(tmp_path)
    rev = collect([folder / "smem_transpose.ncu-rep.xz"])
    assert rev.tune is not None


def test_no_tune_results_no_section(tmp_path):
    rev = collect([_run_folder(tmp_path, with_tune=False)])
    assert rev.tune is None
    assert 'id="tuning"' not in render_html(rev)


def test_named_tune_results_win_over_the_folders(tmp_path):
    folder = _run_folder(tmp_path, with_tune=False)
    rev = collect([folder], tune=RESULTS)
    assert rev.tune is not None and 'id="tuning"' in render_html(rev)


def test_broken_tune_results_stop_the_review(tmp_path):
    folder = _run_folder(tmp_path)
    (folder / "tune" / "results.json").write_text('{"schema": "perfscope.tune/0"}')
    with pytest.raises(PerfscopeError, match=r"is not a perfscope\.tune/1 tune document"):
        collect([folder])


def test_cli_report_takes_tune(tmp_path):
    folder = _run_folder(tmp_path, with_tune=False)
    out = tmp_path / "index.html"
    res = runner.invoke(app, ["report", str(folder), "--html", str(out), "--tune", str(RESULTS)])
    assert res.exit_code == 0, res.output
    assert 'id="tuning"' in out.read_text()
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    res = runner.invoke(app, ["report", str(folder), "--html", str(out), "--tune", str(bad)])
    assert res.exit_code != 0
    assert f"{bad} is not a perfscope.tune/1 tune document: it is not JSON" in res.output
