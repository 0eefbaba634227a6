"""`perfscope report`: the HTML page and the Markdown comment, on the real H200 captures."""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import logging
import re
import shutil
from pathlib import Path

import pytest
from conftest import FIXTURES, fresh_python, report
from typer.testing import CliRunner

from perfscope.cli import app
from perfscope.manifest import BenchFile
from perfscope.render import render
from perfscope.render.html import build_report, generator, render_html
from perfscope.render.markdown import LIMIT
from perfscope.review import collect, folder_reports

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "reports" / "reference" / "h200"
NASTY = 'gemm<128, 64, "x"><script>'
runner = CliRunner()


def _example_module():
    spec = importlib.util.spec_from_file_location("example_report", ROOT / "docs" / "example_report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _renamed(rep, name: str):
    """The report with its first kernel renamed (names come from the report file)."""
    e = rep.entries[0]
    kp = e.profile
    ident = dataclasses.replace(kp.identity, name=name, demangled=name, mangled=name)
    record = dataclasses.replace(e.record, label=name,
                                 profile=dataclasses.replace(kp, identity=ident))
    entry = dataclasses.replace(e, record=record)
    return dataclasses.replace(rep, entries=(entry, *rep.entries[1:]))


def test_kernel_names_are_escaped():
    rep = _renamed(collect([report("smem_transpose")]), NASTY)
    page = render_html(rep)
    # The template has no script element at all, so any '<script' is an injection.
    assert "<script" not in page
    assert "gemm&lt;128, 64, &#34;x&#34;&gt;&lt;script&gt;" in page
    md = render(rep, "markdown")
    assert "<script" not in md and "&lt;script&gt;" in md


@pytest.mark.slow
def test_page_is_self_contained():
    page = build_report([report("cublas_hgemm_4096")])
    assert page.count("<svg") >= 2        # duration overview and the kernel's panels
    # Links within the page, or to the Nsight Compute documentation its own rule messages
    # cite (followed by the reader, never fetched); CSS/SVG references only to ids in it.
    assert re.findall(r'\bsrc\s*=\s*"(?!#)([^"]*)"', page) == []
    assert [u for u in re.findall(r'\bhref\s*=\s*"(?!#)([^"]*)"', page)
            if not u.startswith("https://docs.nvidia.com/")] == []
    assert re.findall(r"url\((?!#)", page) == []
    for tag in ("<script", "<link", "<img", "<iframe", "<object", "<embed", "@import"):
        assert tag not in page


@pytest.mark.slow
def test_card_shows_every_part():
    page = build_report([report("smem_transpose")])
    for text in ("Speed of light (% of peak)", "Warp stalls", "Executed opcode families",
                 "Memory traffic by opcode", "LDS", "Hottest SASS instructions", "PS110",
                 "fix:", "Nsight Compute's own findings", "<details>", "Capture conditions",
                 "NVIDIA H200", "ncu passes", "Kernel duration under Nsight Compute"):
        assert text in page, text


@pytest.mark.slow
def test_ids_are_unique_across_inline_svgs():
    page = build_report([report("cublas_sgemm_4096"), report("spill")],
                        bench=REFERENCE / "bench.json")
    ids = re.findall(r'\bid="([^"]+)"', page)
    assert len(ids) == len(set(ids))
    for ref in re.findall(r"url\(#([^)]+)\)", page):
        assert ref in ids


def test_ladder_overview_from_bench_json():
    rep = collect([report("cublas_sgemm_4096")], bench=REFERENCE / "bench.json")
    fp32 = next(ld for ld in rep.ladders if ld.dtype == "fp32")
    assert fp32.reference == "cublas_sgemm"
    assert fp32.reference_tflops.median > 40
    # H200: 132 SMs x 256 FP32 FLOP per clock at the 1980 MHz measured while timing.
    assert fp32.peak_tflops == pytest.approx(132 * 256 * 1980e6 / 1e12)
    labels = [p.label for p in fp32.points]
    assert labels[0] == "sgemm_naive" and "sgemm_pipe (STAGES=2)" in labels
    assert [ld.dtype for ld in rep.ladders] == ["fp32", "fp16", "bf16"]


def _stage_folder(tmp_path: Path) -> Path:
    """Fixture captures renamed as ladder stages, each with its manifest from bench.json."""
    bench = BenchFile.read(REFERENCE / "bench.json")
    by = {(m.stage, m.params.get("STAGES", 3)): m for m in bench.manifests if m.dtype == "fp32"}
    folder = tmp_path / "ladder"
    folder.mkdir()
    for stage, fixture in (("sgemm_warptile", "float4_copy"), ("sgemm_pipe", "smem_transpose"),
                           ("cublas_sgemm", "cublas_sgemm_4096")):
        stem = f"{stage}-fp32-4096x4096x4096"
        shutil.copy(report(fixture), folder / f"{stem}.ncu-rep.xz")
        (folder / f"{stem}.json").write_text(json.dumps(by[(stage, 3)].to_dict()))
    return folder


def test_stage_is_diffed_against_parent_and_cublas(tmp_path):
    folder = _stage_folder(tmp_path)
    rep = collect([folder])
    pairs = {(c.a.stage, c.kind, c.b.stage) for c in rep.comparisons}
    assert pairs == {("sgemm_pipe", "parent stage", "sgemm_warptile"),
                     ("sgemm_pipe", "cuBLAS", "cublas_sgemm"),
                     ("sgemm_warptile", "cuBLAS", "cublas_sgemm")}
    # Without bench.json the overview comes from the manifests beside the reports.
    assert rep.timing_source.startswith("the run manifests")
    page = render_html(rep)
    assert "Against its parent stage" in page and "Against its cuBLAS" in page
    assert "Side by side" in page and "Run manifest" in page
    md = render(rep, "markdown")
    assert "Against its parent stage **sgemm_warptile · fp32**" in md


def test_markdown_fits_a_pr_comment():
    md = render(collect([FIXTURES], bench=REFERENCE / "bench.json"), "markdown")
    assert len(md) <= LIMIT
    assert md.startswith("### perfscope diagnosis report")
    assert "| fp16 | hgemm_bcf_dbf_rw |" in md


def test_cli_writes_html_and_prints_markdown(tmp_path):
    out = tmp_path / "sub" / "index.html"
    result = runner.invoke(app, ["report", str(report("spill")), "--html", str(out), "--markdown"])
    assert result.exit_code == 0, result.output
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert "spill #1 ps_regs_capped" in result.output
    assert "Full report: `index.html`" in result.output


@pytest.mark.parametrize("args, message", [
    (["report", "FIX"], "--html FILE, --markdown"),
    (["report", "/no/such/folder", "--html", "x.html"], "does not exist"),
    (["report", "FIX", "--markdown", "--kernel", "^nothing$"], "matches '^nothing$'"),
    (["report", "FIX", "--markdown", "--bench", "FIX"], "cannot read bench file"),
])
def test_bad_input_is_one_sentence(args, message):
    args = [str(report("float4_copy")) if a == "FIX" else a for a in args]
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_failed_write_keeps_the_old_page(tmp_path):
    out = tmp_path / "index.html"
    out.write_text("old")
    result = runner.invoke(app, ["report", str(report("float4_copy")), "--html", str(out),
                                 "--bench", str(tmp_path / "missing.json")])
    assert result.exit_code == 2
    assert out.read_text() == "old"


# ------------------------------------------------------------------ committed pages


def _committed_generator(page: str) -> str | None:
    m = re.search(r'<meta name="generator" content="([^"]+)">', page)
    return m.group(1) if m else None


def _assert_unchanged(committed: Path, fresh: str, how: str) -> None:
    old = committed.read_text(encoding="utf-8")
    made_by = _committed_generator(old)
    if made_by != generator():
        # The SVG bytes are matplotlib's: another matplotlib draws other bytes. Same input,
        # same versions, same bytes is what holds; the page records which versions.
        pytest.skip(f"{committed.name} was made by {made_by}, this is {generator()}: regenerate "
                    f"with {how}")
    assert fresh == old, f"{committed.relative_to(ROOT)} is stale: regenerate it with {how}"


def test_same_input_gives_the_same_bytes():
    example = _example_module()
    assert example.build() == example.build()


@pytest.mark.slow
def test_committed_example_is_regenerated_unchanged():
    example = _example_module()
    _assert_unchanged(example.EXAMPLE, example.build(), "python docs/example_report.py")


@pytest.mark.slow
def test_committed_reference_page_is_regenerated_unchanged():
    index = REFERENCE / "index.html"
    if not index.exists() or not any(REFERENCE.glob("*.ncu-rep.xz")):
        pytest.skip("the reference run has not written its reports and index.html yet")
    from perfscope.render.html import reference_page

    _assert_unchanged(index, reference_page(REFERENCE),
                      "perfscope.render.html.reference_page (benchmarks/reference_run.py)")


def test_the_reference_page_holds_a_slower_step_against_its_diff():
    """The calibration section of the committed page: a slower step's loss beside what the
    diff of its reports names (the FFMA order's 16%, unexplained until PS129 and PS133, now
    6% and 7% of it), and no loss left without a reason."""
    page = (REFERENCE / "index.html").read_text()
    section = page[page.index('<section id="calibration">'):]
    section = section[:section.index("</section>")]
    assert "slower: the diff names" in section
    assert '<td class="mono">lost 3%: cluster 3%</td>' in section
    assert 'badge warning">unexplained' not in section
    (order,) = [r for r in section.split("<tr>") if "sgemm_dyn → sgemm_fma_order" in r]
    assert "lost 16%: PS133 7%, PS129 6%" in order


def test_the_reference_page_shows_a_two_step_fix_through_both_steps():
    """PS103's fix on the committed page: the first step marked not counted, and the row
    from sgemm_naive through sgemm_smem to sgemm_reg4x4 holding PS103's estimate."""
    page = (REFERENCE / "index.html").read_text()
    section = page[page.index('<section id="calibration">'):]
    rows = section[:section.index("</section>")].split("<tr>")
    (first,) = [r for r in rows if "sgemm_naive → sgemm_smem " in r]
    assert "first of two steps: not counted" in first
    (both,) = [r for r in rows if "sgemm_naive → sgemm_reg4x4 (through sgemm_smem)" in r]
    assert "PS103 86%" in both and "not counted" not in both


@pytest.mark.slow
def test_a_page_with_charts_leaves_matplotlib_out_of_the_reading_process():
    """The reader kills the process on a metric's unit once matplotlib is loaded (the GPU
    machine's write_index died so, 2026-12-05): the charts are drawn in a worker, so the
    process that reads the reports never imports it, before or after a page."""
    code = ("import sys; from perfscope.render.html import reference_page; "
            f"html = reference_page({str(REFERENCE)!r}); "
            "assert '<svg' in html, 'no chart'; "
            "print(sorted(m for m in ('matplotlib', 'kiwisolver', 'PIL') if m in sys.modules))")
    assert fresh_python(code) == "[]"


def test_charts_are_drawn_here_when_no_worker_can_start(monkeypatch, caplog):
    from perfscope.render import plots

    class NoProcesses:
        def __init__(self, *args, **kwargs):
            raise OSError("fork refused")

    monkeypatch.setattr(plots, "ProcessPoolExecutor", NoProcesses)
    monkeypatch.setattr(plots, "_worker", None)
    with caplog.at_level(logging.WARNING, logger="perfscope.render.plots"):
        svg = plots.ladder("k", "title", "TFLOP/s", [plots.Bar("stage", 1.0)], [])
    assert svg.startswith("<svg") and "stage" in svg
    assert "no worker: fork refused" in caplog.text


@pytest.mark.slow
def test_committed_fp8_page_is_regenerated_unchanged_with_its_fp8_ladder():
    from perfscope.render.html import FP8_DIR, fp8_page

    folder = REFERENCE / FP8_DIR
    page = fp8_page(folder)
    _assert_unchanged(folder / "index.html", page,
                      "perfscope.render.html.fp8_page (benchmarks/reference_run.py)")
    # fp8 is a ladder of its own: hgemm_fp8 against cuBLASLt's fast build at 4096^3.
    assert "fp8: TFLOP/s per stage" in page and "1,476.2" in page


# ------------------------------------------------------------ source view (issue 17)


def _reference_entry(stage: str, dtype: str):
    from perfscope.diagnosis import diagnose

    [record] = diagnose([REFERENCE / f"{stage}-{dtype}-4096x4096x4096.ncu-rep.xz"])
    return record


needs_reference = pytest.mark.skipif(not any(REFERENCE.glob("*.ncu-rep.xz")),
                                     reason="the reference run's reports are not committed")


def _current_mma_stage() -> str:
    """An mma.sync stage of the reference run compiled from the tree its sources/ holds now
    (its source hash has no archive folder under sources/): the older trees' reports show
    their lines from sources/<hash>/ instead, which the tests below set up on purpose."""
    for path in sorted(REFERENCE.glob("hgemm_*-fp16-4096x4096x4096.json")):
        source_hash = json.loads(path.read_text())["compile"]["source_hash"]
        stage = path.name.split("-")[0]
        if not (REFERENCE / "sources" / source_hash).is_dir() and not stage.startswith("hgemm_tma"):
            return stage
    raise AssertionError("no mma.sync stage of the reference run is compiled from sources/")


@needs_reference
def test_source_view_of_a_ladder_stage_shows_cuda_beside_sass():
    from perfscope.source import RUN, source_view

    r = _reference_entry(_current_mma_stage(), "fp16")
    view = source_view(r.profile, r.manifest.compile)
    assert view.coverage == pytest.approx(1.0) and view.lines
    # The reference run keeps the sources it compiled beside its reports.
    [file] = view.files
    assert file.origin == RUN and r.manifest.compile.source_hash in file.note
    hot = view.lines[0]
    assert hot.file == "sources/hgemm.cu" and hot.text
    # The hottest line is an inline-asm operand list: the statement above it comes along.
    assert any("mma.sync" in line for line in (*hot.context, hot.text))
    assert all(s.sass.startswith("HMMA") for s in hot.sass)
    assert hot.samples == sum(s.samples for s in hot.sass) + hot.other_samples
    assert sum(line.samples for line in view.lines) <= view.total_samples


def _lone_report(tmp_path: Path, stage: str, dtype: str) -> Path:
    """A reference report and its manifest in a folder of their own (no sources/ beside)."""
    stem = f"{stage}-{dtype}-4096x4096x4096"
    folder = tmp_path / "run"
    folder.mkdir()
    shutil.copy(REFERENCE / f"{stem}.ncu-rep.xz", folder)
    shutil.copy(REFERENCE / f"{stem}.json", folder)
    return folder / f"{stem}.ncu-rep.xz"


@needs_reference
def test_source_view_checks_the_checkout_against_the_compile(tmp_path):
    from perfscope.diagnosis import diagnose
    from perfscope.source import CHECKOUT, DIFFERS, source_view

    [r] = diagnose([_lone_report(tmp_path, _current_mma_stage(), "fp16")])
    kernels = tmp_path / "kernels"
    shutil.copytree(REFERENCE / "sources", kernels)
    same = source_view(r.profile, r.manifest.compile, kernel_dir=kernels)
    assert [f.origin for f in same.files] == [CHECKOUT] and same.lines[0].text
    assert same.lines[0].file == "perfscope/kernels/hgemm.cu"
    # An edited checkout is not what was compiled: its lines would point at other code.
    (kernels / "hgemm.cu").write_text("// edited\n" + (kernels / "hgemm.cu").read_text())
    view = source_view(r.profile, r.manifest.compile, kernel_dir=kernels)
    [file] = view.files
    assert file.origin == DIFFERS and "differs from the source this kernel was compiled from" in file.note
    assert all(line.text is None for line in view.lines) and view.lines[0].sass


@needs_reference
def test_source_view_finds_an_older_trees_copy_under_its_hash(tmp_path):
    """A run folder holding reports of several trees keeps the older tree's sources under
    sources/<source hash>/: a report compiled from it shows its lines from there, whatever
    sources/ and the checkout hold now."""
    from perfscope.diagnosis import diagnose
    from perfscope.source import RUN, source_view

    report_path = _lone_report(tmp_path, _current_mma_stage(), "fp16")
    [r] = diagnose([report_path])
    kept = report_path.parent / "sources" / r.manifest.compile.source_hash
    shutil.copytree(REFERENCE / "sources", kept)
    (report_path.parent / "sources" / "hgemm.cu").write_text("// a later tree\n")
    edited = tmp_path / "kernels"
    shutil.copytree(REFERENCE / "sources", edited)
    (edited / "hgemm.cu").write_text("// edited\n" + (edited / "hgemm.cu").read_text())
    [r] = diagnose([report_path])
    view = source_view(r.profile, r.manifest.compile, kernel_dir=edited)
    [file] = view.files
    assert file.origin == RUN and file.shown == f"sources/{r.manifest.compile.source_hash}/hgemm.cu"
    assert view.lines[0].text
    # A manifest hash that is not one (a path) names no folder: nothing is read through it.
    odd = dataclasses.replace(r.manifest.compile, source_hash="../../kernels")
    view = source_view(r.profile, odd, kernel_dir=edited)
    assert all(f.shown.count("/") <= 1 for f in view.files)


@needs_reference
def test_keep_sources_moves_an_older_trees_copy_under_its_hash(tmp_path, monkeypatch, caplog):
    """A re-run from an edited checkout replaces sources/; a report of the older tree that
    the folder still holds keeps its lines, because keep_sources first moves that tree's
    copy under sources/<source hash>/ (once; a hash no report names is not kept)."""
    from perfscope import profiling
    from perfscope.diagnosis import diagnose
    from perfscope.source import RUN, source_view

    report_path = _lone_report(tmp_path, _current_mma_stage(), "fp16")
    run = report_path.parent
    # The checkout's files only: the committed folder's own archives of older trees
    # (sources/<hash>/) are not part of the tree this test edits.
    def files_only(folder, names):
        return [n for n in names if (Path(folder) / n).is_dir()]

    shutil.copytree(REFERENCE / "sources", run / "sources", ignore=files_only)
    edited = tmp_path / "kernels"
    shutil.copytree(REFERENCE / "sources", edited, ignore=files_only)
    (edited / "hgemm.cu").write_text("// a later tree\n" + (edited / "hgemm.cu").read_text())
    (edited / "sgemm.cu").write_text("// no report of this folder compiled sgemm.cu\n")
    monkeypatch.setattr(profiling, "KERNEL_DIR", edited)
    [r] = diagnose([report_path])
    old = r.manifest.compile.source_hash

    profiling.keep_sources(run)
    assert sorted(p.name for p in (run / "sources").iterdir() if p.is_dir()) == [old]
    kept = (run / "sources" / old / "hgemm.cu").read_text()
    assert kept == (REFERENCE / "sources" / "hgemm.cu").read_text()
    assert (run / "sources" / "hgemm.cu").read_text().startswith("// a later tree")
    [r] = diagnose([report_path])
    view = source_view(r.profile, r.manifest.compile, kernel_dir=edited)
    [file] = view.files
    assert file.origin == RUN and file.shown == f"sources/{old}/hgemm.cu" and view.lines[0].text
    # Again from the same checkout: sources/ already is the checkout's, nothing more is kept.
    assert profiling.archive_sources(run) == []
    # A copy that is not text is left where it is, with a warning, never a traceback.
    (run / "sources" / "odd.cu").write_bytes(b"\xff\xfe\x00bad")
    with caplog.at_level(logging.WARNING, logger="perfscope.profiling"):
        assert profiling.archive_sources(run) == []
    assert any("odd.cu" in r.getMessage() for r in caplog.records)
    assert sorted(p.name for p in (run / "sources").iterdir() if p.is_dir()) == [old]
    # A tree no report names any more (its report since replaced) loses its folder; a folder
    # not named like a source hash is never touched.
    stale, other = run / "sources" / "0123456789abcdef", run / "sources" / "notes"
    for folder in (stale, other):
        folder.mkdir()
        (folder / "hgemm.cu").write_text("// kept once\n")
    profiling.keep_sources(run)
    assert sorted(p.name for p in (run / "sources").iterdir() if p.is_dir()) == [old, "notes"]


def test_prune_keeps_a_tree_a_bench_file_under_the_folder_names(tmp_path):
    """A tree no report names any more may still be what a bench file timed (a probe's
    bench file in probes/, of any version): its sources/<hash>/ stays; one nothing names
    goes."""
    from perfscope import profiling

    timed, stale = tmp_path / "sources" / "0898ee5d291dcc3e", tmp_path / "sources" / "0123456789abcdef"
    for folder in (timed, stale):
        folder.mkdir(parents=True)
        (folder / "sgemm.cu").write_text("// an older tree\n")
    (tmp_path / "probes").mkdir()
    (tmp_path / "probes" / "bench-old.json").write_text(json.dumps(
        {"kind": "perfscope.bench", "version": 0, "manifests": [
            {"compile": {"source": "sgemm.cu", "source_hash": "0898ee5d291dcc3e"}},
            {"compile": None}, "not a manifest"]}))
    (tmp_path / "probes" / "other.json").write_text("[1, 2]")
    (tmp_path / "probes" / "broken.json").write_text("{")
    assert profiling.prune_archives(tmp_path) == [stale]
    assert (timed / "sgemm.cu").is_file()


def test_source_view_of_user_reports():
    from perfscope.source import EMBEDDED, MISSING, source_view

    triton = ROOT / "tests" / "fixtures" / "external" / "triton_good.ncu-rep.xz"
    if triton.exists():
        [r] = collect([triton]).entries
        assert {f.origin for f in r.source.files} == {EMBEDDED}
        assert any("tl.dot" in (line.text or "") for line in r.source.lines)
    # A kernel compiled to a temporary .cu that no longer exists: lines, samples, no text.
    [transpose] = collect([report("smem_transpose")]).entries
    view = transpose.source
    assert view.lines and view.files[0].origin == MISSING
    assert "not on this machine" in view.files[0].note and view.lines[0].text is None
    # cuBLAS carries no line table: the view says so and the page keeps the SASS hotspots.
    [cublas] = collect([report("cublas_hgemm_4096")]).entries
    assert not cublas.source.lines and "-lineinfo" in cublas.source.note
    assert source_view(cublas.profile).note == cublas.source.note


# ------------------------------------------------------------- the page's layout


@needs_reference
def test_reference_review_flags_the_variant_that_beats_its_default():
    rep = collect([REFERENCE])
    wins = {(w.dtype, w.label): w for w in rep.variant_wins}
    win = wins[("fp16", "hgemm_tma_wgmma (STAGES=3)")]
    assert win.default == "hgemm_tma_wgmma" and win.default_note == "STAGES=4"
    # The two rows bench.json holds for the stage in fp16: STAGES=3 and its default.
    rows = {m.params["STAGES"]: m.timing.tflops.median
            for m in BenchFile.read(REFERENCE / "bench.json").manifests
            if m.stage == "hgemm_tma_wgmma" and m.dtype == "fp16"}
    assert win.tflops.median == pytest.approx(rows[3]) and rows[3] > 1.2 * rows[4]
    assert win.default_tflops.median == pytest.approx(rows[4])
    # Noise is not a win: sgemm_pipe at STAGES=2 and 4 sits on its default's spread.
    assert not any(label.startswith("sgemm_pipe") for _, label in wins)
    fp16 = next(ld for ld in rep.ladders if ld.dtype == "fp16")
    assert [p.label for p in fp16.points if p.beats] == ["hgemm_tma_wgmma (STAGES=3)"]
    assert win.sentence() in render(rep, "markdown").replace("&lt;", "<").replace("&gt;", ">")
    # The stage says why its default stays (the ladder step PS132 asks the next stage for),
    # so the page answers the question instead of asking it; a row without a reason asks.
    assert win.sentence().endswith("second CTA per SM instead.") and "PS132" in win.sentence()
    assert "say why not" not in win.sentence()
    assert dataclasses.replace(win, kept="").sentence().endswith("make it the default, or say why not.")


@needs_reference
def test_reference_page_cards_fold_filter_and_name_the_change():
    from perfscope.render.html import OPEN_CARDS, render_html

    rep = collect([REFERENCE])
    page = render_html(rep)
    cards = re.findall(r'<details class="card kernel([^"]*)" id="(k\d+)"( open)?>', page)
    assert len(cards) == len(rep.entries)
    assert [bool(o) for _, _, o in cards] == [i < OPEN_CARDS for i in range(len(cards))]
    # A filter per finding code, in CSS: its anchor, its rule, and the cards' classes.
    codes = sorted({f.code for e in rep.entries for f in e.evaluation.findings})
    for code in codes:
        assert f'id="only-{code}"' in page
        assert f"#only-{code}:target ~ details.kernel:not(.f-{code})" in page
    assert all(f"f-{f.code}" in cls for (cls, key, _), e in zip(cards, rep.entries, strict=True)
               for f in e.evaluation.findings)
    # Each comparison header says what the stage changes (KernelSpec.change).
    rw = next(e for e in rep.entries if e.stage == "hgemm_bcf_dbf_rw" and e.dtype == "fp16")
    # The folder holds the fused stages' shapes too, so each label names its shape.
    assert rw.label == "hgemm_bcf_dbf_rw · fp16 · 4096x4096x4096"
    assert f"What A changes against B: {rw.record.stage.change}" in page.replace("&#39;", "'")
    # Per-kernel bars are drawn by the template: inline SVG without matplotlib's markup.
    assert page.count('<figure class="bars">') == 3 * len(rep.entries)
    # matplotlib's ladder charts, and the tune sweep's one overview plot per stage and dtype.
    tuned = {(r.stage, r.dtype) for r in rep.tune.results} if rep.tune else set()
    assert page.count("<svg xmlns") == len(rep.ladders) + len(tuned)
    assert page.count('id="tuning"') == (1 if rep.tune else 0)
    assert "beats its default" in page


@functools.lru_cache(maxsize=1)
def _reference_review():
    # The ladder's reports, as on the reference page (fused/ has a page of its own).
    return collect(folder_reports(REFERENCE), bench=REFERENCE / "bench.json",
                   tune=REFERENCE / "tune" / "results.json.xz")


@needs_reference
def test_reference_markdown_fits_a_comment_with_every_kernel():
    rep = _reference_review()
    md = render(rep, "markdown")
    assert len(md) < 65_000 and "left out" not in md
    # Every kernel fits once the blocks give up hottest source lines and the cuBLAS
    # comparisons of the stages a later stage builds on: 32 kernels fitted with one line
    # each; the 36 of 2026-12-05 with one line for as many kernels as the room allowed; the
    # 40 of the tuned and balanced stages only with each comparison cut to two reasons, until
    # the stages inside a ladder gave up their cuBLAS comparisons (their step against the
    # parent tells their story); with PS128's findings on four kernels (2026-12-06), one
    # line for the kernels with findings and as many others as the room allows; the 42 with
    # hgemm_ring_spread (2026-12-06), one line for as many kernels as the room allows, those
    # with findings first. The comment says what it trimmed.
    from perfscope.render.markdown import ladder_ends

    cut = re.search(r"Hottest source lines cut to 1 for (\d+) of (\d+) kernels "
                    r"\(those with findings first\)", md)
    assert cut and int(cut[2]) == len(rep.entries) and "to fit a PR comment" in md
    ends = ladder_ends(rep)
    refs = [c for c in rep.comparisons if c.kind == "cuBLAS"]
    kept = [c for c in refs if c.a.key in ends]
    assert 0 < len(kept) < len(refs)
    assert (f"cuBLAS comparisons kept for the {len(kept)} of {len(refs)} stages no later stage "
            "here builds on") in md
    assert "Each comparison cut" not in md
    blocks = {b.split(":", 1)[0]: b for b in md.split("<details><summary>")[1:]}
    for c in rep.comparisons:
        shown = f"Against its {c.kind} **{c.b.label}**" in blocks[c.a.label]
        assert shown == (c.kind == "parent stage" or c.a.key in ends), (c.a.label, c.kind)
    by_label = {e.label.split(" · 4096")[0]: e.key for e in rep.entries}
    # The persistent stage is built on (tuned, stream-K, cluster); the balanced stage ends
    # the Hopper ladder; the naive stage has no parent to be held against.
    assert by_label["hgemm_tma_wgmma_persistent · fp16"] not in ends
    assert by_label["hgemm_tma_wgmma_balanced · fp16"] in ends
    assert by_label["hgemm_naive · fp16"] in ends
    lined = [e for e in rep.entries if "Hottest source line:" in blocks[e.label]]
    assert len(lined) == int(cut[1]) and all(e.source.lines for e in lined)
    # Those with findings come first: the first of them in the entries' order has its line.
    first = next(e for e in rep.entries if e.source.lines and e.evaluation.findings)
    assert first in lined and any(e.evaluation.findings for e in lined)
    for e in rep.entries:
        assert f"<details><summary>{e.label}:" in md
    assert md.count("<details>") == len(rep.entries) + 1     # one per kernel, one of fixes
    assert "What A improved over B" in md and "What remains in A" in md
    # PS171 (the power cap) is the machine's condition: said once under the kernel table,
    # with how many kernels it holds, and its fix once in the fixes.
    held = sum("PS171" in {f.code for f in e.evaluation.findings} for e in rep.entries)
    assert held and md.count("PS171 `clock-held`") == 1
    assert f"on {held} of {len(rep.entries)} kernels" in md and md.count("- **PS171**:") == 1


@needs_reference
@pytest.mark.parametrize("limit, notes", [
    (57_000, ("(those with findings first)", "cuBLAS comparisons kept", "first 2 reasons")),
    (54_000, ("cuBLAS comparisons kept", "first 1 reason")),
    (48_000, ("cut to none per kernel", "first 1 reason", "kernel(s) left out")),
    (40_000, ("cut to none per kernel", "first 1 reason", "kernel(s) left out")),
])
def test_reference_markdown_trims_in_order_under_a_smaller_limit(monkeypatch, limit, notes):
    """Under a tighter limit the comment gives up, in turn: source lines (one for the
    kernels with findings first), the cuBLAS comparisons inside the ladders, reasons, then
    whole kernels; it stays under the limit and says each cut."""
    import perfscope.render.markdown as markdown

    rep = _reference_review()
    monkeypatch.setattr(markdown, "LIMIT", limit)
    md = render(rep, "markdown")
    assert len(md) <= limit
    said = [line for line in md.splitlines() if line.startswith("_") and "PR comment" in line]
    for note in notes:
        assert any(note in line for line in said), (limit, note, said)
    if "first 2 reasons" in md or "first 1 reason" in md:
        assert "cuBLAS comparisons kept" in md      # comparisons go before reasons
    if "left out" in md:
        assert "first 1 reason" in md and "cut to none per kernel" in md


def test_tuning_section_only_with_tune_results():
    from perfscope.documents import TuneDocument, TuneStats

    rep = collect([report("float4_copy")])
    assert 'id="tuning"' not in render_html(rep)
    tuned = dataclasses.replace(rep, tune=TuneDocument((), TuneStats(), command="perfscope tune <x>"))
    page = render_html(tuned)
    assert page.count('id="tuning"') == 1 and "perfscope tune &lt;x&gt;" in page
    assert "<script" not in page
