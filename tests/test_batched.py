"""Batched GEMMs (B products of M x N x K in one launch, torch.bmm's strided batched GEMM):
named BxMxNxK, recorded in the run manifest, held to the whole batch's work, and held
against cuBLAS's own batched GEMM at the same shape.

The reports are real (tests/fixtures/batched/README.md: an H100, 2026-12-06): a program's
P @ V over 32 heads captured through an NVTX range that names its shape, the cuBLAS
reference `perfscope diff` made for it beside it, and cuBLAS's batch of 16 products of
2048^3; the external set's three torch.bmm workloads (tests/fixtures/external).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from perfscope import cli, diagnosis
from perfscope.kernels import Shape
from perfscope.manifest import RunManifest, Verification, read_manifest
from perfscope.profiling import shape_from_ranges
from perfscope.rules.bounds import headroom, sass_flops, work_of
from perfscope.rules.model import Inputs

BATCHED = Path(__file__).parent / "fixtures" / "batched"
EXTERNAL = Path(__file__).parent / "fixtures" / "external"
FUSED = Path(__file__).parents[1] / "reports" / "reference" / "h200" / "fused"
runner = CliRunner()


def _record(path: Path):
    (r,) = diagnosis.diagnose([path])
    return r


def test_a_single_gemm_manifest_reads_and_writes_as_before_and_a_batch_round_trips():
    one = RunManifest(stage="s", family="f", dtype="bf16", m=8, n=16, k=32, params={},
                      verification=Verification("ok"))
    assert "batch" not in one.to_dict() and one.shape == "8x16x32" and one.flops == 2 * 8 * 16 * 32
    assert RunManifest.from_dict(one.to_dict()) == one
    many = dataclasses.replace(one, batch=4)
    assert many.to_dict()["batch"] == 4 and many.shape == "4x8x16x32"
    assert many.flops == 4 * one.flops and RunManifest.from_dict(many.to_dict()) == many


def test_a_range_named_with_a_batch_gives_it():
    assert shape_from_ranges(["values-bf16-32x2048x128x2048/"]) == (
        "bf16", Shape(2048, 128, 2048, batch=32))
    assert shape_from_ranges(["x-fp16-64x32x16/"]) == ("fp16", Shape(64, 32, 16))


def test_a_program_captured_through_such_a_range_records_its_batch():
    m = read_manifest(BATCHED / "attention_values.json")
    assert (m.batch, m.m, m.n, m.k, m.dtype) == (32, 2048, 128, 2048, "bf16")
    assert m.capture is not None and m.capture.nvtx == ("values-bf16-32x2048x128x2048/",)


@pytest.mark.parametrize(("path", "batch"), [
    (BATCHED / "cublas_bgemm-bf16-16x2048x2048x2048.ncu-rep.xz", 16),
    (EXTERNAL / "torch_bmm_square.ncu-rep.xz", 16),
    (EXTERNAL / "torch_bmm_values.ncu-rep.xz", 32),
])
def test_the_roofline_holds_the_whole_batch(path, batch):
    """The manifest's 2·B·M·N·K is what the SASS executed (cuBLAS pads nothing at these
    shapes), and the math or DRAM floor is the whole batch's."""
    r = _record(path)
    m = r.manifest
    assert m is not None and m.batch == batch
    w = work_of(Inputs(profile=r.profile, manifest=m))
    assert w.flops == m.flops and "a batch of" in w.flops_source
    assert sass_flops(r.profile) == pytest.approx(m.flops, rel=0.01)
    elem = 2
    assert w.bytes == batch * ((m.m * m.k + m.k * m.n) * elem + m.m * m.n * elem)
    room = headroom(Inputs(profile=r.profile, manifest=m))
    assert room is not None and room.fraction < 0.25     # a batch's work, not one product's


def test_a_batch_labelled_as_one_product_is_held_to_what_it_executed():
    """A --shape that names one product of a batch (16 x fewer FLOPs than the launch ran)
    is not believed: the work comes from the SASS, and the source says why."""
    r = _record(EXTERNAL / "torch_bmm_square.ncu-rep.xz")
    one = dataclasses.replace(r.manifest, batch=1)
    w = work_of(Inputs(profile=r.profile, manifest=one))
    assert w.flops == sass_flops(r.profile)
    assert "16.0x the run manifest's 2048x2048x2048" in w.flops_source
    room = headroom(Inputs(profile=r.profile, manifest=one))
    assert room is not None and room.fraction < 0.25


def test_padding_alone_does_not_count_as_a_batch():
    """hgemm_small_m runs M = 16 in 64-row wgmmas: its SASS does 4x the manifest's work,
    which the padding explains, so the manifest's shape stands."""
    r = _record(FUSED / "hgemm_small_m@AROWS=16,BN=64,STAGES=12-bf16-16x8192x8192.ncu-rep.xz")
    m = r.manifest
    assert m is not None and m.batch == 1 and sass_flops(r.profile) > 3.9 * m.flops
    assert work_of(Inputs(profile=r.profile, manifest=m)).flops == m.flops


def test_diff_holds_a_programs_batch_against_cublas_batched_gemm_beside_it(tmp_path):
    """`perfscope diff CAPTURE cublas` finds the reference made at the same batch and shape
    (no GPU needed once it is there) and counts the rows per MFLOP of the whole batch."""
    folder = tmp_path / "capture"
    shutil.copytree(BATCHED, folder)
    result = runner.invoke(cli.app, ["diff", str(folder / "attention_values.ncu-rep.xz"),
                                     "cublas"])
    assert result.exit_code == 0, result.output
    assert "cublas_bgemm-bf16-32x2048x128x2048" in result.output
    assert "different GEMM shapes" not in result.output and "unknown" not in result.output


def test_diff_refuses_a_shape_that_drops_the_batch(tmp_path):
    folder = tmp_path / "capture"
    shutil.copytree(BATCHED, folder)
    result = runner.invoke(cli.app, ["diff", str(folder / "attention_values.ncu-rep.xz"),
                                     str(folder / "cublas_bgemm-bf16-32x2048x128x2048.ncu-rep.xz"),
                                     "--shape", "2048x128x2048"])
    assert result.exit_code != 0
    assert "contradicts" in result.output and "32x2048x128x2048" in result.output
    assert "Traceback" not in result.output


def test_the_fixture_readme_names_every_file():
    text = (BATCHED / "README.md").read_text()
    for f in BATCHED.iterdir():
        if f.name != "README.md":
            assert f.name.split(".")[0] in text, f.name
    for name in ("torch_bmm_scores", "torch_bmm_values", "torch_bmm_square"):
        assert json.loads((EXTERNAL / f"{name}.json").read_text())["batch"] > 1
