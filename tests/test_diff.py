"""perfscope diff: resolution, comparison, verdict and gates on real captures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import report
from typer.testing import CliRunner

from perfscope import diff as d
from perfscope.cli import app
from perfscope.diagnosis import ResolveOptions, resolve
from perfscope.errors import PerfscopeError
from perfscope.record import Diagnosed

runner = CliRunner()
REFERENCE = Path(__file__).resolve().parents[1] / "reports" / "reference" / "h200"


def side(name: str, regex: str | None = None) -> Diagnosed:
    arg = str(report(name)) + (f":{regex}" if regex else "")
    return resolve(arg)


def test_bank_conflicts_lead_the_verdict_for_the_transpose():
    result = d.compare(side("smem_transpose"), side("float4_copy"))
    assert result.verdict[0].code == "PS110"
    assert "bank conflicts" in result.verdict[0].sentence
    assert result.time[1].ratio > 2            # cycles
    assert "shared" in result.only_a


def test_instruction_families_only_in_b_are_named():
    result = d.compare(side("cublas_sgemm_4096"), side("cublas_hgemm_4096"))
    assert {"gmma", "tma"} <= set(result.only_b)
    sentences = " ".join(r.sentence for r in result.verdict)
    assert "HGMMA (wgmma)" in sentences and "UTMALDG (TMA)" in sentences


def test_unknown_shape_normalises_per_instruction_with_a_warning():
    result = d.compare(side("strided_copy"), side("float4_copy"))
    assert result.unit == "1k instructions"
    assert any("per executed instruction" in w for w in result.warnings)
    flops = d.compare(side("strided_copy"), side("float4_copy"), flops=2 * 64**3)
    assert flops.unit == "MFLOP" and not flops.warnings


def test_file_regex_picks_one_kernel_and_several_are_listed():
    assert side("spill", "_capped$").profile.name == "ps_regs_capped"
    with pytest.raises(PerfscopeError, match="ps_regs_capped, ps_regs_uncapped"):
        resolve(str(report("spill")))
    with pytest.raises(PerfscopeError, match="@N"):
        side("spill", "capped$")


def test_unknown_name_lists_stages():
    with pytest.raises(PerfscopeError, match="sgemm_naive"):
        resolve("no_such_stage_or_file")


def test_cublas_needs_a_manifest():
    with pytest.raises(PerfscopeError, match="run manifest"):
        resolve("cublas", like=side("float4_copy"))


def test_gates():
    result = d.compare(side("smem_transpose"), side("float4_copy"))
    assert d.check_gates(result, ["cycles_ratio>1.05"])
    assert not d.check_gates(result, ["cycles_ratio>100"])
    with pytest.raises(PerfscopeError, match="FIELD>NUMBER"):
        d.check_gates(result, ["cycles ratio is big"])
    with pytest.raises(PerfscopeError, match="duration_ratio"):
        d.check_gates(result, ["nonsense>1"])


def test_cli_gate_exits_1_with_the_reason():
    result = runner.invoke(app, ["diff", str(report("smem_transpose")), str(report("float4_copy")),
                                 "--fail-if", "cycles_ratio>1.05"])
    assert result.exit_code == 1
    assert "gate failed: cycles_ratio = 2.68" in result.output


def test_cli_fail_on_new_findings():
    result = runner.invoke(app, ["diff", str(report("smem_transpose")), str(report("float4_copy")),
                                 "--fail-on-new-findings", "--markdown"])
    assert result.exit_code == 1
    assert "PS110" in result.output
    ok = runner.invoke(app, ["diff", str(report("float4_copy")), str(report("smem_transpose")),
                             "--fail-on-new-findings", "--json"])
    assert ok.exit_code == 0, ok.output
    doc = json.loads(ok.output)
    assert doc["schema"] == "perfscope.diff/1" and doc["gate_failures"] == []


def test_cli_bad_input_is_one_sentence():
    result = runner.invoke(app, ["diff", str(report("spill")), str(report("float4_copy"))])
    assert result.exit_code == 2
    assert "pick one with" in result.output and "Traceback" not in result.output


# -- acceptance on the committed reference run ---------------------------------------

needs_reference = pytest.mark.skipif(
    not list(REFERENCE.glob("*.ncu-rep.xz")),
    reason="the reference run's reports are not committed yet (benchmarks/reference_run.py)")


def ref(stage: str, dtype: str) -> str:
    return str(REFERENCE / f"{stage}-{dtype}-4096x4096x4096.ncu-rep.xz")


@needs_reference
def test_reference_naive_vs_bcf_names_bank_conflicts_first():
    result = d.compare(resolve(ref("hgemm_naive", "fp16")), resolve(ref("hgemm_bcf", "fp16")))
    assert result.verdict[0].code in ("PS110", "PS111")


@needs_reference
def test_reference_rw_vs_cublas_names_wgmma_and_tma():
    a = resolve(ref("hgemm_bcf_dbf_rw", "fp16"))
    result = d.compare(a, resolve("cublas", ResolveOptions(reference=REFERENCE.parent), like=a))
    sentences = " ".join(r.sentence for r in result.verdict)
    assert "HGMMA" in sentences and "UTMALDG" in sentences


@needs_reference
def test_reference_sgemm_naive_vs_smem_names_coalescing_or_reuse():
    result = d.compare(resolve(ref("sgemm_naive", "fp32")), resolve(ref("sgemm_smem", "fp32")))
    tags = {f.tag for f in result.new_findings}
    assert tags & {"uncoalesced-global", "no-data-reuse"}
    assert result.verdict[0].code in ("PS101", "PS102", "PS103")


@needs_reference
def test_profiled_manifest_takes_its_timing_from_bench_json():
    """A profiled run is not timed; the bench.json beside it supplies the ratio to cuBLAS."""
    from perfscope.manifest import manifest_beside
    from perfscope.rules import evaluate

    path = ref("hgemm_bcf_dbf_rw", "fp16")
    manifest = manifest_beside(path)
    ratio = manifest.timing.ratio_to_reference.median
    assert 0.3 < ratio < 0.7
    legacy = next(f for f in evaluate(resolve(path).profile, manifest).findings if f.code == "PS141")
    assert legacy.estimated_gain == pytest.approx(1 - ratio, abs=0.01)
