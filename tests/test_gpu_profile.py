"""`perfscope profile` under the real ncu on a GPU (marker gpu; skipped without one)."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

import perfscope
from perfscope import ncu, profiling
from perfscope.errors import PerfscopeError

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def ncu_exe() -> str:
    try:
        return ncu.find_ncu()
    except PerfscopeError as exc:
        pytest.skip(str(exc))


def test_two_stages_one_ncu_process(ncu_exe, tmp_path):
    req = profiling.ProfileRequest(stages=("sgemm_smem", "hgemm_bcf"), shape="512x512x512",
                                   out=tmp_path)
    results = profiling.profile_stages(req, ncu=ncu_exe).results
    assert [r.verdict for r in results] == ["ok", "ok"], results
    for r, stage in zip(results, ("sgemm_smem", "hgemm_bcf"), strict=True):
        (kp,) = perfscope.load(r.report)
        assert stage in kp.identity.demangled
        assert kp.identity.sm_clock_hz and kp.identity.sm_clock_hz > 1e8
        assert kp.memory.shared.actual is not None and kp.opcodes.total
        manifest = json.loads(r.manifest.read_text())
        assert manifest["verification"]["verdict"] == "ok"
    hgemm = perfscope.load(results[1].report)[0]
    assert hgemm.opcodes.has("hmma") and hgemm.opcodes.has("ldsm")


def test_program_mode_profiles_only_matching_kernels(ncu_exe, tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent("""
        import cupy as cp
        k = cp.RawKernel(r'extern "C" __global__ void mine(float* x){x[threadIdx.x] += 1.f;}', "mine")
        x = cp.zeros(256, dtype=cp.float32)
        y = cp.random.default_rng(0).standard_normal(1000)
        k((1,), (256,), (x,))
        cp.cuda.Device().synchronize()
    """))
    opts = ncu.NcuOptions(output=tmp_path / "p", kernel_regex="^mine$")
    report = profiling.profile_command([sys.executable, str(script)], tmp_path / "p.ncu-rep", opts,
                                       ncu=ncu_exe)
    assert [kp.name for kp in perfscope.load(report)] == ["mine"]


def test_a_group_reference_profiles_both_launches_and_reads_as_one_side(ncu_exe, tmp_path):
    import subprocess

    req = profiling.ProfileRequest(stages=("hgemm_small_m", "cublas+gelu"), dtypes=("bf16",),
                                   shape="64x1024x1024", out=tmp_path)
    results = profiling.profile_stages(req, ncu=ncu_exe).results
    assert [r.verdict for r in results] == ["ok", "ok"], results
    assert (tmp_path / "sources" / "perfscope_elementwise.cu").is_file()
    # Reports are read in a process of their own: on the GPU machine the report reader
    # crashes in a process that has loaded CuPy (this one may have, through conftest).
    out = subprocess.run([sys.executable, "-m", "perfscope.cli", "diff", str(results[0].report),
                          str(results[1].report), "--markdown"], capture_output=True, text=True,
                         check=False)
    assert out.returncode == 0, out.stderr
    assert "| launches | 1 | 2 | 0.50x |" in out.stdout and "Unfused epilogue" in out.stdout
    assert "bias_act_inplace" in out.stdout


@pytest.mark.parametrize("stage, shape", [("hgemm_small_m", "16x8192x8192"),
                                          ("hgemm_small_m_packed", "16x8192x8192")])
def test_tensor_maps_of_a_program_are_the_maps_perfscope_planned(ncu_exe, tmp_path, stage, shape):
    """Our own stage run as a program (bench --check-only): the maps the capture library
    records as the program passes them are those kernels/maps.py plans for the stage.
    (The packed stage's strips are read as rank-3 maps by tensormaps.TensorMap.read.)"""
    from perfscope.kernels import Shape, get_spec, parse_shape
    from perfscope.kernels.registry import declared_params, run_reads
    from perfscope.manifest import read_manifest

    entry = get_spec(stage).entry       # the packed stage is hgemm_small_m's template, PACKED=1
    req = profiling.ProgramRequest(
        command=(sys.executable, "-m", "perfscope.cli", "bench", stage, "--shape", shape,
                 "--dtype", "bf16", "--check-only"),
        ncu=ncu.NcuOptions(kernel_regex=f"^{entry}$", launch_count=1), out=tmp_path / "p.ncu-rep",
        shape=shape, dtype="bf16", tensor_maps=True)
    capture = profiling.profile_program(req, ncu=ncu_exe)
    assert not capture.failed and capture.tensor_maps.split()[0] != "no", capture.tensor_maps
    manifest = read_manifest(capture.manifest)
    s: Shape = parse_shape(shape)
    planned = run_reads(stage, declared_params(stage, s), "bf16", s)
    got = [k.reads() for k in manifest.tensor_maps if entry in k.kernel]
    assert got and got[0] is not None, manifest.tensor_maps
    geometry = {(r.rows, r.row_bytes, r.box_rows, r.box_row_bytes, r.run_bytes) for r in got[0]}
    for r in planned:
        assert (r.rows, r.row_bytes, r.box_rows, r.box_row_bytes, r.run_bytes) in geometry, (r, geometry)
