"""Any program's kernels (issue 15, issue 16 items 4-5) on the CPU, with the fake ncu.

`perfscope profile [filters] -- COMMAND`: every new flag's exact argv, the default report
name that never overwrites, the program manifest (shape and dtype from the flags or an
NVTX range's name), a faulting kernel kept but marked not trustworthy, Ctrl-C keeping what
was profiled; launch selection (FILE:REGEX@N, FILE#ID) on real multi-launch captures;
`diff A cublas` profiling a missing reference beside A; and every failure as one sentence
with exit code 2.
"""

from __future__ import annotations

import importlib.util
import json
import lzma
import shutil
import sys
import types
from datetime import datetime
from pathlib import Path

import pytest
from conftest import report
from test_ncu import make_fake
from typer.testing import CliRunner

from perfscope import cli, diagnosis, environment, ncu, profiling
from perfscope.errors import PerfscopeError
from perfscope.kernels import get_spec
from perfscope.kernels.launch import LtMatmul, Prepared
from perfscope.manifest import PROGRAM, UNVERIFIED, read_manifest
from perfscope.runner import stem_for

runner = CliRunner()
MLP = report("torch_mlp")            # 6 launches of one nvjet kernel (examples/torch_matmul.py)
MANY = report("many_launches")       # 4 kernels x 6 sizes, interleaved


def plain(name: str, dest: Path) -> Path:
    with lzma.open(report(name)) as src, open(dest, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return dest


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A fake ncu whose program captures are a real 2-launch report, stage captures a real
    1-launch cuBLAS BF16 report; the working directory is a fresh folder."""
    monkeypatch.setenv("FAKE_NCU_REPORT", str(plain("spill", tmp_path / "two.ncu-rep")))
    monkeypatch.setenv("FAKE_NCU_STAGE_REPORT", str(plain("cublas_bgemm_4096", tmp_path / "one.ncu-rep")))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    # The fake gets no terminal Ctrl-C of its own: stop it without waiting for one.
    monkeypatch.setattr(ncu, "STOP_SELF_S", 0.1)

    def use(scenario="ok"):
        exe, log = make_fake(tmp_path, scenario)
        monkeypatch.setenv("PERFSCOPE_NCU", exe)
        return log
    return use


def calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def profile_call(log: Path) -> list[str]:
    return next(c for c in calls(log) if "--export" in c and "--import" not in c)


def main(*args: str) -> int:
    """Run the real entry point (it turns `-- COMMAND` into the hidden --program)."""
    with pytest.raises(SystemExit) as stop:
        cli.main(list(args))
    return stop.value.code or 0


def assert_one_sentence(result, *fragments: str) -> None:
    assert result.exit_code == 2, result.output
    text = result.output.strip()
    assert "Traceback" not in text and len(text.splitlines()) == 1, text
    assert text.startswith("perfscope: ")
    for f in fragments:
        assert f in text, text


# ------------------------------------------------------------------ every flag's argv


def test_every_program_flag_reaches_ncu_exactly(fake, tmp_path, capsys):
    log = fake("ok")
    target = tmp_path / "mm.ncu-rep"
    code = main("profile", "--kernel", "matmul_kernel|nvjet", "--launch-skip", "2", "--launch-count",
                "1", "--nvtx", "step/", "--nvtx", "warm@iter/", "--replay", "application",
                "--ncu-arg=--print-summary=none", "--ncu-arg", "--target-processes-filter=python3",
                "--out", str(target), "--", "python3", "mm.py", "--iters", "3")
    assert code == 0, capsys.readouterr()
    call = profile_call(log)       # the fake logs its arguments, not its own path
    expected = ncu.build_argv("ncu", ncu.NcuOptions(
        output=target.with_name("mm.part.ncu-rep"), kernel_regex="matmul_kernel|nvjet",
        launch_skip=2, launch_count=1, nvtx_include=("step/", "warm@iter/"),
        replay_mode="application",
        extra=("--print-summary=none", "--target-processes-filter=python3")),
        ["python3", "mm.py", "--iters", "3"])
    assert call == expected[1:]
    # The filters as ncu users know them, in order.
    assert call[call.index("--kernel-name") + 1] == "regex:matmul_kernel|nvjet"
    assert call[call.index("--launch-skip") + 1] == "2" and call[call.index("--launch-count") + 1] == "1"
    assert call[call.index("--replay-mode") + 1] == "application"
    assert call[call.index("--clock-control") + 1] == "none"
    assert call[-6:] == ["--print-summary=none", "--target-processes-filter=python3",
                         "python3", "mm.py", "--iters", "3"]
    assert target.exists()


def test_replay_range_and_nvtx_argv():
    opts = ncu.NcuOptions(output=Path("r.ncu-rep"), replay_mode="range", nvtx_include=("gemm/",),
                          sections=(), metrics=())
    assert ncu.build_argv("ncu", opts, ["./app"]) == [
        "ncu", "--target-processes", "all", "--replay-mode", "range", "--cache-control", "all",
        "--clock-control", "none", "--import-source", "yes", "--nvtx", "--nvtx-include", "gemm/",
        "--force-overwrite", "--export", "r.ncu-rep", "./app"]


@pytest.mark.parametrize("arg", ["-o", "--export=x", "--force-overwrite", "-f", "--import"])
def test_passthrough_cannot_take_the_report_away(arg):
    with pytest.raises(PerfscopeError, match="perfscope's to set"):
        ncu.NcuOptions(output=Path("r"), extra=(arg,))


def test_program_flags_without_a_program_are_refused(fake):
    fake("ok")
    result = runner.invoke(cli.app, ["profile", "sgemm_naive", "--launch-skip", "2"])
    assert_one_sentence(result, "put the program after --")


def test_stage_flags_with_a_program_are_refused(fake):
    fake("ok")
    result = runner.invoke(cli.app, ["profile", "--resume", "--program", json.dumps(["python3", "x.py"])])
    assert_one_sentence(result, "for ladder stages")


# ------------------------------------------------------------------ names and manifests


def test_default_name_never_overwrites(fake, tmp_path):
    fake("ok")
    assert main("profile", "--", "python3", "examples/triton_matmul.py") == 0
    assert main("profile", "--", "python3", "examples/triton_matmul.py") == 0
    written = sorted(Path("reports/local/programs").glob("*.ncu-rep"))
    assert len(written) == 2 and all(p.name.startswith("triton_matmul-") for p in written)
    assert all(p.with_suffix(".json").exists() for p in written)
    # Within one second the second capture takes a counter.
    now = datetime(2026, 12, 1, 10, 0, 0)
    first = profiling.default_output(["python3", "-m", "pkg.train"], now, tmp_path)
    assert first.name == "train-20261201-100000.ncu-rep"
    first.write_text("x")
    assert profiling.default_output(["python3", "-m", "pkg.train"], now, tmp_path).name == \
        "train-20261201-100000-2.ncu-rep"
    assert profiling.command_stem(["./my app"]) == "my_app"


def test_an_explicit_out_that_exists_is_refused(fake, tmp_path):
    fake("ok")
    taken = tmp_path / "taken.ncu-rep"
    taken.write_text("an earlier capture")
    result = runner.invoke(cli.app, ["profile", "--out", str(taken), "--program",
                                     json.dumps(["python3", "x.py"])])
    assert_one_sentence(result, "exists", "never overwrites")
    assert taken.read_text() == "an earlier capture"


def test_shape_and_dtype_make_a_program_manifest(fake, tmp_path):
    fake("ok")
    target = tmp_path / "mm.ncu-rep"
    assert main("profile", "--kernel", "ps_", "--launch-skip", "1", "--shape", "4096x4096x4096",
                "--dtype", "bfloat16", "--out", str(target), "--", "python3", "mm.py") == 0
    m = read_manifest(target.with_suffix(".json"))
    assert (m.stage, m.family, m.dtype, m.shape) == (PROGRAM, PROGRAM, "bf16", "4096x4096x4096")
    assert m.verification.verdict == UNVERIFIED and m.timing is None
    assert m.capture is not None and m.capture.command == ("python3", "mm.py")
    assert (m.capture.kernel_regex, m.capture.launch_skip, m.capture.launches) == ("ps_", 1, 2)
    assert m.capture.fault is None and m.capture.untrusted_launches == ()
    assert m.clock_control == "none"
    # The loader reads it: cublas can now be resolved for any launch of the capture.
    rec = diagnosis.resolve(f"{target}:ps_@1")
    assert rec.manifest is not None and rec.shape == (4096, 4096, 4096)


def test_an_nvtx_range_name_gives_the_shape(fake, tmp_path):
    fake("ok")
    target = tmp_path / "r.ncu-rep"
    assert main("profile", "--nvtx", "gemm-fp16-1024x2048x512/", "--out", str(target), "--",
                "./app") == 0
    m = read_manifest(target.with_suffix(".json"))
    assert (m.dtype, m.shape) == ("fp16", "1024x2048x512")
    assert profiling.shape_from_ranges(["dom@step-bf16-8x16x32/"])[0] == "bf16"
    assert profiling.shape_from_ranges(["step/"]) is None


def test_without_a_shape_the_manifest_says_unknown(fake, tmp_path):
    fake("ok")
    target = tmp_path / "r.ncu-rep"
    assert main("profile", "--out", str(target), "--", "./app") == 0
    m = read_manifest(target.with_suffix(".json"))
    assert not m.shape_known and m.dtype == ""
    assert diagnosis.resolve(f"{target}#0").shape is None


def test_half_a_shape_is_refused(fake):
    fake("ok")
    result = runner.invoke(cli.app, ["profile", "--shape", "8x8x8", "--program",
                                     json.dumps(["./app"])])
    assert_one_sentence(result, "both --shape")


# ------------------------------------------------------------------ faults and Ctrl-C


def test_a_faulting_kernel_is_named_kept_and_not_trusted(fake, tmp_path, capsys):
    fake("fault")
    target = tmp_path / "f.ncu-rep"
    assert main("profile", "--shape", "64x64x64", "--dtype", "fp32", "--out", str(target), "--",
                "./app") == 1
    err = capsys.readouterr().err
    assert "bad_kernel" in err and "CUDA_ERROR_ILLEGAL_ADDRESS" in err and "#1" in err
    assert "not trustworthy" in err and "Traceback" not in err
    assert target.exists()
    cap = read_manifest(target.with_suffix(".json")).capture
    assert cap is not None and cap.untrusted_launches == (1,)
    assert "bad_kernel" in cap.fault and cap.trusts(0) and not cap.trusts(1)


class _CtrlC:
    """A progress bar whose user presses Ctrl-C once the first kernel is profiled."""

    def __init__(self, total=None):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, event):
        if event.done:
            raise KeyboardInterrupt


def test_ctrl_c_keeps_the_stages_already_profiled_and_resume_skips_them(fake, tmp_path, monkeypatch):
    stages = ["sgemm_naive", "sgemm_smem"]
    out = tmp_path / "o"
    fake("interrupt")
    profiling_bar = cli.NcuProgress
    monkeypatch.setattr(cli, "NcuProgress", _CtrlC)
    result = runner.invoke(cli.app, ["profile", *stages, "--shape", "64x64x64", "--out", str(out)])
    assert result.exit_code == 130, result.output
    first, second = (stem_for(s, "fp32", "64x64x64") for s in stages)
    assert (out / f"{first}.ncu-rep").exists() and (out / f"{first}.json").exists()
    assert not (out / f"{second}.ncu-rep").exists()
    assert "kept 1 of 2" in result.output and "--resume" in result.output
    assert not list(out.glob(".staging-*")) and not list(out.rglob("*.interrupted.*"))

    monkeypatch.setattr(cli, "NcuProgress", profiling_bar)
    log = fake("ok")
    log.write_text("")
    again = runner.invoke(cli.app, ["profile", *stages, "--shape", "64x64x64", "--out", str(out),
                                    "--resume"])
    assert again.exit_code == 0, again.output
    run = next(c for c in calls(log) if "--nvtx" in c)
    assert run.count("--nvtx-include") == 1 and f"{second}/" in run


def test_ctrl_c_during_a_program_keeps_its_launches(fake, tmp_path, monkeypatch):
    fake("interrupt")
    monkeypatch.setattr(cli, "NcuProgress", _CtrlC)
    target = tmp_path / "p.ncu-rep"
    result = runner.invoke(cli.app, ["profile", "--out", str(target), "--program",
                                     json.dumps(["./app"])])
    assert result.exit_code == 130
    assert "kept the 2 launch(es)" in result.output and target.exists()


# ------------------------------------------------------------------ launch selection


def test_launch_selection_on_the_torch_mlp_capture():
    ids = [diagnosis.resolve(f"{MLP}:nvjet@{n}").profile.identity.launch_index for n in range(6)]
    assert ids == list(range(6))
    by_id = diagnosis.resolve(f"{MLP}#4")
    assert by_id.profile.identity.launch_index == 4 and by_id.profile.name.startswith("nvjet_sm90")
    # The same kernel, two launches: told apart by @N, and cycles differ between them.
    a, b = diagnosis.resolve(f"{MLP}:nvjet@0"), diagnosis.resolve(f"{MLP}:nvjet@1")
    assert a.profile.name == b.profile.name and a.profile.identity.cycles != b.profile.identity.cycles


def test_launch_selection_counts_matches_of_the_regex_on_many_launches():
    third_float4 = diagnosis.resolve(f"{MANY}:float4@2")
    assert third_float4.profile.name == "ps_float4_copy"
    assert third_float4.profile.identity.launch_index == 9
    assert diagnosis.resolve(f"{MANY}:.@23").profile.identity.launch_index == 23
    assert diagnosis.resolve(f"{MANY}#7").profile.name == "ps_regs_capped"


def test_two_launches_of_one_kernel_diff_by_index():
    result = runner.invoke(cli.app, ["diff", f"{MLP}:nvjet@0", f"{MLP}:nvjet@1"])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(("arg", "fragments"), [
    (f"{MLP}:nvjet@6", ("@6 is out of range", "0 to 5")),
    (f"{MLP}#9", ("no launch #9",)),
    (f"{MLP}:nvjet", ("matches 6 kernel launches", "@N")),
])
def test_bad_launch_selection_is_one_sentence(arg, fragments):
    assert_one_sentence(runner.invoke(cli.app, ["diff", arg, f"{MLP}:nvjet@0"]), *fragments)


# ------------------------------------------------------------------ references on demand


def program_capture(folder: Path, shape: str | None = "4096x4096x4096", dtype: str | None = "bf16") -> Path:
    """The torch MLP capture as `perfscope profile --shape ... --dtype ... -- ...` leaves it."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / "torch_matmul-20261201-100000.ncu-rep.xz"
    shutil.copyfile(MLP, target)
    req = profiling.ProgramRequest(command=("python3", "examples/torch_matmul.py"), shape=shape,
                                   dtype=dtype, ncu=ncu.NcuOptions(kernel_regex="nvjet"))
    manifest = profiling._program_manifest(req, profiling.program_shape(req), 6, None, ())
    profiling._write_manifest(manifest, target)
    return target


@pytest.fixture
def gpu_here(monkeypatch):
    """The profiler side believes it has an H200 (the fake ncu does the rest)."""
    monkeypatch.setattr(profiling, "driver_device_count", lambda: 1)
    monkeypatch.setattr(profiling, "_gpu_name", lambda: "NVIDIA H200")


def test_diff_cublas_profiles_the_missing_reference_beside_a(fake, tmp_path, gpu_here):
    log = fake("ok")
    a = program_capture(tmp_path / "prog")
    result = runner.invoke(cli.app, ["diff", f"{a}:nvjet@2", "cublas"])
    assert result.exit_code == 0, result.output
    stem = stem_for("cublas_bgemm", "bf16", "4096x4096x4096")
    made = tmp_path / "prog" / f"{stem}.ncu-rep"
    assert made.exists() and (tmp_path / "prog" / f"{stem}.json").exists()
    run = next(c for c in calls(log) if "--nvtx" in c)
    assert run[run.index("--clock-control") + 1] == "none" and run.count("--nvtx-include") == 1
    assert f"{stem}/" in run and "perfscope.runner" in run
    # The second time it is found beside A, and nothing is profiled.
    log.write_text("")
    assert runner.invoke(cli.app, ["diff", f"{a}:nvjet@3", "cublas"]).exit_code == 0
    assert not [c for c in calls(log) if "--export" in c and "--import" not in c]


def test_diff_cublaslt_profiles_the_cublaslt_stage(fake, tmp_path, gpu_here):
    log = fake("ok")
    a = program_capture(tmp_path / "prog")
    result = runner.invoke(cli.app, ["diff", f"{a}#1", "cublaslt"])
    assert result.exit_code == 0, result.output
    stem = stem_for("cublaslt_bgemm", "bf16", "4096x4096x4096")
    assert (tmp_path / "prog" / f"{stem}.ncu-rep").exists()
    assert f"{stem}/" in next(c for c in calls(log) if "--nvtx" in c)


def test_time_records_the_ratio_to_the_reference(fake, tmp_path, gpu_here):
    fake("ok")
    target = tmp_path / "t.ncu-rep"
    assert main("profile", "--time", "--shape", "4096x4096x4096", "--dtype", "bf16", "--out",
                str(target), "--", "./app") == 0
    m = read_manifest(target.with_suffix(".json"))
    assert m.timing is not None and m.timing.reference == "cublas_bgemm"
    assert m.timing.ratio_to_reference is not None and m.timing.runs_per_round == 2
    assert "not event-timed" in m.capture.timing_method
    assert (tmp_path / f"{stem_for('cublas_bgemm', 'bf16', '4096x4096x4096')}.ncu-rep").exists()


def test_time_needs_a_shape(fake):
    fake("ok")
    result = runner.invoke(cli.app, ["profile", "--time", "--program", json.dumps(["./app"])])
    assert_one_sentence(result, "--time", "--shape")


def test_no_gpu_says_what_is_missing_and_the_command(fake, tmp_path, monkeypatch):
    fake("ok")
    monkeypatch.setattr(profiling, "driver_device_count", lambda: 0)
    a = program_capture(tmp_path / "prog")
    assert_one_sentence(runner.invoke(cli.app, ["diff", f"{a}:nvjet@0", "cublas"]),
                        "no GPU", "perfscope profile cublas_bgemm --dtype bf16 --shape 4096x4096x4096")


def test_no_ncu_says_what_is_missing_and_the_command(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "")
    monkeypatch.delenv("PERFSCOPE_NCU", raising=False)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.setattr(ncu.glob, "glob", lambda pattern: [])
    monkeypatch.setattr(ncu, "_pathfinder_ncu", lambda: None)
    a = program_capture(tmp_path / "prog")
    assert_one_sentence(runner.invoke(cli.app, ["diff", f"{a}:nvjet@0", "cublas"]),
                        "Nsight Compute (ncu)", "perfscope profile cublas_bgemm")


def test_shape_unknown_is_one_sentence(tmp_path):
    bare = tmp_path / "bare.ncu-rep.xz"
    shutil.copyfile(MLP, bare)
    assert_one_sentence(runner.invoke(cli.app, ["diff", f"{bare}:nvjet@0", "cublas"]),
                        "needs A's GEMM shape and dtype", "no run manifest")
    a = program_capture(tmp_path / "prog", shape=None, dtype=None)
    assert_one_sentence(runner.invoke(cli.app, ["diff", f"{a}:nvjet@0", "cublas"]),
                        "a run manifest without them")


def test_another_gpu_is_refused(fake, tmp_path, monkeypatch):
    fake("ok")
    monkeypatch.setattr(profiling, "driver_device_count", lambda: 1)
    monkeypatch.setattr(profiling, "_gpu_name", lambda: "NVIDIA A100-SXM4-80GB")
    a = program_capture(tmp_path / "prog")
    assert_one_sentence(runner.invoke(cli.app, ["diff", f"{a}:nvjet@0", "cublas"]),
                        "NVIDIA H200", "not be comparable")


def test_the_reference_run_is_never_added_to(tmp_path):
    """--reference resolves in the committed run and never profiles into it."""
    result = runner.invoke(cli.app, ["diff", "hgemm_bcf_dbf", "cublaslt", "--reference"])
    assert result.exit_code == 2 and "cublaslt_hgemm" in result.output


# ------------------------------------------------------------------ cuBLASLt and NVML


def test_cublaslt_stages_are_references_kept_out_of_all():
    from perfscope.kernels import all_specs, stage_catalogue

    for dtype, name in (("fp32", "cublaslt_sgemm"), ("fp16", "cublaslt_hgemm"), ("bf16", "cublaslt_bgemm")):
        spec = get_spec(name)
        assert spec.is_reference and spec.dtypes == (dtype,)
        assert diagnosis.reference_stage("cublaslt", dtype) == name
        assert name in stage_catalogue() and spec not in all_specs()


def test_lt_matmul_plans_once_in_place_and_executes_per_call():
    made = []

    class Matmul:
        def __init__(self, a, b, c=None, alpha=None, beta=None, options=None):
            self.args = (a, b, c, alpha, beta, options)
            self.planned = self.executed = 0
            made.append(self)

        def plan(self):
            self.planned += 1

        def execute(self):
            self.executed += 1

        def free(self):
            pass

    def array(ptr):
        return types.SimpleNamespace(data=types.SimpleNamespace(ptr=ptr))

    lt = LtMatmul(types.SimpleNamespace(Matmul=Matmul))
    prep = Prepared(get_spec("cublaslt_bgemm"), "bf16", None, None, None, (0, 0, 0), (0, 0, 0), 0,
                    library=lt)
    a, b, c = array(1), array(2), array(3)
    for _ in range(3):
        prep.launch(a, b, c)
    assert len(made) == 1 and made[0].planned == 1 and made[0].executed == 3
    _, _, out, _, beta, options = made[0].args
    assert out is c and beta == 0.0 and options["inplace"] is True
    prep.launch(a, b, array(4))              # another C: planned afresh
    assert len(made) == 2


def test_cublaslt_without_nvmath_is_one_sentence(monkeypatch):
    from perfscope.kernels import launch

    monkeypatch.setitem(sys.modules, "nvmath", None)
    with pytest.raises(PerfscopeError, match="need nvmath-python") as e:
        launch.nvmath_advanced()
    assert "\n" not in str(e.value)


def test_nvml_handle_is_looked_up_by_pci_bus_id(monkeypatch):
    asked = []
    fake_nvml = types.SimpleNamespace(
        nvmlInit=lambda: None, NVML_CLOCK_SM=0,
        nvmlDeviceGetHandleByPciBusId=lambda bus: asked.append(("bus", bus)) or "H",
        nvmlDeviceGetHandleByIndex=lambda i: asked.append(("index", i)) or "I",
        nvmlDeviceGetClockInfo=lambda handle, clock: 1980 if handle == "H" else 0)
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml)
    monkeypatch.setattr(environment.ClockReader, "_pci_bus_id", staticmethod(lambda: "0000:3B:00.0"))
    clock = environment.ClockReader()
    assert asked == [("bus", b"0000:3B:00.0")] and clock.sm_mhz() == 1980.0


def test_a_capture_whose_timing_fails_is_kept_and_named(fake, tmp_path, monkeypatch, capsys):
    fake("ok")
    monkeypatch.setattr(profiling, "driver_device_count", lambda: 0)
    target = tmp_path / "t.ncu-rep"
    assert main("profile", "--time", "--shape", "4096x4096x4096", "--dtype", "bf16", "--out",
                str(target), "--", "./app") == 2
    out = capsys.readouterr()
    assert f"wrote {target}" in out.out and "not timed" in out.err and "no GPU" in out.err
    assert target.exists() and read_manifest(target.with_suffix(".json")).timing is None


# ------------------------------------------------------------------ the report reader's range


def test_the_import_order_guard_is_for_2025_readers_only():
    from perfscope.reader import reader_has_import_fault

    assert reader_has_import_fault("2025.3.1") and reader_has_import_fault("2025.1.0")
    assert not reader_has_import_fault("2026.3.1") and not reader_has_import_fault("2026.2.0")


def test_the_profiler_side_loads_the_reader_before_any_cuda_extension():
    """`profile --time` reads reports in the process that profiled: on the H200 the 2025.3
    reader crashed on its first metric unit when cuda-bindings' driver was imported first
    (tensormap read its enums at import), so importing the profiler loads neither CuPy nor
    cuda-bindings, and the reader first."""
    import subprocess

    code = ("import sys, perfscope.cli, perfscope.profiling, perfscope.bench\n"
            "print(sorted(m for m in sys.modules if m.startswith(('cuda.', 'cupy'))))\n"
            "print('ncu_report' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parent.parent).stdout.splitlines()
    assert out[0] == "[]"
    assert out[1] == str(importlib.util.find_spec("ncu_report") is not None)


def test_matplotlib_first_is_refused_only_by_a_faulty_reader():
    import subprocess

    code = ("import matplotlib\n"
            "from perfscope.errors import PerfscopeError\n"
            "from perfscope.reader import reader_has_import_fault, reader_module\n"
            "try:\n"
            "    reader_module()\n"
            "    print('loaded', reader_has_import_fault())\n"
            "except PerfscopeError as exc:\n"
            "    print('refused', reader_has_import_fault(), exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parent.parent).stdout
    faulty = out.split()[1] == "True"
    assert out.startswith("refused" if faulty else "loaded"), out
    if faulty:
        assert "install ncu-report 2026.3" in out


@pytest.mark.gpu
@pytest.mark.parametrize("stage", ["cublaslt_sgemm", "cublaslt_hgemm", "cublaslt_bgemm"])
def test_cublaslt_references_verify_on_the_gpu(stage, tmp_path):
    """In a process of its own: CuPy and the report reader loaded here cannot share one."""
    import importlib.util
    import subprocess

    from perfscope.manifest import BenchFile

    if importlib.util.find_spec("nvmath") is None:
        pytest.skip("nvmath-python is not installed")
    written = tmp_path / "bench.json"
    out = subprocess.run([sys.executable, "-m", "perfscope.cli", "bench", stage, "--shape",
                          "1000x2000x504", "--check-only", "--out", str(written)],
                         capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
    assert out.returncode == 0, out.stdout + out.stderr
    (run,) = BenchFile.read(written).manifests
    assert run.stage == stage and run.verification.verdict == "ok", run.verification
