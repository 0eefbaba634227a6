"""What a pipeline reads: `--version`, `diagnose --fail-on`, GitHub annotations on the
source lines findings point at, and the step summary (issue 16, expected conventions)."""

from __future__ import annotations

import json
import os
import re
import stat

import pytest
from conftest import report
from typer.testing import CliRunner

from perfscope.cli import app
from perfscope.diagnosis import diagnose
from perfscope.record import source_line
from perfscope.render.github import command

runner = CliRunner()
# The hotspots of the small fixtures point into the NVRTC source of their capture run.
CAPTURE_DIR = "/tmp/tmpqhf9n30k"


# --------------------------------------------------------------------- --version


def _fake_ncu(tmp_path, version: str):
    exe = tmp_path / "ncu"
    exe.write_text(f"#!/bin/sh\necho 'NVIDIA (R) Nsight Compute Command Line Profiler'\n"
                   f"echo 'Version {version} (build 36273991) (public-release)'\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def test_version_names_perfscope_the_reader_and_ncu(tmp_path):
    exe = _fake_ncu(tmp_path, "2025.3.1.0")
    result = runner.invoke(app, ["--version"], env={"PERFSCOPE_NCU": str(exe)})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert re.match(r"perfscope \d+\.\d+\.\d+ ", lines[0])
    assert lines[1].startswith("report reader: ncu-report 2025.3.1")
    assert lines[2] == f"ncu: 2025.3.1 ({exe})"


def test_version_without_ncu_says_so(tmp_path):
    result = runner.invoke(app, ["--version"], env={"PERFSCOPE_NCU": str(tmp_path / "none")})
    assert result.exit_code == 0, result.output
    assert "ncu: PERFSCOPE_NCU=" in result.stdout and "Traceback" not in result.output


# ---------------------------------------------------------------------- --fail-on


def test_fail_on_a_severity_names_the_findings():
    result = runner.invoke(app, ["diagnose", str(report("smem_transpose")), "--fail-on", "warning"])
    assert result.exit_code == 1
    (line,) = [ln for ln in result.stderr.splitlines() if ln.startswith("perfscope: --fail-on")]
    assert f"{report('smem_transpose')}#0 (ps_smem_transpose) has PS110 " in line
    assert "(warning)" in line


def test_fail_on_a_code_only_fails_on_that_rule():
    passed = runner.invoke(app, ["diagnose", str(report("smem_transpose")), "--fail-on", "PS130"])
    assert passed.exit_code == 0, passed.output
    failed = runner.invoke(app, ["diagnose", str(report("spill")), "--fail-on", "ps130", "--json"])
    assert failed.exit_code == 1
    doc = json.loads(failed.stdout)
    assert len(doc["failures"]) == 1 and "ps_regs_capped" in doc["failures"][0]
    assert "PS130" in doc["failures"][0]


def test_fail_on_nonsense_is_one_sentence():
    result = runner.invoke(app, ["diagnose", str(report("float4_copy")), "--fail-on", "loud"])
    assert result.exit_code == 2
    assert result.output.count("\n") == 1
    assert "--fail-on 'loud' is neither a severity (info, optimization, warning, error)" in result.output


# ------------------------------------------------------------------ annotations


def test_a_finding_points_at_its_own_instruction():
    (transpose,) = diagnose([report("smem_transpose")])
    conflict = next(f for f in transpose.evaluation.findings if f.code == "PS110")
    # The hottest line is the S2R at line 24; the conflicting LDS is at line 32.
    assert transpose.profile.hotspots[0].line == 24
    assert source_line(transpose, conflict)[1] == 32
    assert source_line(transpose)[1] == 24
    (cublas,) = diagnose([report("cublas_hgemm_4096")])
    assert source_line(cublas) is None          # no -lineinfo in cuBLAS


def _github_env(tmp_path, **extra):
    return {"GITHUB_ACTIONS": "true", "GITHUB_WORKSPACE": CAPTURE_DIR,
            "GITHUB_STEP_SUMMARY": "", **extra}


def test_annotations_on_the_source_lines(tmp_path):
    result = runner.invoke(app, ["diagnose", str(report("smem_transpose"))], env=_github_env(tmp_path))
    assert result.exit_code == 0, result.output
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith("::")]
    ps110 = next(ln for ln in lines if "title=perfscope PS110" in ln)
    # Relative to the workspace, so GitHub places it on the file in the pull request.
    assert re.match(r"::warning file=eaeac06c5efcb2da3a442e40b3202832d528dc72\.cubin\.cu,line=32,", ps110)
    assert "Fix: " in ps110
    outside = runner.invoke(app, ["diagnose", str(report("smem_transpose"))])
    assert "::warning" not in outside.output


def test_annotations_go_to_stderr_beside_json(tmp_path):
    result = runner.invoke(app, ["diagnose", "--json", str(report("spill"))], env=_github_env(tmp_path))
    assert result.exit_code == 0, result.output
    json.loads(result.stdout)                       # stdout stays one JSON document
    assert "title=perfscope PS130" in result.stderr


def test_a_kernel_without_lines_gets_an_annotation_without_a_file(tmp_path):
    result = runner.invoke(app, ["diff", str(report("cublas_sgemm_4096")), str(report("cublas_hgemm_4096"))],
                           env=_github_env(tmp_path))
    assert result.exit_code == 0, result.output
    found = [ln for ln in result.stdout.splitlines() if ln.startswith("::") and "perfscope PS" in ln]
    assert found and all("file=" not in ln for ln in found)


def test_gate_failures_are_error_annotations(tmp_path):
    result = runner.invoke(app, ["diff", str(report("smem_transpose")), str(report("float4_copy")),
                                 "--fail-if", "cycles_ratio>1.05"], env=_github_env(tmp_path))
    assert result.exit_code == 1
    assert "::error title=perfscope gate failed::cycles_ratio = 2.68" in result.stdout


def test_workflow_command_escaping():
    line = command("warning", "50% of time\nsecond line", title="a: b, c", where=("dir/a,b.cu", 7))
    assert line == "::warning file=dir/a%2Cb.cu,line=7,title=a%3A b%2C c::50%25 of time%0Asecond line"


# ----------------------------------------------------------------- step summary


@pytest.mark.parametrize("command_args, heading", [
    (["diagnose", "SPILL"], "### perfscope diagnose: 2 kernel launch(es)"),
    (["diff", "TRANSPOSE", "FLOAT4"], "### perfscope diff: `ps_smem_transpose` vs `ps_float4_copy`"),
])
def test_step_summary_is_appended(tmp_path, command_args, heading):
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    names = {"SPILL": report("spill"), "TRANSPOSE": report("smem_transpose"),
             "FLOAT4": report("float4_copy")}
    args = [str(names.get(a, a)) for a in command_args]
    env = {"GITHUB_STEP_SUMMARY": str(summary)}
    result = runner.invoke(app, args, env=env)
    assert result.exit_code == 0, result.output
    text = summary.read_text()
    assert text.startswith("earlier step\n") and heading in text
    again = runner.invoke(app, args, env=env)
    assert again.exit_code == 0 and summary.read_text().count(heading) == 2


def test_diagnose_summary_lists_the_failures(tmp_path):
    summary = tmp_path / "summary.md"
    result = runner.invoke(app, ["diagnose", str(report("spill")), "--fail-on", "PS130"],
                           env={"GITHUB_STEP_SUMMARY": str(summary)})
    assert result.exit_code == 1
    text = summary.read_text()
    assert "> **failed:** " in text and "PS130" in text
    assert "| launch | kernel |" in text


def test_unwritable_step_summary_does_not_fail_the_command(tmp_path):
    result = runner.invoke(app, ["diagnose", str(report("float4_copy"))],
                           env={"GITHUB_STEP_SUMMARY": str(tmp_path / "no" / "such" / "file.md")})
    assert result.exit_code == 0, result.output
    assert "cannot append to GITHUB_STEP_SUMMARY" in result.stderr
    assert not os.path.exists(tmp_path / "no")
