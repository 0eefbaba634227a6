"""The fp8 stage (fp8.cu, issue 19's stretch) on the CPU, as in CI.

The e4m3 codes against an independent float8 implementation (ml_dtypes), the float64
reference's scales, the tensor maps of A and Bt, the spec's geometry, the SASS of the stage
(QGMMA, UTMALDG, UTMASTG; no HGMMA, HMMA or LDGSTS; no spills) and the one-sentence
refusals. Correctness and speed on the GPU: tests/test_gpu_fp8.py and benchmarks.
"""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from conftest import disassembler_or_skip
from typer.testing import CliRunner

from perfscope.cli import app
from perfscope.errors import PerfscopeError
from perfscope.hardware import output_element_bytes
from perfscope.kernels import Shape, get_spec
from perfscope.kernels.fp8 import (
    FP8_SCALES,
    decode_e4m3,
    encode_e4m3,
    fp8_operands_f64,
    scale_product,
)
from perfscope.kernels.fused_specs import output_dtype
from perfscope.kernels.launch import compile_stage
from perfscope.kernels.maps import plan_maps
from perfscope.kernels.registry import REFERENCE_FOR_DTYPE, audit_specs, names
from perfscope.kernels.spec import KERNEL_DIR, normalize_dtype
from perfscope.manifest import OK, WRONG
from perfscope.sass.disasm import disassemble
from perfscope.verify import Bound, _compare, _products

ARCH = "sm_90a"
SMEM_LIMIT = 227 * 1024
runner = CliRunner()

pytestmark = pytest.mark.usefixtures("private_cubin_cache")


# ------------------------------------------------------------------ e4m3 codes
def test_every_code_decodes_as_ml_dtypes_does():
    codes = np.arange(256, dtype=np.uint8)
    ours = decode_e4m3(np, codes)
    theirs = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    finite = ~np.isnan(theirs)
    assert finite.sum() == 254   # 0x7F and 0xFF are NaN, e4m3fn has no infinity
    np.testing.assert_array_equal(ours[finite], theirs[finite])


def test_encoding_rounds_as_ml_dtypes_does():
    rng = np.random.default_rng(3)
    # Normal draws, subnormals, the exact codes and the halfway points between them.
    table = decode_e4m3(np, np.arange(0x7F, dtype=np.uint8))
    halfway = (table[1:] + table[:-1]) / 2
    x = np.concatenate([rng.standard_normal(20000) * 4, rng.standard_normal(2000) * 2.0**-8,
                        table, -table, halfway, -halfway])
    x = x[np.abs(x) <= 448]
    ours = encode_e4m3(np, x)
    theirs = x.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    # -0.0 and 0.0 are one value; ml_dtypes keeps the sign of a negative that rounds to 0.
    same = (ours == theirs) | ((ours & 0x7F) == 0) & ((theirs & 0x7F) == 0)
    assert same.all(), x[~same][:5]


def test_encoding_saturates_past_448():
    # cvt.rn.satfinite: the largest finite e4m3, never NaN.
    assert decode_e4m3(np, encode_e4m3(np, np.array([1e4, -600.0]))).tolist() == [448.0, -448.0]


# ------------------------------------------------------------------ the float64 reference
def test_the_reference_carries_both_scales_and_bt_is_transposed():
    rng = np.random.default_rng(0)
    a = encode_e4m3(np, rng.standard_normal((5, 48)))
    bt = encode_e4m3(np, rng.standard_normal((7, 48)))
    a64, b64 = fp8_operands_f64(np, a, bt)
    assert b64.shape == (48, 7)
    product, bound = _products(np, a, bt, "fp8")
    assert scale_product() == FP8_SCALES[0] * FP8_SCALES[1] == np.float32(0.75) * np.float32(0.3125)
    np.testing.assert_array_equal(product, scale_product() * (a64 @ b64))
    np.testing.assert_array_equal(bound, scale_product() * (np.abs(a64) @ np.abs(b64)))


def test_a_kernel_that_drops_a_scale_fails_the_check():
    rng = np.random.default_rng(1)
    a = encode_e4m3(np, rng.standard_normal((64, 256)))
    bt = encode_e4m3(np, rng.standard_normal((32, 256)))
    product, bound = _products(np, a, bt, "fp8")
    right = product.astype(ml_dtypes.bfloat16)
    assert _compare(np, right, product, Bound("fp8", bound)).verdict == OK
    wrong = (product / FP8_SCALES[1]).astype(ml_dtypes.bfloat16)
    assert _compare(np, wrong, product, Bound("fp8", bound)).verdict == WRONG


# ------------------------------------------------------------------ the spec
def test_the_stage_is_registered_with_its_reference():
    spec = get_spec("hgemm_fp8")
    assert normalize_dtype("e4m3") == normalize_dtype("float8_e4m3fn") == "fp8"
    assert spec.dtypes == ("fp8",) and spec.parent == "hgemm_tma_wgmma_persistent"
    assert spec.archs == (ARCH,) and spec.abi == "tensormap" and spec.persistent
    assert "hgemm_fp8" in names() and spec in audit_specs()
    assert REFERENCE_FOR_DTYPE["fp8"] == "cublaslt_fp8gemm"
    assert get_spec("cublaslt_fp8gemm").is_reference
    assert output_dtype(spec, "fp8") == "bf16" and output_element_bytes("fp8") == 2
    assert spec.name_expression("fp8") == "hgemm_fp8<__nv_fp8_e4m3, 128, 256, 128, 4, 16, 1, 1>"
    assert spec.block_dims() == (384, 1, 1)
    assert spec.dynamic_smem_bytes() == 4 * (128 + 256) * 128 + 2 * 64 * 64 * 2 + 1024
    assert spec.static_smem_bytes() == 2 * 4 * 8
    text = (KERNEL_DIR / "fp8.cu").read_text()
    assert "\n// hgemm_fp8\n//   template <typename T = __nv_fp8_e4m3, " in text
    assert "//   parent   hgemm_tma_wgmma_persistent" in text


def test_tensor_maps_read_a_and_bt_k_major_and_write_a_bf16_c():
    spec = get_spec("hgemm_fp8")
    a, b, c = plan_maps(spec, "fp8", Shape(1000, 2000, 512))
    assert (a.dims, a.row_stride, a.box) == ((512, 1000), 512, (128, 128))
    assert (b.dims, b.row_stride, b.box) == ((512, 2000), 512, (128, 256))  # Bt: N rows of K
    assert (c.dims, c.row_stride, c.box) == ((2000, 1000), 4000, (64, 64))  # bf16 C
    assert a.data_type == b.data_type != c.data_type


@pytest.mark.parametrize(("shape", "says"), [
    (Shape(128, 128, 24), "multiple of 16"),
    (Shape(128, 100, 128), "multiple of 8"),
])
def test_shapes_tma_cannot_describe_are_refused(shape, says):
    with pytest.raises(PerfscopeError, match=says):
        get_spec("hgemm_fp8").check_shape(shape)


@pytest.mark.parametrize(("args", "says"), [
    (["bench", "hgemm_fp8", "--dtype", "fp8", "--shape", "128x128x24"], "multiple of 16"),
    (["bench", "hgemm_fp8", "--dtype", "bf16"], "takes fp8"),
    (["bench", "hgemm_tma_wgmma_persistent", "--dtype", "e4m3"], "fp8"),
])
def test_bad_fp8_input_is_one_sentence_and_exit_2(args, says):
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    text = result.output.strip()
    assert says in text and "Traceback" not in text and len(text.splitlines()) == 1, text


# ------------------------------------------------------------------ the SASS
@pytest.mark.slow
@pytest.mark.parametrize("bn", [256, 128])
def test_stage_compiles_to_qgmma_without_spills(bn):
    tool = disassembler_or_skip()
    spec = get_spec("hgemm_fp8").with_params(BN=bn)
    mod = compile_stage(spec, "fp8", ARCH)
    expr = spec.name_expression("fp8")
    use = mod.usage(expr)
    assert not use.spills and not use.wgmma_serialized, mod.log
    assert use.static_smem == spec.static_smem_bytes()
    assert use.static_smem + spec.dynamic_smem_bytes() <= SMEM_LIMIT
    sass = disassemble(mod.cubin_path, tool).kernel(mod.mangled(expr))
    ops, bases = sass.opcodes, sass.base_opcodes
    assert any(op.startswith(f"QGMMA.64x{bn}x32.F32.E4M3.E4M3") for op in ops), sorted(ops)
    assert bases["UTMALDG"] > 0 and bases["UTMASTG"] > 0 and bases["USETMAXREG"] >= 2
    for absent in ("HGMMA", "HMMA", "LDGSTS", "LDL", "STL"):
        assert not bases[absent], absent


def test_both_reference_aliases_name_cublaslt_for_fp8():
    from perfscope.diagnosis import reference_stage

    assert reference_stage("cublas", "fp8") == reference_stage("cublaslt", "fp8") == "cublaslt_fp8gemm"
    assert reference_stage("cublaslt", "bf16") == "cublaslt_bgemm"


def test_cublaslt_refuses_dimensions_off_16_in_one_sentence():
    with pytest.raises(PerfscopeError, match=r"M, N and K divisible by 16.*M=1000"):
        get_spec("cublaslt_fp8gemm").check_shape(Shape(1000, 2000, 512))


def test_an_fp8_manifest_names_its_tn_layout():
    from perfscope import bench
    from perfscope.manifest import LAYOUT, OK, Verification

    (job,) = bench.plan(["hgemm_fp8"], ["fp8"], Shape(256, 256, 256))
    assert "Bt[N][K]" in bench.make_manifest(job, Verification(OK)).layout
    (job,) = bench.plan(["hgemm_tma_wgmma_persistent"], ["bf16"], Shape(256, 256, 256))
    assert bench.make_manifest(job, Verification(OK)).layout == LAYOUT


# ------------------------------------------------- the fp8 reports of the reference run
FP8_RUN = Path(__file__).resolve().parents[1] / "reports" / "reference" / "h200" / "fp8"


def _fp8_record(stage: str, folder: Path = FP8_RUN):
    from perfscope.diagnosis import diagnose

    (record,) = diagnose([folder / f"{stage}-fp8-4096x4096x4096.ncu-rep.xz"])
    return record


def test_the_fp8_stage_is_held_to_the_8_bit_peak_with_a_bf16_c():
    """4096^3 e4m3 A and B, bf16 C: 16 + 16 + 32 MiB compulsory, the FP8 tensor peak at
    the clock ncu measured (8192 FLOP per SM per cycle), the bound the math."""
    r = _fp8_record("hgemm_fp8")
    h = r.evaluation.headroom
    assert h.work.dtype == "fp8" and h.work.dtype_source == "run manifest"
    assert h.work.bytes == 4096 * 4096 * (1 + 1 + 2)
    assert h.bound == "math (tensor8)"
    clock_hz = r.profile.identity.sm_clock_hz
    assert h.t_math_ns == pytest.approx(2 * 4096**3 / (8192 * 132 * clock_hz) * 1e9, rel=1e-3)
    # 0.87 of the FP8 peak at the 1562 MHz ncu measured (93.7 us for 81.4 us of math).
    assert 0.85 < h.t_min_ns / h.t_ns < 0.90


def test_cublaslt_fp8_without_its_manifest_is_inferred_fp8_from_qgmma(tmp_path):
    """The report alone (no run manifest beside it), as a user's own capture would be."""
    import shutil

    name = "cublaslt_fp8gemm_precise-fp8-4096x4096x4096.ncu-rep.xz"
    shutil.copy(FP8_RUN / name, tmp_path / name)
    r = _fp8_record("cublaslt_fp8gemm_precise", tmp_path)
    assert r.manifest is None
    h = r.evaluation.headroom
    assert h.work.dtype == "fp8" and "QGMMA" in h.work.dtype_source
    assert h.bound == "math (tensor8)"
    # Without M x N the k loop's promotion cannot be told from an epilogue: PS124 says so.
    (f,) = [f for f in r.evaluation.findings if f.code == "PS124"]
    assert any("PS125" in str(e.threshold) for e in f.evidence)


def test_the_k_loop_promotion_is_not_called_an_epilogue():
    codes = {f.code for f in _fp8_record("cublaslt_fp8gemm_precise").evaluation.findings}
    assert "PS125" in codes and "PS124" not in codes
    fast = {f.code for f in _fp8_record("cublaslt_fp8gemm").evaluation.findings}
    assert "PS125" not in fast


def test_diff_of_the_fp8_stage_against_cublaslt_runs_on_the_real_reports():
    result = CliRunner().invoke(app, ["diff", str(FP8_RUN / "hgemm_fp8-fp8-4096x4096x4096.ncu-rep.xz"),
                                      str(FP8_RUN / "cublaslt_fp8gemm-fp8-4096x4096x4096.ncu-rep.xz")])
    assert result.exit_code == 0, result.output
    assert "QGMMA" in result.output and "0.98x" in result.output
