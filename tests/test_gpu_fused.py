"""On a GPU: the fused stages and their group references through bench's own path.

Every epilogue (bias + GELU, bias + SiLU, + residual) on ragged shapes against float64,
hgemm_small_m across its tile-row tiers, the residual aliasing C, and one timed run whose
reference is the group of launches. Skipped cleanly (conftest) where there is no GPU.
"""

from __future__ import annotations

import pytest

from perfscope import bench, verify
from perfscope.kernels import Shape, get_spec
from perfscope.kernels.epilogue import Epilogue, EpilogueOperands, apply
from perfscope.kernels.launch import prepare, require_gpu
from perfscope.manifest import OK
from perfscope.timing import BenchOptions

pytestmark = pytest.mark.gpu

EPILOGUES = (Epilogue("gelu"), Epilogue("silu"), Epilogue("gelu", residual=True),
             Epilogue("none", residual=True))
# K and N multiples of 8 (TMA); M, N and K off the tile edges.
BIAS_ACT_SHAPES = (Shape(1, 8, 8), Shape(127, 136, 72), Shape(300, 4104, 1032))
SMALL_M_SHAPES = (Shape(1, 136, 264), Shape(37, 1032, 4104), Shape(200, 264, 2056),
                  Shape(256, 4096, 4096))


def _cases():
    for epi in EPILOGUES:
        for shape in BIAS_ACT_SHAPES:
            yield "hgemm_fused_bias_act", epi, shape
        for shape in SMALL_M_SHAPES:
            yield "hgemm_small_m", epi, shape
        yield epi.group, epi, Shape(127, 136, 72)


CASES = list(_cases())


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize(("stage", "epi", "shape"), CASES,
                         ids=[f"{s}-{e.label}-{sh}" for s, e, sh in CASES])
def test_epilogue_is_correct(stage, epi, shape, dtype):
    params = {} if get_spec(stage).is_reference else epi.params
    (job,) = bench.plan([stage], [dtype], shape, params)
    prep = prepare(job.spec, dtype, shape)
    assert prep.epilogue == epi
    for seed in (1, 2):
        v = verify.verify(prep, seed)
        assert v.verdict == OK, f"{stage} {epi.label} {dtype} {shape}: {v.detail}"


@pytest.mark.parametrize("stage", ["hgemm_fused_bias_act", "hgemm_small_m"])
def test_the_residual_may_alias_c(stage):
    cp = require_gpu()
    shape, epi = Shape(200, 264, 520), Epilogue("gelu", residual=True)
    (job,) = bench.plan([stage], ["bf16"], shape, epi.params)
    prep = prepare(job.spec, "bf16", shape)
    a, b = verify.make_inputs(cp, shape, "bf16", 5, scaled=True)
    extra = verify.make_epilogue_operands(cp, shape, "bf16", 5, epi)
    c = extra.residual.copy()                        # C = gelu(A@B + bias) + C
    prep.launch(a, b, c, EpilogueOperands(extra.bias, c))
    cp.cuda.get_current_stream().synchronize()
    assert verify.check_epilogue(cp, a, b, c, "bf16", epi, extra).verdict == OK
    pre = a.astype(cp.float64) @ b.astype(cp.float64) + extra.bias.astype(cp.float64)[None, :]
    assert apply(cp, epi, pre, extra.residual.astype(cp.float64)).shape == c.shape


def test_a_fused_stage_is_timed_against_its_group():
    jobs = bench.plan(["hgemm_small_m"], ["bf16"], Shape(64, 4096, 4096))
    (m,) = bench.run_jobs(jobs, BenchOptions(runs=3, rounds=2, warmup=1))
    assert m.verification.verdict == OK
    assert m.timing.reference == "cublas+gelu" and m.timing.ratio_to_reference.median > 0
