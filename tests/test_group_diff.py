"""A side of a diff that is a group of launches (cuBLAS, then its epilogue pass), on real
H200 captures (tests/fixtures/h200/fused): read as one record, summed, and the unfused
epilogue named with its DRAM bytes and time."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from perfscope import diff
from perfscope.cli import app
from perfscope.diagnosis import resolve

FIXTURES = Path(__file__).parent / "fixtures" / "h200" / "fused"
runner = CliRunner()


def _pair(stage: str, shape: str):
    a = resolve(str(FIXTURES / f"{stage}-bf16-{shape}.ncu-rep.xz"))
    b = resolve(str(FIXTURES / f"cublas+gelu-bf16-{shape}.ncu-rep.xz"))
    return a, b


def test_a_group_report_reads_as_its_gemm_with_the_epilogue_pass_beside_it():
    _, b = _pair("hgemm_fused_bias_act", "4096x4096x4096")
    assert b.profile.name.startswith("nvjet_sm90") and len(b.group) == 1
    assert b.group[0].profile.name == "bias_act_inplace"
    assert b.stage.is_group and [x.profile.identity.launch_index for x in b.launches] == [0, 1]


def test_the_fused_stage_wins_by_the_epilogue_pass_it_does_not_run():
    a, b = _pair("hgemm_fused_bias_act", "4096x4096x4096")
    d = diff.compare(a, b)
    rows = d.rows_by_key()
    # Both launches of B count: its duration is the GEMM's plus the pass's.
    assert rows["duration_ns"].b == pytest.approx(sum(x.profile.sol.duration_ns for x in b.launches))
    assert (rows["launches"].a, rows["launches"].b) == (1.0, 2.0)
    assert d.improved and d.gap == pytest.approx(1 - 304260 / 315988, abs=1e-4)
    top = d.verdict[0]
    assert top.kind == "unfused-epilogue" and "re-reads C and writes it again" in top.sentence
    assert "40.4 MB of DRAM traffic" in top.sentence and "16.4 us" in top.sentence
    # The pass's share of B's cycles, within the gap it explains.
    assert 0 < top.estimated_gain <= d.gap + 1e-9
    assert "Fuse the epilogue" in top.fix


def test_when_the_group_is_faster_its_epilogue_pass_is_named_but_not_counted():
    a, b = _pair("hgemm_small_m", "64x8192x8192")
    d = diff.compare(a, b)
    assert not d.improved
    note = next(r for r in d.verdict if r.kind == "unfused-epilogue")
    assert note.estimated_gain is None and "B is faster anyway" in note.sentence
    assert "bias_act_inplace" in note.sentence


def test_diff_gates_on_the_launch_count_and_dram_bytes():
    a = str(FIXTURES / "hgemm_fused_bias_act-bf16-4096x4096x4096.ncu-rep.xz")
    b = str(FIXTURES / "cublas+gelu-bf16-4096x4096x4096.ncu-rep.xz")
    result = runner.invoke(app, ["diff", a, b, "--fail-if", "launches_b>1"])
    assert result.exit_code == 1 and "launches_b" in result.output
    ok = runner.invoke(app, ["diff", a, b, "--fail-if", "dram_bytes_ratio>1.05"])
    assert ok.exit_code == 0, ok.output
