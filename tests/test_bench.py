"""bench on the CPU: the verification checks, planning, manifests, and the CLI's refusals.

check_result only uses array functions that NumPy and CuPy share, so it is exercised here
with NumPy standing in for CuPy: the same code decides WRONG on the GPU.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from fakes.fake_cuda import DoneEvent
from typer.testing import CliRunner

from perfscope import bench, verify
from perfscope.cli import app
from perfscope.errors import PerfscopeError
from perfscope.kernels import Shape, get_spec
from perfscope.kernels.spec import parse_params
from perfscope.manifest import (
    OK,
    WRONG,
    BenchFile,
    CompileInfo,
    Environment,
    RunManifest,
    Spread,
    Timing,
    Verification,
)
from perfscope.render.console import bench_rows

runner = CliRunner()


def _gemm(shape: Shape, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((shape.m, shape.k)).astype(dtype)
    b = rng.standard_normal((shape.k, shape.n)).astype(dtype)
    c = (a.astype(np.float32) @ b.astype(np.float32)).astype(dtype)
    return a, b, c


@pytest.mark.parametrize("shape", [Shape(1, 1, 1), Shape(2, 3, 5), Shape(127, 129, 65),
                                   Shape(64, 256, 1024)])
def test_fp32_product_passes(shape):
    a, b, c = _gemm(shape)
    v = verify.check_result(np, a, b, c, "fp32")
    assert v.verdict == OK, v.detail
    assert v.rel_fro_error < 1e-6


def test_fp16_product_rounded_to_half_passes():
    a, b, c = _gemm(Shape(96, 80, 512), np.float16)
    v = verify.check_result(np, a, b, c, "fp16")
    assert v.verdict == OK, v.detail


def test_one_wrong_element_fails():
    a, b, c = _gemm(Shape(200, 300, 256))
    # A missed 16-wide slice of K for one output: the norm barely moves, the bound catches it.
    c[17, 42] -= a[17, :16] @ b[:16, 42]
    v = verify.check_result(np, a, b, c, "fp32")
    assert v.verdict == WRONG and v.bad_elements == 1
    assert "C[17][42]" in v.detail


def test_nan_never_passes():
    a, b, c = _gemm(Shape(8, 8, 8))
    c[3, 3] = np.nan
    v = verify.check_result(np, a, b, c, "fp32")
    assert v.verdict == WRONG and v.nan_elements == 1


def test_poison_left_in_place_fails():
    a, b, _ = _gemm(Shape(4, 4, 4))
    c = np.full((4, 4), np.nan, dtype=np.float32)
    assert verify.check_result(np, a, b, c, "fp32").verdict == WRONG


def test_tf32_like_error_fails_fp32():
    a, b, _ = _gemm(Shape(128, 128, 1024))
    # Operands rounded to 10 mantissa bits, as TF32 does: not an fp32 GEMM.
    def tf32(x):
        return (x.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)

    c = tf32(a) @ tf32(b)
    assert verify.check_result(np, a, b, c, "fp32").verdict == WRONG


def test_zero_output_fails():
    a, b, _ = _gemm(Shape(16, 16, 16))
    assert verify.check_result(np, a, b, np.zeros((16, 16), np.float32), "fp32").verdict == WRONG


def test_plan_named_stage_defaults_to_its_first_dtype():
    jobs = bench.plan(["hgemm_bcf"], [], Shape(128, 128, 64))
    assert [(j.spec.name, j.dtype) for j in jobs] == [("hgemm_bcf", "fp16")]


def test_plan_all_marks_refusals_instead_of_failing():
    jobs = bench.plan(["all"], ["fp16"], Shape(127, 129, 65))
    names = {j.spec.name: j.refusal for j in jobs}
    assert names["hgemm_naive"] is None and names["cublas_hgemm"] is None
    assert "multiple of 8" in names["hgemm_bcf"]
    assert all(j.dtype == "fp16" for j in jobs)


def test_plan_params_reach_the_stage():
    (job,) = bench.plan(["sgemm_pipe"], [], Shape(64, 64, 64), {"STAGES": 4})
    assert job.spec.param_dict["STAGES"] == 4
    assert "4>" in job.spec.name_expression("fp32")


@pytest.mark.parametrize("item", ["STAGES", "STAGES=x", "=4"])
def test_bad_param(item):
    with pytest.raises(PerfscopeError, match="NAME=INTEGER"):
        parse_params([item])


def _manifest(verdict=OK, timing=True) -> RunManifest:
    t = Timing(runs_per_round=20, rounds=3, warmup=3, l2_flush_bytes=1 << 29,
               time_ms=Spread(1.0, 1.1, 1.3), tflops=Spread(100, 120, 130),
               reference="cublas_sgemm", reference_time_ms=Spread(0.9, 1.0, 1.1),
               reference_tflops=Spread(120, 130, 140), ratio_to_reference=Spread(0.8, 0.9, 0.95),
               round_ratios=(0.8, 0.9, 0.95), sm_clock_mhz=Spread(1755, 1980, 1980))
    c = CompileInfo(arch="sm_90a", name_expression="sgemm_naive<float, 8, 32>",
                    mangled="_Z1x", source="sgemm.cu", source_hash="abc",
                    options=("-lineinfo",), resources={"registers": 40}, nvrtc="13.0",
                    block=(256, 1, 1), grid=(128, 512, 1))
    return RunManifest(stage="sgemm_naive", family="sgemm", dtype="fp32", m=4096, n=4096,
                       k=4096, params={"BM": 8, "BN": 32},
                       verification=Verification(verdict, 1e-7, 1e-5, 0.01, 0, 0),
                       timing=t if timing else None, compile=c)


def test_manifest_round_trip(tmp_path):
    env = Environment(gpu="NVIDIA H200", compute_capability="9.0", sm_count=132,
                      driver="580", cuda_driver="13.0", cuda_runtime="13.0", nvrtc="13.0",
                      cupy="14.2.0", cublas="130000", cuda_bindings="13.3.1",
                      ml_dtypes="0.6", python="3.12")
    path = tmp_path / "bench.json"
    BenchFile(manifests=(_manifest(),), environment=env).write(path)
    back = BenchFile.read(path)
    assert back.manifests[0] == _manifest() and back.environment == env
    assert json.loads(path.read_text())["version"] == 1


def test_wrong_run_cannot_carry_a_speed():
    with pytest.raises(ValueError):
        _manifest(verdict=WRONG)
    assert _manifest(verdict=WRONG, timing=False).timing is None


def test_summary_never_shows_speed_for_wrong():
    wrong = RunManifest(stage="x", family="sgemm", dtype="fp32", m=1, n=1, k=1, params={},
                        verification=Verification(WRONG, 0.5, 1e-5, 9.0, 1, 0, "bad"))
    (row,) = bench_rows(bench.summary([wrong]))
    assert row[3].startswith("WRONG") and row[5] == "-" and row[6] == "-"


def test_unknown_manifest_version_refused(tmp_path):
    path = tmp_path / "b.json"
    path.write_text(json.dumps({"kind": "perfscope.bench", "version": 99, "manifests": []}))
    with pytest.raises(PerfscopeError, match="version"):
        BenchFile.read(path)


# ---------------------------------------------------------------- CLI refusals


def _cli(*args):
    result = runner.invoke(app, ["bench", *args])
    return result.exit_code, result.output


@pytest.mark.parametrize(("args", "needle"), [
    (["sgemm_nope"], "valid stages are"),
    (["sgemm_naive", "--shape", "4096x4096"], "MxNxK"),
    (["sgemm_naive", "--shape", "big"], "MxNxK"),
    (["sgemm_naive", "--shape", "0x16x16"], "positive"),
    (["sgemm_naive", "--shape", "16x-3x16"], "positive"),
    (["hgemm_bcf", "--shape", "127x129x65"], "multiple of 8"),
    (["sgemm_float4", "--shape", "128x130x128"], "multiple of 4"),
    (["sgemm_naive", "--dtype", "bf16"], "takes fp32"),
    (["hgemm_bcf", "--dtype", "fp64"], "unknown dtype"),
    (["sgemm_pipe", "--param", "STAGEZ=3"], "no template parameter"),
    (["all", "sgemm_naive"], "cannot be combined"),
])
def test_bad_input_is_one_sentence(args, needle):
    code, out = _cli(*args)
    assert code == 2, out
    assert needle in out and "Traceback" not in out
    assert out.strip().count("\n") == 0


def test_no_gpu_is_one_sentence(monkeypatch):
    # A machine without CuPy is what CI is; pretend so here even where CuPy exists.
    monkeypatch.setitem(sys.modules, "cupy", None)
    code, out = _cli("sgemm_naive", "--shape", "64x64x64")
    assert code == 2 and "no GPU" in out and "Traceback" not in out


def test_tf32_env_refused(monkeypatch):
    monkeypatch.setenv("CUPY_TF32", "1")
    code, out = _cli("cublas_sgemm", "--shape", "64x64x64")
    assert code == 2 and "CUPY_TF32" in out


def test_summary_names_changed_parameters():
    m = RunManifest(stage="sgemm_pipe", family="sgemm", dtype="fp32", m=1, n=1, k=1,
                    params={**get_spec("sgemm_pipe").param_dict, "STAGES": 4},
                    verification=Verification(OK, 0.0, 1e-5, 0.0, 0, 0))
    assert bench_rows(bench.summary([m]))[0][0] == "sgemm_pipe [STAGES=4]"


def test_committed_h200_reference_is_consistent():
    """The committed bench.json reads back, is right everywhere, and every ratio is real."""
    from pathlib import Path

    path = Path(__file__).parent.parent / "reports" / "reference" / "h200" / "bench.json"
    ref = BenchFile.read(path)
    assert ref.environment is not None and "H200" in ref.environment.gpu
    assert ref.environment.driver and ref.environment.cupy and ref.environment.nvrtc
    assert all(m.verification.verdict == OK for m in ref.manifests)
    assert {(m.stage, m.dtype) for m in ref.manifests} >= {
        (s.name, d) for s in bench.all_specs() for d in s.dtypes}
    for m in ref.manifests:
        assert (m.m, m.n, m.k) == (4096, 4096, 4096)
        t = m.timing
        assert t is not None and t.runs_per_round >= 20 and t.rounds >= 3
        assert t.sm_clock_mhz is not None
        if m.family != "cublas":
            assert t.ratio_to_reference is not None and len(t.round_ratios) == t.rounds
    # No ladder stage is slower than its parent, except declared variants; every step was
    # timed head to head (the parent in the child's rounds).
    steps = bench.parent_steps(ref.manifests)
    assert steps and not [s for s in steps if s.regression]
    assert all(s.head_to_head for s in steps)
    # The stream-K stage is its parent at 4096^3 (3.9 rounds, no split): a tie, within
    # STEP_TIE of it whether or not its rounds all fall on one side.
    (tie,) = [s for s in steps if s.stage == "hgemm_tma_wgmma_streamk" and s.dtype == "bf16"]
    assert abs(tie.speedup - 1.0) < bench.STEP_TIE and not tie.regression
    # At 8192^3 (15.5 rounds) it splits the last round and is faster than its parent. The card
    # sits at its power cap there (1.1-1.98 GHz while timing) and each stage's rounds against
    # cuBLAS spread over 0.9-1.15, so two medians taken in separate rounds came out either way
    # (2026-12-04, 16:12: bf16 1.049 against 1.073). Head to head, in bench-8192.json itself
    # and in probes/streamk-8192.jsonl (benchmarks/kernel_ab.py --versus), it leads.
    large = BenchFile.read(path.with_name("bench-8192.json"))
    lead = [s for s in bench.parent_steps(large.manifests) if s.stage == "hgemm_tma_wgmma_streamk"]
    assert {s.dtype for s in lead} == {"bf16", "fp16"}
    assert all(s.head_to_head and s.speedup > 1.01 and not s.regression for s in lead), lead
    rows = [json.loads(line) for line in
            (path.parent / "probes" / "streamk-8192.jsonl").read_text().splitlines()]
    assert {r["dtype"] for r in rows} == {"bf16", "fp16"}
    for r in rows:
        assert r["stage"] == "hgemm_tma_wgmma_streamk" and r["shape"] == "8192x8192x8192"
        assert r["other"]["stage"] == "hgemm_tma_wgmma_persistent" and r["verify"] == ["ok", "ok"]
        # Faster by the median and in two rounds of three or more: a lead, not one round's luck
        # (the rounds spread over 0.96-1.14 at the power cap).
        assert r["speed_over_other"]["median"] > 1.01, r
        assert sum(x > 1.0 for x in r["round_ratios"]) >= 2 * len(r["round_ratios"]) / 3, r


def test_reference_bench_times_each_stage_at_its_declared_depth_as_a_step():
    """bench_h200 runs sgemm_pipe and hgemm_tma_wgmma at several ring depths: the declared
    depth is the stage itself (timed head to head with its parent, and the parent of the next
    step), the others are not. A Job rebuilt without `declared` had dropped four steps' head
    to head from the reference bench."""
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
    import bench_h200

    jobs = bench_h200.jobs_for(bench_h200.parse_shape("4096x4096x4096"))
    swept = [j for j in jobs if j.spec.name in bench_h200.DEPTHS and j.refusal is None]
    assert swept
    for j in swept:
        at_default = j.spec.param_dict == bench_h200.get_spec(j.spec.name).param_dict
        assert j.declared == at_default, (j.spec.name, j.dtype, j.spec.param_dict)
    declared = [(j.spec.name, j.dtype) for j in jobs if j.declared]
    assert len(declared) == len(set(declared))
    assert {("sgemm_pipe", "fp32"), ("hgemm_tma_wgmma", "bf16")} <= set(declared)


def test_a_slower_stage_is_a_regression_only_beyond_the_rounds_spread():
    assert bench.ParentStep("child", "bf16", "parent", 0.998, False, apart=False).regression is False
    assert bench.ParentStep("child", "bf16", "parent", 0.99, False, apart=True).regression is True
    # Within STEP_TIE of the parent it is a tie, even with every round on one side.
    assert bench.ParentStep("child", "bf16", "parent", 0.998, False, apart=True).regression is False
    assert bench.ParentStep("child", "bf16", "parent", 0.90, True, apart=True).regression is False


# ------------------------------------------------- --json prints, --out writes (issue 16)


# ------------------------------------------- a ladder step timed head to head (this tree)


def _with_parent_rounds(m: RunManifest, parent: str, ratios: tuple[float, ...]) -> RunManifest:
    import dataclasses
    return dataclasses.replace(m, timing=dataclasses.replace(
        m.timing, parent=parent, ratio_to_parent=Spread.of(list(ratios)),
        parent_round_ratios=ratios))


def test_a_step_timed_head_to_head_is_read_from_its_own_rounds():
    """The 8192^3 case bench's medians got wrong (bench-8192.json, 2026-12-04): stream-K's
    median TFLOP/s was 0.978 of the persistent stage's from separate rounds, where the two
    timed against each other (probes/streamk-8192.jsonl) gave 1.02. A head-to-head record
    wins over the medians; without one the medians still decide."""
    import dataclasses
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "reports" / "reference" / "h200" / "bench-8192.json"
    # The committed file's steps are head to head: without their rounds, the medians decide.
    large = [dataclasses.replace(m, timing=dataclasses.replace(
                 m.timing, parent=None, ratio_to_parent=None, parent_round_ratios=()))
             for m in BenchFile.read(path).manifests if m.dtype == "bf16"]
    (medians,) = [s for s in bench.parent_steps(large) if s.stage == "hgemm_tma_wgmma_streamk"]
    by_stage = {m.stage: m.timing.tflops.median for m in large}
    assert not medians.head_to_head and medians.speedup == \
        by_stage["hgemm_tma_wgmma_streamk"] / by_stage["hgemm_tma_wgmma_persistent"]
    h2h = [_with_parent_rounds(m, "hgemm_tma_wgmma_persistent", (1.03, 0.99, 1.02))
           if m.stage == "hgemm_tma_wgmma_streamk" else m for m in large]
    (step,) = [s for s in bench.parent_steps(h2h) if s.stage == "hgemm_tma_wgmma_streamk"]
    assert step.head_to_head and step.speedup == 1.02 and not step.apart and not step.regression
    # A record of rounds against another stage (not the parent) is not a step's.
    other = [_with_parent_rounds(m, "hgemm_tma_wgmma_ws", (1.03, 1.04, 1.02))
             if m.stage == "hgemm_tma_wgmma_streamk" else m for m in large]
    (step,) = [s for s in bench.parent_steps(other) if s.stage == "hgemm_tma_wgmma_streamk"]
    assert not step.head_to_head and step.speedup == medians.speedup
    # Every round on one side of 1: beyond the spread, so a slower one is a regression.
    slow = [_with_parent_rounds(m, "hgemm_tma_wgmma_persistent", (0.97, 0.98, 0.96))
            if m.stage == "hgemm_tma_wgmma_streamk" else m for m in large]
    (step,) = [s for s in bench.parent_steps(slow) if s.stage == "hgemm_tma_wgmma_streamk"]
    assert step.apart and step.regression and step.speedup == 0.97


def test_head_to_head_rounds_read_back_and_old_files_have_none():
    m = _with_parent_rounds(_manifest(), "sgemm_naive", (1.1, 1.2, 1.15))
    (row,) = bench_rows(bench.summary([m]))
    assert "1.15 (1.10-1.20) sgemm_naive" in row
    assert bench_rows(bench.summary([_manifest()]))[0][7] == "-"
    assert RunManifest.from_dict(m.to_dict()) == m
    assert m.timing.step_ratio("sgemm_naive") == Spread(1.1, 1.15, 1.2)
    assert m.timing.step_ratio("sgemm_other") is None
    data = _manifest().to_dict()
    for key in ("parent", "ratio_to_parent", "parent_round_ratios"):
        del data["timing"][key]
    assert RunManifest.from_dict(data).timing.step_ratio("sgemm_naive") is None


class _FakePrep:
    def __init__(self, name: str, ms: float, epilogue=None):
        from types import SimpleNamespace
        self.spec = SimpleNamespace(name=name)
        self.shape = Shape(1024, 1024, 1024)
        self.epilogue, self.ms = epilogue, ms


def _fake_timer(calls: list):
    from perfscope import timing

    class Timer:
        def __init__(self, cp, prep, opts):
            self.opts = opts

        def warm(self, prep):
            pass

        def batch(self, prep):
            calls.append(prep.spec.name)
            ms = prep.next_ms() if hasattr(prep, "next_ms") else prep.ms   # _ScriptedPrep
            return timing._Batch(tuple([ms] * self.opts.runs), (1980.0,))
    return Timer


def test_time_stage_times_the_parent_in_the_same_rounds(monkeypatch):
    """Stage, reference and parent in every round, each round in another order; one ratio
    per round against each (the other's time over the stage's)."""
    from perfscope import timing
    calls: list[str] = []
    monkeypatch.setattr(timing, "require_gpu", lambda: None)
    monkeypatch.setattr(timing, "_Timer", _fake_timer(calls))
    opts = timing.BenchOptions(runs=2, rounds=3)
    t = timing.time_stage(_FakePrep("child", 2.0), _FakePrep("cublas", 1.0), opts,
                          parent=_FakePrep("parent", 3.0))
    assert calls == ["child", "cublas", "parent", "child", "parent", "cublas",
                     "parent", "child", "cublas"]
    # Six rounds run every order once.
    calls.clear()
    timing.time_stage(_FakePrep("child", 2.0), _FakePrep("cublas", 1.0),
                      timing.BenchOptions(runs=1, rounds=6), parent=_FakePrep("parent", 3.0))
    orders = {tuple(calls[i:i + 3]) for i in range(0, 18, 3)}
    assert len(orders) == 6
    assert t.parent == "parent" and t.parent_round_ratios == (1.5, 1.5, 1.5)
    assert t.round_ratios == (0.5, 0.5, 0.5) and t.reference == "cublas"
    assert t.time_ms == Spread(2.0, 2.0, 2.0)
    # Without a parent the rounds alternate the two as before, and record no step.
    calls.clear()
    t = timing.time_stage(_FakePrep("child", 2.0), _FakePrep("cublas", 1.0), opts)
    assert calls == ["child", "cublas", "cublas", "child", "child", "cublas"]
    assert t.parent is None and t.ratio_to_parent is None and t.parent_round_ratios == ()
    # A parent of another epilogue cannot be timed against the stage: one sentence.
    with pytest.raises(PerfscopeError, match="child and parent compute different epilogues"):
        timing.time_stage(_FakePrep("child", 2.0), None, opts,
                          parent=_FakePrep("parent", 3.0, epilogue="gelu"))


def test_the_timer_packs_each_sides_weight_once_outside_the_timed_launches():
    """bench's timer hands each side B as that side takes it (Prepared.weight): made once,
    in the warm-up, per side, so a packed stage gets its strips and its parent or reference
    the row-major B in the same rounds, and no timed batch packs anything."""
    from types import SimpleNamespace

    from perfscope import timing

    Event = DoneEvent

    stream = SimpleNamespace(synchronize=lambda: None)
    cp = SimpleNamespace(cuda=SimpleNamespace(Event=Event, get_elapsed_time=lambda s, e: 1.0,
                                              get_current_stream=lambda: stream))

    class Prep:
        def __init__(self, packs: bool):
            self.packs, self.packed, self.got = packs, 0, []

        def weight(self, b):
            self.packed += 1
            return ("strips", b) if self.packs else b

        def launch(self, a, b, c, extra):
            self.got.append(b)

    timer = object.__new__(timing._Timer)
    timer.cp, timer.opts = cp, timing.BenchOptions(runs=2, warmup=1)
    timer.a, timer.b, timer.c, timer.extra = "A", "B", "C", None
    timer.flush, timer.clock, timer.weights = (lambda: None), SimpleNamespace(sm_mhz=lambda: None), {}
    packed, plain = Prep(True), Prep(False)
    for p in (packed, plain):
        timer.warm(p)
    for _ in range(2):
        for p in (packed, plain):
            assert timer.batch(p).times_ms == (1.0, 1.0)
    assert packed.packed == plain.packed == 1
    assert packed.got == [("strips", "B")] * 5 and plain.got == ["B"] * 5


def test_old_json_file_form_is_pointed_to_out():
    code, out = _cli("sgemm_naive", "--json", "bench.json")
    assert code == 2 and out.count("\n") == 1
    assert "bench.json is not a stage: write the bench file with --out bench.json" in out


def test_json_output_reads_back_as_a_bench_file(tmp_path):
    from pathlib import Path

    from perfscope.render import render

    reference = Path(__file__).resolve().parents[1] / "reports" / "reference" / "h200" / "bench.json"
    manifests = BenchFile.read(reference).manifests
    printed = render(bench.summary(manifests), "json")
    path = tmp_path / "printed.json"
    path.write_text(printed)
    again = BenchFile.read(path)
    assert again.manifests == manifests


def test_help_names_out_and_json():
    result = runner.invoke(app, ["bench", "--help"], env={"COLUMNS": "200"})
    assert "--out" in result.output and "Print the bench file as JSON" in result.output


def test_l2_flush_mode_is_checked_and_recorded():
    from perfscope.timing import BenchOptions
    assert BenchOptions().l2_flush == "read"
    with pytest.raises(PerfscopeError, match="the L2 flush is one of read, write, not 'clean'"):
        BenchOptions(l2_flush="clean")


def test_timing_written_before_the_flush_mode_reads_as_a_write_flush(tmp_path):
    """Files from before the read flush (2026-12-01) have no l2_flush: all flushed by writing."""
    m = _manifest()
    data = m.to_dict()
    del data["timing"]["l2_flush"]
    assert RunManifest.from_dict(data).timing.l2_flush == "write"
    assert RunManifest.from_dict(m.to_dict()).timing == m.timing


def test_a_record_without_a_later_parameter_is_at_the_defaults():
    from perfscope.stage import at_defaults

    defaults = get_spec("hgemm_tma_wgmma_persistent").param_dict
    assert defaults["DEFER"] == 0
    # A report of the persistent stage recorded before DEFER existed is its default run.
    before = {k: v for k, v in defaults.items() if k != "DEFER"}
    assert at_defaults(before, defaults) and at_defaults(defaults, defaults)
    assert not at_defaults({**defaults, "DEFER": 1}, defaults)
    assert not at_defaults({**before, "STAGES": 4}, defaults)
    assert not at_defaults({**defaults, "SPLITK": 2}, defaults)   # not the stage's parameter


def test_plan_refuses_params_beyond_the_limits_before_launching():
    # 8 stages of 128x256x64 fp16 tiles need 786 KB of shared memory: the limit, in one
    # sentence, not the driver's CUDA_ERROR_INVALID_VALUE after compiling.
    with pytest.raises(PerfscopeError, match=r"hgemm_tma_wgmma_persistent with STAGES=8 "
                       r"\(fp16\) cannot launch: \d+ bytes of shared memory exceed"):
        bench.plan(["hgemm_tma_wgmma_persistent"], ["fp16"], Shape(4096, 4096, 4096),
                   {"STAGES": 8})
    jobs = bench.plan(["all"], ["fp16"], Shape(4096, 4096, 4096), {"STAGES": 8})
    by_name = {j.spec.name: j.refusal for j in jobs}
    assert "cannot launch" in by_name["hgemm_tma_wgmma_persistent"]
    assert by_name["cublas_hgemm"] is None


def test_plan_keeps_params_within_the_limits():
    (job,) = bench.plan(["hgemm_tma_wgmma_persistent"], ["fp16"], Shape(4096, 4096, 4096),
                        {"STAGES": 3})
    assert job.refusal is None and job.spec.param_dict["STAGES"] == 3


# ------------------------- hgemm_small_m's host-chosen tile is the stage as declared


def test_the_host_chosen_tile_is_the_stage_as_declared():
    """bench_fused.py times hgemm_small_m_packed head to head with hgemm_small_m: both take
    the tile the host chooses for the shape (BN 64, AROWS 16 at 16 x 8192^2, not the
    declared BN 128, AROWS 64), and that is each stage as `perfscope bench STAGE` runs it.
    A --param that moves the tile is not; one that pins the host's own value still is."""
    shape = Shape(16, 8192, 8192)
    jobs = bench.plan(["hgemm_small_m", "hgemm_small_m_packed"], ["bf16"], shape)
    assert [j.declared for j in jobs] == [True, True]
    assert jobs[0].spec.param_dict["BN"] != get_spec("hgemm_small_m").param_dict["BN"]
    (moved,) = bench.plan(["hgemm_small_m_packed"], ["bf16"], shape, {"STAGES": 12})
    (same,) = bench.plan(["hgemm_small_m_packed"], ["bf16"], shape, {"STAGES": 8})
    assert not moved.declared and same.declared
    # Any other stage: its declared defaults, as before.
    (pipe,) = bench.plan(["sgemm_pipe"], ["fp32"], Shape(4096, 4096, 4096))
    (tuned,) = bench.plan(["sgemm_pipe"], ["fp32"], Shape(4096, 4096, 4096), {"STAGES": 2})
    assert pipe.declared and not tuned.declared


def test_a_small_m_step_at_the_host_tile_is_a_ladder_step():
    """parent_steps reads hgemm_small_m -> hgemm_small_m_packed at the host's tile from the
    child's own rounds, as it reads the 4096^3 ladder (both manifests at the host's choice)."""
    import dataclasses
    from pathlib import Path

    from perfscope.kernels.fused_specs import small_m_for

    shape = Shape(16, 8192, 8192)
    path = Path(__file__).resolve().parents[1] / "reports" / "reference" / "h200" / "bench.json"
    base = BenchFile.read(path).manifests[0]

    def timed(stage: str, parent: str | None) -> RunManifest:
        params = small_m_for(get_spec(stage), shape).param_dict
        timing = dataclasses.replace(base.timing, parent=parent,
                                     ratio_to_parent=Spread.of([1.03, 1.04, 1.05]) if parent else None,
                                     parent_round_ratios=(1.03, 1.04, 1.05) if parent else ())
        return dataclasses.replace(base, stage=stage, family="fused", dtype="bf16", m=16, n=8192,
                                   k=8192, params=params, parent=parent, timing=timing)

    (step,) = bench.parent_steps([timed("hgemm_small_m", None),
                                  timed("hgemm_small_m_packed", "hgemm_small_m")])
    assert step.head_to_head and step.speedup == pytest.approx(1.04) and not step.regression


# ------------------------------------------ bench --until: rounds until the ratios settle


def test_the_median_interval_is_distribution_free():
    from perfscope.timing import median_interval

    assert median_interval([1.0, 2.0, 3.0, 4.0]) is None            # 4 rounds: 0.875 at best
    assert median_interval([3.0, 1.0, 2.0, 5.0, 4.0]) == (1.0, 5.0)  # 5: [min, max], 0.94
    assert median_interval([8, 1, 7, 2, 6, 3, 5, 4]) == (2, 7)       # 8: 2nd to 7th, 0.93


class _ScriptedPrep(_FakePrep):
    """A side whose batches take the scripted times in turn (the last one repeated)."""

    def __init__(self, name: str, script: list[float]):
        super().__init__(name, script[0])
        self.script = list(script)

    def next_ms(self) -> float:
        return self.script.pop(0) if len(self.script) > 1 else self.script[0]


def test_until_adds_rounds_until_the_ratio_settles(monkeypatch):
    """Reference rounds of 1.0, 1.1, 0.9 ms against a steady 2 ms stage, then steady: the
    ratio's interval is +-10% through seven rounds (five to seven give only [min, max]), and
    at eight the 2nd-to-7th interval is the median itself. --until 0.01 stops there; a
    --max-rounds of 6 stops first; without --until bench runs --rounds."""
    from perfscope import timing

    monkeypatch.setattr(timing, "require_gpu", lambda: None)
    monkeypatch.setattr(timing, "_Timer", _fake_timer([]))

    def run(**kw):
        ref = _ScriptedPrep("cublas", [1.0, 1.1, 0.9, 1.0])
        return timing.time_stage(_FakePrep("child", 2.0), ref,
                                 timing.BenchOptions(runs=2, rounds=3, **kw))

    t = run(until=0.01, max_rounds=9)
    assert t.rounds == 8 and len(t.round_ratios) == 8
    assert (t.until, t.max_rounds) == (0.01, 9)
    assert run(until=0.01, max_rounds=6).rounds == 6
    fixed = run()
    assert fixed.rounds == 3 and fixed.until is None and fixed.max_rounds is None
    # Steady from the start: settled as soon as five rounds can say so.
    steady = timing.time_stage(_FakePrep("child", 2.0), _FakePrep("cublas", 1.0),
                               timing.BenchOptions(runs=1, rounds=3, until=0.01))
    assert steady.rounds == 5
    # No reference and no parent: no ratio to settle, --rounds it is.
    alone = timing.time_stage(_FakePrep("child", 2.0), None,
                              timing.BenchOptions(runs=1, rounds=3, until=0.01))
    assert alone.rounds == 3


@pytest.mark.parametrize(("argv", "words"), [
    (["--until", "0"], "--until is a fraction of the ratio between 0 and 0.5"),
    (["--until", "0.7"], "--until is a fraction of the ratio between 0 and 0.5"),
    (["--until", "0.01", "--rounds", "5", "--max-rounds", "4"], "--max-rounds (4) is below --rounds (5)"),
])
def test_until_refuses_what_cannot_stop_in_one_sentence(argv, words):
    result = CliRunner().invoke(app, ["bench", "sgemm_naive", *argv])
    assert result.exit_code == 2, result.output
    assert words in result.output and "Traceback" not in result.output
