"""The registry: every stage of both ladders and the cuBLAS references, as one tuple,
and the stages perfscope compiles and audits but has never run, as a second one.

Geometry and parameters here follow the header comment of each kernel in sgemm.cu,
hgemm.cu and blackwell.cu; ``tests/test_kernels.py`` compiles every entry for sm_80 and
sm_90a and holds the static shared memory ptxas reports against what the spec declares;
``tests/test_sass.py`` audits every stage's SASS against its fingerprint for its archs.

``COMPILED_ONLY`` is a separate tuple on purpose: everything that runs kernels (bench and
profile "all", the GPU tests, the rule validation matrix) iterates ``REGISTRY`` and so
can never pick up a stage no GPU has executed.
"""

from __future__ import annotations

from collections.abc import Mapping

from perfscope.errors import PerfscopeError
from perfscope.kernels.epilogue import epilogue_of
from perfscope.kernels.fused_specs import FUSED, GROUPS, H200_MULTIPROCESSORS, small_m_for
from perfscope.kernels.maps import operand_reads_of
from perfscope.kernels.spec import (
    FP8,
    KernelSpec,
    Params,
    SearchSpace,
    Shape,
    ShapeConstraint,
    SpaceRule,
    TmaBox,
    TmaBoxes,
    no_smem,
    ring_and_boxes_smem,
    tile_grid,
)
from perfscope.stage import OperandRead, StageInfo

HALF = ("fp16", "bf16")


def _threads(n: int):
    def block(_params: Params) -> tuple[int, int, int]:
        return (n, 1, 1)

    block.__doc__ = f"({n}, 1, 1)"
    return block


def _block_of(formula: str, fn):
    """A 1-D block whose thread count the kernel derives from its template parameters."""

    def block(p: Params) -> tuple[int, int, int]:
        return (fn(p), 1, 1)

    block.__doc__ = f"({formula}, 1, 1)"
    return block


_NAIVE_BLOCK = _block_of("BM * BN", lambda p: p["BM"] * p["BN"])
_SMEM_BLOCK = _block_of("TILE * TILE", lambda p: p["TILE"] * p["TILE"])
_REG_BLOCK = _block_of("(BM / TM) * (BN / TN)", lambda p: (p["BM"] // p["TM"]) * (p["BN"] // p["TN"]))
_WARP_BLOCK = _block_of("(BM / WM) * (BN / WN) * 32",
                        lambda p: (p["BM"] // p["WM"]) * (p["BN"] // p["WN"]) * 32)


def _tiles_smem(stages: int | str, elem: int, pad_m: int = 0):
    """STAGES copies of an A tile BK x (BM + pad) and a B tile BK x BN, elem bytes each."""

    def smem(p: Params) -> int:
        n = p[stages] if isinstance(stages, str) else stages
        return n * (p["BK"] * (p["BM"] + pad_m) + p["BK"] * p["BN"]) * elem

    return smem


_K4 = ShapeConstraint("K", 4, "A's rows are read as 16-byte float4 vectors")
_N4 = ShapeConstraint("N", 4, "B's and C's rows are accessed as 16-byte float4 vectors")
_K8 = ShapeConstraint("K", 8, "A's rows are copied in 16-byte cp.async chunks")
_N8 = ShapeConstraint("N", 8, "B's and C's rows are copied in 16-byte chunks")

_HGEMM = {"family": "hgemm", "dtypes": HALF, "source": "hgemm.cu",
          "params": (("BM", 128), ("BN", 128), ("BK", 32), ("GROUP", 8)),
          "block": _threads(256), "grid": tile_grid(), "min_cc": 80,
          "fingerprint": ("ldgsts", "ldsm", "hmma"), "static_smem": _tiles_smem(1, 2),
          # sm_80 instructions only: the mma.sync ladder never reaches for TMA or wgmma.
          "absent": ("gmma", "tma")}

_SGEMM_BASE = {"family": "sgemm", "dtypes": ("fp32",), "source": "sgemm.cu", "min_cc": 80,
               "fingerprint": ("ffma",)}
_N8_TMA = ShapeConstraint("N", 8, "TMA needs B's and C's row strides to be multiples of 16 bytes")
_K8_TMA = ShapeConstraint("K", 8, "TMA needs A's row stride to be a multiple of 16 bytes")



def _ring_smem(staging_rows: int = 0):
    """STAGES ring slots of A (BM x BK) and B (BK x BN), plus staging_rows x BN of C per
    consumer pair, plus 1024 bytes to realign the ring (hopper.cu's header)."""

    def smem(p: Params) -> int:
        return (p["STAGES"] * (p["BM"] * p["BK"] + p["BK"] * p["BN"]) * 2
                + 2 * staging_rows * p["BN"] * 2 + 1024)

    smem.__doc__ = (f"STAGES * (BM*BK + BK*BN) * 2 + {2 * staging_rows} * BN * 2 + 1024"
                    if staging_rows else "STAGES * (BM*BK + BK*BN) * 2 + 1024")
    return smem


def _mbarriers(per_stage: int):
    def smem(p: Params) -> int:
        return per_stage * p["STAGES"] * 8

    return smem


def _tma_boxes(p: Params) -> TmaBoxes:
    # A in BK x BM boxes, B in 64-column atoms of BK rows, C (TMA store) in 64 x 64 boxes.
    return TmaBoxes(a=TmaBox(p["BM"], p["BK"]), b=TmaBox(p["BK"], 64), c=TmaBox(64, 64))


def _persistent_tiles(p: Params, shape: Shape) -> tuple[int, int, int]:
    tiles = -(-shape.m // p["BM"]) * -(-shape.n // p["BN"])
    return (tiles, 1, 1)


_persistent_tiles.__doc__ = "(ceil(M/BM) * ceil(N/BN), 1, 1), capped at the multiprocessors"


def _cluster_pairs(p: Params, shape: Shape) -> tuple[int, int, int]:
    # Two CTAs per pair of vertically adjacent tiles (an odd last row still takes a pair).
    pairs = -(-shape.m // (2 * p["BM"])) * -(-shape.n // p["BN"])
    return (2 * pairs, 1, 1)


_cluster_pairs.__doc__ = ("(2 * ceil(M/(2*BM)) * ceil(N/BN), 1, 1), capped at the co-resident "
                          "clusters x 2")

# The persistent template's configuration `perfscope tune` found fastest at 4096^3
# (probes/tune-persistent.md), where hgemm_tma_wgmma_tuned and _balanced run it.
_TUNED_PERSISTENT = (("BM", 128), ("BN", 256), ("BK", 64), ("STAGES", 4), ("GROUP", 16),
                     ("BOXES", 1), ("STREAMK", 0), ("DEFER", 1))

# hopper.cu's persistent template, as the persistent and stream-K stages launch it.
_PERSISTENT_TEMPLATE = {
    "entry": "hgemm_tma_wgmma_persistent", "block": _threads(384), "grid": _persistent_tiles,
    "persistent": True, "dynamic_smem": ring_and_boxes_smem, "static_smem": _mbarriers(2),
    "fingerprint": ("tma", "gmma", "setmaxreg"),
}

_HOPPER = {"family": "hgemm", "dtypes": HALF, "source": "hopper.cu", "min_cc": 90,
           "only_cc": (90,), "archs": ("sm_90a",), "abi": "tensormap",
           "tma_boxes": _tma_boxes, "constraints": (_K8_TMA, _N8_TMA),
           "absent": ("hmma", "ldgsts")}

# ------------------------------------------------------------------ search spaces
# What `perfscope tune` may vary, read off each template's static_asserts. Limits common to
# every stage (shared memory per block, 48 KiB of static shared memory, TMA boxes of at
# most 256 per dimension, 1024 threads, ptxas spills) are checked by the tuner itself, so
# e.g. BN=256 with 4 or more STAGES is declared here and pruned there (it needs more than
# the 227 KiB an H200 block may opt into).
_WGMMA_N = (128, 256)   # the Wgmma<T, N> specialisations hopper.cuh provides
_RING_STAGES = (2, 3, 4, 5, 6)

_SPACE_TMA_WGMMA = SearchSpace(values=(
    ("BM", (64, 128, 192, 256)), ("BN", _WGMMA_N), ("BK", (64,)), ("STAGES", _RING_STAGES)))
# The warp-specialised stages split BM over two 64-row consumer warpgroups: BM is 128.
_SPACE_WS = SearchSpace(values=(
    ("BM", (128,)), ("BN", _WGMMA_N), ("BK", (64,)), ("STAGES", (2, 3, 4, 5, 6, 7))))
# BOXES: C staging boxes per consumer; 4 is the whole tile at BN 256 and, as 2, at BN 128.
# STREAMK: 1 splits the last partial round of tiles by k iterations (hop::StreamK in
# hopper.cuh); 2, which does so only from 8 rounds up, is the streamk stage's, not searched;
# 3 (the tail split) leaves each tile of that round with its CTA and hands its last k tiles
# to the CTAs the round leaves idle.
# DEFER: 1 sends each finished tile's C a box per k tile of the consumer's next unit, under
# its wgmmas, instead of between the two (64 more registers, no more shared memory).
# STREAMK 2's threshold, hopper.cuh's SK_MIN_ROUNDS: the rounds of tiles over the CTAs from
# which the streamk stage splits its last round (below, it is the persistent stage).
STREAMK_MIN_ROUNDS = 8
_SPACE_PERSISTENT = SearchSpace(values=(
    ("BM", (128,)), ("BN", _WGMMA_N), ("BK", (64,)), ("STAGES", _RING_STAGES),
    ("GROUP", (1, 2, 4, 8, 16)), ("BOXES", (1, 2, 4)), ("STREAMK", (0, 1, 3)),
    ("DEFER", (0, 1))))
_SPACE_CLUSTER = SearchSpace(
    values=(("BM", (128,)), ("BN", _WGMMA_N), ("BK", (64,)), ("STAGES", _RING_STAGES),
            ("GROUP", (2, 4, 8, 16)), ("BOXES", (1, 2, 4)), ("DEFER", (0, 1))),
    rules=(SpaceRule("GROUP must hold whole CTA pairs (a multiple of 2)",
                     lambda p: p["GROUP"] % 2 == 0),))


def _warp_threads(p: Params) -> int:
    return (p["BM"] // p["WM"]) * (p["BN"] // p["WN"]) * 32


_SPACE_PIPE = SearchSpace(
    values=(("BM", (64, 128, 256)), ("BN", (64, 128, 256)), ("BK", (8, 16)),
            ("WM", (16, 32, 64)), ("WN", (32, 64, 128)), ("TM", (4, 8, 16)), ("TN", (4, 8, 16)),
            ("STAGES", (2, 3, 4))),
    rules=(
        SpaceRule("the block tile must split into whole warp tiles and each warp tile into "
                  "whole thread tiles (BM % WM, BN % WN, WM % TM, WN % TN)",
                  lambda p: not (p["BM"] % p["WM"] or p["BN"] % p["WN"] or p["WM"] % p["TM"]
                                 or p["WN"] % p["TN"])),
        SpaceRule("a warp tile must hold exactly 32 lanes ((WM / TM) * (WN / TN) == 32)",
                  lambda p: (p["WM"] // max(p["TM"], 1)) * (p["WN"] // max(p["TN"], 1)) == 32),
        SpaceRule("A's 4-byte copies must cover the tile evenly (threads % BK, BM * BK % threads)",
                  lambda p: _warp_threads(p) % p["BK"] == 0
                  and (p["BM"] * p["BK"]) % _warp_threads(p) == 0),
        SpaceRule("B's 16-byte copies must cover the tile evenly (BK * BN / 4 % threads)",
                  lambda p: (p["BK"] * p["BN"] // 4) % _warp_threads(p) == 0),
    ))

# sgemm_pipe_dyn's space: sgemm_pipe's, with no 48 KB limit on the buffers, and the FMA order.
_SPACE_PIPE_DYN = SearchSpace(values=(*_SPACE_PIPE.values, ("JOUTER", (0, 1))),
                              rules=_SPACE_PIPE.rules)


def _copies_whole_chunks(p: Params) -> bool:
    return ((p["BM"] * p["BK"] // 8) % 256 == 0 and (p["BK"] * p["BN"] // 8) % 256 == 0
            and (p["BM"] * p["BN"] // 8) % 256 == 0)


_SPACE_BCF = SearchSpace(
    values=(("BM", (64, 128, 256)), ("BN", (64, 128, 256)), ("BK", (16, 32, 64)),
            ("GROUP", (4, 8, 16))),
    rules=(
        SpaceRule("each of the 256 threads must copy a whole number of 16-byte chunks of A, "
                  "B and the C tile", _copies_whole_chunks),
        SpaceRule("the C staging tile (BM * BN * 2 bytes) must fit in 48 KiB of static shared "
                  "memory", lambda p: p["BM"] * p["BN"] * 2 <= 48 * 1024),
    ))

_SPACE_RING = SearchSpace(
    values=(("BM", (64, 128, 256)), ("BN", (128, 256)), ("BK", (32, 64)),
            ("STAGES", (2, 3, 4, 5)), ("GROUP", (8, 16))),
    rules=(SpaceRule("each of the 256 threads must copy a whole number of 16-byte chunks of A, "
                     "B and the C tile", _copies_whole_chunks),))


_SPACE_SPREAD = SearchSpace(
    values=(*_SPACE_RING.values, ("SPREAD", (1, 2, 4))),
    rules=_SPACE_RING.rules)


def _ring_or_c(p: Params) -> int:
    return max(p["STAGES"] * (p["BM"] * p["BK"] + p["BK"] * p["BN"]) * 2, p["BM"] * p["BN"] * 2)


_ring_or_c.__doc__ = "max(STAGES * (BM*BK + BK*BN) * 2, BM*BN*2)"

REGISTRY: tuple[KernelSpec, ...] = (
    # ------------------------------------------------------------------ FP32 ladder
    KernelSpec(name="sgemm_naive", entry="sgemm_naive", parent=None,
               params=(("BM", 8), ("BN", 32)), block=_NAIVE_BLOCK, grid=tile_grid(),
               change="One thread per output element reads its row of A and column of B "
                      "straight from global memory.",
               seed="002 §1; 000 §2.1", **_SGEMM_BASE),
    KernelSpec(name="sgemm_smem", entry="sgemm_smem", parent="sgemm_naive",
               params=(("TILE", 32),), block=_SMEM_BLOCK, grid=tile_grid("TILE", "TILE"),
               static_smem=lambda p: 2 * p["TILE"] * p["TILE"] * 4,
               change="Stages square A and B tiles in shared memory so each global value is "
                      "read once per tile, one output per thread.",
               seed="002 §2; 000 §2.1", **_SGEMM_BASE),
    KernelSpec(name="sgemm_reg4x4", entry="sgemm_reg4x4", parent="sgemm_smem",
               params=(("BM", 64), ("BN", 64), ("BK", 16), ("TM", 4), ("TN", 4)),
               block=_REG_BLOCK, grid=tile_grid(), static_smem=_tiles_smem(1, 4),
               change="64x64x16 shared tiles with 256 threads, each accumulating a 4x4 block "
                      "of C in registers.",
               seed="000 §2.2-2.3", **_SGEMM_BASE),
    KernelSpec(name="sgemm_reg8x8", entry="sgemm_reg8x8", parent="sgemm_reg4x4",
               params=(("BM", 128), ("BN", 128), ("BK", 8), ("TM", 8), ("TN", 8)),
               block=_REG_BLOCK, grid=tile_grid(), static_smem=_tiles_smem(1, 4),
               change="128x128 tiles with an 8x8 block of C per thread: 16 operand loads "
                      "feed 64 FMAs.",
               seed="002 §2.2", **_SGEMM_BASE),
    KernelSpec(name="sgemm_reg8x8_capped", entry="sgemm_reg8x8_capped", parent="sgemm_reg8x8",
               params=(("BM", 128), ("BN", 128), ("BK", 8), ("TM", 8), ("TN", 8)),
               block=_REG_BLOCK, grid=tile_grid(), static_smem=_tiles_smem(1, 4),
               variant=True,
               flags=("-maxrregcount=64",),
               change="The same body under -maxrregcount=64, so the accumulators spill to "
                      "local memory (slow on purpose).",
               seed="002 §2.2", **{**_SGEMM_BASE, "fingerprint": ("ffma", "local")}),
    KernelSpec(name="sgemm_float4", entry="sgemm_float4", parent="sgemm_reg8x8",
               params=(("BM", 128), ("BN", 128), ("BK", 8), ("TM", 8), ("TN", 8)),
               block=_REG_BLOCK, grid=tile_grid(), static_smem=_tiles_smem(1, 4),
               constraints=(_K4, _N4),
               change="Moves A, B and C as 128-bit float4 vectors and stores A transposed in "
                      "shared memory so the inner loop reads it as float4 too.",
               seed="002 §3", **_SGEMM_BASE),
    KernelSpec(name="sgemm_warptile", entry="sgemm_warptile", parent="sgemm_float4",
               params=(("BM", 128), ("BN", 128), ("BK", 8), ("WM", 32), ("WN", 64),
                       ("TM", 8), ("TN", 8)),
               block=_WARP_BLOCK, grid=tile_grid(), constraints=(_K4, _N4),
               static_smem=_tiles_smem(1, 4, pad_m=4),
               change="Maps threads to warp tiles of strided 4x4 fragments and pads A's "
                      "transposed tile so every shared load is conflict-free.",
               seed="002 §7; 000 §3.3", **_SGEMM_BASE),
    KernelSpec(name="sgemm_pipe", entry="sgemm_pipe", parent="sgemm_warptile",
               params=(("BM", 128), ("BN", 128), ("BK", 8), ("WM", 32), ("WN", 64),
                       ("TM", 8), ("TN", 8), ("STAGES", 3)),
               block=_WARP_BLOCK, grid=tile_grid(), constraints=(_N4,),
               static_smem=_tiles_smem("STAGES", 4, pad_m=4),
               change="Feeds the warp-tiled kernel through a STAGES-deep cp.async ring of "
                      "shared buffers (STAGES = 2, 3 or 4).",
               seed="002 §4; 000 §3.1-3.2", **{**_SGEMM_BASE, "fingerprint": ("ffma", "ldgsts")},
               space=_SPACE_PIPE),
    KernelSpec(name="sgemm_tile8x16", entry="sgemm_pipe", parent="sgemm_pipe",
               params=(("BM", 128), ("BN", 128), ("BK", 16), ("WM", 64), ("WN", 64),
                       ("TM", 8), ("TN", 16), ("STAGES", 2)),
               block=_WARP_BLOCK, grid=tile_grid(), constraints=(_N4,),
               static_smem=_tiles_smem("STAGES", 4, pad_m=4),
               change="The pipelined kernel at the configuration `perfscope tune` found: an "
                      "8x16 thread tile (128 FFMA per 6 LDS.128 instead of 64 per 4), 64x64 "
                      "warp tiles of 4 warps, BK 16 (half the barriers per FFMA) and 2 stages.",
               seed="002 §4; 000 §5.1", **{**_SGEMM_BASE, "fingerprint": ("ffma", "ldgsts")},
               notes="Same template as sgemm_pipe; chosen by an exhaustive `perfscope tune "
                     "sgemm_pipe --strategy exhaustive` on the H200 at 4096^3 (249 of 405 legal "
                     "configurations timed, the rest pruned by ptxas), after a 110-trial bayes "
                     "search had stopped at its transpose, TM=16 TN=8 (0.893). It addresses "
                     "PS143 (issue slots spent on overhead instructions), the rule this step "
                     "showed missing."),
    KernelSpec(name="sgemm_dyn", entry="sgemm_pipe_dyn", parent="sgemm_tile8x16",
               params=(("BM", 128), ("BN", 128), ("BK", 16), ("WM", 64), ("WN", 64),
                       ("TM", 8), ("TN", 16), ("STAGES", 2), ("JOUTER", 0)),
               block=_WARP_BLOCK, grid=tile_grid(), constraints=(_N4,),
               dynamic_smem=_tiles_smem("STAGES", 4, pad_m=4),
               change="sgemm_tile8x16 with its buffers in dynamic shared memory: the loop "
                      "head no longer reads SR_CgaCtaId (the S2UR that drew sgemm_tile8x16's "
                      "most dispatch-stall samples, 1,105) to find the static buffers.",
               seed="002 §4; 000 §5.1", **{**_SGEMM_BASE, "fingerprint": ("ffma", "ldgsts")},
               space=_SPACE_PIPE_DYN, variant=True,
               notes="From the SASS and source counters of sgemm_tile8x16's committed report, "
                     "not from a finding (diagnose gives it none at 0.90 of cuBLAS): 59% of its "
                     "dispatch stalls fall at the k-tile boundary, and its single most stalled "
                     "instruction is the loop head's S2UR of SR_CgaCtaId, which ptxas emits for "
                     "the static buffers' shared window every k tile and not for dynamic ones "
                     "(the same 33,280 bytes). Its space also opens the configurations the 48 KB "
                     "static limit cut. Measured on the H200 (2026-12-05, 4096^3, 5 rounds, "
                     "probes/bench-fp32-dyn.json): 0.997x sgemm_tile8x16, and 0.995x in "
                     "both reference benches of 2026-12-05 (every round below): the S2UR was "
                     "not what set the time. A declared variant; sgemm_tile128x256 takes its "
                     "dynamic buffers as the way to its larger tile."),
    KernelSpec(name="sgemm_fma_order", entry="sgemm_pipe_dyn", parent="sgemm_dyn",
               params=(("BM", 128), ("BN", 128), ("BK", 16), ("WM", 64), ("WN", 64),
                       ("TM", 8), ("TN", 16), ("STAGES", 2), ("JOUTER", 1)),
               block=_WARP_BLOCK, grid=tile_grid(), constraints=(_N4,),
               dynamic_smem=_tiles_smem("STAGES", 4, pad_m=4),
               change="sgemm_dyn with its FMAs issued column by column: ptxas rotates 131 of "
                      "the loop's 2,048 accumulators between registers instead of 548, and the "
                      "loop holds fewer other instructions (381 against sgemm_tile8x16's 407).",
               seed="002 §4; 000 §5.1", **{**_SGEMM_BASE, "fingerprint": ("ffma", "ldgsts")},
               space=_SPACE_PIPE_DYN, variant=True,
               notes="From the SASS and source counters of sgemm_tile8x16's committed report, "
                     "not from a finding (diagnose gives it none at 0.90 of cuBLAS): 59% of its "
                     "dispatch stalls fall at the k-tile boundary (the loop-head S2UR of "
                     "SR_CgaCtaId alone draws 1,105 samples, uniform predicate work and "
                     "parameter reloads follow), where its rotated FFMAs sit; rotation is not "
                     "itself the cause (Triton's FP32 kernel rotates half its FFMAs with no "
                     "more stalls). Measured on the H200 (2026-12-05, 4096^3, 5 rounds, "
                     "probes/bench-fp32-dyn.json): 0.841x sgemm_dyn, 38.9 TFLOP/s: kept as a "
                     "declared variant, the order that keeps a[i] in the operand reuse cache "
                     "along a row is the faster one."),
    KernelSpec(name="sgemm_tile128x256", entry="sgemm_pipe_dyn", parent="sgemm_tile8x16",
               params=(("BM", 128), ("BN", 256), ("BK", 16), ("WM", 64), ("WN", 64),
                       ("TM", 8), ("TN", 16), ("STAGES", 2), ("JOUTER", 0)),
               block=_WARP_BLOCK, grid=tile_grid(), constraints=(_N4,),
               dynamic_smem=_tiles_smem("STAGES", 4, pad_m=4),
               change="sgemm_tile8x16's thread and warp tiles in a 128x256 CTA tile of 8 "
                      "warps, one CTA per SM (cuBLAS's on the H200), its buffers in dynamic "
                      "shared memory because they must be: 49,664 bytes at 2 stages, over the "
                      "48 KB a kernel may declare statically (the variant sgemm_dyn is that "
                      "move alone, at sgemm_tile8x16's tile).",
               seed="002 §4; 000 §5.1", **{**_SGEMM_BASE, "fingerprint": ("ffma", "ldgsts")},
               space=_SPACE_PIPE_DYN,
               notes="Chosen from `perfscope diff sgemm_tile8x16 cublas_sgemm` (its first reason: "
                     "the CTA tile, 128x128 against 128x256), not from a finding: diagnose "
                     "gives sgemm_tile8x16 none at 0.90 of cuBLAS. Its space is sgemm_pipe's "
                     "with no 48 KB limit: the 3- and 4-stage and 128x256 configurations the "
                     "exhaustive tune lost to ptxas. Measured on the H200 (2026-12-05, 4096^3, "
                     "the reference bench.json): 1.010x sgemm_tile8x16 in its rounds, 47.0 "
                     "TFLOP/s, 0.917 of cuBLAS (1.016x sgemm_dyn in "
                     "probes/bench-fp32-dyn.json)."),
    KernelSpec(name="sgemm_stages4", entry="sgemm_pipe_dyn", parent="sgemm_tile128x256",
               params=(("BM", 128), ("BN", 256), ("BK", 16), ("WM", 64), ("WN", 64),
                       ("TM", 8), ("TN", 16), ("STAGES", 4), ("JOUTER", 0)),
               block=_WARP_BLOCK, grid=tile_grid(), constraints=(_N4,),
               dynamic_smem=_tiles_smem("STAGES", 4, pad_m=4),
               change="sgemm_tile128x256 with a 4-stage cp.async ring instead of 2: three k "
                      "tiles in flight behind the one the warps compute on (99,328 bytes of "
                      "buffers; one CTA per SM either way, its 255 registers set that).",
               seed="002 §4; 000 §5.1", **{**_SGEMM_BASE, "fingerprint": ("ffma", "ldgsts")},
               space=_SPACE_PIPE_DYN,
               notes="Chosen by `perfscope tune sgemm_dyn --strategy exhaustive` on the H200 "
                     "(2026-12-05, 4096^3: 642 configurations timed, 8,106 pruned; "
                     "probes/tune-sgemm-dyn.md), not from a finding: diagnose gives "
                     "sgemm_tile128x256 none at 0.92 of cuBLAS (headroom only, capped by the "
                     "gap to cuBLAS). In the tune's rounds 4 stages at this tile are 0.926 of "
                     "cuBLAS against 0.913 at 2 (its best, 0.927, differs only in a 32x128 "
                     "warp tile: a tie). In the reference bench (2026-12-05): 1.014x "
                     "sgemm_tile128x256, 47.6 TFLOP/s, 0.930 of cuBLAS at 4096^3, 0.928 at "
                     "2048^3 and 0.948 at 8192^3 (bench-fp32.json)."),
    # ------------------------------------------------------------------ FP16/BF16 ladder
    KernelSpec(name="hgemm_naive", entry="hgemm_naive", parent=None,
               change="cp.async, ldmatrix and mma.sync m16n8k16 on a 128x128x32 tile with "
                      "8 warps as 2x4 and a grid swizzle; shared tiles unswizzled.",
               seed="004 §1", **_HGEMM),
    KernelSpec(name="hgemm_bcf", entry="hgemm_bcf", parent="hgemm_naive",
               constraints=(_K8, _N8),
               change="XOR-swizzles the A and B shared tiles so every ldmatrix phase is "
                      "bank-conflict free.",
               seed="004 §2", **_HGEMM),
    KernelSpec(name="hgemm_bcf_dbf", entry="hgemm_bcf_dbf", parent="hgemm_bcf",
               constraints=(_K8, _N8),
               change="Double-buffers the shared tiles: tile k+1's cp.async is in flight "
                      "during tile k's tensor-core work, one barrier per k tile.",
               seed="004 §3", **{**_HGEMM, "static_smem": _tiles_smem(2, 2)}),
    KernelSpec(name="hgemm_bcf_dbf_rw", entry="hgemm_bcf_dbf_rw", parent="hgemm_bcf_dbf",
               constraints=(_K8, _N8),
               change="Stages the C tile through swizzled shared memory and writes it back "
                      "with 16-byte coalesced stores.",
               seed="004 §4", **{**_HGEMM, "static_smem": _tiles_smem(2, 2)},
               space=_SPACE_BCF),
    KernelSpec(name="hgemm_ring", entry="hgemm_ring", parent="hgemm_bcf_dbf_rw",
               constraints=(_K8, _N8),
               change="Replaces the two fixed buffers with a STAGES-deep cp.async ring in "
                      "dynamic shared memory (STAGES-1 tiles in flight, one barrier per k "
                      "tile), which lets one resident block hide the latency the parent "
                      "needed two for, so the warp tile grows to 64x64 (128x256 blocks).",
               seed="004 §3; 002 §4",
               **{**_HGEMM, "params": (("BM", 128), ("BN", 256), ("BK", 64), ("STAGES", 3),
                                       ("GROUP", 8)),
                  "static_smem": no_smem, "dynamic_smem": _ring_or_c},
               space=_SPACE_RING),
    KernelSpec(name="hgemm_ring_spread", entry="hgemm_ring_spread", parent="hgemm_ring",
               constraints=(_K8, _N8),
               change="Works out each thread's copy addresses and bounds once instead of per "
                      "k tile (a whole-K tile's copy is one address and one LDGSTS) and issues "
                      "a tile's copies in SPREAD shares between the next tile's k16 steps, "
                      "where the ring issued them all at the barrier with its warp's mma.sync "
                      "stream stopped.",
               seed="004 §3; 002 §4",
               **{**_HGEMM, "params": (("BM", 128), ("BN", 256), ("BK", 64), ("STAGES", 3),
                                       ("GROUP", 8), ("SPREAD", 4)),
                  "static_smem": no_smem, "dynamic_smem": _ring_or_c},
               space=_SPACE_SPREAD),
    # ------------------------------------------------------------------ Hopper (hopper.cu)
    KernelSpec(name="hgemm_tma_wgmma", entry="hgemm_tma_wgmma", parent="hgemm_bcf_dbf_rw",
               params=(("BM", 128), ("BN", 128), ("BK", 64), ("STAGES", 4)),
               block=_threads(128), grid=tile_grid(), dynamic_smem=_ring_smem(),
               static_smem=_mbarriers(1), fingerprint=("tma", "gmma"),
               change="TMA brings 128B-swizzled A and B tiles into a 4-deep mbarrier ring and "
                      "one warpgroup issues wgmma m64n128k16 straight from shared memory, "
                      "waiting for each k tile's wgmmas before its slot is refilled.",
               kept_default="it is the ladder's single-warpgroup step: its 4-stage ring "
                            "(132 KB) holds one CTA per SM, whose exposed latency PS132 finds "
                            "and the next stage, hgemm_tma_wgmma_ws, removes by warp "
                            "specialisation; STAGES=3 (99 KB) hides the same latency with a "
                            "second CTA per SM instead",
               seed="000 §4; 004 §5", **_HOPPER, space=_SPACE_TMA_WGMMA),
    KernelSpec(name="hgemm_tma_wgmma_ws", entry="hgemm_tma_wgmma_ws", parent="hgemm_tma_wgmma",
               params=(("BM", 128), ("BN", 256), ("BK", 64), ("STAGES", 4)),
               block=_threads(384), grid=tile_grid(), dynamic_smem=_ring_smem(),
               static_smem=_mbarriers(2), fingerprint=("tma", "gmma", "setmaxreg"),
               change="Warp specialisation: a producer warpgroup (setmaxnreg.dec) issues TMA "
                      "against empty/full mbarriers while two consumer warpgroups "
                      "(setmaxnreg.inc) keep one wgmma m64n256k16 group in flight; 128x256 "
                      "tiles.",
               seed="000 §4", **_HOPPER, space=_SPACE_WS),
    KernelSpec(name="hgemm_tma_wgmma_persistent", parent="hgemm_tma_wgmma_ws",
               params=(("BM", 128), ("BN", 256), ("BK", 64), ("STAGES", 3), ("GROUP", 8),
                       ("BOXES", 4), ("STREAMK", 0), ("DEFER", 0)),
               **_PERSISTENT_TEMPLATE,
               change="Persistent CTAs, one per multiprocessor, walk the tiles in grouped "
                      "L2-friendly order; the producer runs ahead into the next tile while the "
                      "consumers store C through swizzled shared memory by TMA.",
               seed="000 §4", **_HOPPER, space=_SPACE_PERSISTENT,
               notes="Its STREAMK option's third value, the tail split, measured on the H200 "
                     "(tune/, 2026-12-02) 1.012-1.023 of the unsplit kernel where the tiles make "
                     "many rounds (6144^3, 4096x14336x4096, 8192^3) and does not split at 512 or "
                     "256 tiles on 132 CTAs, where a cut piece's fp32 partial (about 6 k tiles "
                     "of math, measured) costs more than the idle SMs. Its DEFER option, the "
                     "deferred store (each finished tile sent a box per k tile of the next, "
                     "under its wgmmas), measured a median 1.003-1.017 of the same "
                     "configuration without it per shape and is in every shape's best "
                     "configuration of the 2026-12-02 13:24 sweep (tune/); the default stays "
                     "without it, the ladder's persistent step as profiled."),
    KernelSpec(name="hgemm_tma_wgmma_streamk", parent="hgemm_tma_wgmma_persistent",
               params=(("BM", 128), ("BN", 256), ("BK", 64), ("STAGES", 3), ("GROUP", 8),
                       ("BOXES", 4), ("STREAMK", 2), ("DEFER", 0)),
               **_PERSISTENT_TEMPLATE,
               change="Stream-K for the last, partial round of tiles once the tiles make at "
                      "least 8 rounds of persistent CTAs: its k iterations are shared evenly "
                      "by all CTAs and the cut tiles' fp32 partials added by the CTA holding "
                      "each tile's first k tiles.",
               seed="000 §5.1, §6.3", **_HOPPER,
               notes="The persistent template at STREAMK=2 (GROUP=16 until the k order made "
                     "the default 8 as fast at 8192^3 and faster at 4096^3), from `perfscope tune` "
                     "over the template's STREAMK option on the H200: splitting the last round "
                     "always (STREAMK=1) won only at 8192^3, 6144^3 and 4096x14336x4096 (8.7 "
                     "to 15.5 rounds) and lost 5-12% at 1.9-3.9 rounds, where the split round "
                     "is a large share of the work and its CTAs, at different k, share little "
                     "in L2 (it still lost with the partials' writes and reads taken out). "
                     "So this stage splits only from 8 rounds up and is the persistent stage "
                     "at 4096^3.",
               min_rounds=STREAMK_MIN_ROUNDS),
    KernelSpec(name="hgemm_tma_wgmma_tuned", parent="hgemm_tma_wgmma_persistent",
               params=_TUNED_PERSISTENT, **_PERSISTENT_TEMPLATE,
               change="The persistent template at the configuration `perfscope tune` found "
                      "fastest at 4096^3: four ring slots, raster groups of 16 tile rows, one "
                      "64 x 64 C staging box a consumer, and each finished tile sent a box per "
                      "k tile of the next, under its wgmmas (DEFER 1).",
               seed="000 §4", **_HOPPER, space=_SPACE_PERSISTENT,
               notes="Chosen by `perfscope tune` of the persistent stage over its whole space "
                     "on the H200 (probes/tune-persistent.md: 235 configurations timed per "
                     "dtype at 4096^3), not from a finding: diagnose gives the persistent stage "
                     "PS153 alone, which the next stage takes up. The configurations within the "
                     "tune's noise of the best differ in GROUP (2-16) and BOXES (1-2); this "
                     "one is the power probe's and the cluster variant's reference "
                     "(power-probe-tuned.json, probes/cluster-template.jsonl). In the reference "
                     "bench (H200, 2026-12-05): 1.0135x / 1.0115x the persistent stage at 4096^3 "
                     "(bf16 / fp16), 1.022 of cuBLAS in both; 1.02x it at 8192^3."),
    KernelSpec(name="hgemm_tma_wgmma_balanced", parent="hgemm_tma_wgmma_tuned",
               params=_TUNED_PERSISTENT, **_PERSISTENT_TEMPLATE, balanced=True,
               change="Launched on the fewest CTAs that take the tiles in the rounds one CTA "
                      "per multiprocessor takes (ceil(tiles / ceil(tiles / SMs))): at 4096^3 "
                      "512 tiles on 128 CTAs of 4 tiles each, 4 SMs idle throughout, where 132 "
                      "CTAs leave 16 idle for the last of 4 rounds.",
               seed="000 §5.1, §6.3",
               notes="PS153 on its parent: the persistent CTAs get unequal shares (3.88 rounds "
                     "of tiles on 132 CTAs), an idle share of 0.031, worth under 0.01 net of "
                     "what splitting the last round costs (6 k tiles of 4 x 64), so no finding "
                     "predicts the step (it was est. 0.031 until 2026-12-06). The step cuts no work "
                     "from the busiest CTA (4 tiles either way); it pays only at the power cap, "
                     "where the tensor GEMMs run at 1.5-1.6 GHz of 1.98 (PS171): 128 CTAs run "
                     "all four rounds at the clock 128 busy SMs can afford, where 132 hold the "
                     "clock of 132 through a last round on 116 (the governor acts over "
                     "milliseconds, a launch takes 175 us). On the H200 (reference bench, "
                     "2026-12-05): 1.006x / 1.001x its parent at 4096^3 (bf16 / fp16), 1.027 "
                     "/ 1.023 of cuBLAS, and under ncu 1624 against 1606 MHz (bf16) for the "
                     "same work; probes/balanced-grid-h200.jsonl 1.003-1.006x. On H100s "
                     "1.008-1.016x, the same cycles within 0.3% at a 0.7-1.3% higher clock "
                     "(probes/balanced-grid-h100*). At 8192^3 (16 rounds of 128 against 15.5 of "
                     "132) 0.998 / 1.008x its parent, within the cap's swing. Its tune over the "
                     "template's space finds nothing clearly better (probes/tune-balanced-h200"
                     ".md: bf16 1.031 at GROUP 4 against 1.028 here, fp16 1.024 at STAGES 3, "
                     "GROUP 4, BOXES 2 against 1.022).",
               **_HOPPER, space=_SPACE_PERSISTENT),
    KernelSpec(name="hgemm_tma_wgmma_cluster", entry="hgemm_tma_wgmma_cluster",
               parent="hgemm_tma_wgmma_persistent",
               params=(("BM", 128), ("BN", 256), ("BK", 64), ("STAGES", 3), ("GROUP", 8),
                       ("BOXES", 4), ("DEFER", 0)),
               block=_threads(384), grid=_cluster_pairs, persistent=True, cluster=2,
               dynamic_smem=ring_and_boxes_smem, static_smem=_mbarriers(2),
               fingerprint=("tma", "gmma", "setmaxreg"), variant=True,
               change="2-CTA clusters on vertically adjacent tiles: each CTA loads its own A "
                      "and half of the shared B tile, multicast to both (TMA .multicast::cluster), "
                      "and a slot is freed only when both CTAs' consumers arrive on it.",
               seed="000 §4",
               notes="Issue 8's stretch stage, kept as a variant: on the H200 it measured 0.96 "
                     "of cuBLAS at 4096^3 against the persistent stage's 1.00 (bf16 and fp16), "
                     "0.98 against 1.02 at 8192^3. The persistent stage is not short of L2 "
                     "bandwidth, so halving B's L2 reads buys nothing while the pair's shared "
                     "slots make each CTA wait for the slower one. Since 2026-12-04 it is the "
                     "persistent template with CTA pairs (BOXES and DEFER, four ring slots "
                     "possible): at STAGES 4, GROUP 16, BOXES 1, DEFER 1 it measured 1.007 / "
                     "1.008 of cuBLAS at 4096^3 and 0.990 / 0.989 of the persistent stage at "
                     "the same configuration, 1.004 / 1.018 of it at 8192^3 (bf16 / fp16, "
                     "alternating rounds, probes/cluster-template.jsonl). Its defaults stay the "
                     "persistent stage's, the whole tile staged.", **_HOPPER,
               space=_SPACE_CLUSTER),
    # ------------------------------------------------------------------ cuBLAS references
    KernelSpec(name="cublas_sgemm", family="cublas", batched=True, dtypes=("fp32",),
               change="cuBLAS FP32 GEMM through cupy.matmul (TF32 off).",
               seed="002 §5", fingerprint=("ffma",)),
    KernelSpec(name="cublas_hgemm", family="cublas", batched=True, dtypes=("fp16",),
               change="cuBLAS FP16 GEMM (fp32 accumulate) through cupy.matmul.",
               seed="004 §5", fingerprint=("gmma",)),
    KernelSpec(name="cublas_bgemm", family="cublas", batched=True, dtypes=("bf16",),
               change="cuBLAS BF16 GEMM (fp32 accumulate) through cupy.matmul on "
                      "ml_dtypes.bfloat16 arrays.",
               seed="004 §5", fingerprint=("gmma",)),
)

# cuBLASLt through nvmath-python's stateful Matmul (planned once, executed per call), for
# `perfscope diff A cublaslt`: profiled on demand, never under "all" (nvmath is optional).
# REFERENCE_FOR_DTYPE stays cuBLAS: these are a second opinion, not the ladder's line.
# cuBLASLt's FP8 GEMM is the fp8 dtype's only reference: cuBLAS through CuPy has no FP8.
# Two builds of it: with fast accumulation, the tensor cores' own fp32 accumulators over the
# whole K, as hgemm_fp8 accumulates (the reference it is timed against), and cuBLASLt's
# default, which promotes the partial sums to fp32 on the CUDA cores every few k steps
# (slower and more precise: the one to hold hgemm_fp8's accuracy against).
_LT_FP8_SHAPES = tuple(ShapeConstraint(d, 16, "cuBLASLt's FP8 GEMM takes only M, N and K "
                                              "divisible by 16") for d in "MNK")
LT_FP8_FAST_ACCUMULATION: Mapping[str, bool] = {"cublaslt_fp8gemm": True,
                                                "cublaslt_fp8gemm_precise": False}
_LT_FP8_REFERENCES = tuple(
    KernelSpec(name=name, family="cublas", dtypes=(FP8,), constraints=_LT_FP8_SHAPES,
               change="cuBLASLt FP8 GEMM (e4m3 A and Bt, the per-tensor scales of A and B, bf16 "
                      f"C) {how}, through nvmath-python's stateful Matmul on torch float8 views "
                      "of the same bytes, planned once, in place.",
               seed="000 §6", fingerprint=("gmma",))
    for name, how in (("cublaslt_fp8gemm", "with fast accumulation (fp32 in the tensor cores "
                                           "over the whole K, as hgemm_fp8)"),
                      ("cublaslt_fp8gemm_precise", "as cuBLASLt does by default (partial sums "
                                                   "promoted to fp32 on the CUDA cores)")))
LT_REFERENCES: tuple[KernelSpec, ...] = (*(
    KernelSpec(name=f"cublaslt_{letter}gemm", family="cublas", dtypes=(dtype,),
               change=f"cuBLASLt {what} GEMM (fp32 accumulate, no epilogue) through nvmath-python's "
                      "stateful Matmul, planned once, written in place into row-major C.",
               seed="000 §6", fingerprint=fingerprint)
    for letter, dtype, what, fingerprint in (("s", "fp32", "FP32", ("ffma",)),
                                             ("h", "fp16", "FP16", ("gmma",)),
                                             ("b", "bf16", "BF16", ("gmma",)))
), *_LT_FP8_REFERENCES)

# ------------------------------------------------------------------ fp8 inputs
# e4m3 A and Bt (N x K) with per-tensor scales, bf16 C (perfscope/kernels/fp8.py). Run by
# name and never under "all": its reference is cuBLASLt's FP8 GEMM through nvmath-python
# (an optional package) on torch's float8 tensors, since cuBLAS through CuPy has no FP8.
_K16_FP8 = ShapeConstraint("K", 16, "TMA needs the rows of A and Bt (K one-byte elements) to "
                                    "be multiples of 16 bytes")


def _fp8_tma_boxes(p: Params) -> TmaBoxes:
    # A in BK x BM boxes, Bt in BK x BN (both K-major, 128 one-byte elements of K), C in 64 x 64.
    return TmaBoxes(a=TmaBox(p["BM"], p["BK"]), b=TmaBox(p["BN"], p["BK"]), c=TmaBox(64, 64))


def _fp8_smem(p: Params) -> int:
    return (p["STAGES"] * (p["BM"] + p["BN"]) * p["BK"]
            + 2 * min(p["BOXES"], p["BN"] // 64) * 64 * 64 * 2 + 1024)


_fp8_smem.__doc__ = ("STAGES * (BM + BN) * BK + 2 * min(BOXES, BN/64) * 64 * 64 * 2 + 1024 (the "
                     "one-byte ring, the bf16 C staging boxes of each consumer, realignment)")

_SPACE_FP8 = SearchSpace(values=(
    ("BM", (128,)), ("BN", _WGMMA_N), ("BK", (128,)), ("STAGES", _RING_STAGES),
    ("GROUP", (1, 2, 4, 8, 16)), ("BOXES", (1, 2, 4)), ("DEFER", (0, 1))))

FP8_STAGES: tuple[KernelSpec, ...] = (
    KernelSpec(name="hgemm_fp8", entry="hgemm_fp8", family="fp8", dtypes=(FP8,),
               source="fp8.cu", parent="hgemm_tma_wgmma_persistent",
               params=(("BM", 128), ("BN", 256), ("BK", 128), ("STAGES", 4), ("GROUP", 16),
                       ("BOXES", 1), ("DEFER", 1)),
               block=_threads(384), grid=_persistent_tiles, persistent=True,
               dynamic_smem=_fp8_smem, static_smem=_mbarriers(2),
               min_cc=90, only_cc=(90,), archs=("sm_90a",), abi="tensormap",
               tma_boxes=_fp8_tma_boxes, constraints=(_K16_FP8, _N8_TMA),
               fingerprint=("tma", "gmma", "setmaxreg"), absent=("hmma", "ldgsts"),
               change="e4m3 inputs on the persistent body: A and Bt both K-major in a one-byte "
                      "ring (BK 128), wgmma m64n256k32 e4m3 (QGMMA, twice the bf16 rate), and "
                      "the per-tensor scales of A and B applied to the fp32 tile as it is "
                      "rounded to bf16 and stored by TMA.",
               seed="000 §4, §7.1", space=_SPACE_FP8,
               notes="Issue 19's stretch stage, at the configuration `perfscope tune` chose "
                     "for its parent at 4096^3 (STAGES 4, GROUP 16, one staging box, the "
                     "deferred store). Held against cuBLASLt's FP8 GEMM (cublaslt_fp8gemm, "
                     "fast accumulation) with the same scales: 1.03 at 4096^3, 1.02 at 8192^3, "
                     "0.96-0.97 at K = 2048 (H200, reports/reference/h200/fp8/). It does not "
                     "promote partial sums to fp32 in the k loop, as cuBLASLt's default build "
                     "(cublaslt_fp8gemm_precise) does: its error grows with K."),
)

# ------------------------------------------------------------------ compiled, never run
COMPILED_ONLY: tuple[KernelSpec, ...] = (
    KernelSpec(name="hgemm_tcgen05", entry="hgemm_tcgen05", family="blackwell", dtypes=HALF,
               source="blackwell.cu", parent=None,
               params=(("BM", 128), ("BN", 128), ("BK", 64), ("STAGES", 4)),
               block=_threads(128), grid=tile_grid(),
               # The ring, plus 1024 bytes to realign it for 128B-swizzled operands.
               dynamic_smem=lambda p: p["STAGES"] * (p["BM"] * p["BK"] + p["BK"] * p["BN"]) * 2 + 1024,
               # 2*STAGES+1 mbarriers (8 bytes) and the tensor-memory address slot (4).
               static_smem=lambda p: (2 * p["STAGES"] + 1) * 8 + 8,
               min_cc=100, only_cc=(100, 103), archs=("sm_100a", "sm_103a"), never_run=True,
               abi="tensormap", tma_boxes=_tma_boxes, absent=("hmma", "ldgsts"),
               constraints=(_K8_TMA, _N8_TMA),
               fingerprint=("tma", "utcmma", "tmem"),
               change="TMA brings 128B-swizzled A and B tiles into a 4-stage mbarrier ring; one "
                      "thread issues tcgen05.mma into a tensor-memory accumulator, releases each "
                      "stage with tcgen05.commit, and the epilogue reads C with tcgen05.ld.",
               seed="000 §4.1-4.2",
               notes="Takes the tensor-map ABI of hopper.cu (CUtensorMap A, B, C, T* C, M, N, "
                     "K); the root of the Blackwell family, after hgemm_bcf_dbf_rw."),
)

# fp8's is cuBLASLt: cuBLAS through CuPy has no FP8 GEMM.
REFERENCE_FOR_DTYPE: Mapping[str, str] = {
    "fp32": "cublas_sgemm", "fp16": "cublas_hgemm", "bf16": "cublas_bgemm",
    FP8: "cublaslt_fp8gemm"}

# The fused-epilogue stages (kernels/fused_specs.py) take bias/residual pointers after the
# tensor-map ABI, and their references are groups of launches (cuBLAS, then an elementwise
# pass): bench, profile and diff run them by name, never under "all" (their shapes are the
# inference shapes of issue 19, not the ladder's 4096^3).
EPILOGUE_STAGES: tuple[KernelSpec, ...] = FUSED
GROUP_REFERENCES: tuple[KernelSpec, ...] = GROUPS

_EVERY = (REGISTRY + LT_REFERENCES + COMPILED_ONLY + EPILOGUE_STAGES + GROUP_REFERENCES
          + FP8_STAGES)
_BY_NAME: Mapping[str, KernelSpec] = {s.name: s for s in _EVERY}
if len(_BY_NAME) != len(_EVERY):
    raise ImportError("two stages share a name")
if any(not s.never_run for s in COMPILED_ONLY) or any(s.never_run for s in REGISTRY):
    raise ImportError("COMPILED_ONLY holds exactly the never-run stages")


def all_specs() -> tuple[KernelSpec, ...]:
    """The stages bench and profile run under "all": never a compiled-only one."""
    return REGISTRY


def audit_specs() -> tuple[KernelSpec, ...]:
    """Every stage with CUDA source, runnable or compiled-only: what `perfscope sass` audits."""
    return tuple(s for s in REGISTRY + COMPILED_ONLY + EPILOGUE_STAGES + FP8_STAGES
                 if not s.is_reference)


def names() -> tuple[str, ...]:
    """The runnable stages (what reports and bench results can come from)."""
    return tuple(s.name for s in REGISTRY + EPILOGUE_STAGES + GROUP_REFERENCES + FP8_STAGES)


def get_spec(name: str) -> KernelSpec:
    """The spec called name, or a one-sentence refusal that lists the valid names."""
    spec = _BY_NAME.get(name)
    if spec is None:
        never = ", ".join(f"{s.name} ({s.label})" for s in COMPILED_ONLY)
        raise PerfscopeError(f"unknown stage {name!r}; valid stages are {', '.join(names())}, "
                             f"and for `perfscope sass` only {never}")
    return spec


def declared_params(name: str, shape: Shape,
                    multiprocessors: int = H200_MULTIPROCESSORS) -> dict[str, int] | None:
    """The parameters `perfscope bench NAME --shape SHAPE` runs with no --param: the stage's
    defaults, with hgemm_small_m's tile chosen for the shape on this many multiprocessors;
    None for a stage this perfscope no longer has, or a shape it refuses."""
    try:
        return small_m_for(get_spec(name), shape, None, multiprocessors).param_dict
    except PerfscopeError:
        return None


def run_reads(name: str | None, params: Mapping[str, int], dtype: str | None,
              shape: Shape) -> tuple[OperandRead, ...] | None:
    """How a run of the stage called name read A and B (kernels/maps.py): None for a name
    the registry lacks, a stage that loads no operand by TMA, or a run it cannot plan."""
    return operand_reads_of(_BY_NAME.get(name or ""), params, dtype, shape)


# What each stage's change addresses among its parent's findings (KernelSpec.addresses),
# kept beside the rows so the table above stays the stages' own data.
ADDRESSES: Mapping[str, tuple[str, ...]] = {
    "sgemm_smem": ("PS101", "PS102", "PS103"),
    "sgemm_reg4x4": ("PS113",),
    "sgemm_reg8x8": ("PS113",),
    "sgemm_float4": ("PS102", "PS110"),
    "sgemm_warptile": ("PS110",),
    "sgemm_pipe": ("PS120", "PS122"),
    "sgemm_tile8x16": ("PS143",),
    "hgemm_bcf": ("PS110", "PS111"),
    "hgemm_bcf_dbf": ("PS120", "PS121"),
    "hgemm_bcf_dbf_rw": ("PS105",),
    "hgemm_ring": ("PS131", "PS120"),
    "hgemm_ring_spread": ("PS127",),
    "hgemm_tma_wgmma": ("PS141", "PS142"),
    "hgemm_tma_wgmma_ws": ("PS121",),
    "hgemm_tma_wgmma_persistent": ("PS123", "PS150"),
    "hgemm_tma_wgmma_streamk": ("PS153",),
    "hgemm_tma_wgmma_balanced": ("PS153",),
    "hgemm_tma_wgmma_cluster": ("PS104", "PS160"),
}


# Fixes a finding names that the ladder makes in two steps, by the stage that completes
# them: PS103's fix is shared tiles and a register block, and sgemm_smem stages the tiles
# alone (the seed ladders' own order), so PS103's estimate is held against naive -> reg4x4.
COMPLETES: Mapping[str, tuple[str, ...]] = {
    "sgemm_reg4x4": ("PS103",),
}


def _addresses(spec: KernelSpec) -> tuple[str, ...]:
    return spec.addresses or ADDRESSES.get(spec.name, ())


def stage_info(spec: KernelSpec) -> StageInfo:
    """What analysis needs of a stage, as a plain value (rules and pages never import this
    registry; the loader attaches it to each report of a stage)."""
    order = {s.name: i for i, s in enumerate(_EVERY)}
    refs = {} if spec.is_reference else {d: reference_name(spec, d) for d in spec.dtypes
                                         if d in REFERENCE_FOR_DTYPE}
    return StageInfo(name=spec.name, family=spec.family, dtypes=spec.dtypes, change=spec.change,
                     seed=spec.seed, parent=spec.parent, references=refs,
                     fingerprint=spec.fingerprint, absent=spec.absent, defaults=spec.param_dict,
                     variant=spec.variant, archs=spec.archs, order=order.get(spec.name, len(order)),
                     addresses=_addresses(spec), completes=COMPLETES.get(spec.name, ()),
                     notes=spec.notes,
                     kept_default=spec.kept_default, min_rounds=spec.min_rounds)


def reference_name(spec: KernelSpec, dtype: str) -> str:
    """What a stage is held against: the group of launches that computes the same epilogue
    for a fused stage (``cublas+gelu``), else cuBLAS of its dtype."""
    epilogue = epilogue_of(spec) if spec.family == "fused" else None
    return epilogue.group if epilogue is not None else REFERENCE_FOR_DTYPE[dtype]


def stage_catalogue() -> dict[str, StageInfo]:
    """StageInfo of every runnable stage (the cuBLASLt references, the fused stages and their
    groups included), by name, in registry order."""
    return {s.name: stage_info(s) for s in REGISTRY + LT_REFERENCES + EPILOGUE_STAGES
            + GROUP_REFERENCES + FP8_STAGES}
