"""On a GPU: hgemm_fp8 (fp8.cu) and its cuBLASLt reference through bench's own path.

The stage on ragged shapes (M, N and K off the 128 x 256 x 128 tile) and on many-round ones
against float64 of the same e4m3 inputs and scales; the scales bit for bit on inputs whose
product fp32 computes exactly; cuBLASLt's FP8 GEMM through the same check; one timed run
against it. Skipped cleanly (conftest) where there is no GPU; the cuBLASLt cases where
nvmath-python is not installed.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from perfscope import bench, verify
from perfscope.kernels import Shape
from perfscope.kernels.fp8 import FP8_SCALES, encode_e4m3, scale_product
from perfscope.kernels.launch import prepare, require_gpu
from perfscope.manifest import OK
from perfscope.timing import BenchOptions

pytestmark = [pytest.mark.gpu, pytest.mark.cupy]

# K a multiple of 16 and N of 8 (TMA); one tile, ragged tiles, a partial last round
# (1000 x 2000: 32 tiles), several rounds (4096^2: 128 tiles on 132 SMs; 4096 x 8192:
# 256 tiles, two rounds) and a K of one k tile and a part.
SHAPES = (Shape(1, 8, 16), Shape(127, 136, 144), Shape(1000, 2000, 512),
          Shape(300, 4104, 1040), Shape(4096, 4096, 4096), Shape(4096, 8192, 1024))


def _nvmath_or_skip() -> None:
    if importlib.util.find_spec("nvmath") is None:
        pytest.skip("nvmath-python is not installed (cuBLASLt's FP8 GEMM is reached through it)")


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_the_stage_is_correct(shape):
    (job,) = bench.plan(["hgemm_fp8"], ["fp8"], shape)
    prep = prepare(job.spec, "fp8", shape)
    for seed in (1, 2):
        v = verify.verify(prep, seed)
        assert v.verdict == OK, f"hgemm_fp8 {shape}: {v.detail}"


@pytest.mark.parametrize("params", [{"BN": 128}, {"DEFER": 0, "BOXES": 2}, {"STAGES": 3, "GROUP": 1}],
                         ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_other_configurations_are_correct(params):
    shape = Shape(1000, 2000, 512)
    (job,) = bench.plan(["hgemm_fp8"], ["fp8"], shape, params)
    v = verify.verify(prepare(job.spec, "fp8", shape), 3)
    assert v.verdict == OK, f"hgemm_fp8 {params} {shape}: {v.detail}"


@pytest.mark.parametrize("stage", ["hgemm_fp8", "cublaslt_fp8gemm", "cublaslt_fp8gemm_precise"])
def test_the_scales_are_applied_bit_for_bit(stage):
    """Small-integer e4m3 inputs: A·Btᵀ is exact in fp32 (|sums| <= 4 K < 2^13), times the
    exact scale product, so C must be the float64 reference rounded to bf16, bit for bit."""
    if stage.startswith("cublaslt"):
        _nvmath_or_skip()
    import ml_dtypes

    cp = require_gpu()
    shape = Shape(304, 528, 1024)   # cuBLASLt's FP8 GEMM takes multiples of 16
    rng = np.random.default_rng(7)
    a = rng.integers(-2, 3, (shape.m, shape.k)).astype(np.float64)
    bt = rng.integers(-2, 3, (shape.n, shape.k)).astype(np.float64)
    (job,) = bench.plan([stage], ["fp8"], shape)
    prep = prepare(job.spec, "fp8", shape)
    c = cp.zeros((shape.m, shape.n), dtype=cp.uint16)
    prep.launch(cp.asarray(encode_e4m3(np, a)), cp.asarray(encode_e4m3(np, bt)), c)
    cp.cuda.get_current_stream().synchronize()
    want = (scale_product() * (a @ bt.T)).astype(np.float32).astype(ml_dtypes.bfloat16)
    got = cp.asnumpy(c).view(ml_dtypes.bfloat16)
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16)), (
        f"{stage}: {int(np.count_nonzero(got != want))} of {got.size} differ")
    # Not a scale of one in disguise: dropping either scale moves most outputs.
    assert FP8_SCALES[0] != 1 and FP8_SCALES[1] != 1


@pytest.mark.parametrize("stage", ["cublaslt_fp8gemm", "cublaslt_fp8gemm_precise"])
def test_the_cublaslt_references_pass_the_same_check(stage):
    _nvmath_or_skip()
    shape = Shape(1008, 2000, 512)
    (job,) = bench.plan([stage], ["fp8"], shape)
    v = verify.verify(prepare(job.spec, "fp8", shape), 1)
    assert v.verdict == OK, v.detail


def test_the_stage_is_timed_against_cublaslt():
    _nvmath_or_skip()
    jobs = bench.plan(["hgemm_fp8"], ["fp8"], Shape(4096, 4096, 4096))
    (m,) = bench.run_jobs(jobs, BenchOptions(runs=3, rounds=2, warmup=1))
    assert m.verification.verdict == OK
    assert m.timing.reference == "cublaslt_fp8gemm" and m.timing.ratio_to_reference.median > 0


def test_a_shape_cublaslt_refuses_is_timed_without_a_ratio():
    """M = 1000 is no multiple of 16: the stage is checked and timed, the ratio left out."""
    jobs = bench.plan(["hgemm_fp8"], ["fp8"], Shape(1000, 2000, 512))
    (m,) = bench.run_jobs(jobs, BenchOptions(runs=3, rounds=2, warmup=1))
    assert m.verification.verdict == OK and m.timing.time_ms.median > 0
    assert m.timing.ratio_to_reference is None
