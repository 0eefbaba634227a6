"""The terminal on narrow screens and in pipes, the diagnose summary rows, and numbers
printed as what they are (issue 16, items 13, 14 and 15)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import report
from typer.testing import CliRunner

from perfscope import bench
from perfscope.cli import app
from perfscope.manifest import BenchFile
from perfscope.render import render
from perfscope.render.summary import evidence_value

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "reports" / "reference" / "h200" / "bench.json"
runner = CliRunner()


def _at(columns: int, *args: str):
    result = runner.invoke(app, list(args), env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    return result.output


def _wider_than(text: str, columns: int) -> list[str]:
    return [line for line in text.splitlines() if len(line) > columns]


# ------------------------------------------------------------------ item 14: narrow


def test_bench_table_at_80_columns_keeps_stage_dtype_and_shape_whole():
    doc = bench.summary(BenchFile.read(BENCH).manifests)
    text = render(doc, "console", width=80)
    assert not _wider_than(text, 80)
    assert "…" not in text
    for dtype in ("fp16", "bf16"):
        # The two rows of one stage differ where a reader looks: the row's own heading.
        assert f"hgemm_bcf_dbf_rw · {dtype} · 4096x4096x4096" in text
    wide = render(doc, "console", width=200)
    assert "│ hgemm_bcf_dbf_rw" in wide and "…" not in wide


@pytest.mark.parametrize("command", [["kernels"], ["rules"]])
def test_listings_at_80_columns_cut_no_name(command):
    text = _at(80, *command)
    assert "…" not in text and not _wider_than(text, 80)
    if command == ["kernels"]:
        assert "hgemm_tma_wgmma_persistent" in text and "hgemm_tma_wgmma_cluster (variant)" in text
    else:
        assert re.search(r"^PS110 · bank-conflicts$", text, re.M)


def test_piped_output_keeps_names_whole():
    """Under a runner (as in a pipe) there is no terminal: 120 columns, never a cut name."""
    result = runner.invoke(app, ["kernels"])
    assert result.exit_code == 0
    assert "…" not in result.output and "hgemm_tma_wgmma_persistent" in result.output
    # The fused family is listed with the ladder.
    assert all(name in result.output for name in ("hgemm_fused_bias_act", "hgemm_small_m",
                                                  "hgemm_fused_quant"))


def test_diff_labels_stand_whole_above_the_table():
    a, b = str(report("smem_transpose")), str(report("float4_copy"))
    text = _at(80, "diff", a, b)
    assert f"A: {a}" in text and f"B: {b}" in text
    assert not _wider_than(text, 80)


# ------------------------------------------------------- item 15: one row per kernel


def test_several_kernels_get_one_row_each():
    text = _at(250, "diagnose", str(report("many_launches")))
    rows = [line for line in text.splitlines() if "many_launches.ncu-rep.xz#" in line]
    assert len(rows) == 24
    assert "Speed of light" not in text                  # no panels by default
    first = rows[0]
    for cell in ("#0", "ps_strided_copy", "us", "569,544", "1.958 GHz", "long_scoreboard",
                 "worst PS101 warning, est."):
        assert cell in first, cell
    assert len(text.splitlines()) < 40


def test_several_kernels_at_80_columns_become_blocks():
    text = _at(80, "diagnose", str(report("many_launches")))
    assert not _wider_than(text, 80)
    assert f"{report('many_launches')}#23 · " in text
    assert text.count("  findings: ") == 24 and text.count("  SM clock: ") == 24


def test_full_gives_the_panels_and_one_kernel_always_has_its_panel():
    full = _at(200, "diagnose", "--full", str(report("spill")))
    assert full.count("Speed of light") == 2
    one = _at(200, "diagnose", str(report("smem_transpose")))
    assert "Speed of light" in one and "perfscope findings" in one


def test_markdown_summary_table_for_several_kernels():
    text = _at(120, "diagnose", "--markdown", str(report("spill")))
    assert "| launch | kernel | duration | cycles | SM clock | top stall | findings |" in text
    assert f"| {report('spill')}#1 | ps_regs_capped |" in text


def test_report_says_where_it_wrote(tmp_path):
    out = tmp_path / "index.html"
    result = runner.invoke(app, ["report", str(report("spill")), "--html", str(out)])
    assert result.exit_code == 0, result.output
    assert result.stderr.strip() == f"wrote {out} (2 kernel(s))"


# ----------------------------------------------------------- item 13: numbers


def test_full_theoretical_occupancy_names_no_limiter():
    text = _at(200, "diagnose", "--full", str(report("spill")))
    capped = text[text.index("ps_regs_capped"):]
    assert re.search(r"achieved of 100\.0% theoretical \(the most an SM holds\)", capped)
    uncapped = text[:text.index("ps_regs_capped")]
    assert "of 37.5% theoretical, limited by registers" in uncapped


def test_counts_print_as_integers_and_clocks_in_ghz():
    assert evidence_value(32.0) == "32" and evidence_value(1048576.0) == "1,048,576"
    assert evidence_value(0.124) == "0.124" and evidence_value("sm_90a") == "sm_90a"
    text = _at(200, "diff", str(report("spill") ) + ":_capped$", str(report("strided_copy")))
    regs = next(line for line in text.splitlines() if re.search(r"│ registers\s", line))
    assert ".0 " not in regs and re.search(r"│ \d+\s", regs.split("registers", 1)[1])
    clock = next(line for line in text.splitlines() if "SM clock" in line)
    assert "GHz" in clock and " Hz" not in clock and "," not in clock


def test_parked_warps_are_shown_and_answer_nsight_computes_barrier_rule(tmp_path):
    """diagnose shows where warps are parked (KernelProfile.parked) and what the stall shares
    are without them, marks that hotspot, and answers Nsight Compute's Barrier Stalls rule,
    which counts them as lost time (hgemm_small_m's pairs at 256 x 8192^2: 60% of its
    barrier samples), in the console, the Markdown and the JSON; a kernel with none shows
    none of it."""
    pairs = str(ROOT / "reports" / "reference" / "h200" / "fused" /
                "hgemm_small_m@AROWS=128,BM=128,MPAIR=2,STAGES=6-bf16-256x8192x8192.ncu-rep.xz")
    text = _at(400, "diagnose", pairs)
    assert "Parked warps" in text and "3.0 warps per CTA" in text
    assert "barrier 23% (not 42%), membar 0% (not 2%) of the stall cycles" in text
    assert re.search(r"UCGABAR_WAIT +1,047 samples \[barrier\] at fused\.cu:899 \(parked warps", text)
    assert "perfscope: 60% of these barrier samples are warps parked at 0x6cf0 UCGABAR_WAIT" in text
    md = _at(400, "diagnose", "--markdown", pairs)
    assert "*perfscope: 60% of these barrier samples" in md and "**Parked warps**" in md
    doc = json.loads(_at(400, "diagnose", "--json", pairs))
    (parked,) = doc["kernels"][0]["parked"]
    assert parked["opcode"] == "UCGABAR_WAIT" and parked["passes"] == 512
    plain = _at(400, "diagnose", str(report("smem_transpose")))
    assert "Parked warps" not in plain and "parked" not in plain


def test_headroom_no_finding_explains_is_said_so():
    """A kernel with 10% or more headroom and no finding estimating any of it says that no
    rule names the cause, so "none" does not read as "nothing left" (sgemm_stages4: 28.7%
    headroom, no finding); a kernel whose findings estimate part of its headroom (the column
    split, PS106 and PS153), one at a roof a finding names, or one at its memory floor,
    does not."""
    from perfscope.render.summary import UNEXPLAINED

    stages4 = str(ROOT / "reports" / "reference" / "h200" / "sgemm_stages4-fp32-4096x4096x4096.ncu-rep.xz")
    text = " ".join(_at(400, "diagnose", stages4).split())
    assert "headroom 28.7% of kernel time" in text and UNEXPLAINED in text
    md = _at(400, "diagnose", "--markdown", stages4)
    assert UNEXPLAINED in md
    # hgemm_small_m's pairs at 256 x 8192^2: 21.8% headroom, at the roof shared memory sets
    # for its m64n128 wgmmas and 128 x 128 tiles (PS115 names it): no rule gap.
    pairs = str(ROOT / "reports" / "reference" / "h200" / "fused" /
                "hgemm_small_m@AROWS=128,BM=128,MPAIR=2,STAGES=6-bf16-256x8192x8192.ncu-rep.xz")
    text = " ".join(_at(400, "diagnose", pairs).split())
    assert "headroom 21.8% of kernel time" in text and UNEXPLAINED not in text
    assert "held at a roof: PS115" in text
    split = str(ROOT / "reports" / "reference" / "h200" / "probes" / "column-split-h200.ncu-rep.xz")
    assert UNEXPLAINED not in " ".join(_at(400, "diagnose", split).split())
    # cuBLAS's decode GEMM: 17% headroom against the DRAM peak, and within 10% of its floor
    # (a launch's fixed time plus its bytes at the rate a copy reaches): no rule gap.
    decode = str(ROOT / "tests" / "fixtures" / "external" / "torch_decode_m16.ncu-rep.xz")
    text = " ".join(_at(400, "diagnose", decode).split())
    assert UNEXPLAINED not in text and "at its floor (" in text
    # The stream-K stage at 4096^3 (fp16): 3% of its time idle at the end, which a split of its
    # 3.88 rounds would not give back (PS153 under the line): named, no rule gap.
    streamk = str(ROOT / "reports" / "reference" / "h200" /
                  "hgemm_tma_wgmma_streamk-fp16-4096x4096x4096.ncu-rep.xz")
    text = " ".join(_at(400, "diagnose", streamk).split())
    assert UNEXPLAINED not in text and "named under the line" in text and "PS153 (3%" in text
