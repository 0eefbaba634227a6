"""On a GPU: every stage, in every dtype it takes, is right on every shape of issue 3.

Skipped cleanly (conftest) where there is no GPU. A shape a stage refuses must be refused
by one of its declared constraints, never silently run.
"""

from __future__ import annotations

import numpy as np
import pytest

from perfscope import bench, verify
from perfscope.errors import PerfscopeError
from perfscope.kernels import REGISTRY, Shape, get_spec
from perfscope.kernels.launch import prepare, require_gpu
from perfscope.kernels.tensormap import balanced_grid
from perfscope.manifest import OK

pytestmark = [pytest.mark.gpu, pytest.mark.cupy]

CASES = [(s, d) for s in REGISTRY for d in s.dtypes]
CASES += [(get_spec("sgemm_pipe").with_params(STAGES=n), "fp32") for n in (2, 4)]
# hgemm_ring_spread's other share counts and ring depths: its copies fall in different k
# steps and its last R - 1 tiles fill differently (at STAGES=2 no tile is in flight across
# a barrier).
CASES += [(get_spec("hgemm_ring_spread").with_params(STAGES=n, SPREAD=s), "bf16")
          for n, s in ((2, 1), (4, 2), (4, 1))]


# Ragged shapes that satisfy every declared constraint (K and N multiples of 8, M and
# the tile edges not), and one with an odd K for the stages that take any K.
RAGGED = (Shape(129, 136, 72), Shape(1000, 2000, 504), Shape(130, 132, 67))


def _id(case) -> str:
    spec, dtype = case
    default = get_spec(spec.name).param_dict
    changed = "".join(f"-{k}{v}" for k, v in spec.param_dict.items() if default.get(k) != v)
    return f"{spec.name}{changed}-{dtype}"


@pytest.mark.parametrize("shape", verify.CHECK_SHAPES + RAGGED, ids=str)
@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_stage_is_correct(case, shape):
    spec, dtype = case
    try:
        spec.check_shape(shape)
    except PerfscopeError:
        assert spec.constraints, f"{spec.name} refused {shape} without a declared constraint"
        return
    prep = prepare(spec, dtype, shape)
    # Two draws: an error that moves between fresh inputs points at a race.
    for seed in (1, 2):
        v = verify.verify(prep, seed)
        assert v.verdict == OK, f"{spec.name} {dtype} {shape}: {v.detail}"


# The tensor-map stages refuse most issue-3 shapes (K and N multiples of 8), so they get
# their own: K = 8 (one partly filled k tile), ragged M and N with more tiles than
# multiprocessors (the persistent stage wraps), a square one, 512 tiles of 4 k tiles (the
# stream-K shares cut tiles) and the 8192^3.
TENSORMAP_CASES = [(s, d) for s in REGISTRY if s.abi == "tensormap" for d in s.dtypes]
# The persistent template's tuned options: a fourth ring slot paid for with two staging
# boxes, one box at BN 128, and stream-K (its split tiles, their partials and flags).
_PERSISTENT = get_spec("hgemm_tma_wgmma_persistent")
TENSORMAP_CASES += [(_PERSISTENT.with_params(**p), d) for d in _PERSISTENT.dtypes for p in (
    {"STAGES": 4, "BOXES": 2}, {"STREAMK": 1}, {"STREAMK": 1, "STAGES": 4, "BOXES": 1, "GROUP": 16},
    {"STREAMK": 1, "BN": 128, "BOXES": 1}, {"STREAMK": 2}, {"STREAMK": 2, "BN": 128})]
# The tail split (STREAMK 3): its tail tiles' CTAs and the spares that finish their k tiles.
TAIL_SPLIT = [(_PERSISTENT.with_params(**p), d) for d in _PERSISTENT.dtypes for p in (
    {"STREAMK": 3}, {"STREAMK": 3, "BN": 128, "BOXES": 1}, {"STREAMK": 3, "STAGES": 4, "BOXES": 2})]
TENSORMAP_CASES += TAIL_SPLIT
# The deferred store (DEFER 1): each tile leaves under the next tile's first wgmmas, whole
# or box by box, after whole tiles, stream-K shares and the tail split's pieces.
DEFERRED = [(_PERSISTENT.with_params(**p), d) for d in _PERSISTENT.dtypes for p in (
    {"DEFER": 1}, {"DEFER": 1, "STAGES": 4, "BOXES": 1}, {"DEFER": 1, "BN": 128, "BOXES": 1},
    {"DEFER": 1, "STREAMK": 1, "GROUP": 16}, {"DEFER": 1, "STREAMK": 3, "STAGES": 4, "BOXES": 2})]
TENSORMAP_CASES += DEFERRED
TENSORMAP_SHAPES = (Shape(200, 264, 8), Shape(2056, 4104, 520),
                    Shape(8, 8, 8), Shape(4096, 4096, 200), Shape(8192, 8192, 8192))


@pytest.mark.parametrize("shape", TENSORMAP_SHAPES, ids=str)
@pytest.mark.parametrize("case", TENSORMAP_CASES, ids=[_id(c) for c in TENSORMAP_CASES])
def test_tensormap_stage_is_correct(case, shape):
    spec, dtype = case
    prep = prepare(spec, dtype, shape)
    for seed in (1, 2):
        v = verify.verify(prep, seed)
        assert v.verdict == OK, f"{spec.name} {dtype} {shape}: {v.detail}"


# Where the tail split cuts with several pieces per spare (of the shapes above it cuts only
# 8192^3, two pieces a spare): 220 tiles of 48 k tiles at BN 256 (88 tail tiles, 44 spares,
# 2 pieces each, cut at 34; at BN 128, 440 tiles, one piece, cut at 24), the same ragged,
# and 231 tiles of 64 k tiles (99 tail tiles, 33 spares, 3 pieces, cut at 51).
TAIL_SPLIT_SHAPES = (Shape(1408, 5120, 3072), Shape(1400, 5096, 3064), Shape(1408, 5376, 4096))


@pytest.mark.parametrize("shape", TAIL_SPLIT_SHAPES, ids=str)
@pytest.mark.parametrize("case", TAIL_SPLIT + DEFERRED[-2:], ids=[_id(c) for c in TAIL_SPLIT + DEFERRED[-2:]])
def test_tail_split_pieces_are_correct(case, shape):
    spec, dtype = case
    prep = prepare(spec, dtype, shape)
    for seed in (1, 2, 3):   # the spares' flags are consumed and cleared launch after launch
        v = verify.verify(prep, seed)
        assert v.verdict == OK, f"{spec.name} {dtype} {shape}: {v.detail}"


def test_persistent_grid_is_one_cta_per_multiprocessor():
    import cupy

    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    big = prepare(get_spec("hgemm_tma_wgmma_persistent"), "bf16", Shape(4096, 4096, 4096))
    assert big.grid == (sms, 1, 1) and big.block == (384, 1, 1)
    small = prepare(get_spec("hgemm_tma_wgmma_persistent"), "bf16", Shape(256, 512, 64))
    assert small.grid == (4, 1, 1)   # 2 x 2 tiles of 128 x 256: fewer tiles than SMs
    pairs = prepare(get_spec("hgemm_tma_wgmma_cluster"), "bf16", Shape(4096, 4096, 4096))
    assert pairs.grid[0] % 2 == 0 and sms - 2 <= pairs.grid[0] <= sms
    # The balanced stage: 512 tiles in the rounds one CTA per SM takes, on the fewest CTAs
    # (128 on a 132-SM H100/H200), and its launcher launches that grid.
    even = prepare(get_spec("hgemm_tma_wgmma_balanced"), "bf16", Shape(4096, 4096, 4096))
    assert even.grid == (balanced_grid(512, sms), 1, 1) and even.tensormap.geometry[0] == even.grid
    assert prepare(get_spec("hgemm_tma_wgmma_balanced"), "bf16", Shape(256, 512, 64)).grid == (4, 1, 1)


def test_timing_produces_a_ratio():
    (job,) = bench.plan(["hgemm_naive"], ["fp16"], Shape(512, 512, 512))
    opts = bench.BenchOptions(runs=3, rounds=3, warmup=1, l2_flush_bytes=1 << 24)
    (m,) = list(bench.run_jobs([job], opts))
    assert m.verification.verdict == OK
    t = m.timing
    assert t is not None and t.reference == "cublas_hgemm"
    assert t.l2_flush == "read" and t.l2_flush_bytes == 1 << 24
    assert len(t.round_ratios) == 3 and t.ratio_to_reference is not None
    assert t.tflops.min <= t.tflops.median <= t.tflops.max
    assert m.compile is not None and m.compile.resources["registers"] > 0
    assert m.environment is not None and m.environment.gpu


def test_a_child_is_timed_against_its_parent_in_the_same_rounds():
    """A run holding a stage and its parent (both at their defaults) times the parent in the
    child's rounds: one ratio per round, and parent_steps reads the step from them. A child
    at other parameters gets none (a step is the defaults')."""
    shape = Shape(512, 512, 512)
    jobs = bench.plan(["hgemm_naive", "hgemm_bcf"], ["fp16"], shape)
    odd = bench.plan(["hgemm_bcf"], ["fp16"], shape, {"GROUP": 4})
    opts = bench.BenchOptions(runs=3, rounds=3, warmup=1, l2_flush_bytes=1 << 24)
    parent, child, *rest = list(bench.run_jobs(jobs + odd, opts))
    assert parent.timing.parent is None and parent.timing.parent_round_ratios == ()
    t = child.timing
    assert t.parent == "hgemm_naive" and len(t.parent_round_ratios) == 3
    assert t.ratio_to_parent.median > 1.0   # the bank-conflict-free tiles beat the naive kernel
    assert len(t.round_ratios) == 3 and t.reference == "cublas_hgemm"
    (step,) = bench.parent_steps([parent, child])
    assert step.head_to_head and step.speedup == t.ratio_to_parent.median
    for m in rest:
        assert m.timing.parent is None


@pytest.mark.parametrize("mode", ["read", "write"])
def test_l2_flush_evicts_what_the_last_launch_read(mode):
    """After either flush, a read of 32 MiB (which the 60 MiB L2 holds) takes longer than
    it does straight after the same read: the flush left none of its lines in L2."""
    from perfscope.timing import L2Flush
    cp = require_gpu()
    buf = cp.ones(8 * 2**20, dtype=cp.float32)
    flush = L2Flush(cp, 512 * 2**20, mode)

    def timed(before) -> float:
        times = []
        for _ in range(7):
            before()
            s, e = cp.cuda.Event(), cp.cuda.Event()
            s.record()
            buf.sum()
            e.record()
            e.synchronize()
            times.append(cp.cuda.get_elapsed_time(s, e))
        return sorted(times)[3]

    # The same 32 MiB read just before, then ~100 us of a kernel that touches no memory,
    # so that the GPU is busy while the host enqueues the timed read, as after a flush.
    spin = cp.RawKernel(r"""extern "C" __global__ void spin(long long n) {
        const long long t0 = clock64(); while (clock64() - t0 < n) {} }""", "spin")
    warm = timed(lambda: (buf.sum(), spin((1,), (32,), (np.int64(200_000),))))
    cold = timed(flush)
    assert cold > 1.3 * warm


BATCHED = (Shape(127, 129, 65, batch=3), Shape(512, 256, 1024, batch=8))


@pytest.mark.parametrize("shape", BATCHED, ids=str)
@pytest.mark.parametrize("name", ["cublas_sgemm", "cublas_hgemm", "cublas_bgemm"])
def test_cublas_batch_is_one_strided_batched_launch_and_correct(name, shape):
    """A batched shape runs cuBLAS on 3-D operands (every product checked against float64),
    and a wrong product anywhere in the batch is named with its index."""
    spec = get_spec(name)
    dtype = spec.dtypes[0]
    prep = prepare(spec, dtype, shape)
    v = verify.verify(prep, 1)
    assert v.verdict == OK, f"{name} {shape}: {v.detail}"
    cp = require_gpu()
    a, b = verify.make_inputs(cp, shape, dtype, 1)
    assert a.shape == (shape.batch, shape.m, shape.k) and b.shape == (shape.batch, shape.k, shape.n)
    c = verify.poisoned_output(cp, prep)
    prep.launch(a, b, c)
    # On the host: CuPy has no arithmetic on ml_dtypes' bfloat16.
    host = cp.asnumpy(c)
    host[shape.batch - 1, 5, 7] = np.float32(host[shape.batch - 1, 5, 7]) + np.float32(1000)
    wrong = verify.check_result(cp, a, b, cp.asarray(host), dtype)
    assert wrong.verdict != OK and f"C[{shape.batch - 1}][5][7]" in wrong.detail
