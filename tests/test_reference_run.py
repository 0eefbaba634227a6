"""benchmarks/reference_run.py without a GPU: a full run clears only what it regenerates and
its README names what other commands left in the folder."""

from __future__ import annotations

from conftest import benchmark_script


def _module():
    return benchmark_script("reference_run")


def test_a_full_run_keeps_what_other_commands_wrote(tmp_path):
    rr = _module()
    for name in ("tune", "fused", "sources"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "x.txt").write_text("x")
    for name in ("calibration.json", "bench.json", "sgemm_naive-fp32-4096x4096x4096.ncu-rep.xz",
                 "index.html", "README.md"):
        (tmp_path / name).write_text("{}")
    rr.clear_generated(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calibration.json", "fused", "tune"]
    assert (tmp_path / "fused" / "x.txt").is_file()
    lines = rr.kept_lines(tmp_path)
    assert any(line.startswith("- `tune/`") for line in lines)
    assert any(line.startswith("- `fused/`") for line in lines)
    assert not any("programs/" in line for line in lines)


def test_a_full_run_starts_an_empty_folder(tmp_path):
    rr = _module()
    out = tmp_path / "new"
    rr.clear_generated(out)
    assert out.is_dir() and not any(out.iterdir()) and rr.kept_lines(out) == []
