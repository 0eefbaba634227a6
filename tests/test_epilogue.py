"""Fused epilogues on the CPU: the Epilogue value, the group references, planning a fused
stage (its group as the reference, hgemm_small_m's tile rows from M), the float64 checks
on NumPy, the launch geometry, and the bad input the issue lists (one sentence, exit 2)."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from perfscope import bench, verify
from perfscope.cli import app
from perfscope.errors import PerfscopeError
from perfscope.kernels import Shape, get_spec, parse_shape, stage_catalogue
from perfscope.kernels.epilogue import (
    Epilogue,
    EpilogueOperands,
    apply,
    elementwise_expression,
    elementwise_grid,
    epilogue_of,
    gelu_tanh,
)
from perfscope.kernels.fused_specs import GROUPS, fused_geometry, small_m_for, small_m_width
from perfscope.kernels.launch import Prepared
from perfscope.kernels.registry import reference_name
from perfscope.manifest import OK, WRONG

runner = CliRunner()


def test_epilogue_names_its_math_and_its_unfused_group():
    assert Epilogue("gelu").label == "bias+gelu" and Epilogue("gelu").group == "cublas+gelu"
    assert Epilogue("silu", residual=True).group == "cublas+silu+residual"
    assert Epilogue("none").label == "bias" and Epilogue("none").group == "cublas+bias"
    assert Epilogue("silu", True).params == {"ACT": 2, "RESIDUAL": 1}
    with pytest.raises(PerfscopeError, match="unknown activation 'relu'"):
        Epilogue("relu")


def test_every_group_is_a_registered_reference_with_its_epilogue():
    names = {g.name for g in GROUPS}
    assert names == {"cublas+bias", "cublas+gelu", "cublas+silu", "cublas+bias+residual",
                     "cublas+gelu+residual", "cublas+silu+residual", "cublas+gelu+fp8",
                     "cublas+gelu+int8"}
    for g in GROUPS:
        spec = get_spec(g.name)
        assert spec.is_reference and epilogue_of(spec).group == g.name
        assert stage_catalogue()[g.name].is_group
    assert not stage_catalogue()["cublas_bgemm"].is_group


def test_a_fused_stage_is_held_against_the_group_of_its_epilogue():
    fused = get_spec("hgemm_fused_bias_act")
    assert reference_name(fused, "bf16") == "cublas+gelu"
    assert reference_name(fused.with_params(ACT=2, RESIDUAL=1), "fp16") == "cublas+silu+residual"
    assert reference_name(get_spec("hgemm_ring"), "bf16") == "cublas_bgemm"
    assert stage_catalogue()["hgemm_small_m"].reference_for("bf16") == "cublas+gelu"
    job = bench.plan(["hgemm_fused_bias_act"], ["bf16"], parse_shape("4096x4096x4096"))[0]
    assert bench.reference_spec("bf16", job.spec).name == "cublas+gelu"


# At N = 8192, 64-column tiles fill 128 SMs without a split (8 ring slots at BM 64, the
# measured depth, and 8 at BM 128 above 64 rows, which fill 192 KB); at M = 256 two tile
# rows of them would be 256 tiles, so the tile is 128 wide, in two 128-row tile rows whose
# CTAs share B (MPAIR=2: 6 slots of 32 KB).
@pytest.mark.parametrize(("m", "bm", "stages", "bn", "arows"),
                         [(1, 64, 8, 64, 16), (20, 64, 8, 64, 32), (64, 64, 8, 64, 64),
                          (65, 128, 8, 64, 128), (256, 128, 6, 128, 128)])
def test_small_m_takes_its_tile_rows_from_m_unless_pinned(m, bm, stages, bn, arows):
    job = bench.plan(["hgemm_small_m"], ["bf16"], Shape(m, 8192, 8192))[0]
    p = job.spec.param_dict
    assert (p["BM"], p["STAGES"], p["BN"], p["AROWS"]) == (bm, stages, bn, arows)
    pinned = small_m_for(get_spec("hgemm_small_m").with_params(STAGES=2), Shape(m, 8192, 8192),
                         {"STAGES": 2})
    assert pinned.param_dict["STAGES"] == 2 and pinned.param_dict["BM"] == bm


def test_fused_geometry_splits_k_over_clusters_and_caps_the_persistent_grid():
    small = small_m_for(get_spec("hgemm_small_m"), Shape(64, 8192, 8192))
    grid, cluster = fused_geometry(small, Shape(64, 8192, 8192), 132)
    assert cluster == 1 and grid == (128, 1, 1)              # 128 N tiles of 64: no split
    wide = small_m_for(get_spec("hgemm_small_m").with_params(BN=128), Shape(64, 8192, 8192),
                       {"BN": 128})
    grid, cluster = fused_geometry(wide, Shape(64, 8192, 8192), 132)
    assert cluster == 2 and grid == (64 * 2, 1, 1)           # 64 N tiles x 2 splits
    grid, cluster = fused_geometry(wide, Shape(64, 8192, 8192), 132, fits=lambda c, n: False)
    assert cluster == 1 and grid == (64, 1, 1)
    # MCAST=2: the same splits in clusters of pairs of N tiles (2 x 2 CTAs), the fit asked
    # for 32 clusters of 4; at most 4 splits, so a pair's cluster stays portable (8).
    asked = []
    paired = wide.with_params(MCAST=2)
    grid, cluster = fused_geometry(paired, Shape(64, 8192, 8192), 132,
                                   fits=lambda c, n: asked.append((c, n)) or True)
    assert (grid, cluster) == ((64 * 2, 1, 1), 4) and asked == [(4, 32)]
    narrow2 = small_m_for(get_spec("hgemm_small_m"), Shape(16, 4096, 4096)).with_params(MCAST=2)
    assert fused_geometry(narrow2, Shape(16, 4096, 4096), 132) == ((128, 1, 1), 4)
    narrow = small_m_for(get_spec("hgemm_small_m"), Shape(16, 4096, 4096))
    assert fused_geometry(narrow, Shape(16, 4096, 4096), 132) == ((128, 1, 1), 2)
    # 14336 columns are 224 tiles of 64, two waves: 112 tiles of 128 instead.
    assert small_m_width(Shape(16, 14336, 4096)) == 128 and small_m_width(Shape(256, 8192, 8192)) == 128
    # Two tile rows of 128 x 64 at M = 256, N = 4096: 128 tiles, no split.
    at256 = small_m_for(get_spec("hgemm_small_m"), Shape(256, 4096, 4096))
    assert (at256.param_dict["BM"], at256.param_dict["BN"]) == (128, 64)
    assert fused_geometry(at256, Shape(256, 4096, 4096), 132) == ((64, 2, 1), 1)
    grid, cluster = fused_geometry(get_spec("hgemm_fused_bias_act"), Shape(4096, 4096, 4096), 132)
    assert (grid, cluster) == ((132, 1, 1), 1)


def test_small_m_pairs_of_tile_rows_share_b_in_one_cluster():
    """MPAIR=2: the two 128-row tiles of M = 256 in one cluster along x (x = (n tile * 2 +
    tile row) * S + split, y = tile row / 2); with 64 tiles at N = 4096 each splits K in two,
    clusters of 2 x 2 CTAs, the fit asked for 32 of them."""
    pin = {"BM": 128, "BN": 128, "MPAIR": 2}
    spec = small_m_for(get_spec("hgemm_small_m").with_params(**pin), Shape(256, 8192, 8192), pin)
    assert spec.param_dict["AROWS"] == 128 and spec.param_dict["STAGES"] == 6
    assert fused_geometry(spec, Shape(256, 8192, 8192), 132) == ((128, 1, 1), 2)
    asked = []
    grid, cluster = fused_geometry(spec, Shape(256, 4096, 4096), 132,
                                   fits=lambda c, n: asked.append((c, n)) or True)
    assert (grid, cluster) == ((32 * 2 * 2, 1, 1), 4) and asked == [(4, 32)]
    # The host pairs 128 x 128 tiles only where the pair fills more than half the SMs unsplit:
    # at N = 4096 (64 CTAs) a pinned BN 128 keeps the one 256-row tile row.
    assert small_m_for(get_spec("hgemm_small_m"), Shape(256, 8192, 8192)).param_dict["MPAIR"] == 2
    wide4096 = small_m_for(get_spec("hgemm_small_m").with_params(BN=128), Shape(256, 4096, 14336),
                           {"BN": 128}).param_dict
    assert (wide4096["MPAIR"], wide4096["BM"]) == (1, 256)
    # 128 x 64 tiles pair from 128 k tiles on.
    assert small_m_for(get_spec("hgemm_small_m"), Shape(256, 4096, 14336)).param_dict["MPAIR"] == 2
    assert small_m_for(get_spec("hgemm_small_m"), Shape(256, 4096, 4096)).param_dict["MPAIR"] == 1
    # 64-row tiles at M = 100: two tile rows, A's box the whole 64 rows.
    pin64 = {"BM": 64, "BN": 64, "MPAIR": 2}
    thin = small_m_for(get_spec("hgemm_small_m").with_params(**pin64), Shape(100, 4104, 1032), pin64)
    assert thin.param_dict["AROWS"] == 64
    assert fused_geometry(thin, Shape(100, 4104, 1032), 132) == ((65 * 2, 1, 1), 2)


def test_elementwise_pass_geometry_and_names():
    assert elementwise_expression("bf16", Epilogue("silu", True)) == \
        "bias_act_inplace<__nv_bfloat16, 2, 1>"
    assert elementwise_grid(64, 8192, 132) == (65536, 256)
    assert elementwise_grid(4096, 4096, 132) == (2097152, 2112)
    with pytest.raises(PerfscopeError, match="fp16 or bf16"):
        elementwise_expression("fp32", Epilogue())


def test_epilogue_reference_math():
    x = np.array([-3.0, -1.0, 0.0, 0.5, 2.0])
    exact = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
    assert np.allclose(gelu_tanh(np, x), exact)
    res = np.ones_like(x)
    assert np.allclose(apply(np, Epilogue("silu", True), x, res), x / (1 + np.exp(-x)) + 1)
    with pytest.raises(PerfscopeError, match="needs the residual"):
        apply(np, Epilogue("gelu", True), x, None)


def _operands(m=6, n=8, k=16, residual=True, seed=3):
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal((m, k)) / np.sqrt(k)).astype(np.float16)
    b = rng.standard_normal((k, n)).astype(np.float16)
    bias = (0.5 * rng.standard_normal(n)).astype(np.float16)
    res = rng.standard_normal((m, n)).astype(np.float16) if residual else None
    return a, b, EpilogueOperands(bias, res)


@pytest.mark.parametrize("act", ["none", "gelu", "silu"])
def test_the_epilogue_check_passes_the_right_answer_and_fails_one_wrong_element(act):
    epi = Epilogue(act, residual=True)
    a, b, extra = _operands()
    pre = a.astype(np.float64) @ b.astype(np.float64) + extra.bias.astype(np.float64)
    right = apply(np, epi, pre, extra.residual.astype(np.float64)).astype(np.float16)
    assert verify.check_epilogue(np, a, b, right, "fp16", epi, extra).verdict == OK
    wrong = right.copy()
    wrong[2, 5] += np.float16(0.25)
    got = verify.check_epilogue(np, a, b, wrong, "fp16", epi, extra)
    assert got.verdict == WRONG and "C[2][5]" in got.detail
    # The plain GEMM's answer is not the epilogue's.
    plain = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float16)
    assert verify.check_epilogue(np, a, b, plain, "fp16", epi, extra).verdict == WRONG


def test_a_fused_launch_without_its_operands_is_refused():
    spec = get_spec("hgemm_fused_bias_act")
    prep = Prepared(spec, "bf16", Shape(64, 64, 64), None, object(), (1, 1, 1), (384, 1, 1), 0,
                    epilogue=Epilogue("gelu"))
    with pytest.raises(PerfscopeError, match="needs its bias operands"):
        prep.launch(None, None, None)


@pytest.mark.parametrize(("args", "says"), [
    (["bench", "hgemm_small_m", "--dtype", "bf16", "--shape", "512x4096x4096"],
     "covers M of 1 to 256"),
    (["bench", "hgemm_fused_bias_act", "--dtype", "bf16", "--param", "ACT=7"],
     "no epilogue for ACT=7"),
    (["bench", "hgemm_fused_bias_act", "--dtype", "bf16", "--param", "RESIDUAL=2"],
     "RESIDUAL=0 or 1"),
    (["profile", "hgemm_small_m", "--dtype", "fp16", "--shape", "4096x4096x4096"],
     "covers M of 1 to 256"),
    (["bench", "hgemm_small_m_streamk", "--dtype", "bf16", "--shape", "128x4096x4096"],
     "covers M of 1 to 64, not M=128; take hgemm_small_m for that shape"),
    (["bench", "hgemm_fused_bias_act", "--dtype", "fp32"], "does not support dtype fp32"),
    (["bench", "hgemm_small_m", "--dtype", "bf16", "--shape", "64x4160x4096", "--param", "MCAST=2"],
     "65 tiles of 64 columns, an odd count"),
    (["bench", "hgemm_small_m", "--dtype", "bf16", "--shape", "256x8192x8192", "--param", "BM=256",
      "--param", "MPAIR=2"], "1 tile row(s) of 256, an odd count"),
    (["bench", "hgemm_small_m", "--dtype", "bf16", "--shape", "256x8192x8192", "--param", "BM=128",
      "--param", "MPAIR=2", "--param", "MCAST=2"], "share A (MCAST=2) or B (MPAIR=2), not both"),
])
def test_bad_epilogue_input_is_one_sentence_and_exit_2(args, says):
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    text = result.output.strip()
    assert says in text and "Traceback" not in text and len(text.splitlines()) == 1


def test_a_group_refuses_an_n_its_pass_cannot_read_in_vectors():
    with pytest.raises(PerfscopeError, match="N to be a multiple of 8 because the elementwise pass"):
        bench.plan(["cublas+gelu"], ["bf16"], Shape(64, 100, 64))
