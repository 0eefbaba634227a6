"""`perfscope kernels` reads its ratios from the committed reference run's bench files: the
ladder at 4096^3, the fused stages against their groups over issue 19's shapes, hgemm_fp8
against cuBLASLt; only rows at each stage's defaults (hgemm_small_m's tile as the host
picks it for the shape) count."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from perfscope.cli import app
from perfscope.documents import KernelRow
from perfscope.kernels.listing import bench_files, kernels_table

ROOT = Path(__file__).resolve().parents[1]
REF = ROOT / "reports" / "reference" / "h200"


def _rows(bench):
    return {r.name: r for r in kernels_table(bench).rows}


def test_the_reference_folder_times_the_ladder_the_fused_stages_and_fp8():
    rows = _rows(REF)
    ladder = rows["hgemm_tma_wgmma_persistent"]
    assert ladder.shapes == 1 and ladder.reference.startswith("cublas_")
    assert " vs " not in ladder.ratio_text and ladder.ratio_text.endswith(f"({ladder.best_dtype})")
    small = rows["hgemm_small_m"]
    # M = 16, 64 and 256 at four (N, K) each, against cuBLAS and the elementwise pass.
    assert small.shapes == 12 and small.reference == "cublas+gelu"
    assert small.ratio_low < small.best_ratio
    assert small.ratio_text.startswith(f"{small.ratio_low:.3f}-{small.best_ratio:.3f} vs cublas+gelu")
    assert rows["hgemm_small_m_streamk"].shapes == 8   # the variant takes M up to 64
    fp8 = rows["hgemm_fp8"]
    assert fp8.reference == "cublaslt_fp8gemm" and fp8.shapes == 4
    assert rows["hgemm_tcgen05"].ratio_text == "compiled, never run"
    assert rows["cublas_bgemm"].ratio_text == "reference"


def test_only_rows_at_the_stages_defaults_count():
    """small-m-decode.json times hgemm_small_m at every width; only the host's own width at
    each shape (and its repeat) is the stage as `bench` runs it."""
    decode = REF / "fused" / "small-m-decode.json"
    doc = json.loads(decode.read_text())
    row = _rows(decode)["hgemm_small_m"]
    assert row.shapes == 8 and row.measured_in == str(decode)
    host = [m for m in doc["manifests"] if (m["n"] == 14336) == (m["params"]["BN"] == 128)]
    assert len(host) < len(doc["manifests"])   # the other widths are there, and left out
    assert row.best_ratio == max(m["timing"]["ratio_to_reference"]["median"] for m in host)
    assert row.ratio_low == min(max(m["timing"]["ratio_to_reference"]["median"] for m in host
                                    if (m["m"], m["n"], m["k"]) == shape)
                                for shape in {(m["m"], m["n"], m["k"]) for m in host})


def test_a_bench_file_alone_and_a_missing_one():
    ladder = REF / "bench.json"
    assert bench_files(ladder) == (ladder,)
    assert _rows(ladder)["hgemm_small_m"].ratio_text == "not timed"
    missing = kernels_table(ROOT / "no-such-bench.json")
    assert missing.bench is None
    assert {r.ratio_text for r in missing.rows} == {"not timed", "reference", "compiled, never run"}


def test_ratio_text_reads_one_shape_or_a_range():
    base = dict(name="s", family="fused", parent=None, archs=(), change="", variant=False,
                label="", best_dtype="bf16", measured_in="f")
    assert KernelRow(**base, best_ratio=1.234).ratio_text == "1.234 (bf16)"
    one = KernelRow(**base, best_ratio=1.234, shapes=1, reference="cublas_bgemm")
    assert one.ratio_text == "1.234 (bf16)"
    many = KernelRow(**base, best_ratio=1.171, ratio_low=0.922, shapes=12, reference="cublas+gelu")
    assert many.ratio_text == "0.922-1.171 vs cublas+gelu (12 shapes)"
    # Three places: a stage at 1.027 does not read as 1.03.
    assert KernelRow(**base, best_ratio=1.0273).ratio_text == "1.027 (bf16)"
    assert KernelRow(**{**base, "best_dtype": None}, best_ratio=None).ratio_text == "not timed"


def test_the_command_lists_the_fused_ranges():
    result = CliRunner().invoke(app, ["kernels", "--json"])
    assert result.exit_code == 0
    rows = {r["name"]: r for r in json.loads(result.output)}
    assert rows["hgemm_fused_bias_act"]["reference"] == "cublas+gelu"
    assert rows["hgemm_fused_bias_act"]["shapes"] == 16


def test_a_bench_that_is_not_there_is_one_sentence(tmp_path):
    result = CliRunner().invoke(app, ["kernels", "--bench", str(tmp_path / "nope.json")])
    assert result.exit_code == 2
    assert "is neither a bench file nor a folder holding one" in result.output
    assert result.output.count("\n") == 1
