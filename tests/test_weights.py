"""The weight layouts (kernels/weights.py): hgemm_small_m_packed's 64-column strips, their
tensor map, and the one sentence for a B in the wrong layout. CPU only: the packing is
array code, run here on numpy exactly as on the GPU on cupy."""

from __future__ import annotations

import numpy as np
import pytest

from perfscope.errors import PerfscopeError
from perfscope.kernels import Shape, get_spec
from perfscope.kernels.fused_specs import fused_geometry, small_m_for
from perfscope.kernels.maps import SWIZZLE_128B, plan_maps
from perfscope.kernels.weights import (
    ROW_MAJOR,
    STRIPS64,
    check_weight,
    pack_strips,
    strips_shape,
    unpack_strips,
    weight_for,
)


@pytest.mark.parametrize(("k", "n"), [(8, 8), (64, 64), (1000, 1032), (4104, 136), (128, 8192)])
def test_strips_hold_every_column_of_b_once_and_zeros_past_it(k, n):
    b = np.arange(k * n, dtype=np.float32).reshape(k, n) + 1
    p = pack_strips(np, b)
    strips, kp, cols = strips_shape(k, n)
    assert p.shape == (strips, kp, cols) and cols == 64 and kp % 64 == 0 and kp - k < 64
    assert p.flags.c_contiguous
    for t in range(strips):
        width = min(64, n - 64 * t)
        assert np.array_equal(p[t, :k, :width], b[:, 64 * t:64 * t + width])
    # The padding is zero: a k tile past K or a strip's columns past N add nothing.
    assert np.count_nonzero(p) == k * n
    assert np.array_equal(unpack_strips(np, p, k, n), b)


def test_a_box_of_the_strips_is_the_row_major_box_in_one_piece():
    """The kernel's box at (0, t * Kp + 64 kt) of the strips' map reads the same 64 x 64
    elements as the row-major box at (64 t, 64 kt), from 8 KB of contiguous memory."""
    k, n = 256, 512
    b = np.random.default_rng(3).standard_normal((k, n)).astype(np.float16)
    p = pack_strips(np, b)
    flat = p.reshape(-1, 64)
    _, kp, _ = strips_shape(k, n)
    for t, kt in ((0, 0), (3, 2), (7, 3)):
        box = flat[t * kp + 64 * kt: t * kp + 64 * kt + 64]
        assert np.array_equal(box, b[64 * kt:64 * kt + 64, 64 * t:64 * t + 64])
        assert box.flags.c_contiguous   # one piece of 8 KB


def test_the_packed_stage_maps_b_as_a_matrix_of_64_columns():
    shape = Shape(16, 8192, 4104)
    spec = small_m_for(get_spec("hgemm_small_m_packed"), shape)
    row = small_m_for(get_spec("hgemm_small_m"), shape)
    a, b, c = plan_maps(spec, "bf16", shape)
    ra, rb, rc = plan_maps(row, "bf16", shape)
    strips, kp, _ = strips_shape(shape.k, shape.n)
    assert (b.dims, b.row_stride, b.box) == ((64, strips * kp), 128, rb.box)
    assert rb.dims == (8192, 4104) and b.swizzle == rb.swizzle == SWIZZLE_128B
    assert (a, c) == (ra, rc)
    # The same kernel, tile and launch: only PACKED differs.
    assert {k: v for k, v in spec.param_dict.items() if k != "PACKED"} == row.param_dict
    assert spec.param_dict["PACKED"] == 1 and spec.entry == row.entry
    assert fused_geometry(spec, shape, 132) == fused_geometry(row, shape, 132)


def test_weight_for_packs_only_for_the_strips_layout():
    b = np.ones((72, 136), dtype=np.float16)
    assert weight_for(np, ROW_MAJOR, b) is b
    assert weight_for(np, STRIPS64, b).shape == (3, 128, 64)
    with pytest.raises(PerfscopeError, match="unknown weight layout 'tiles'"):
        weight_for(np, "tiles", b)
    with pytest.raises(PerfscopeError, match="K x N matrix"):
        pack_strips(np, np.ones((2, 3, 4)))


def test_a_b_in_the_wrong_layout_is_one_sentence():
    row_major = np.ones((4104, 8192), dtype=np.float16)
    with pytest.raises(PerfscopeError) as err:
        check_weight("hgemm_small_m_packed", STRIPS64, row_major, 4104, 8192)
    msg = str(err.value)
    assert msg.count(". ") == 0 and "64-column strips" in msg and "(128, 4160, 64)" in msg
    check_weight("hgemm_small_m_packed", STRIPS64, pack_strips(np, row_major), 4104, 8192)
    with pytest.raises(PerfscopeError, match="row-major K x N matrix"):
        check_weight("hgemm_small_m", ROW_MAJOR, pack_strips(np, row_major), 4104, 8192)


def test_the_packed_stage_refuses_what_hgemm_small_m_refuses_under_its_own_name():
    with pytest.raises(PerfscopeError) as err:
        small_m_for(get_spec("hgemm_small_m_packed"), Shape(300, 4096, 4096))
    assert str(err.value) == ("hgemm_small_m_packed covers M of 1 to 256, not M=300; take "
                              "hgemm_fused_bias_act for that shape")
    with pytest.raises(PerfscopeError, match=r"^hgemm_small_m_packed with MPAIR=2 pairs"):
        small_m_for(get_spec("hgemm_small_m_packed").with_params(MPAIR=2, BM=128),
                    Shape(100, 4096, 4096), {"MPAIR": 2, "BM": 128})


def test_operand_reads_give_the_run_each_box_reads_in_one_piece():
    """What the analysis is told of a run (kernels/maps.py, via run_reads): hgemm_small_m at
    16 x 8192^2 reads B in 64 x 128-byte boxes whose rows lie 16 KB apart; the packed stage
    at the same parameters reads the same bytes as 8 KB pieces."""
    from perfscope.kernels import run_reads

    shape = Shape(16, 8192, 8192)
    params = small_m_for(get_spec("hgemm_small_m"), shape).param_dict
    a, b = run_reads("hgemm_small_m", params, "bf16", shape)
    assert (a.operand, a.rows, a.row_bytes, a.box_row_bytes, a.run_bytes) == ("A", 16, 16384, 128, 128)
    assert (b.rows, b.row_bytes, b.box_rows, b.run_bytes, b.layout) == (8192, 16384, 64, 128, ROW_MAJOR)
    _, p = run_reads("hgemm_small_m_packed", params, "bf16", shape)
    assert (p.row_bytes, p.run_bytes, p.layout) == (128, 64 * 128, STRIPS64)
    assert p.bytes == b.bytes == 8192 * 8192 * 2
    assert "64 x 128-byte boxes, rows 16384 bytes apart" in b.describe()
    # fp8 takes B transposed (N x K, K contiguous): its rows are K bytes.
    _, t = run_reads("hgemm_fp8", {}, "fp8", Shape(4096, 4096, 8192))
    assert t.rows == 4096 and t.row_bytes == 8192


@pytest.mark.parametrize(("name", "params", "dtype"), [
    ("sgemm_naive", {}, "fp32"),                  # pointers, no tensor map
    ("no_such_stage", {}, "bf16"),
    (None, {}, "bf16"),                           # a program's kernel
    ("hgemm_small_m", {"NOT_A_PARAM": 1}, "bf16"),  # a parameter this tree's stage lacks
    ("hgemm_small_m", {}, None),
])
def test_operand_reads_are_unknown_rather_than_guessed(name, params, dtype):
    from perfscope.kernels import run_reads

    assert run_reads(name, params, dtype, Shape(16, 8192, 8192)) is None
