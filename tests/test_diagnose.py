"""`perfscope diagnose` output and the exports, on real captures."""

from __future__ import annotations

import json

from conftest import FIXTURES, report
from typer.testing import CliRunner

import perfscope
from perfscope.cli import app
from perfscope.export import to_dataframe, to_json
from perfscope.render.jsondoc import DIAGNOSE_SCHEMA as SCHEMA

runner = CliRunner()

KERNEL_KEYS = {"name", "duration_ns", "sol", "stalls", "memory", "launch", "opcodes",
               "opcode_families", "hotspots", "ncu_rules"}


def test_console_shows_every_section():
    result = runner.invoke(app, ["diagnose", str(report("smem_transpose"))], terminal_width=120)
    assert result.exit_code == 0, result.output
    for text in ("Speed of light", "Top stalls", "mio_throttle", "LDS (load)", "32.0x ideal",
                 "limited by warps", "Opcode families", "Hotspots",
                 "Nsight Compute's own findings", "SharedMemoryConflicts"):
        assert text in result.output, text


def test_json_document_follows_schema():
    result = runner.invoke(app, ["diagnose", "--json", str(report("cublas_hgemm_4096")),
                                 str(report("spill"))])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["schema"] == SCHEMA
    assert len(doc["kernels"]) == 3
    for k in doc["kernels"]:
        assert set(k) >= KERNEL_KEYS
    hgemm = doc["kernels"][0]
    assert hgemm["opcode_families"]["gmma"] > 0
    assert hgemm["identity"]["cluster"] == [2, 1, 1]
    capped = doc["kernels"][2]
    assert capped["memory"]["local_load_bytes"] > 0


def test_markdown_is_a_pr_comment():
    result = runner.invoke(app, ["diagnose", "--markdown", str(report("strided_copy"))])
    assert result.exit_code == 0
    assert result.output.startswith("### `ps_strided_copy`")
    assert "| LDG.E.CONSTANT (load) |" in result.output
    assert "<details>" in result.output


def test_folder_and_kernel_filter():
    result = runner.invoke(app, ["diagnose", "--json", str(FIXTURES), "--kernel", "ps_regs"])
    assert result.exit_code == 0
    names = {k["name"] for k in json.loads(result.output)["kernels"]}
    assert names == {"ps_regs_capped", "ps_regs_uncapped"}


def test_dataframe_is_long_and_complete():
    profiles = perfscope.load(report("spill"))
    df = to_dataframe(profiles)
    assert list(df.columns) == ["kernel", "launch", "source", "metric", "value", "unit"]
    assert set(df["kernel"]) == {"ps_regs_capped", "ps_regs_uncapped"}
    per_kernel = df.groupby("kernel").size()
    assert (per_kernel == [len(p.metrics) for p in sorted(profiles, key=lambda p: p.name)]).all()
    regs = df[(df.metric == "launch__registers_per_thread")].set_index("kernel")["value"]
    assert regs["ps_regs_capped"] == 32


def test_json_has_findings_only_when_rules_were_evaluated():
    from perfscope.diagnosis import diagnose
    from perfscope.render.jsondoc import diagnose_document

    profiles = perfscope.load(report("strided_copy"))
    assert "findings" not in to_json(profiles)["kernels"][0]
    doc = diagnose_document(diagnose([report("strided_copy")]))
    assert doc["kernels"][0]["findings"][0]["code"] == "PS101"
    assert doc["kernels"][0]["rules_not_evaluated"]
