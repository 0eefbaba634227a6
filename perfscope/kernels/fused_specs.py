"""The fused-epilogue stages of ``fused.cu`` (issue 19) as KernelSpecs, and the host-side
choices their launches make.

Both stages take hopper.cu's tensor-map ABI with two pointers appended, ``(TensorMap2D
tmap_a, tmap_b, tmap_c, T* C, int M, int N, int K, const T* bias, const T* residual)``,
and compute ``C = act(A @ B + bias) (+ residual)`` in fp32 before rounding C once. The
epilogue is chosen at compile time by the template parameters ``ACT`` (:data:`ACTIVATIONS`)
and ``RESIDUAL``; KernelSpec has no field for an epilogue yet, so they ride in ``params``.

``hgemm_small_m`` splits K over the CTAs of a thread-block cluster (``cluster = (S, 1, 1)``,
or ``(2S, 1, 1)`` for a pair of tiles sharing an operand; ``S`` read by the kernel from
``%cluster_nctarank``) and reduces the fp32 partials through distributed shared memory;
``S`` depends on the shape and on how many clusters the GPU holds at once, so it is a launch
choice (:func:`split_count`), not a template parameter.

This module imports nothing but :mod:`perfscope.kernels.spec`, so the registry can import
it without a cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from perfscope.errors import PerfscopeError
from perfscope.hardware import OUTPUT_DTYPE
from perfscope.kernels.spec import (
    KernelSpec,
    Params,
    SearchSpace,
    Shape,
    ShapeConstraint,
    TmaBox,
    TmaBoxes,
    ring_and_boxes_smem,
)
from perfscope.kernels.weights import STRIPS64

HALF = ("fp16", "bf16")
SMALL_M = "hgemm_small_m"
SMALL_M_STREAMK = "hgemm_small_m_streamk"
# hgemm_small_m with B in 64-column strips (kernels/weights.py): the same kernel, host
# choice and geometry.
SMALL_M_PACKED = "hgemm_small_m_packed"
SMALL_M_TILED = (SMALL_M, SMALL_M_PACKED)
SOURCE = "fused.cu"
SEED = "000 §7.1"

# The ACT template parameter of the fused stages.
ACTIVATIONS: Mapping[str, int] = {"none": 0, "gelu": 1, "silu": 2}
# hgemm_fused_quant's QUANT template parameter: the one-byte type C is quantised to.
QUANTS: Mapping[str, int] = {"fp8": 1, "int8": 2}
QUANT_STAGE = "hgemm_fused_quant"

# What the spec grid assumes when no GPU is asked (the H200's multiprocessors); the launch
# on a GPU passes the device's own count to split_count.
H200_MULTIPROCESSORS = 132
# Portable cluster size limit (larger clusters need a non-portable opt-in).
MAX_SPLITS = 8
# Fewer k tiles than this per split and the ring never fills before the split is done.
MIN_K_TILES_PER_SPLIT = 4
# hgemm_small_m's ring: 192 KB of the 227 KB a block may take, except at the 64-row tile.
SMALL_M_RING_BYTES = 192 * 1024
# The 64-row tile (M <= 64) streams B and barely computes; there a shallower ring measured
# faster (H200, 2026-12-01, bf16 and fp16 against cublas+gelu, read flush): BN 64 with 8
# stages (64 KB of B in flight per SM) against 12 (96 KB) 0.7-4.5% faster at all six
# BN-64 shapes of M 16 and 64, most at M = 16 (37.5 against 38.8 us at 16 x 8192^2); BN
# 128 with 6 stages against 8 up to 2% faster. More bytes queued than DRAM drains only
# lengthen the queue. At BK 64; other widths keep the 192 KB ring.
SMALL_M_THIN_STAGES = {64: 8, 128: 6}
SMALL_M_MAX_M = 256

_K8_TMA = ShapeConstraint("K", 8, "TMA needs A's row stride to be a multiple of 16 bytes")
_N8_TMA = ShapeConstraint("N", 8, "TMA needs B's and C's row strides (and the bias and residual "
                                  "rows) to be multiples of 16 bytes")


def group_name(act: str, residual: bool, quant: str | None = None) -> str:
    """``cublas+gelu``, ``cublas+silu+residual``, ``cublas+bias``, ``cublas+gelu+fp8``: the
    unfused baseline of an epilogue, cuBLAS followed by one elementwise pass
    (kernels/epilogue.py)."""
    return "+".join(["cublas", act if act != "none" else "bias",
                     *(["residual"] if residual else []), *([quant] if quant else [])])


def quant_of(spec: KernelSpec) -> str | None:
    """The one-byte type a stage's QUANT parameter quantises C to (``fp8``, ``int8``), None
    without one; a code the kernel has no conversion for is refused in one sentence."""
    code = spec.param_dict.get("QUANT")
    if code is None:
        return None
    for name, value in QUANTS.items():
        if value == code:
            return name
    raise PerfscopeError(f"{spec.name} has no output quantisation QUANT={code}; QUANT takes "
                         + ", ".join(f"{v} ({k})" for k, v in QUANTS.items()))


def output_dtype(spec: KernelSpec, dtype: str) -> str:
    """The element type of C: the quantised type of a QUANT stage, bf16 for fp8 inputs,
    else the GEMM's dtype."""
    return quant_of(spec) or OUTPUT_DTYPE.get(dtype, dtype)


_N8_PASS = ShapeConstraint("N", 8, "the elementwise pass reads C and the bias in 16-byte vectors")
_N16_BYTES = ShapeConstraint("N", 16, "C is one byte per element and its rows must start on "
                                      "16-byte boundaries (TMA and 4-byte stores)")


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _slot_bytes(p: Params) -> int:
    return (p["BM"] * p["BK"] + p["BK"] * p["BN"]) * 2


def _tma_boxes(p: Params) -> TmaBoxes:
    # A in BK x BM boxes (BK x AROWS for hgemm_small_m's thin tiers), B in 64-column atoms
    # of BK rows, C (TMA store) in 64 x 64 boxes.
    return TmaBoxes(a=TmaBox(p.get("AROWS", p["BM"]), p["BK"]), b=TmaBox(p["BK"], 64),
                    c=TmaBox(64, 64))


def _mbarriers(p: Params) -> int:
    # A "full" and an "empty" mbarrier (8 bytes each) per ring slot.
    return 2 * p["STAGES"] * 8


_mbarriers.__doc__ = "2 * STAGES * 8 (a full and an empty mbarrier per slot)"


# ------------------------------------------------------------------ hgemm_fused_bias_act
def _bias_act_block(_p: Params) -> tuple[int, int, int]:
    return (384, 1, 1)


_bias_act_block.__doc__ = "(384, 1, 1)"


def _bias_act_grid(p: Params, shape: Shape) -> tuple[int, int, int]:
    return (_ceil(shape.m, p["BM"]) * _ceil(shape.n, p["BN"]), 1, 1)


_bias_act_grid.__doc__ = "(ceil(M/BM) * ceil(N/BN), 1, 1), capped at the multiprocessors"


def _pingpong_smem(p: Params) -> int:
    # The ring, BOXES swizzled 64 x 64 staging boxes per consumer, 1024 bytes of realignment.
    return p["STAGES"] * _slot_bytes(p) + 2 * p["BOXES"] * 64 * 64 * 2 + 1024


_pingpong_smem.__doc__ = "STAGES * (BM*BK + BK*BN) * 2 + 2 * BOXES * 8192 + 1024"


def _pingpong_static(p: Params) -> int:
    # The ring's mbarriers and one order mbarrier per consumer warpgroup.
    return 2 * p["STAGES"] * 8 + 2 * 8


_pingpong_static.__doc__ = "2 * STAGES * 8 + 16 (the ring's mbarriers, two order mbarriers)"


def _quant_smem(p: Params) -> int:
    # The ring and 1024 bytes of realignment: C is stored from registers, not staged.
    return p["STAGES"] * _slot_bytes(p) + 1024


_quant_smem.__doc__ = "STAGES * (BM*BK + BK*BN) * 2 + 1024 (no C staging)"


# ------------------------------------------------------------------------ hgemm_small_m
def small_m_consumers(bm: int) -> int:
    """Consumer warpgroups of hgemm_small_m: one for a 64-row tile, two above."""
    return 1 if bm == 64 else 2


def small_m_tile_rows(m: int) -> int:
    """The BM that covers M rows in one tile row (so B streams once): 64, 128 or 256."""
    if not 1 <= m <= SMALL_M_MAX_M:
        raise ValueError(f"hgemm_small_m covers 1..{SMALL_M_MAX_M} rows in one tile row, not {m}")
    return 64 if m <= 64 else 128 if m <= 128 else 256


def small_m_a_rows(m: int, bm: int) -> int:
    """The rows of A's TMA box: 16 or 32 where M fits them in a 64-row tile (the rest of the
    tile is zeroed once, not zero-filled per k tile), else the whole tile row."""
    if bm == 64:
        return next((r for r in (16, 32) if m <= r), bm)
    return bm


def small_m_params(m: int, bn: int = 128, bk: int = 64, bm: int | None = None) -> dict[str, int]:
    """BM (given, else the one tile row for M), the ring depth (SMALL_M_THIN_STAGES for the
    64-row tile at BK 64, else the deepest ring that fits SMALL_M_RING_BYTES), and A's box
    rows."""
    bm = bm or small_m_tile_rows(m)
    thin = SMALL_M_THIN_STAGES.get(bn) if bm == 64 and bk == 64 else None
    return {"BM": bm, "STAGES": thin or SMALL_M_RING_BYTES // ((bm * bk + bk * bn) * 2),
            "AROWS": small_m_a_rows(m, bm)}


# hgemm_small_m's narrow tile: 64 columns, with 64 rows up to M = 64 and 128 above (two
# tile rows at M = 256), wherever that many tiles fit one wave; else 128 columns and the
# one tile row of small_m_tile_rows. Measured (bf16, against cublas+gelu, 2026-12-01):
# 256x4096x4096 1.048 (BM 128, BN 64) against 0.779 (BM 256, BN 128: 32 tiles, whose
# 4-CTA clusters are not all co-resident, so 96 SMs); 128x8192x8192 1.014 against 0.967;
# 256x8192x8192 is 256 narrow tiles and keeps BM 256, BN 128 (0.963; BM 128 BN 128 0.917).
SMALL_M_NARROW = 64


def small_m_width(shape: Shape, multiprocessors: int = H200_MULTIPROCESSORS) -> int:
    """64 where the shape's 64-column tiles (small_m_narrow_rows high) fit one wave of the
    multiprocessors, else 128."""
    tiles = _ceil(shape.n, SMALL_M_NARROW) * _ceil(shape.m, small_m_narrow_rows(shape.m))
    return SMALL_M_NARROW if tiles <= multiprocessors else 128


# Pairs of 128-row tiles sharing B (MPAIR=2) at M > 128, measured against the single
# tile row's kernel (H200, 2026-12-02, bf16 and fp16, against cublas+gelu in one process,
# fused/small-m-pairs.json): 128 x 128 tiles where two
# rows of them fill one wave (N = 8192 on 132 SMs) 1.02-1.15x faster than the 256-row tile
# and its split-K reduction (192 and 256 x 8192 x 8192, 256 x 8192 x 4096); 128 x 64 tiles
# 1.03-1.06x faster at K = 14336, 1.01-1.03x at 8192, 0.96-0.97x at K = 4096 (even at 6144
# in an earlier run of the same day):
# a short stream does not pay for the pair's lock step and its later first load.
SMALL_M_PAIR_MIN_K_TILES = 128


def small_m_pairs(shape: Shape, bn: int, bk: int = 64,
                  multiprocessors: int = H200_MULTIPROCESSORS) -> bool:
    """Whether the host pairs hgemm_small_m's two 128-row tiles (M > 128) to share B: at BN
    128 where both rows' tiles fill more than half of one wave without a split (a pair that
    also splits K needs clusters of four, which the H200 does not hold 32 of at once: at
    256 x 4096 x 14336 the paired 128 x 128 tiles ran on 64 CTAs, 0.66 of cublas+gelu), at
    BN 64 from SMALL_M_PAIR_MIN_K_TILES k tiles."""
    if shape.m <= 128 or shape.m > SMALL_M_MAX_M:
        return False
    if bn == 128:
        return multiprocessors // 2 < 2 * _ceil(shape.n, 128) <= multiprocessors
    return bn == SMALL_M_NARROW and _ceil(shape.k, bk) >= SMALL_M_PAIR_MIN_K_TILES


# Paired 128 x 128 tiles that also split K over the grid (GSPLIT=2: part 1's fp32 fragments
# through the stream-K workspace, no cluster of 4) where the pairs alone fill at most half
# the SMs and K is long. Measured (H200, 2026-12-04, fused/small-m-gsplit.json, bf16 / fp16
# against cublas+gelu, each configuration in its own alternating rounds): 1.048 / 1.053 at
# 256 x 4096 x 14336, where the paired 128 x 64 tiles the host took before ran 0.950 / 0.932
# and unpaired 128 x 128 tiles split the same way 0.929 / 0.958; at 256 x 4096 x 4096 (64 k
# tiles) 1.001 / 0.987 against 1.062 / 1.066 for the host's 128 x 64 tiles. The k-tile
# threshold is the pairs' own (SMALL_M_PAIR_MIN_K_TILES); no shape between was timed.
# The tile small_m_grid_split takes: paired 128 x 128 tiles in two parts of K.
SMALL_M_GRID_SPLIT = {"BM": 128, "BN": 128, "MPAIR": 2, "GSPLIT": 2}


def small_m_grid_split(shape: Shape, bk: int = 64,
                       multiprocessors: int = H200_MULTIPROCESSORS) -> bool:
    """Whether the host takes SMALL_M_GRID_SPLIT for this shape: M above 128, both parts'
    CTAs within the SMs (so all are resident at once), and at least
    SMALL_M_PAIR_MIN_K_TILES k tiles."""
    if not 128 < shape.m <= SMALL_M_MAX_M or _ceil(shape.k, bk) < SMALL_M_PAIR_MIN_K_TILES:
        return False
    gx, gy, gz = small_m_grid_for({**SMALL_M_GRID_SPLIT, "BK": bk}, shape, 1)
    return gx * gy * gz <= multiprocessors


def small_m_narrow_rows(m: int) -> int:
    """The tile rows beside 64 columns: 64 up to M = 64, else 128 (two tile rows at M = 256)."""
    return 64 if m <= 64 else 128


# hgemm_small_m_streamk's rows: one 64-row tile row (the kernel takes more, each tile row
# streaming B again, 0.3-0.5 of hgemm_small_m's speed at M = 256 on the H200).
STREAMK_MAX_M = 64


def check_small_m(spec: KernelSpec, shape: Shape) -> None:
    """Refuse, in one sentence, an M hgemm_small_m (or its stream-K child) does not cover."""
    most = {SMALL_M: SMALL_M_MAX_M, SMALL_M_PACKED: SMALL_M_MAX_M,
            SMALL_M_STREAMK: STREAMK_MAX_M}.get(spec.name)
    if most is not None and not 1 <= shape.m <= most:
        raise PerfscopeError(f"{spec.name} covers M of 1 to {most}, not M={shape.m}; take "
                             + ("hgemm_small_m" if shape.m <= SMALL_M_MAX_M
                                else "hgemm_fused_bias_act") + " for that shape")


# hgemm_small_m's GSPLIT: at most this many parts of K over the grid's z.
SMALL_M_MAX_GSPLIT = 4


def check_small_m_gsplit(spec: KernelSpec, shape: Shape,
                         multiprocessors: int = H200_MULTIPROCESSORS) -> None:
    """Refuse, in one sentence, a GSPLIT hgemm_small_m cannot run: above SMALL_M_MAX_GSPLIT,
    with two m64 fragments per consumer (BM 256), more parts than k tiles, more CTAs than
    multiprocessors (part 0 waits for the other parts, so all must be resident at once),
    or more pushed fragments than the stream-K workspace's STREAMK_MAX_CTAS slots."""
    p = spec.param_dict
    g = p.get("GSPLIT", 1)
    if g == 1:
        return
    if not 1 <= g <= SMALL_M_MAX_GSPLIT:
        raise PerfscopeError(f"{spec.name} splits K over the grid into 1 to {SMALL_M_MAX_GSPLIT} "
                             f"parts, not GSPLIT={g}")
    if p["BM"] // 64 // small_m_consumers(p["BM"]) != 1:
        raise PerfscopeError(f"{spec.name} with GSPLIT={g} needs one m64 fragment per consumer "
                             f"(BM 64 or 128), not BM={p['BM']}")
    _, _, k_tiles = small_m_tiles(p, shape)
    gx, gy, _ = small_m_grid_for(p, shape, 1)
    if k_tiles < g:
        raise PerfscopeError(f"{spec.name} cannot split K={shape.k} ({k_tiles} k tiles) into "
                             f"GSPLIT={g} parts")
    if gx * gy * g > multiprocessors:
        raise PerfscopeError(f"{spec.name} with GSPLIT={g} at {shape} needs {gx * gy * g} CTAs "
                             f"resident at once, more than the {multiprocessors} SMs; take a "
                             "smaller GSPLIT or wider tiles")
    if gx * gy * (g - 1) > STREAMK_MAX_CTAS:
        raise PerfscopeError(f"{spec.name} with GSPLIT={g} at {shape} pushes {gx * gy * (g - 1)} "
                             f"partial tiles, more than the workspace's {STREAMK_MAX_CTAS} slots")


def small_m_pair(p: Params) -> int:
    """CTAs of hgemm_small_m that share one operand's loads: 2 with MCAST=2 (A, two N tiles)
    or MPAIR=2 (B, two M tiles), else 1."""
    return p.get("MCAST", 1) * p.get("MPAIR", 1)


def check_small_m_pairs(spec: KernelSpec, shape: Shape) -> None:
    """Refuse, in one sentence, MCAST=2 where the N tiles do not pair up (an odd count),
    MPAIR=2 where the M tiles do not, and the two together."""
    p = spec.param_dict
    tiles_n, tiles_m, _ = small_m_tiles(p, shape)
    if p.get("MCAST", 1) == 2 and p.get("MPAIR", 1) == 2:
        raise PerfscopeError(f"{spec.name} pairs CTAs to share A (MCAST=2) or B (MPAIR=2), not both; "
                             "take one of them")
    if p.get("MCAST", 1) == 2 and tiles_n % 2:
        raise PerfscopeError(f"{spec.name} with MCAST=2 pairs adjacent N tiles, but N={shape.n} makes "
                             f"{tiles_n} tiles of {p['BN']} columns, an odd count; take MCAST=1")
    if p.get("MPAIR", 1) == 2 and tiles_m % 2:
        raise PerfscopeError(f"{spec.name} with MPAIR=2 pairs adjacent M tiles, but M={shape.m} makes "
                             f"{tiles_m} tile row(s) of {p['BM']}, an odd count; take MPAIR=1 "
                             "(or a BM that gives two tile rows)")


def small_m_for(spec: KernelSpec, shape: Shape, pinned: Mapping[str, int] | None = None,
                multiprocessors: int = H200_MULTIPROCESSORS) -> KernelSpec:
    """hgemm_small_m with BN chosen for the shape (small_m_width), MPAIR (small_m_pairs, which
    takes 128-row tiles) and BM, STAGES and AROWS for M (small_m_params), each unless pinned;
    or, where small_m_grid_split says for this many multiprocessors and no tile parameter is
    pinned, paired 128 x 128 tiles split over the grid (GSPLIT=2); any other stage unchanged."""
    if spec.name == SMALL_M_STREAMK:
        return _streamk_for(spec, shape, pinned or {})
    if spec.name not in SMALL_M_TILED:
        return spec
    check_small_m(spec, shape)
    pinned = pinned or {}
    bk = spec.param_dict["BK"]
    if (not pinned.keys() & {"BM", "BN", "MCAST", "MPAIR", "GSPLIT"}
            and small_m_grid_split(shape, bk, multiprocessors)):
        tile = {**SMALL_M_GRID_SPLIT, **small_m_params(shape.m, 128, bk, 128)}
    else:
        bn = pinned.get("BN", small_m_width(shape))
        # Pairs only where nothing pinned rules them out (A shared instead, no pair, 256 rows).
        pairs = (pinned.get("MPAIR", 2) == 2 and pinned.get("MCAST", 1) == 1
                 and pinned.get("BM", 128) == 128 and small_m_pairs(shape, bn, bk))
        bm = pinned.get("BM", small_m_narrow_rows(shape.m) if bn == SMALL_M_NARROW or pairs
                        else small_m_tile_rows(shape.m))
        tile = {"BN": bn, "MPAIR": 2 if pairs else 1, **small_m_params(shape.m, bn, bk, bm)}
    chosen = {k: v for k, v in tile.items() if k not in pinned}
    out = spec.with_params(**chosen) if chosen else spec
    check_small_m_pairs(out, shape)
    check_small_m_gsplit(out, shape, multiprocessors)
    return out


# hopper.cuh's SK_MAX_CTAS: the stream-K workspace (module data) holds a partial and a flag
# for this many CTAs.
STREAMK_MAX_CTAS = 160


def streamk_ctas(p: Params, shape: Shape, multiprocessors: int) -> int:
    """CTAs of hgemm_small_m_streamk: one per multiprocessor (at most STREAMK_MAX_CTAS), or
    fewer where the shape has fewer than MIN_K_TILES_PER_SPLIT units (tile x k tile) each."""
    tiles_n, tiles_m, k_tiles = small_m_tiles(p, shape)
    return max(1, min(multiprocessors, STREAMK_MAX_CTAS,
                      tiles_n * tiles_m * k_tiles // MIN_K_TILES_PER_SPLIT))


def _streamk_for(spec: KernelSpec, shape: Shape, pinned: Mapping[str, int]) -> KernelSpec:
    """hgemm_small_m_streamk with hgemm_small_m's width for the shape (small_m_width: 64
    columns where those tiles are no more than the SMs, so no CTA's range spans more than
    K and its k tiles run in ascending order), the 64-row tile's measured ring for that
    width (SMALL_M_THIN_STAGES) and A's box rows for M, each unless pinned."""
    check_small_m(spec, shape)
    bn = pinned.get("BN", small_m_width(shape))
    chosen = {k: v for k, v in {"BN": bn, **small_m_params(shape.m, bn, spec.param_dict["BK"], 64)
                                }.items() if k not in pinned}
    return spec.with_params(**chosen) if chosen else spec


def fused_geometry(spec: KernelSpec, shape: Shape, multiprocessors: int,
                   fits: Callable[[int, int], bool] | None = None
                   ) -> tuple[tuple[int, int, int], int]:
    """(grid, cluster size) of a fused stage's launch on a GPU with this many
    multiprocessors: hgemm_small_m's clusters of MCAST x MPAIR x S CTAs (``fits(ctas, clusters)``:
    that many clusters of that many CTAs co-resident), the persistent grid of
    hgemm_fused_bias_act."""
    if spec.name == SMALL_M_STREAMK:
        check_small_m(spec, shape)
        return (streamk_ctas(spec.param_dict, shape, multiprocessors), 1, 1), 1
    if spec.name in SMALL_M_TILED:
        check_small_m(spec, shape)
        p = spec.param_dict
        tiles_n, tiles_m, k_tiles = small_m_tiles(p, shape)
        pair = small_m_pair(p)
        check_small_m_pairs(spec, shape)
        if p.get("GSPLIT", 1) > 1:
            check_small_m_gsplit(spec, shape, multiprocessors)
            grid = small_m_grid_for(p, shape, 1)
            # Part 0 (z = 0, launched first) waits for the other parts: beside all of part
            # 0's clusters at least one more must be resident, so some part 0 finishes and
            # frees its SMs (check_small_m_gsplit already keeps every CTA within the SMs).
            clusters = grid[0] * grid[1] // pair + 1
            if fits is not None and pair > 1 and not fits(pair, clusters):
                raise PerfscopeError(f"{spec.name} with GSPLIT={p['GSPLIT']} at {shape} needs "
                                     f"{clusters} clusters of {pair} resident at once, more than "
                                     "this GPU holds; take GSPLIT=1")
            return grid, pair
        tiles = tiles_n * tiles_m
        splits = split_count(tiles, k_tiles, multiprocessors,
                             None if fits is None else lambda s: fits(s * pair, tiles // pair),
                             MAX_SPLITS // pair)
        return small_m_grid_for(p, shape, splits), splits * pair
    tiles = spec.grid_dims(shape)[0]
    return (max(1, min(tiles, multiprocessors)), 1, 1), 1


def split_count(tiles: int, k_tiles: int, multiprocessors: int,
                fits: Callable[[int], bool] | None = None, max_splits: int = MAX_SPLITS) -> int:
    """Split-K factor S of hgemm_small_m: the largest S <= max_splits with at least
    MIN_K_TILES_PER_SPLIT k tiles per split and tiles * S <= multiprocessors, for which
    ``fits(S)`` holds (all ``tiles`` clusters of S CTAs co-resident, asked of the driver);
    1 when none does. One wave, every CTA streaming an equal share of B."""
    limit = min(max_splits, k_tiles // MIN_K_TILES_PER_SPLIT, multiprocessors // max(tiles, 1))
    for s in range(limit, 1, -1):
        if fits is None or fits(s):
            return s
    return 1


def small_m_tiles(p: Params, shape: Shape) -> tuple[int, int, int]:
    """(tiles along N, tiles along M, k tiles) of hgemm_small_m for a shape."""
    return _ceil(shape.n, p["BN"]), _ceil(shape.m, p["BM"]), _ceil(shape.k, p["BK"])


def small_m_grid_for(p: Params, shape: Shape, splits: int) -> tuple[int, int, int]:
    """CTA x = n tile * S + split (a cluster is S consecutive CTAs along x), y = m tile; with
    MPAIR=2, x = (n tile * 2 + m tile % 2) * S + split and y = m tile / 2 (a cluster is the
    2 S CTAs of two vertically adjacent tiles)."""
    tiles_n, tiles_m, _ = small_m_tiles(p, shape)
    mpair = p.get("MPAIR", 1)
    return (tiles_n * splits * mpair, _ceil(tiles_m, mpair), p.get("GSPLIT", 1))


def _small_m_grid(p: Params, shape: Shape) -> tuple[int, int, int]:
    tiles_n, tiles_m, k_tiles = small_m_tiles(p, shape)
    pair = small_m_pair(p)
    if p.get("GSPLIT", 1) > 1:   # split over the grid's z, not the cluster
        return small_m_grid_for(p, shape, 1)
    return small_m_grid_for(p, shape, split_count(tiles_n * tiles_m, k_tiles, H200_MULTIPROCESSORS,
                                                  max_splits=MAX_SPLITS // pair))


_small_m_grid.__doc__ = ("(ceil(N/BN) * S * MPAIR, ceil(M/BM/MPAIR), GSPLIT), S = "
                         "split_count(...) for 132 SMs (1 with GSPLIT > 1); the launch uses the "
                         "device's count and cluster dims (MCAST * MPAIR * S, 1, 1)")


def _small_m_block(p: Params) -> tuple[int, int, int]:
    return (128 * (1 + small_m_consumers(p["BM"])), 1, 1)


_small_m_block.__doc__ = "(128 * (1 + CONS), 1, 1), CONS = 1 for BM 64, else 2"


def small_m_push(p: Params) -> bool:
    """Whether hgemm_small_m hands a split's partial over by st.async (fused.cu's PUSH: a
    64 x 64 tile, no pair, no grid split), into shared memory past the ring."""
    return (p["BM"] == 64 and p["BN"] == 64 and p.get("MCAST", 1) == 1
            and p.get("MPAIR", 1) == 1 and p.get("GSPLIT", 1) == 1)


def _small_m_smem(p: Params) -> int:
    # PUSH: the peer's fp32 partial, 128 consumer threads x 32 floats, past the ring.
    return p["STAGES"] * _slot_bytes(p) + (128 * 32 * 4 if small_m_push(p) else 0) + 1024


_small_m_smem.__doc__ = ("STAGES * (BM*BK + BK*BN) * 2 + 1024, + 16384 for the peer's partial "
                         "where BM = BN = 64 without a pair or a grid split")


def _small_m_mbarriers(p: Params) -> int:
    # The ring's, and with PUSH the barrier the peer's partial completes on and one more
    # (fused.cu keeps the block at a multiple of 16 bytes, as ptxas rounds it).
    return _mbarriers(p) + (16 if small_m_push(p) else 0)


_small_m_mbarriers.__doc__ = "2 * STAGES * 8, + 16 where the partial is pushed (BM = BN = 64)"


def _streamk_grid(p: Params, shape: Shape) -> tuple[int, int, int]:
    return (streamk_ctas(p, shape, H200_MULTIPROCESSORS), 1, 1)


_streamk_grid.__doc__ = ("(min(132, ceil(M/64) * ceil(N/BN) * ceil(K/BK) / 4), 1, 1): a CTA per "
                         "multiprocessor (the launch uses the device's count)")


def _streamk_block(_p: Params) -> tuple[int, int, int]:
    return (256, 1, 1)


_streamk_block.__doc__ = "(256, 1, 1)"


def _streamk_smem(p: Params) -> int:
    # The ring, BN / 64 staging boxes of 64 x 64 (the ring stays busy while a tile is
    # stored mid-range), 1024 bytes of realignment.
    return p["STAGES"] * _slot_bytes(p) + p["BN"] // 64 * 64 * 64 * 2 + 1024


_streamk_smem.__doc__ = "STAGES * (BM*BK + BK*BN) * 2 + BN / 64 * 8192 + 1024"


_COMMON = {"family": "fused", "dtypes": HALF, "source": SOURCE, "seed": SEED,
           "parent": "hgemm_tma_wgmma_persistent", "min_cc": 90, "only_cc": (90,),
           "archs": ("sm_90a",), "abi": "tensormap", "tma_boxes": _tma_boxes,
           "constraints": (_K8_TMA, _N8_TMA), "absent": ("hmma", "ldgsts"),
           "static_smem": _mbarriers}

# What `perfscope tune` may vary in hgemm_fused_bias_act: its parent's space
# (registry._SPACE_PERSISTENT: the ring, the tile order, the staging boxes, stream-K or the
# tail split, the deferred store); the epilogue (ACT, RESIDUAL) is held at the stage's, or
# at what --param pins.
_SPACE_BIAS_ACT = SearchSpace(values=(
    ("BM", (128,)), ("BN", (128, 256)), ("BK", (64,)), ("STAGES", (2, 3, 4, 5, 6)),
    ("GROUP", (1, 2, 4, 8, 16)), ("ACT", tuple(ACTIVATIONS.values())), ("RESIDUAL", (0, 1)),
    ("BOXES", (1, 2, 4)), ("STREAMK", (0, 1, 3)), ("DEFER", (0, 1))),
    held=("ACT", "RESIDUAL"))

# hgemm_small_m's template parameters before PACKED (hgemm_small_m_packed appends it).
_SMALL_M_PARAMS = (("BM", 64), ("BN", 128), ("BK", 64), ("STAGES", 8),
                   ("ACT", ACTIVATIONS["gelu"]), ("RESIDUAL", 0), ("AROWS", 64),
                   ("MCAST", 1), ("MPAIR", 1), ("GSPLIT", 1))

FUSED: tuple[KernelSpec, ...] = (
    KernelSpec(name="hgemm_fused_bias_act", entry="hgemm_fused_bias_act",
               params=(("BM", 128), ("BN", 256), ("BK", 64), ("STAGES", 3), ("GROUP", 8),
                       ("ACT", ACTIVATIONS["gelu"]), ("RESIDUAL", 0), ("BOXES", 4),
                       ("STREAMK", 0), ("DEFER", 0)),
               block=_bias_act_block, grid=_bias_act_grid, persistent=True,
               dynamic_smem=ring_and_boxes_smem, fingerprint=("tma", "gmma", "setmaxreg"),
               space=_SPACE_BIAS_ACT,
               change="Applies + bias[n], the activation (GELU-tanh or SiLU, in fp32) and an "
                      "optional + residual[m][n] to the fp32 accumulators before the TMA-store "
                      "epilogue, so C is written once instead of being re-read by elementwise "
                      "passes.",
               notes="ABI: the tensor-map ABI plus (const T* bias, const T* residual); ACT "
                     "(0 none, 1 GELU-tanh, 2 SiLU) and RESIDUAL (0/1) are template parameters. "
                     "The residual may alias C. Halfway through each tile's k loop each "
                     "consumer thread loads its bias pairs into registers (without a residual: "
                     "read between the tiles they cost 2.2% at 4096^3, "
                     "benchmarks/epilogue_cost.py) or, with one, the residual rows are "
                     "prefetched into L2. BOXES, STREAMK and DEFER are the parent's tuning "
                     "options (staging boxes, stream-K or the tail split, the deferred store), "
                     "searched by `perfscope tune` with the epilogue held.", **_COMMON),
    KernelSpec(name="hgemm_small_m", entry="hgemm_small_m", params=_SMALL_M_PARAMS,
               block=_small_m_block, grid=_small_m_grid, dynamic_smem=_small_m_smem,
               fingerprint=("tma", "gmma"),
               change="For M <= 256: one thin tile row (M zero-padded to BM), a deep ring "
                      "(6 x 16 KB of B in flight per SM at BM 64, BN 128; 8 x 8 KB at BN 64) "
                      "and split-K over a thread-block "
                      "cluster whose fp32 partials the splits reduce together in distributed "
                      "shared memory (a 64 x 64 tile's second split pushes its partial into the "
                      "first's by st.async, with no cluster barrier between the k loop and the "
                      "epilogue), so about every SM streams its own slab of B once and the "
                      "fused epilogue runs once per output element; above M = 128, pairs of "
                      "128-row tiles whose two CTAs share each B tile by TMA multicast "
                      "(MPAIR=2), split over the grid (GSPLIT=2, the partials through a global "
                      "workspace) where the pairs alone would leave half the SMs idle.",
               notes="Launched with cluster dims (P * S, 1, 1), P = MCAST * MPAIR, S from "
                     "split_count (the kernel reads it from %cluster_nctarank); a launch "
                     "without the cluster "
                     "attribute gives S = 1 per CTA, so the grid's S CTAs per tile would each "
                     "compute the whole tile. BM by M: 64 / 128 / 256 (small_m_params), "
                     "STAGES to fill 192 KB above 64 rows and 8 / 6 at BN 64 / 128 for the "
                     "64-row tile (measured: SMALL_M_THIN_STAGES), AROWS (A's box rows) 16 / 32 "
                     "for M <= 16 / 32; "
                     "BN 64 (with BM 64, or 128 above 64 rows) where those tiles fit one wave, "
                     "else 128 (small_m_width); MPAIR=2 with BM 128 above M = 128 where "
                     "small_m_pairs says (measured: 128-column tiles whose two rows fit one "
                     "wave, 64-column ones from 128 k tiles). "
                     "Same ABI and epilogue parameters as hgemm_fused_bias_act. MCAST=2 "
                     "multicasts A across pairs of N tiles (clusters of 2 x S CTAs); measured "
                     "slower on the H200 (0.67-0.99 of MCAST=1's speed), so 1 stays the "
                     "default. GSPLIT > 1 splits K over the grid's z instead of the cluster "
                     "(the parts' fp32 fragments through hopper.cuh's stream-K workspace, part "
                     "0 finishing), so pairs can split without clusters of 4; every CTA must "
                     "be co-resident (check_small_m_gsplit).",
               **{**_COMMON, "static_smem": _small_m_mbarriers}),
    KernelSpec(name=SMALL_M_PACKED, entry=SMALL_M, params=(*_SMALL_M_PARAMS, ("PACKED", 1)),
               block=_small_m_block, grid=_small_m_grid, dynamic_smem=_small_m_smem,
               fingerprint=("tma", "gmma"), weight_layout=STRIPS64,
               change="Takes the weight B packed once into 64-column strips (each strip's K "
                      "rows of 128 bytes one after another) instead of row-major K x N, so "
                      "every TMA box a CTA loads is 8 KB of contiguous memory rather than 64 "
                      "rows of 128 bytes 2N bytes apart, and a decode GEMM's weight stream "
                      "runs nearer the rate of a plain read.",
               notes="The same kernel, tile choice, grid and epilogue as hgemm_small_m "
                     "(PACKED=1 changes only B's TMA coordinates; the shared-memory image and "
                     "the wgmmas are the same, so C is bit-identical to hgemm_small_m's: "
                     "tests/test_gpu_fused.py checks it). B is packed by "
                     "Prepared.weight (kernels/weights.py: K zero-padded to whole k tiles, N "
                     "to whole strips) once per weight, before any launch is timed, as an "
                     "inference engine packs a model's weights when it loads them; every "
                     "reference still reads the row-major matrix. Bench, verify and profile "
                     "pack B themselves; Prepared.launch refuses a B of any other shape.",
               addresses=("PS172",),
               **{**_COMMON, "parent": SMALL_M, "static_smem": _small_m_mbarriers}),
    KernelSpec(name=SMALL_M_STREAMK, entry=SMALL_M_STREAMK,
               params=(("BM", 64), ("BN", 64), ("BK", 64), ("STAGES", 8),
                       ("ACT", ACTIVATIONS["gelu"]), ("RESIDUAL", 0), ("AROWS", 64)),
               block=_streamk_block, grid=_streamk_grid, dynamic_smem=_streamk_smem,
               fingerprint=("tma", "gmma"),
               change="Spreads the 64-row tile's work evenly over one CTA per SM, k tile by "
                      "k tile (stream-K over every tile), instead of one CTA or cluster of "
                      "splits per tile, so every SM streams its 1/132 of B where 64-column "
                      "tiles left 4 of 132 SMs idle (and 128-column ones 20 at N = 14336), and "
                      "a tile cut between CTAs is finished by the one holding its last k "
                      "tile from the others' fp32 partials, pushed early through a global "
                      "workspace.",
               notes="Measured slower on the H200 (2026-12-04, fused/streamk-check.json.xz): "
                     "0.87-0.92 of hgemm_small_m's speed at the M = 16 and 64 decode shapes "
                     "with N or K of 8192 or 14336 (0.82-0.84 at N = K = 4096); with one CTA "
                     "per tile (the parent's work, no cut) 0.97-1.01 "
                     "(fused/streamk-grid-probe.json), so the cut tiles cost more than the 4 "
                     "or 20 idle SMs give back: under ncu DRAM runs at 70% (74%) of peak "
                     "against the parent's 80% (78%) at 16 x 8192^2 (16 x 14336 x 4096) with "
                     "the same bytes, and `perfscope diff` names only that (PS170). "
                     "A range runs the start of its last tile first and the end of its "
                     "first tile last, so its k tiles ascend and the grid reads B's rows in "
                     "phase; the piece with a tile's last k tile finishes it and the other "
                     "pieces (run first in theirs) push their partials early, so no cluster "
                     "and no barrier after the stream. M <= 64. "
                     "Same ABI as hgemm_small_m; the partials and their flags are "
                     "hopper.cuh's stream-K workspace (module data, a slot per CTA: at most "
                     "160 CTAs), which the finishers leave zeroed, so launches of one module "
                     "must not overlap. Every CTA must "
                     "be co-resident (a finisher waits for earlier CTAs): one per SM. BN as "
                     "hgemm_small_m's (small_m_width) with the 64-row tile's measured rings "
                     "(SMALL_M_THIN_STAGES) and A's box rows by M (16 / 32 / 64).",
               variant=True, **{**_COMMON, "parent": SMALL_M}),
    KernelSpec(name="hgemm_fused_pingpong", entry="hgemm_fused_pingpong",
               params=(("BM", 64), ("BN", 256), ("BK", 64), ("STAGES", 4), ("GROUP", 16),
                       ("ACT", ACTIVATIONS["gelu"]), ("RESIDUAL", 0), ("BOXES", 2)),
               block=_bias_act_block, grid=_bias_act_grid, persistent=True,
               dynamic_smem=_pingpong_smem, fingerprint=("tma", "gmma", "setmaxreg"),
               change="The two consumer warpgroups take turns instead of sharing each tile: "
                      "each owns whole 64 x 256 tiles, and one's k loop starts when the other "
                      "has issued its last wgmma, so each tile's bias + activation + store runs "
                      "under the other warpgroup's wgmmas instead of idling the tensor pipe.",
               notes="Measured slower on the H200 (0.96-1.03 of cublas+gelu at M = 4096 "
                     "against the parent's 1.01-1.07, 2026-12-02): the epilogue hides, but a 64-row "
                     "tile's operands (1.67x the L2 bytes per FLOP of the cooperative "
                     "128 x 256 tile) keep one warpgroup's wgmmas waiting at the full "
                     "barrier; 128 x 128 tiles per consumer (BM=128 BN=128, 1.33x the bytes) "
                     "are no faster (0.93-0.98). Same ABI and epilogue parameters as "
                     "hgemm_fused_bias_act; BOXES staging boxes of 64 x 64 per consumer.",
               addresses=("PS124",), variant=True,
               **{**_COMMON, "parent": "hgemm_fused_bias_act", "static_smem": _pingpong_static}),
    KernelSpec(name=QUANT_STAGE, entry=QUANT_STAGE,
               params=(("BM", 128), ("BN", 256), ("BK", 64), ("STAGES", 4), ("GROUP", 8),
                       ("ACT", ACTIVATIONS["gelu"]), ("RESIDUAL", 0), ("QUANT", QUANTS["fp8"])),
               block=_bias_act_block, grid=_bias_act_grid, persistent=True,
               dynamic_smem=_quant_smem, fingerprint=("tma", "gmma", "setmaxreg"),
               change="Quantises the epilogue's output to one byte before it is stored: fp8 "
                      "e4m3 with a per-tensor scale read on the device, and the amax of the "
                      "unscaled outputs reduced in the epilogue for the next step's scale "
                      "(QUANT=1), or int8 with a per-row scale (QUANT=2); C is written from "
                      "registers, so the C staging's shared memory becomes a fourth ring slot.",
               notes="ABI: the tensor-map ABI with C as unsigned char* and (const T* bias, "
                     "const T* residual, const float* scale, float* amax) appended; scale is "
                     "one float (fp8) or M floats (int8); amax is max-ed into (zero it first) "
                     "or nullptr. Rounding: one fp32 multiply x*scale, then e4m3 "
                     "round-to-nearest-even with satfinite, or int8 round-to-nearest-even "
                     "saturated to [-128, 127].",
               **{**_COMMON, "parent": "hgemm_fused_bias_act",
                  "constraints": (_K8_TMA, _N8_TMA, _N16_BYTES)}),
)

# The unfused baselines, one per epilogue: cuBLAS (cupy.matmul), then one elementwise pass
# that re-reads C, applies the epilogue in fp32 and writes C again (kernels/epilogue.py).
# References like cuBLAS itself (family "cublas"), they are what a fused stage is timed and
# diffed against: `perfscope bench hgemm_fused_bias_act`, `perfscope diff A cublas+gelu`.
GROUPS: tuple[KernelSpec, ...] = tuple(
    KernelSpec(name=group_name(act, bool(res)), family="cublas", dtypes=HALF,
               params=(("ACT", code), ("RESIDUAL", res)),
               change=f"cuBLAS GEMM through cupy.matmul, then one elementwise pass in place: + "
                      f"bias[n]{'' if act == 'none' else ', ' + act.upper() + ' in fp32'}"
                      f"{', + residual[m][n]' if res else ''} (C written, re-read and written "
                      "again; two launches).",
               seed=SEED, fingerprint=("gmma",), constraints=(_N8_PASS,),
               notes="A group of two launches: times and traffic are the sum of both.")
    for act, code in ACTIVATIONS.items() for res in (0, 1)) + tuple(
    KernelSpec(name=group_name("gelu", False, quant), family="cublas", dtypes=HALF,
               params=(("ACT", ACTIVATIONS["gelu"]), ("RESIDUAL", 0), ("QUANT", code)),
               change="cuBLAS GEMM through cupy.matmul into a scratch C of the GEMM's dtype, then "
                      "one elementwise pass: + bias[n], GELU in fp32, x*scale quantised to "
                      f"{quant} into the one-byte output"
                      f"{' and amax max-ed' if quant == 'fp8' else ''} (two launches).",
               seed=SEED, fingerprint=("gmma",), constraints=(_N8_PASS, _N16_BYTES),
               notes="A group of two launches: times and traffic are the sum of both. The same "
                     "rounding as hgemm_fused_quant (activation.cuh's quant::two).")
    for quant, code in QUANTS.items())

BY_NAME: Mapping[str, KernelSpec] = {s.name: s for s in FUSED + GROUPS}
