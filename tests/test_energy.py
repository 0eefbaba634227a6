"""The power-cap probes on the CPU: benchmarks/energy_per_launch.py and power_probe.py refuse
bad input in one sentence before touching a GPU, their cases plan, and ClockReader reads
NVML's energy counter (None where it cannot)."""

from __future__ import annotations

import pytest
from conftest import benchmark_script

from perfscope import environment
from perfscope.kernels import get_spec


@pytest.fixture(scope="module")
def energy():
    return benchmark_script("energy_per_launch")


@pytest.mark.parametrize("argv, says", [
    (["--shape", "1x2x3"], "no cases for (1, 2, 3)"),
    (["--shape", "abc"], "is not of the form MxNxK"),
    (["--seconds", "0"], "--seconds must be positive"),
    (["--rounds", "0"], "--rounds at least 1"),
    (["--settle", "-1"], "--settle not negative"),
    (["--dtype", "fp8"], "--dtype 'fp8' is not one of bf16, fp16"),
])
def test_energy_probe_refuses_bad_input_in_one_sentence(energy, tmp_path, capsys, argv, says):
    out = tmp_path / "e.json"
    assert energy.main(["--out", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1
    assert not out.exists()


def test_energy_probe_settles_in_proportion_to_its_segments(energy):
    # 400 launches fill the 0.5 s segment: a 1 s settle is 800 of them, none is the 3 warm-up
    assert energy.settle_launches(400, 0.5, 1.0) == 800
    assert energy.settle_launches(400, 0.5, 0.0) == 3
    assert energy.settle_launches(20, 2.0, 0.1) == 3


def test_energy_probe_cases_name_real_stages_and_parameters(energy):
    for shape, cases in energy.CASES.items():
        assert len(shape) == 3
        labels = [label for label, _, _ in cases]
        assert len(set(labels)) == len(labels)
        # The first case is what the others are held against: a cuBLAS reference.
        assert get_spec(cases[0][1]).is_reference
        for _, stage, params in cases:
            spec = get_spec(stage)
            assert set(params) <= set(spec.param_dict)
            spec.with_params(**params)   # a value the stage refuses raises here


def test_energy_probe_runs_each_dtype_against_its_own_cublas(energy):
    # cuBLAS's GEMM is one stage per dtype; the stages and groups take the dtype themselves.
    assert energy.stage_for("cublas_bgemm", "fp16") == "cublas_hgemm"
    assert energy.stage_for("cublas_bgemm", "bf16") == "cublas_bgemm"
    assert energy.stage_for("cublas+gelu", "fp16") == "cublas+gelu"
    assert energy.stage_for("hgemm_tma_wgmma_balanced", "fp16") == "hgemm_tma_wgmma_balanced"
    for cases in energy.CASES.values():
        for dtype in energy.DTYPES:
            assert get_spec(energy.stage_for(cases[0][1], dtype)).is_reference
    # The ladder's best stage at 4096^3 is among the cases it is held to cuBLAS by.
    assert "hgemm_tma_wgmma_balanced" in {stage for _, stage, _ in energy.CASES[(4096,) * 3]}


def test_power_probe_refuses_a_bad_shape(tmp_path, capsys):
    probe = benchmark_script("power_probe")
    assert probe.main(["--out", str(tmp_path / "p.json"), "--shape", "4096x"]) == 2
    assert "is not of the form MxNxK" in capsys.readouterr().err
    assert "tuned" in probe.CONFIGS and probe.CONFIGS["tuned"]["DEFER"] == 1


class _FakeNvml:
    def __init__(self, mj):
        self.mj = mj

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        if isinstance(self.mj, Exception):
            raise self.mj
        return self.mj


def _reader(nvml):
    clock = environment.ClockReader.__new__(environment.ClockReader)
    clock._nvml, clock._handle, clock._smi, clock._bus_id = nvml, object(), None, None
    return clock


def test_energy_counter_reads_nvml_and_is_none_without_it():
    assert _reader(_FakeNvml(123456)).energy_mj() == 123456
    assert _reader(None).energy_mj() is None
    assert _reader(_FakeNvml(RuntimeError("not supported"))).energy_mj() is None
