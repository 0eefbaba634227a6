"""`perfscope profile` on the CPU, with a fake ncu: stage mode, program mode, failures."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from conftest import report
from test_ncu import make_fake
from typer.testing import CliRunner

from perfscope import cli, profiling
from perfscope.errors import PerfscopeError
from perfscope.runner import stem_for

runner = CliRunner()
STAGES = ["sgemm_naive", "sgemm_smem"]


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """Point PERFSCOPE_NCU at a fake whose reports are a real 2-launch capture."""
    plain = tmp_path / "two.ncu-rep"
    import lzma

    with lzma.open(report("spill")) as src, open(plain, "wb") as dst:
        shutil.copyfileobj(src, dst)
    monkeypatch.setenv("FAKE_NCU_REPORT", str(plain))

    def use(scenario="ok"):
        exe, log = make_fake(tmp_path, scenario)
        monkeypatch.setenv("PERFSCOPE_NCU", exe)
        return log
    return use


def invoke(*args):
    return runner.invoke(cli.app, list(args))


def argv_log(log):
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_stage_mode_writes_one_report_and_manifest_per_stage(fake, tmp_path):
    log = fake("ok")
    out = tmp_path / "out"
    result = invoke("profile", *STAGES, "--shape", "64x64x64", "--out", str(out))
    assert result.exit_code == 0, result.output
    for stage in STAGES:
        stem = stem_for(stage, "fp32", "64x64x64")
        assert (out / f"{stem}.ncu-rep").exists() and (out / f"{stem}.json").exists()
        # The runner under ncu cannot know the clock control; the parent stamps it.
        assert json.loads((out / f"{stem}.json").read_text())["clock_control"] == "none"
    assert not list(out.glob(".staging-*")) and not list(out.glob("*.part.*"))
    calls = argv_log(log)
    profiling_call = next(c for c in calls if "--nvtx" in c)
    assert profiling_call.count("--nvtx-include") == 2
    assert profiling_call[profiling_call.index("--clock-control") + 1] == "none"
    assert "perfscope.runner" in profiling_call
    # One ncu process for the whole ladder, then one split per stage.
    splits = [c for c in calls if "--launch-skip" in c and "--import" in c]
    assert [c[c.index("--launch-skip") + 1] for c in splits] == ["0", "1"]


def test_a_stage_with_parameters_is_selected_by_a_range_ncu_can_match(fake, tmp_path):
    """On the H200, `tune --profile-best` profiled nothing: the range filter of a stem with
    parameters ("stage@BN=256-...") read as ncu's "domain@range". The range is spelled with
    '+', and the report keeps the stem's name."""
    log = fake("ok")
    out = tmp_path / "out"
    result = invoke("profile", "hgemm_tma_wgmma", "--param", "STAGES=3", "--dtype", "bf16",
                    "--shape", "256x256x256", "--out", str(out))
    assert result.exit_code == 0, result.output
    call = next(c for c in argv_log(log) if "--nvtx" in c)
    (expr,) = [call[i + 1] for i, a in enumerate(call) if a == "--nvtx-include"]
    assert expr == "hgemm_tma_wgmma+STAGES=3-bf16-256x256x256/" and "@" not in expr
    stem = stem_for("hgemm_tma_wgmma", "bf16", "256x256x256", {"STAGES": 3})
    assert (out / f"{stem}.ncu-rep").exists()


def test_wrong_stage_is_listed_and_exit_is_nonzero(fake, tmp_path):
    fake("wrong")
    result = invoke("profile", *STAGES, "--shape", "64x64x64", "--out", str(tmp_path / "o"))
    assert result.exit_code == 1
    assert "WRONG" in result.output
    assert "1 stage(s) failed" in result.output


def test_resume_skips_stages_whose_report_loads(fake, tmp_path):
    log = fake("ok")
    out = tmp_path / "o"
    assert invoke("profile", *STAGES, "--shape", "64x64x64", "--out", str(out)).exit_code == 0
    log.write_text("")
    result = invoke("profile", *STAGES, "--shape", "64x64x64", "--out", str(out), "--resume")
    assert result.exit_code == 0, result.output
    assert "skipped" in result.output
    assert not [c for c in argv_log(log) if "--nvtx" in c]


def test_crash_keeps_earlier_stages_and_names_the_rest(fake, tmp_path):
    fake("crash")
    out = tmp_path / "o"
    result = invoke("profile", *STAGES, "--shape", "64x64x64", "--out", str(out))
    assert result.exit_code == 1
    first = stem_for(STAGES[0], "fp32", "64x64x64")
    assert (out / f"{first}.ncu-rep").exists()
    assert "crashed" in result.output


@pytest.mark.parametrize(("scenario", "fragment"), [
    ("perm", "administrator must allow it"),
    ("nomatch", "nothing matched"),
])
def test_ncu_failures_are_one_sentence(fake, tmp_path, scenario, fragment):
    fake(scenario)
    result = invoke("profile", "sgemm_naive", "--shape", "64x64x64", "--out", str(tmp_path / "o"))
    assert result.exit_code != 0
    assert fragment in result.output
    assert "Traceback" not in result.output


def test_timeout_is_one_sentence(fake, tmp_path):
    fake("hang")
    result = invoke("profile", "sgemm_naive", "--shape", "64x64x64", "--out", str(tmp_path / "o"),
                    "--timeout", "2")
    assert result.exit_code == 2
    assert "did not finish within 2 s" in result.output


def test_unknown_stage_lists_valid_ones(fake, tmp_path):
    fake("ok")
    result = invoke("profile", "sgemm_nonsense", "--out", str(tmp_path / "o"))
    assert result.exit_code == 2
    assert "sgemm_naive" in result.output and "Traceback" not in result.output


def test_ncu_missing_says_how_to_set_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PERFSCOPE_NCU", str(tmp_path / "no-ncu"))
    result = invoke("profile", "sgemm_naive", "--out", str(tmp_path / "o"))
    assert result.exit_code == 2
    assert "PERFSCOPE_NCU" in result.output


def test_program_mode_after_double_dash(fake, tmp_path, capsys):
    log = fake("ok")
    target = tmp_path / "mine.ncu-rep"
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["profile", "--kernel", "gemm", "--out", str(target), "--", "python", "my.py"])
    assert exit_info.value.code in (0, None)
    assert target.exists()
    call = next(c for c in argv_log(log) if "--export" in c)
    assert call[-2:] == ["python", "my.py"]
    assert call[call.index("--kernel-name") + 1] == "regex:gemm"


def test_program_mode_unreadable_report(fake, tmp_path):
    fake("garbage")
    target = tmp_path / "bad.ncu-rep"
    result = invoke("profile", "--out", str(target), "--program", json.dumps(["python", "x.py"]))
    assert result.exit_code == 2
    assert "not an Nsight Compute report" in result.output


def test_gpu_slug():
    assert profiling.gpu_slug("NVIDIA H200") == "h200"
    assert profiling.gpu_slug("NVIDIA GeForce RTX 5060 Laptop GPU") == "geforce-rtx-5060-laptop-gpu"
    assert profiling.gpu_slug(None) == "gpu"


def test_ranges_by_launch_matches_whole_stems():
    csv_text = ('"ID","thread Domain:Push/Pop_Range:PL_Type","Kernel Name"\n"","",""\n'
                '"0","1  ""<default domain>:a-fp16-8x8x8:none"" ","k"\n'
                '"1","1  ""<default domain>:a+S=4-fp16-8x8x8:none"" ","k"\n')
    assert profiling.ranges_by_launch(csv_text, ["a-fp16-8x8x8", "a@S=4-fp16-8x8x8"]) == [
        "a-fp16-8x8x8", "a@S=4-fp16-8x8x8"]


def test_split_refuses_interleaved_launches(tmp_path):
    with pytest.raises(PerfscopeError, match="not contiguous"):
        profiling._split("ncu", tmp_path / "x.ncu-rep", ["a", "b", "a"], tmp_path)


def test_reports_are_written_under_temporary_names(fake, tmp_path, monkeypatch):
    """No final-named report exists until ncu has finished."""
    fake("ok")
    seen = []
    real_replace = os.replace

    def spy(src, dst):
        seen.append((str(src), str(dst)))
        return real_replace(src, dst)
    monkeypatch.setattr(os, "replace", spy)
    out = tmp_path / "o"
    assert invoke("profile", "sgemm_naive", "--shape", "64x64x64", "--out", str(out)).exit_code == 0
    assert any(s.endswith(".part.ncu-rep") and d.endswith(".ncu-rep") for s, d in seen)


def test_cublas_references_get_their_own_ncu_process(fake, tmp_path):
    log = fake("ok")
    out = tmp_path / "o"
    result = invoke("profile", "sgemm_naive", "cublas_sgemm", "--shape", "64x64x64", "--out", str(out))
    assert result.exit_code == 0, result.output
    runs = [c for c in argv_log(log) if "--nvtx" in c]
    assert [c.count("--nvtx-include") for c in runs] == [1, 1]
    assert "sgemm_naive-fp32-64x64x64/" in runs[0] and "cublas_sgemm-fp32-64x64x64/" in runs[1]
    for stage in ("sgemm_naive", "cublas_sgemm"):
        assert (out / f"{stem_for(stage, 'fp32', '64x64x64')}.ncu-rep").exists()


def test_each_reference_gets_an_ncu_process_of_its_own(fake, tmp_path):
    """cuBLAS's 14 MB SGEMM module must not ride along in the half-precision references."""
    log = fake("ok")
    out = tmp_path / "o"
    plan = profiling.plan_jobs(profiling.ProfileRequest(
        stages=("hgemm_naive", "cublas_sgemm", "cublas_hgemm"), dtypes=(), shape="64x64x64"))
    groups = profiling._groups(list(plan.jobs))
    assert [[j.stage for j in g] for _, g in groups] == [["hgemm_naive"], ["cublas_sgemm"],
                                                         ["cublas_hgemm"]]
    assert len({name for name, _ in groups}) == 3
    result = invoke("profile", "cublas_hgemm", "cublas_sgemm", "--shape", "64x64x64", "--out", str(out))
    assert result.exit_code == 0, result.output
    runs = [c for c in argv_log(log) if "--nvtx" in c]
    assert [c.count("--nvtx-include") for c in runs] == [1, 1]
