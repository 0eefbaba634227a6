"""benchmarks/kernel_ab.py on the CPU: cases parse to the stage and configuration they name,
and bad input is refused in one sentence, exit 2, before any GPU work and with no output
file written."""

from __future__ import annotations

import pytest
from conftest import benchmark_script


@pytest.fixture(scope="module")
def ab():
    return benchmark_script("kernel_ab")


def test_a_case_names_stage_parameters_shape_and_dtype(ab):
    case = ab.parse_case("hgemm_tma_wgmma_persistent:GROUP=16,STAGES=4@4096x4096x4096/bf16")
    assert case.spec.name == "hgemm_tma_wgmma_persistent"
    assert case.spec.param_dict["GROUP"] == 16 and case.spec.param_dict["STAGES"] == 4
    assert (case.shape_text, case.dtype) == ("4096x4096x4096", "bf16")


def test_small_m_takes_the_hosts_tile_unless_pinned(ab):
    host = ab.parse_case("hgemm_small_m@256x8192x8192/bf16").spec.param_dict
    assert (host["BM"], host["BN"], host["MPAIR"]) == (128, 128, 2)
    pinned = ab.parse_case("hgemm_small_m:MPAIR=1@256x8192x8192/bf16").spec.param_dict
    assert pinned["MPAIR"] == 1


@pytest.mark.parametrize("argv, says", [
    (["--case", "hgemm_tma_wgmma_persistent@4096x4096x4096", "--versus", "cublas_bgemm"],
     "is not STAGE[:K=V,...]@MxNxK/DTYPE"),
    (["--case", "hgemm_tma_wgmma_persistent:STAGES=four@4096x4096x4096/bf16",
      "--versus", "hgemm_tma_wgmma_persistent"], "is not of the form NAME=INTEGER"),
    (["--case", "hgemm_tma_wgmma_persistent@4096x4096x4096/bf16", "--against", "."],
     "holds no perfscope kernels"),
    (["--case", "hgemm_tma_wgmma_persistent@4096x4096x4096/fp32", "--against", "."],
     "fp32"),
    (["--case", "hgemm_fp8@4096x4096x4096/fp8", "--versus", "hgemm_tma_wgmma_persistent"],
     "fp8"),
    (["--case", "hgemm_tma_wgmma_persistent@4096x4096x4096/bf16", "--versus",
      "hgemm_tma_wgmma_persistent", "--rounds", "0"], "rounds must be at least 1"),
    (["--case", "hgemm_tma_wgmma_persistent@4096x4096x4096/bf16", "--versus",
      "hgemm_tma_wgmma_persistent", "--until", "0"], "--until is a fraction of the ratio"),
    (["--case", "hgemm_tma_wgmma_persistent@4096x4096x4096/bf16", "--versus",
      "hgemm_tma_wgmma_persistent", "--until", "0.01", "--max-rounds", "3"],
     "--max-rounds (3) is below --rounds (9)"),
    (["--case", "hgemm_tma_wgmma_persistent@4096x4096x4096/bf16", "--versus",
      "hgemm_tma_wgmma_persistent", "--label", " "], "--label is empty"),
])
def test_bad_input_is_one_sentence_and_exit_2(ab, tmp_path, capsys, argv, says):
    out = tmp_path / "ab.jsonl"
    assert ab.main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1, err
    assert not out.exists()


def test_without_a_gpu_it_says_so(ab, tmp_path, capsys):
    try:
        import cupy  # noqa: F401
        pytest.skip("CuPy is installed here")
    except ImportError:
        pass
    out = tmp_path / "ab.jsonl"
    assert ab.main(["--case", "hgemm_tma_wgmma_persistent@4096x4096x4096/bf16", "--versus",
                    "hgemm_tma_wgmma_persistent", "--out", str(out)]) == 2
    assert "needs CuPy" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("verdicts, probe, timed", [
    (["ok", "ok"], False, True),
    (["WRONG", "ok"], False, False),
    (["WRONG", "ok"], True, True),      # a probe skips work on purpose
    (["ok", "WRONG"], True, False),     # the side it is held against must still be right
    (["error", "ok"], True, False),     # a kernel that did not run has no time
])
def test_only_a_probe_times_a_wrong_case(ab, verdicts, probe, timed):
    assert ab.timed(verdicts, probe) is timed


def test_a_label_names_the_variant_in_every_row(ab, monkeypatch):
    # Stand-ins for the GPU side: both sides built, the case verified WRONG (so the row is
    # written without timing, as for any wrong case), which is all a row's labelling needs.
    from perfscope import verify
    from perfscope.kernels import launch

    monkeypatch.setattr(launch, "prepare", lambda spec, dtype, shape: spec)
    monkeypatch.setattr(verify, "verify", lambda prep, seed: type("V", (), {"verdict": "WRONG"}))
    case = ab.parse_case("hgemm_tma_wgmma_balanced@4096x4096x4096/bf16")
    row = ab.run_case(case, case.spec, None, label="trim-ringtail")
    assert row["variant"] == "trim-ringtail" and row["verify"] == ["WRONG", "WRONG"]
    assert "speed_over_other" not in row
    assert "variant" not in ab.run_case(case, case.spec, None)
