"""The tune document rendered: console table, Markdown, JSON and the HTML section."""

from __future__ import annotations

import json
import re

import pytest
from fakes.tune_fakes import FakeExecutor

from perfscope.kernels import parse_shape
from perfscope.render import render
from perfscope.render.tune import html_page, html_section, ratio_plot
from perfscope.tune import workflow
from perfscope.tune.space import Config
from perfscope.tune.store import ProfileKey, Store

STAGE = "hgemm_tma_wgmma_persistent"
SHAPES = (parse_shape("4096x4096x4096"), parse_shape("1024x8192x8192"))


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    path = tmp_path_factory.mktemp("tune") / "tune.sqlite"
    req = workflow.TuneRequest(stages=(STAGE,), shapes=SHAPES, dtypes=("bf16",), store=path,
                               confirm=2, pins={"BOXES": 4, "STREAMK": 0, "DEFER": 0})
    first = workflow.run(req, FakeExecutor(wrong=[{"BN": 128, "STAGES": 2, "GROUP": 1}]))
    # A best-against-worst diff as the profiling child would store it.
    from perfscope.kernels import get_spec
    from perfscope.tune.store import run_key

    spec = get_spec(STAGE)
    r = first.results[0]
    with Store.open(path) as s:
        rows = [t for t in s.trials(STAGE, "bf16", SHAPES[0]) if t.ratio is not None]
        best, worst = max(rows, key=lambda t: t.ratio), min(rows, key=lambda t: t.ratio)
        s.record_profile(ProfileKey(STAGE, "bf16", SHAPES[0], best.key.run, best.key.source,
                                    best.key.params, worst.key.params),
                         {"best": Config.from_key(spec, best.key.params).label(spec.param_dict),
                          "worst": Config.from_key(spec, worst.key.params).label(spec.param_dict),
                          "cycles_ratio": 1.31,
                          "verdict": ["1. A waits on <mbarrier> 2x longer (stall long_scoreboard). "
                                      "Fix: deepen the ring."],
                          "new_findings": ["PS120 Warps wait on the pipeline"], "gone_findings": []})
        assert best.key.run == run_key(FakeExecutor().env)
    assert r.best is not None
    return workflow.run(req.__class__(**{**req.__dict__, "resume": True}), FakeExecutor())


def test_console_table(doc):
    text = render(doc, "console", width=220)
    assert "perfscope tune on FAKE H200" in text
    assert "4096x4096x4096" in text and "1024x8192x8192" in text
    assert "(confirmed)" in text
    assert "geometric mean of the best ratios to cuBLAS, hgemm_tma_wgmma_persistent (bf16)" in text
    assert "compile:" in text and "verifying" in text
    assert "the worst takes 1.31x the cycles" in text
    # Every row: timed / wrong / failed / pruned.
    assert "34 / 1 / 0 / 15" in text


def test_markdown(doc):
    text = render(doc, "markdown")
    assert "| hgemm_tma_wgmma_persistent | bf16 | 4096x4096x4096 |" in text
    assert "&lt;mbarrier&gt;" in text and "<mbarrier>" not in text
    assert text.count("<details>") == 1


def test_json(doc):
    data = json.loads(render(doc, "json"))
    assert data["schema"] == "perfscope.tune/1"
    first = data["results"][0]
    assert first["best"]["phase"] == "confirm"
    wrong = [t for t in first["trials"] if t["verdict"] == "WRONG"]
    assert wrong and all(t["ratio"] is None and t["tflops"] is None for t in wrong)
    assert data["geomeans"][0]["shapes"] == 2
    wanted = {"compile_wall_s", "compile_serial_s", "compile_speedup", "verify_s", "time_s"}
    assert wanted <= set(data["stats"])
    assert first["diff"]["cycles_ratio"] == 1.31


def test_html_section_escapes_and_plots_every_shape(doc):
    html = str(html_section(doc))
    assert html.startswith('<section class="tune" id="tuning">') and html.endswith("</section>")
    assert html.count("<svg") == 2
    assert "&lt;mbarrier&gt;" in html and "<mbarrier>" not in html
    assert "<script" not in html and "http" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")
    # The same document gives the same bytes.
    assert str(html_section(doc)) == html
    page = html_page(doc)
    assert page.startswith("<!DOCTYPE html>") and html in page


def test_plot_marks_best_default_and_wrong(doc):
    svg = str(ratio_plot(doc.results[0]))
    assert svg.count("<circle") == 34 + 1          # every timed configuration, a ring on the default
    assert re.search(r"stroke-dasharray=\"4 3\"", svg)   # the cuBLAS line
    assert "WRONG" in svg                           # the wrong one, as a cross with its verdict
    assert "1 wrong or failed" in svg


def test_document_reads_back_equal(doc, tmp_path):
    from perfscope.documents import TuneDocument
    from perfscope.render.jsondoc import tune_document

    # The document with a diff, a WRONG trial and pruned configurations, through the dict and
    # through the printed JSON (`tune --json`) read from a file.
    assert TuneDocument.from_dict(tune_document(doc)) == doc
    path = tmp_path / "tune.json"
    path.write_text(render(doc, "json"))
    back = TuneDocument.read(path)
    assert back == doc
    assert back.results[0].diff is not None and back.results[0].diff.cycles_ratio == 1.31
    assert back.geomeans() == doc.geomeans()


def _one_sentence(message: str) -> None:
    assert "\n" not in message and message.endswith(".") and ". " not in message, message


@pytest.mark.parametrize(("text", "fragment"), [
    ('{"schema": "perfscope.diff/1"}', "is not a perfscope.tune/1 tune document (it has schema "
                                       "'perfscope.diff/1')"),
    ('{"kind": "perfscope.bench", "version": 1, "manifests": []}', "(it has no schema)"),
    ("[1, 2]", "(it has no schema)"),
    ("not json {", "it is not JSON (Expecting value at line 1)"),
    ('{"schema": "perfscope.tune/1", "results": [{"stage": "x"}]}',
     "has schema perfscope.tune/1 but cannot be read"),
])
def test_other_documents_are_refused_in_one_sentence(tmp_path, text, fragment):
    from perfscope.documents import TuneDocument
    from perfscope.errors import PerfscopeError

    path = tmp_path / "results.json"
    path.write_text(text)
    with pytest.raises(PerfscopeError) as info:
        TuneDocument.read(path)
    assert fragment in str(info.value)
    assert str(path) in str(info.value)
    _one_sentence(str(info.value))


def test_missing_document_is_one_sentence(tmp_path):
    from perfscope.documents import TuneDocument
    from perfscope.errors import PerfscopeError

    with pytest.raises(PerfscopeError, match=r"cannot read the tune document .*No such file") as info:
        TuneDocument.read(tmp_path / "none.json")
    _one_sentence(str(info.value))


def test_a_fused_stage_names_its_group_as_the_reference():
    """A fused stage's ratios are to the group of its epilogue, and the document says so: the
    held epilogue's group, or the one a pinned epilogue computes."""
    from perfscope.kernels import get_spec
    from perfscope.tune.space import configurations
    from perfscope.tune.workflow import reference_label

    fused = get_spec("hgemm_fused_bias_act")
    assert reference_label(get_spec(STAGE), "bf16", ()) == "cuBLAS"
    assert reference_label(fused, "bf16", configurations(fused, {"BN": 256})) == "cublas+gelu"
    pinned = configurations(fused, {"ACT": 2, "RESIDUAL": 1, "DEFER": 1})
    assert reference_label(fused, "fp16", pinned) == "cublas+silu+residual"


def test_fused_sweep_tables_name_the_group(tmp_path):
    req = workflow.TuneRequest(stages=("hgemm_fused_bias_act",), shapes=(SHAPES[0],),
                               dtypes=("bf16",), store=tmp_path / "t.sqlite",
                               pins={"BN": 256, "GROUP": 8, "STAGES": 3, "BOXES": 4})
    doc = workflow.run(req, FakeExecutor())
    assert doc.results[0].reference == "cublas+gelu"
    text = render(doc, "markdown")
    assert " vs cublas+gelu |" in text
    assert "geometric mean of the best ratios to cublas+gelu, hgemm_fused_bias_act (bf16)" in text
