"""benchmarks/reference_run.py without a GPU: a full run clears only what it regenerates and
its README names what other commands left in the folder."""

from __future__ import annotations

from conftest import benchmark_script, fresh_python


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


def test_large_holds_the_steps_that_act_only_at_large_shapes(tmp_path):
    """The stream-K stage splits only from 8 rounds of tiles (KernelSpec.min_rounds), so the
    run profiles it and its parent at 8192^3 into large/, where its step acts, with clocks as
    found; bench_h200.py times the two there into bench-8192.json."""
    from perfscope import profiling

    rr = _module()
    assert rr.large_stages() == ("hgemm_tma_wgmma_persistent", "hgemm_tma_wgmma_streamk")
    req = rr.large_request(tmp_path)
    assert req.stages == rr.large_stages() and req.shape == "8192x8192x8192"
    assert req.out == tmp_path / "large" and req.ncu.clock_control == "none"
    # Both dtypes of both stages: named stages given no dtype would run in their first only.
    plan = profiling.plan_jobs(req)
    assert sorted(j.stem for j in plan.jobs) == sorted(
        f"{s}-{d}-8192x8192x8192" for s in rr.large_stages() for d in ("fp16", "bf16"))
    assert not plan.refused
    bench_h200 = benchmark_script("bench_h200")
    assert bench_h200.LARGE_SHAPE == rr.LARGE_SHAPE
    assert set(rr.large_stages()) <= set(bench_h200.HOPPER)


def test_the_run_loads_the_report_reader_before_numpy():
    """The GPU machine reads reports with the Nsight Compute install's ncu_report, which
    crashes at its first metric unit when numpy's extension was loaded before it (the
    reference page's diagnosis died so on 2026-12-05): reference_run loads the reader before
    its benchmark modules bring numpy in (a fresh interpreter: the test process has both)."""
    code = ("import sys; sys.path.insert(0, 'benchmarks'); import reference_run; "
            "order = list(sys.modules); "
            "print(order.index('ncu_report') < order.index('numpy'))")
    assert fresh_python(code, timeout=120) == "True"
