"""The quantising epilogue (hgemm_fused_quant and its unfused group, issue 19) on the CPU.

The float64 reference of the quantisation (e4m3 round-to-nearest-even with satfinite,
int8 round-to-nearest-even saturated), the check that holds a quantised C to it, the
stage's spec, tensor maps and launch arguments, its SASS (HGMMA fed by TMA, the e4m3 or
int8 conversions, the amax reduction, C stored from registers), and the bad input the
issue lists: a scale of 0 or NaN, an unknown QUANT, an N whose byte rows TMA cannot
describe. Bit-exactness against the GPU is tests/test_gpu_fused.py's.
"""

from __future__ import annotations

import ctypes
import math

import numpy as np
import pytest
from conftest import disassembler_or_skip
from test_bad_input import assert_one_sentence
from test_fused import FakeDriver
from typer.testing import CliRunner

from perfscope.cli import app
from perfscope.errors import PerfscopeError
from perfscope.kernels import Shape, get_spec
from perfscope.kernels.epilogue import (
    E4M3_MAX,
    Epilogue,
    EpilogueOperands,
    check_quant_scale,
    decoded,
    e4m3_values,
    elementwise_expression,
    epilogue_of,
    quantised,
    round_e4m3,
    round_int8,
)
from perfscope.kernels.fused_specs import BY_NAME, QUANT_STAGE, output_dtype
from perfscope.kernels.launch import _operand_pointers, compile_stage, elementwise_request
from perfscope.kernels.maps import DATA_TYPE, plan_maps
from perfscope.kernels.tensormap import TensorMap, TensorMapLauncher
from perfscope.manifest import OK, WRONG
from perfscope.sass.disasm import disassemble
from perfscope.verify import check_quantised, make_epilogue_operands

ARCH = "sm_90a"
runner = CliRunner()
FINITE = e4m3_values()[np.isfinite(e4m3_values())]


# ------------------------------------------------------------------ the rounding
def test_every_e4m3_value_rounds_to_itself():
    assert len(FINITE) == 254 and FINITE.max() == E4M3_MAX == -FINITE.min()
    got = round_e4m3(np, FINITE)
    assert np.array_equal(got, FINITE) and np.array_equal(np.signbit(got), np.signbit(FINITE))


def test_e4m3_ties_go_to_the_even_code():
    pos = np.unique(FINITE[FINITE >= 0])   # ascending; code i has value pos[i] for i < 127
    mids = (pos[:-1] + pos[1:]) / 2
    got = round_e4m3(np, mids)
    codes = np.searchsorted(pos, got)
    assert np.all(codes % 2 == 0)          # the even one of the two neighbours
    assert np.all((got == pos[:-1]) | (got == pos[1:]))
    # Just off a tie, the nearer neighbour wins.
    assert np.array_equal(round_e4m3(np, np.nextafter(mids, np.inf)), pos[1:])
    assert np.array_equal(round_e4m3(np, np.nextafter(mids, -np.inf)), pos[:-1])


def test_e4m3_saturates_keeps_nan_and_the_sign_of_zero():
    y = np.array([449.0, 464.0, 1e30, np.inf, -500.0, np.nan, -1e-6, 0.0, 2.0**-10, 3 * 2.0**-10])
    got = round_e4m3(np, y)
    assert list(got[:5]) == [448.0, 448.0, 448.0, 448.0, -448.0]
    assert np.isnan(got[5])
    assert got[6] == 0.0 and np.signbit(got[6]) and not np.signbit(got[7])
    # Subnormals step by 2^-9: 2^-10 is a tie between 0 and 2^-9 (to 0, even); 3 * 2^-10
    # between 2^-9 and 2^-8 (to 2^-8, code 2).
    assert got[8] == 0.0 and got[9] == 2.0**-8


def test_e4m3_matches_ml_dtypes_inside_the_finite_range():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(3)
    y = np.concatenate([rng.standard_normal(20000) * s for s in (1e-3, 0.1, 10, 100)])
    y = y[np.abs(y) < 448].astype(np.float32).astype(np.float64)
    theirs = y.astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
    assert np.array_equal(round_e4m3(np, y), theirs)


def test_int8_rounds_half_to_even_and_saturates():
    y = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 126.6, 127.5, 1000.0, -128.4, -129.0, np.nan])
    got = round_int8(np, y)
    assert list(got) == [0, 2, 2, 0, -2, 127, 127, 127, -128, -128, 0]
    assert not np.signbit(got[3])   # rint(-0.5) is -0.0; a stored int8 is +0


def test_the_product_is_rounded_to_fp32_before_the_conversion():
    # x * s is a tie for e4m3 in fp32, but just above one in exact arithmetic: the kernel
    # (one fp32 multiply, then cvt) rounds the tie to even, float64 would round up.
    x = np.float64(np.float32(1.0 + 2.0**-23))
    s = np.float32(1.0625 / (1.0 + 2.0**-23))   # fp32(x * s) == 1.0625, a tie of 1.0 and 1.125
    assert np.float32(x) * s == np.float32(1.0625)
    assert float(x) * float(s) > 1.0625
    assert quantised(np, "fp8", np.array([[x]]), s)[0, 0] == 1.0
    assert round_e4m3(np, np.array([float(x) * float(s)]))[0] == 1.125


def test_per_row_scales_apply_to_their_rows():
    x = np.full((3, 4), 10.0)
    got = quantised(np, "int8", x, np.array([1.0, 2.0, 20.0], dtype=np.float32))
    assert list(got[:, 0]) == [10, 20, 127]


def test_decoding_reads_the_stored_bytes():
    codes = np.array([[0x00, 0x80, 0x38, 0x7E, 0xFE, 0x7F]], dtype=np.uint8)
    got = decoded(np, "fp8", codes)
    assert list(got[0, :5]) == [0.0, -0.0, 1.0, 448.0, -448.0] and np.isnan(got[0, 5])
    assert list(decoded(np, "int8", np.array([[0xFF, 0x80, 0x7F]], dtype=np.uint8))[0]) == [-1, -128, 127]


# ------------------------------------------------------------------ the check
def _operands(quant: str, shape: Shape) -> tuple[np.ndarray, np.ndarray, EpilogueOperands]:
    rng = np.random.default_rng(7)
    a = (rng.standard_normal((shape.m, shape.k)) / math.sqrt(shape.k)).astype(np.float16)
    b = rng.standard_normal((shape.k, shape.n)).astype(np.float16)
    extra = make_epilogue_operands(np, shape, "fp16", 7, Epilogue("none", quant=quant))
    return a, b, extra


def _as_kernel(quant: str, a, b, extra) -> np.ndarray:
    """What a correct kernel stores: the float64 epilogue quantised, as bytes."""
    x = a.astype(np.float64) @ b.astype(np.float64) + extra.bias.astype(np.float64)[None, :]
    extra.amax[0] = np.abs(x).max()
    scale = extra.scale if quant == "int8" else extra.scale[0]
    q = quantised(np, quant, x, scale)
    if quant == "int8":
        return q.astype(np.int8).view(np.uint8)
    pos = np.unique(FINITE[FINITE >= 0])
    codes = np.searchsorted(pos, np.abs(q)).astype(np.uint8)
    return codes | np.where(np.signbit(q), 0x80, 0).astype(np.uint8)


@pytest.mark.parametrize("quant", ["fp8", "int8"])
def test_a_correct_quantised_output_passes_and_a_wrong_one_fails(quant):
    shape = Shape(40, 48, 64)
    a, b, extra = _operands(quant, shape)
    epi = Epilogue("none", quant=quant)
    c = _as_kernel(quant, a, b, extra)
    assert check_quantised(np, a, b, c, "fp16", epi, extra).verdict == OK
    off = c.copy()
    off[3, 5] = off[3, 5] + 3 if quant == "int8" else off[3, 5] ^ 0x04   # a few steps away
    v = check_quantised(np, a, b, off, "fp16", epi, extra)
    assert v.verdict == WRONG and "C[3][5]" in v.detail
    never = c.copy()
    never[7, 9] = 0x7F if quant == "fp8" else 0x80                  # the poison left in place
    assert check_quantised(np, a, b, never, "fp16", epi, extra).verdict == WRONG
    extra.amax[0] *= 1.5
    v = check_quantised(np, a, b, c, "fp16", epi, extra)
    assert v.verdict == WRONG and "amax" in v.detail


def test_int8_scales_differ_by_row():
    _, _, extra = _operands("int8", Shape(10, 16, 8))
    assert extra.scale.shape == (10,) and len(set(extra.scale.tolist())) == 5
    _, _, fp8 = _operands("fp8", Shape(10, 16, 8))
    assert fp8.scale.shape == (1,) and fp8.amax.tolist() == [0.0]


# ------------------------------------------------------------------ the stage
def test_the_stage_and_its_groups():
    spec = get_spec(QUANT_STAGE)
    assert epilogue_of(spec) == Epilogue("gelu", quant="fp8")
    assert epilogue_of(spec.with_params(QUANT=2)).label == "bias+gelu+int8"
    assert epilogue_of(spec).group == "cublas+gelu+fp8"
    for quant in ("fp8", "int8"):
        group = get_spec(f"cublas+gelu+{quant}")
        assert group.is_reference and epilogue_of(group) == Epilogue("gelu", quant=quant)
        assert output_dtype(group, "bf16") == quant
    assert output_dtype(get_spec("hgemm_fused_bias_act"), "bf16") == "bf16"
    assert spec.dynamic_smem_bytes() == 4 * 49152 + 1024   # four ring slots, no C staging
    assert elementwise_expression("bf16", Epilogue("gelu", quant="int8")) == \
        "bias_act_quant<__nv_bfloat16, 1, 0, 2>"


def test_c_is_a_map_of_bytes_and_the_scale_and_amax_follow_the_residual():
    spec, shape = get_spec(QUANT_STAGE), Shape(300, 4112, 1032)
    a_plan, b_plan, c_plan = plan_maps(spec, "bf16", shape)
    assert a_plan.data_type == DATA_TYPE["bf16"] and c_plan.data_type == DATA_TYPE["fp8"] == 0
    assert c_plan.row_stride == 4112 and c_plan.dims == (4112, 300)
    fake = FakeDriver()
    launch = TensorMapLauncher((a_plan, b_plan, c_plan), 0xF00, ((132, 1, 1), (384, 1, 1), 1),
                               shape, fake)

    class Dev:
        def __init__(self, ptr):
            self.data = type("P", (), {"ptr": ptr})()

    extra = EpilogueOperands(Dev(0x4000), None, Dev(0x5000), Dev(0x6000))
    launch(0x1000, 0x2000, 0x3000, 7, _operand_pointers(extra, epilogue_of(spec)))
    ((_, _, _, args, _),) = fake.launches
    assert len(args) == 11 and all(isinstance(x, TensorMap) for x in args[:3])
    assert [x.value for x in args[3:4]] == [0x3000]
    assert all(isinstance(x, ctypes.c_int) for x in args[4:7])
    assert [x.value for x in args[7:]] == [0x4000, None, 0x5000, 0x6000]
    with pytest.raises(PerfscopeError, match="scale operand"):
        _operand_pointers(EpilogueOperands(Dev(1)), epilogue_of(spec))


@pytest.mark.slow
@pytest.mark.parametrize("quant", [1, 2])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_the_stage_converts_in_registers_and_stores_from_them(quant, dtype):
    tool = disassembler_or_skip()
    spec = BY_NAME[QUANT_STAGE].with_params(QUANT=quant)
    mod = compile_stage(spec, dtype, ARCH)
    expr = spec.name_expression(dtype)
    use = mod.usage(expr)
    assert not use.spills and use.registers * 384 <= 65536
    sass = disassemble(mod.cubin_path, tool).kernel(mod.mangled(expr))
    ops, bases = sass.opcodes, sass.base_opcodes
    assert any(op.startswith("HGMMA.64x256x16.F32") for op in ops)
    assert bases["UTMALDG"] > 0 and not bases["UTMASTG"]   # C leaves through STG, not TMA
    assert bases["STG"] > 0 and bases["REDUX"] > 0        # the amax's warp reduction
    assert not bases["HMMA"] and not bases["LDGSTS"] and not bases["LDL"]
    # Every value of a 64 x 256 fragment is converted: two per F2FP (e4m3x2), one per F2I.
    e4m3 = sum(n for op, n in ops.items() if op.startswith("F2FP") and "E4M3" in op)
    to_int = ops["F2I.NTZ"]
    assert (e4m3 >= 64 and to_int == 0) if quant == 1 else (e4m3 == 0 and to_int >= 128)


@pytest.mark.slow
@pytest.mark.parametrize("quant", ["fp8", "int8"])
def test_the_groups_quantising_pass_compiles(quant):
    epi = Epilogue("gelu", quant=quant)
    mod = compile_cubin_of(epi)
    assert not mod.usage(elementwise_expression("bf16", epi)).spills


@pytest.mark.parametrize("quant", ["fp8", "int8"])
def test_the_quantising_pass_meets_in_shared_memory_before_its_one_atomic(quant):
    """The pass's amax: each warp's REDUX, then the block's warps in shared memory (ATOMS
    between two barriers), then one REDG per block, not one per warp: 16,896 same-address
    REDG (one per warp at 4096^2) serialised in an L2 slice and took the fp8 pass to 1.45x
    the in-place pass's time for fewer bytes."""
    tool = disassembler_or_skip()
    epi = Epilogue("gelu", quant=quant)
    mod = compile_cubin_of(epi)
    bases = disassemble(mod.cubin_path, tool).kernel(
        mod.mangled(elementwise_expression("bf16", epi))).base_opcodes
    assert bases["REDUX"] > 0 and bases["ATOMS"] == 1 and bases["BAR"] >= 2
    assert bases["REDG"] == 1


def compile_cubin_of(epi: Epilogue):
    from perfscope.build import compile_cubin

    return compile_cubin(elementwise_request("bf16", epi, ARCH))


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("scale", ["0", "nan", "-1", "inf"])
def test_a_scale_of_zero_or_nan_is_one_sentence(scale):
    result = runner.invoke(app, ["bench", QUANT_STAGE, "--shape", "64x4096x4096",
                                 "--quant-scale", scale])
    assert_one_sentence(result, "quantisation scale", "finite number above 0")
    with pytest.raises(PerfscopeError):
        check_quant_scale(float(scale))


def test_an_unknown_quant_is_one_sentence():
    result = runner.invoke(app, ["bench", QUANT_STAGE, "--shape", "64x4096x4096",
                                 "--param", "QUANT=3"])
    assert_one_sentence(result, "QUANT=3", "1 (fp8), 2 (int8)")


def test_an_n_whose_byte_rows_tma_cannot_describe_is_one_sentence():
    result = runner.invoke(app, ["bench", QUANT_STAGE, "--shape", "64x4104x4096"])
    assert_one_sentence(result, "N", "16")
    with pytest.raises(PerfscopeError):
        Epilogue("gelu", quant="fp4")
