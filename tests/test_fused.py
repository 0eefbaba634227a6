"""The fused-epilogue stages (fused.cu, issue 19) on the CPU, as in CI.

Each stage and epilogue is compiled for sm_90a through perfscope's NVRTC path and its SASS
audited: HGMMA, UTMALDG and UTMASTG, no HMMA or LDGSTS, no spills, MUFU.TANH exactly when
there is an activation. The four hopper.cu stages, whose building blocks moved to
hopper.cuh, must compile to the same SASS as the committed hopper.cu. The host side of the
GPU check (benchmarks/fused_check.py) is driven through a fake driver: tensor-map plans,
the ABI's argument order, the split-K cluster launch; its float64 reference and tolerance
check are run on numpy against an fp32 emulation of the kernels' epilogue. Correctness and
speed on the GPU are that script's job.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
from conftest import benchmark_script, disassembler_or_skip
from fakes.fake_cuda import DoneEvent

from perfscope import bench
from perfscope.build import CompileRequest, compile_cubin
from perfscope.errors import PerfscopeError
from perfscope.kernels.fused_specs import (
    ACTIVATIONS,
    BY_NAME,
    FUSED,
    H200_MULTIPROCESSORS,
    fused_geometry,
    small_m_for,
    small_m_grid_for,
    small_m_params,
    small_m_tile_rows,
    small_m_tiles,
    split_count,
    streamk_ctas,
)
from perfscope.kernels.launch import compile_stage, elementwise_request
from perfscope.kernels.maps import MapPlan
from perfscope.kernels.spec import KERNEL_DIR, Shape
from perfscope.kernels.tensormap import TensorMap
from perfscope.kernels.weights import strips_shape, unpack_strips
from perfscope.sass.disasm import disassemble

ROOT = Path(__file__).resolve().parents[1]
ARCH = "sm_90a"
DTYPES = ("fp16", "bf16")
SMEM_LIMIT = 227 * 1024
HOPPER_STAGES = {  # name -> template parameters of its default (registry) instantiation
    "hgemm_tma_wgmma": (128, 128, 64, 4),
    "hgemm_tma_wgmma_ws": (128, 256, 64, 4),
    "hgemm_tma_wgmma_persistent": (128, 256, 64, 3, 8, 4, 0, 0),
    "hgemm_tma_wgmma_cluster": (128, 256, 64, 3, 8, 4, 0),
}
CXX = {"fp16": "__half", "bf16": "__nv_bfloat16"}

pytestmark = pytest.mark.usefixtures("private_cubin_cache")


fc = benchmark_script("fused_check")


# ------------------------------------------------------------------ the specs
def test_the_fused_family_continues_from_the_persistent_stage():
    assert [s.name for s in FUSED] == ["hgemm_fused_bias_act", "hgemm_small_m",
                                       "hgemm_small_m_packed", "hgemm_small_m_streamk",
                                       "hgemm_fused_pingpong", "hgemm_fused_quant"]
    parents = {"hgemm_fused_quant": "hgemm_fused_bias_act",
               "hgemm_fused_pingpong": "hgemm_fused_bias_act",
               "hgemm_small_m_streamk": "hgemm_small_m",
               "hgemm_small_m_packed": "hgemm_small_m"}
    # The packed stage is hgemm_small_m's kernel with B's coordinates in strips.
    entries = {"hgemm_small_m_packed": "hgemm_small_m"}
    for spec in FUSED:
        assert spec.family == "fused"
        assert spec.parent == parents.get(spec.name, "hgemm_tma_wgmma_persistent")
        assert spec.seed == "000 §7.1" and spec.source == "fused.cu"
        assert spec.entry == entries.get(spec.name, spec.name)
        assert spec.weight_layout == ("strips64" if spec.name == "hgemm_small_m_packed"
                                      else "row-major")
        assert spec.dtypes == DTYPES and spec.archs == (ARCH,) and spec.only_cc == (90,)
        assert spec.abi == "tensormap" and spec.min_cc == 90
        # One sentence, as every registry stage's change.
        assert spec.change.endswith(".") and spec.change.count(". ") == 0, spec.change
        assert {"tma", "gmma"} <= set(spec.fingerprint)
        assert set(spec.absent) == {"hmma", "ldgsts"}
        params = spec.param_dict
        assert params["ACT"] == ACTIVATIONS["gelu"] and params["RESIDUAL"] == 0
        # The header comment of fused.cu describes the stage as hopper.cu's does.
    text = (KERNEL_DIR / "fused.cu").read_text()
    for spec in FUSED:
        assert f"\n// {spec.name}\n//   template <typename T, " in text, spec.name
    assert text.count("//   parent   hgemm_tma_wgmma_persistent") == 2
    assert text.count("//   parent   hgemm_fused_bias_act") == 2
    assert text.count("//   parent   hgemm_small_m\n") == 2
    assert text.count("//   seed     000 §7.1") == 6


def test_name_expressions_follow_the_template_parameters():
    """The epilogue after the tile, then (hgemm_fused_bias_act) the parent's staging boxes,
    stream-K mode and deferred store, in the template's order."""
    spec = BY_NAME["hgemm_fused_bias_act"].with_params(ACT=ACTIVATIONS["silu"], RESIDUAL=1)
    assert spec.name_expression("bf16") == \
        "hgemm_fused_bias_act<__nv_bfloat16, 128, 256, 64, 3, 8, 2, 1, 4, 0, 0>"
    tuned = spec.with_params(BOXES=1, STREAMK=3, DEFER=1)
    assert tuned.name_expression("bf16").endswith(", 2, 1, 1, 3, 1>")
    assert BY_NAME["hgemm_small_m"].name_expression("fp16") == \
        "hgemm_small_m<__half, 64, 128, 64, 8, 1, 0, 64, 1, 1, 1>"
    assert BY_NAME["hgemm_fused_quant"].name_expression("fp16") == \
        "hgemm_fused_quant<__half, 128, 256, 64, 4, 8, 1, 0, 1>"


def test_geometry_follows_the_header():
    bias_act, small_m = BY_NAME["hgemm_fused_bias_act"], BY_NAME["hgemm_small_m"]
    assert bias_act.block_dims() == (384, 1, 1) and bias_act.persistent
    assert bias_act.dynamic_smem_bytes() == 3 * 49152 + 65536 + 1024
    assert bias_act.static_smem_bytes() == 2 * 3 * 8
    assert bias_act.grid_dims(Shape(4096, 4096, 4096)) == (32 * 16, 1, 1)
    assert small_m.block_dims() == (256, 1, 1) and not small_m.persistent
    assert small_m.dynamic_smem_bytes() == 8 * 24576 + 1024
    assert small_m.static_smem_bytes() == 2 * 8 * 8
    for m, bm, stages, threads, arows in ((16, 64, 6, 256, 16), (20, 64, 6, 256, 32),
                                          (64, 64, 6, 256, 64), (100, 128, 6, 384, 128),
                                          (256, 256, 4, 384, 256)):
        spec = small_m.with_params(**small_m_params(m))
        assert spec.param_dict["BM"] == bm and spec.param_dict["STAGES"] == stages
        assert spec.param_dict["AROWS"] == arows and spec.boxes().a.rows == arows
        assert spec.block_dims() == (threads, 1, 1)
        # The tiers above 64 rows fill 192 KB; the 64-row tile takes its measured depth.
        ring = 192 * 1024 if bm > 64 else 6 * 24576
        assert spec.dynamic_smem_bytes() == ring + 1024
    # The 64 x 64 tile also holds a split peer's pushed fp32 partial (128 threads x 32
    # floats) past its ring, and the barrier it completes on.
    thin = small_m.with_params(BN=64, **small_m_params(16, bn=64))
    assert thin.dynamic_smem_bytes() == 8 * 16384 + 16384 + 1024
    assert thin.static_smem_bytes() == 2 * 8 * 8 + 16
    assert thin.with_params(GSPLIT=2).dynamic_smem_bytes() == 8 * 16384 + 1024
    assert small_m_params(16, bn=256)["STAGES"] == 4   # no measured depth: the 192 KB ring
    for spec in FUSED:
        boxes = spec.boxes()
        assert (boxes.a.rows, boxes.a.cols) == (spec.param_dict["BM"], 64)
        assert (boxes.b.rows, boxes.b.cols) == (64, 64) and (boxes.c.rows, boxes.c.cols) == (64, 64)


@pytest.mark.parametrize("m, bm", [(1, 64), (64, 64), (65, 128), (128, 128), (129, 256), (256, 256)])
def test_small_m_takes_every_row_in_one_tile_row(m, bm):
    assert small_m_tile_rows(m) == bm


def test_small_m_refuses_more_rows_than_one_tile_row():
    with pytest.raises(ValueError, match=r"1\.\.256"):
        small_m_tile_rows(257)


@pytest.mark.parametrize("tiles, k_tiles, fits, splits", [
    (64, 128, None, 2),                  # N = 8192: 128 CTAs
    (32, 64, None, 4),                   # N = 4096, K = 4096
    (32, 224, None, 4),                  # N = 4096, K = 14336
    (112, 64, None, 1),                  # N = 14336: 112 tiles already fill the GPU
    (8, 64, None, 8),                    # the portable cluster limit
    (9, 16, None, 4),                    # at least 4 k tiles per split
    (1, 1, None, 1),                     # nothing to split
    (32, 64, lambda s: s <= 3, 3),       # only clusters of 3 are all co-resident
    (64, 128, lambda s: False, 1),       # no cluster fits: no split
])
def test_split_count(tiles, k_tiles, fits, splits):
    assert split_count(tiles, k_tiles, H200_MULTIPROCESSORS, fits) == splits


def test_small_m_grid_covers_the_output_with_whole_clusters():
    spec = BY_NAME["hgemm_small_m"]
    for shape in (Shape(16, 8192, 8192), Shape(37, 1032, 1000), Shape(300, 136, 64)):
        gx, gy, gz = spec.grid_dims(shape)
        p = spec.param_dict
        assert gx * p["BN"] >= shape.n and gy * p["BM"] >= shape.m and gz == 1
    assert spec.grid_dims(Shape(16, 8192, 8192)) == (64 * 2, 1, 1)
    assert small_m_grid_for(spec.param_dict, Shape(37, 1032, 1000), 4) == (9 * 4, 1, 1)


STREAMK = BY_NAME["hgemm_small_m_streamk"]


@pytest.mark.parametrize("shape, bn, ctas", [
    (Shape(16, 8192, 8192), 64, 132),    # 128 tiles x 128 k tiles: every SM, not 128 of them
    (Shape(16, 14336, 4096), 128, 132),  # 112 tiles of 128 columns (224 of 64 > 132 SMs)
    (Shape(64, 4096, 14336), 64, 132),   # 64 tiles x 224 k tiles, not 64 clusters of 2
    (Shape(1, 8, 8), 64, 1),             # one tile, one k tile
    (Shape(37, 1032, 1000), 64, 68),     # 17 tiles x 16 k tiles = 272 units, 4 per CTA
])
def test_streamk_takes_one_cta_per_sm_with_at_least_four_units_each(shape, bn, ctas):
    spec = small_m_for(STREAMK, shape)
    assert spec.param_dict["BN"] == bn
    assert spec.grid_dims(shape) == (ctas, 1, 1)
    assert fused_geometry(spec, shape, H200_MULTIPROCESSORS) == ((ctas, 1, 1), 1)
    assert streamk_ctas(spec.param_dict, shape, 100) == min(ctas, 100)
    # hopper.cuh's stream-K workspace has a slot for 160 CTAs.
    assert streamk_ctas(spec.param_dict, shape, 200) == min(ctas * 2, 160) or ctas < 132


@pytest.mark.parametrize("m, arows", [(1, 16), (16, 16), (17, 32), (32, 32), (33, 64), (64, 64)])
def test_streamk_takes_the_thin_ring_and_a_box_of_a_for_m(m, arows):
    spec = small_m_for(STREAMK, Shape(m, 4096, 4096))
    assert spec.param_dict == {**STREAMK.param_dict, "STAGES": 8, "AROWS": arows}
    wide = small_m_for(STREAMK, Shape(m, 14336, 4096))
    assert (wide.param_dict["BN"], wide.param_dict["STAGES"]) == (128, 6)
    pinned = small_m_for(STREAMK.with_params(STAGES=4), Shape(m, 4096, 4096), {"STAGES": 4})
    assert pinned.param_dict["STAGES"] == 4


def test_streamk_refuses_an_m_past_one_tile_row():
    with pytest.raises(PerfscopeError, match=r"hgemm_small_m_streamk covers M of 1 to 64, not "
                                             r"M=65; take hgemm_small_m for that shape"):
        small_m_for(STREAMK, Shape(65, 4096, 4096))


@pytest.mark.slow
@pytest.mark.parametrize("bn", [64, 128])
@pytest.mark.parametrize("act, residual", [("gelu", 0), ("silu", 1)])
def test_streamk_compiles_without_spills_and_pushes_partials_through_l2(bn, act, residual):
    """No cluster (no cluster barrier, no distributed shared memory); TMA loads and stores,
    wgmma n64 / n128 kept in flight; the partials pushed and pulled as the persistent
    stage's stream-K does."""
    tool = disassembler_or_skip()
    pin = {"BN": bn, "ACT": ACTIVATIONS[act], "RESIDUAL": residual}
    spec = small_m_for(STREAMK.with_params(**pin), Shape(16, 8192, 8192), pin)
    mod = compile_stage(spec, "bf16", ARCH)
    expr = spec.name_expression("bf16")
    use = mod.usage(expr)
    assert not use.spills, mod.log
    assert use.static_smem == spec.static_smem_bytes()
    assert use.static_smem + spec.dynamic_smem_bytes() <= SMEM_LIMIT
    sass = disassemble(mod.cubin_path, tool).kernel(mod.mangled(expr))
    ops, bases = sass.opcodes, sass.base_opcodes
    assert any(op.startswith(f"HGMMA.64x{bn}x16.F32") for op in ops), sorted(ops)
    assert bases["UTMALDG"] > 0 and bases["UTMASTG"] > 0
    assert not bases["UCGABAR_ARV"] and not bases["UCGABAR_WAIT"]
    # hopper.cuh's StreamK: the partial out in 16-byte stores, back through L2 (__ldcg), the
    # flag raised by an atomic exchange and acquired at GPU scope.
    assert ops["STG.E.128"] == bn // 8 and ops["LDG.E.128.STRONG.GPU"] == bn // 8
    assert ops["ATOMG.E.EXCH.STRONG.GPU"] == 1 and ops["LDG.E.STRONG.GPU"] == 1
    assert not bases["LDL"] and not bases["STL"] and not bases["HMMA"]
    # The accumulators are set by each piece's first wgmma (scale-d 0), not zeroed in
    # registers between pieces, which made ptxas serialize the wgmmas (C7515).
    assert not use.wgmma_serialized


# ------------------------------------------------------------------ compiles and SASS
def _variants():
    out = []
    for act in ("none", "gelu", "silu"):
        out.append(("hgemm_fused_bias_act", act, 0, None, None))
    out.append(("hgemm_fused_bias_act", "gelu", 1, None, None))
    for m in (16, 100, 256):
        for act, res in (("gelu", 0), ("silu", 0), ("gelu", 1)):
            out.append(("hgemm_small_m", act, res, m, 128))
    out += [("hgemm_small_m", "gelu", 0, 16, 256), ("hgemm_small_m", "gelu", 1, 16, 256),
            ("hgemm_small_m", "gelu", 0, 16, 64), ("hgemm_small_m", "silu", 1, 64, 64),
            ("hgemm_small_m", "gelu", 0, 256, 64), ("hgemm_small_m", "gelu", 1, 100, 64)]
    return out


def _spec(name, act, residual, m, bn):
    spec = BY_NAME[name].with_params(ACT=ACTIVATIONS[act], RESIDUAL=residual)
    if m is None:
        return spec
    return spec.with_params(BN=bn, **small_m_params(m, bn=bn))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name, act, residual, m, bn", _variants(),
                         ids=lambda x: str(x) if x is not None else "-")
def test_stage_compiles_without_spills_and_runs_on_tma_and_wgmma(name, act, residual, m, bn, dtype):
    tool = disassembler_or_skip()
    spec = _spec(name, act, residual, m, bn)
    mod = compile_stage(spec, dtype, ARCH)
    expr = spec.name_expression(dtype)
    use = mod.usage(expr)
    assert not use.spills, mod.log
    assert use.static_smem == spec.static_smem_bytes(), spec.name
    assert use.static_smem + spec.dynamic_smem_bytes() <= SMEM_LIMIT
    assert use.registers * spec.block_threads() <= 65536
    assert "setmaxnreg" not in mod.log.lower(), mod.log   # ptxas drops it with a warning
    sass = disassemble(mod.cubin_path, tool).kernel(mod.mangled(expr))
    ops, bases = sass.opcodes, sass.base_opcodes
    bn = spec.param_dict["BN"]
    assert any(op.startswith(f"HGMMA.64x{bn}x16.F32") for op in ops), sorted(ops)
    assert bases["UTMALDG"] > 0 and bases["UTMASTG"] > 0
    assert not bases["HMMA"] and not bases["LDGSTS"]
    assert not bases["LDL"] and not bases["STL"]
    tanh = ops["MUFU.TANH"]
    assert (tanh > 0) == (act != "none")
    if name == "hgemm_small_m":
        # The split-K reduction: cluster barriers. The leader loads its bias into registers
        # before the stream, so only a residual is prefetched into L2.
        assert bases["UCGABAR_ARV"] > 0 and bases["UCGABAR_WAIT"] > 0
        assert (bases["UBLKPF"] > 0) == bool(residual)
        # setmaxnreg on both sides, one consumer warpgroup too: after it ptxas keeps the k
        # loop's wgmma descriptors in uniform registers (tests/test_hopper.py).
        assert bases["USETMAXREG"] >= 2
    else:
        assert bases["USETMAXREG"] >= 2
        assert (bases["UBLKPF"] > 0) == bool(residual)   # the residual's L2 prefetch


@pytest.mark.slow
@pytest.mark.parametrize("m, n, k", [(64, 8192, 8192), (256, 8192, 8192)])
def test_small_m_pairs_multicast_a_and_free_slots_in_both_ctas(m, n, k):
    """MCAST=2: each CTA of a pair of N tiles loads every other A tile for both
    (UTMALDG .MULTICAST) and frees each slot in its own and its partner's empty barrier
    (remote arrives); MCAST=1 multicasts nothing."""
    tool = disassembler_or_skip()
    # MPAIR pinned to 1: at 256 x 8192^2 the host would pair the tile rows to share B instead.
    base = small_m_for(BY_NAME["hgemm_small_m"].with_params(MPAIR=1), Shape(m, n, k), {"MPAIR": 1})
    for mcast in (1, 2):
        spec = base.with_params(MCAST=mcast)
        mod = compile_stage(spec, "bf16", ARCH)
        assert not mod.usage(spec.name_expression("bf16")).spills, mod.log
        sass = disassemble(mod.cubin_path, tool).kernel(mod.mangled(spec.name_expression("bf16")))
        multicast = sum(v for op, v in sass.opcodes.items()
                        if op.startswith("UTMALDG") and "MULTICAST" in op)
        assert (multicast > 0) == (mcast == 2), sorted(sass.opcodes)


@pytest.mark.slow
@pytest.mark.parametrize("shape", [Shape(16, 8192, 8192), Shape(16, 14336, 4096),
                                   Shape(64, 4096, 14336), Shape(256, 8192, 8192),
                                   Shape(256, 4096, 14336)], ids=str)
def test_the_packed_stage_is_hgemm_small_m_but_for_b_coordinates(shape):
    """hgemm_small_m_packed at every tier (thin, 128 columns, pushed split, pair, grid
    split): the same tile and the same wgmma, TMA, barrier and shared-memory instructions
    as hgemm_small_m, no spills; what differs is integer arithmetic (B's coordinates)."""
    tool = disassembler_or_skip()
    kept = ("HGMMA", "UTMA", "UBLKCP", "SYNCS", "BAR", "STS", "LDS", "WARPGROUP", "STAS")
    sides = []
    for name in ("hgemm_small_m", "hgemm_small_m_packed"):
        spec = small_m_for(BY_NAME[name], shape)
        mod = compile_stage(spec, "bf16", ARCH)
        assert not mod.usage(spec.name_expression("bf16")).spills, mod.log
        ops = disassemble(mod.cubin_path, tool).kernel(mod.mangled(spec.name_expression("bf16"))).opcodes
        sides.append(({op: v for op, v in ops.items() if op.startswith(kept)}, sum(ops.values()),
                      {k: v for k, v in spec.param_dict.items() if k != "PACKED"}))
    (row_ops, row_count, row_tile), (packed_ops, packed_count, packed_tile) = sides
    assert packed_tile == row_tile
    assert packed_ops == row_ops and any(op.startswith("HGMMA") for op in row_ops)
    assert abs(packed_count - row_count) <= 0.05 * row_count


@pytest.mark.slow
@pytest.mark.parametrize("bn", [64, 128])
def test_small_m_row_pairs_multicast_b_and_free_slots_in_both_ctas(bn):
    """MPAIR=2: each CTA of a pair of tile rows loads every other B atom for both (UTMALDG
    .MULTICAST, A unicast), frees each slot in both CTAs' empty barriers, and stores its own
    tile's boxes (UTMASTG) without spills."""
    tool = disassembler_or_skip()
    pin = {"BM": 128, "BN": bn, "MPAIR": 2}
    spec = small_m_for(BY_NAME["hgemm_small_m"].with_params(**pin), Shape(256, 8192, 8192), pin)
    mod = compile_stage(spec, "bf16", ARCH)
    assert not mod.usage(spec.name_expression("bf16")).spills, mod.log
    sass = disassemble(mod.cubin_path, tool).kernel(mod.mangled(spec.name_expression("bf16")))
    ops = sass.opcodes
    assert sum(v for op, v in ops.items() if op.startswith("UTMALDG") and "MULTICAST" in op) > 0
    assert sum(v for op, v in ops.items() if op.startswith("UTMALDG") and "MULTICAST" not in op) > 0
    assert sum(v for op, v in ops.items() if op.startswith("UTMASTG")) > 0
    assert any(op.startswith(f"HGMMA.64x{bn}x16.F32") for op in ops), sorted(ops)


@pytest.mark.slow
def test_pingpong_takes_two_fragments_per_consumer():
    """hgemm_fused_pingpong at BM=128, BN=128: each consumer owns a 128 x 128 tile, two
    m64n128 wgmmas per k16 step, without spills."""
    tool = disassembler_or_skip()
    spec = BY_NAME["hgemm_fused_pingpong"].with_params(BM=128, BN=128, STAGES=5)
    mod = compile_stage(spec, "bf16", ARCH)
    assert not mod.usage(spec.name_expression("bf16")).spills, mod.log
    sass = disassemble(mod.cubin_path, tool).kernel(mod.mangled(spec.name_expression("bf16")))
    assert any(op.startswith("HGMMA.64x128x16.F32") for op in sass.opcodes), sorted(sass.opcodes)
    assert not any(op.startswith("HGMMA.64x256") for op in sass.opcodes)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_baselines_elementwise_kernel_compiles(dtype):
    mod = compile_cubin(elementwise_request(dtype, fc.BASELINE_EPILOGUE, ARCH))
    assert not mod.usage(fc.ELEMENTWISE_EXPR[dtype]).spills


def _git(*args: str) -> str | None:
    if shutil.which("git") is None:
        return None
    proc = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False)
    return proc.stdout if proc.returncode == 0 else None


@pytest.fixture(scope="module")
def committed_kernels(tmp_path_factory):
    """hopper.cu and the headers it can include, as committed (HEAD), in a folder."""
    listing = _git("ls-tree", "--name-only", "HEAD", "perfscope/kernels/")
    if listing is None:
        pytest.skip("no git history here to hold hopper.cu's SASS against")
    out = tmp_path_factory.mktemp("committed")
    for path in listing.split():
        if path.endswith((".cuh", "/hopper.cu")):
            text = _git("show", f"HEAD:{path}")
            assert text is not None, path
            (out / Path(path).name).write_text(text)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", HOPPER_STAGES)
def test_hopper_stages_compile_to_the_committed_sass(committed_kernels, name, dtype):
    """Moving hop:: into hopper.cuh changed no instruction of the four hopper.cu stages."""
    tool = disassembler_or_skip()
    expr = f"{name}<{CXX[dtype]}, {', '.join(str(v) for v in HOPPER_STAGES[name])}>"

    def sass(folder: Path):
        mod = compile_cubin(CompileRequest((folder / "hopper.cu").read_text(), "hopper.cu",
                                           (expr,), ARCH, (), folder))
        return disassemble(mod.cubin_path, tool).kernel(mod.mangled(expr)), mod.usage(expr)

    (now, now_use), (then, then_use) = sass(KERNEL_DIR), sass(committed_kernels)
    assert Counter(now.opcodes) == Counter(then.opcodes)
    assert len(now.instructions) == len(then.instructions)
    assert (now_use.registers, now_use.static_smem) == (then_use.registers, then_use.static_smem)


# ------------------------------------------------------------------ the GPU check's host side
class FakeDriver:
    """Records what the launcher would hand cuTensorMapEncodeTiled and cuLaunchKernelEx."""

    def __init__(self, clusters: dict[int, int] | None = None) -> None:
        self.encoded: list[tuple[MapPlan, int]] = []
        self.launches: list[tuple] = []
        self.clusters = clusters or {}

    def encode(self, plan: MapPlan, address: int) -> TensorMap:
        self.encoded.append((plan, address))
        return TensorMap()

    def launch(self, function, geometry, stream, args, cluster=1) -> None:
        self.launches.append((function, geometry, stream, args, cluster))

    def max_active_clusters(self, function, block, smem, cluster) -> int:
        return self.clusters.get(cluster, 1000)


def test_launcher_passes_maps_c_m_n_k_then_bias_and_residual():
    spec = BY_NAME["hgemm_fused_bias_act"].with_params(RESIDUAL=1)
    shape = Shape(1000, 2008, 520)
    fake = FakeDriver()
    launch = fc.FusedLaunch.plan(spec, "bf16", shape, 0xF00, fake, 132)
    assert launch.grid == (64, 1, 1) and launch.cluster == 1   # 8 x 8 tiles, under 132
    launch(0x1000, 0x2000, 0x3000, 0x4000, 0x3000, 7)          # the residual is C
    launch(0x1000, 0x2000, 0x3000, 0x4000, 0x3000, 7)
    assert [(p.operand, addr) for p, addr in fake.encoded] == [("A", 0x1000), ("B", 0x2000),
                                                               ("C", 0x3000)]   # encoded once
    a_plan = fake.encoded[0][0]
    assert a_plan.dims == (520, 1000) and a_plan.box == (64, 128)
    (fn, geometry, stream, args, cluster), _ = fake.launches
    assert (fn, stream, cluster) == (0xF00, 7, 1)
    assert geometry == ((64, 1, 1), (384, 1, 1), 214016)
    assert all(isinstance(x, TensorMap) for x in args[:3]) and len(args) == 9
    assert args[3].value == 0x3000 and [x.value for x in args[4:7]] == [1000, 2008, 520]
    assert all(isinstance(x, ctypes.c_int) for x in args[4:7])
    assert (args[7].value, args[8].value) == (0x4000, 0x3000)
    launch(0x1000, 0x2000, 0x5000, 0, 0, 7)
    assert fake.launches[-1][3][8].value is None   # no residual: a null pointer


def test_launcher_persistent_grid_caps_at_the_multiprocessors():
    launch = fc.FusedLaunch.plan(BY_NAME["hgemm_fused_bias_act"], "fp16", Shape(4096, 4096, 4096),
                                 1, FakeDriver(), 132)
    assert launch.grid == (132, 1, 1)


def test_small_m_launch_is_a_split_k_cluster():
    spec = BY_NAME["hgemm_small_m"]
    shape = Shape(16, 8192, 8192)
    launch = fc.FusedLaunch.plan(spec, "fp16", shape, 1, FakeDriver(), 132)
    assert (launch.grid, launch.block, launch.cluster) == ((128, 1, 1), (256, 1, 1), 2)
    launch(0x1000, 0x2000, 0x3000, 0x4000, 0, 0)
    ((_, _, _, args, cluster),) = launch.driver.launches
    assert cluster == 2 and len(args) == 9
    a_plan = launch.driver.encoded[0][0]
    assert a_plan.dims == (8192, 16) and a_plan.box == (64, 64)   # M = 16 in a 64-row box
    # Fewer co-resident clusters of 2 than tiles: no split rather than a second wave.
    narrow = fc.FusedLaunch.plan(spec, "fp16", shape, 1, FakeDriver({2: 60}), 132)
    assert (narrow.grid, narrow.cluster) == ((64, 1, 1), 1)
    forced = fc.FusedLaunch.plan(spec, "fp16", shape, 1, FakeDriver(), 132, splits=8)
    assert (forced.grid, forced.cluster) == ((512, 1, 1), 8)


def test_the_check_needs_every_variant_once():
    variants = fc.needed_variants(timing=True)
    labels = [s.name_expression(d) for s, d in variants]
    assert len(labels) == len(set(labels))
    tiers = {(s.param_dict["BM"], s.param_dict["BN"], s.param_dict["STAGES"], s.param_dict["AROWS"])
             for s, _ in variants if s.name == "hgemm_small_m"}
    assert tiers == {(64, 64, 8, 16), (64, 64, 8, 64), (64, 128, 6, 16), (64, 128, 6, 64),
                     (128, 64, 8, 128), (128, 128, 6, 128), (256, 128, 4, 256)}
    streamk = {(s.param_dict["BN"], s.param_dict["STAGES"], s.param_dict["AROWS"])
               for s, _ in variants if s.name == "hgemm_small_m_streamk"}
    assert streamk == {(64, 8, 16), (64, 8, 32), (64, 8, 64), (128, 6, 16), (128, 6, 64)}
    assert len(variants) <= 100   # a few seconds of parallel compiles on the GPU machine


# ------------------------------------------------------------------ the reference and the check
def _bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 (round to nearest even) -> float32, without ml_dtypes."""
    bits = x.astype(np.float32).view(np.uint32)
    bits = (bits + np.uint32(0x7FFF) + ((bits >> 16) & 1)) & np.uint32(0xFFFF0000)
    return bits.view(np.float32)


def _round(x: np.ndarray, dtype: str) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32) if dtype == "fp16" else _bf16(x)


def _fused_in_fp32(a, b, bias, res, act, dtype, rng):
    """What the kernels compute: fp32 accumulate, fp32 epilogue with a tanh off by up to
    2^-11 (tanh.approx), one rounding of C."""
    acc = a.astype(np.float32) @ b.astype(np.float32) + bias.astype(np.float32)
    wobble = 1 + rng.choice([-1.0, 1.0], size=acc.shape).astype(np.float32) * np.float32(2.0 ** -11)
    if act == "gelu":
        u = acc * (np.float32(0.0356774081363001) * acc * acc + np.float32(0.7978845608028654))
        acc = 0.5 * acc * (1 + np.tanh(u) * wobble)
    elif act == "silu":
        acc = 0.5 * acc * (1 + np.tanh(0.5 * acc) * wobble)
    if res is not None:
        acc = acc + res
    return _round(acc, dtype).astype(np.float64)


@pytest.fixture(scope="module", params=DTYPES)
def problem(request):
    rng = np.random.default_rng(19)
    dtype = request.param
    m, n, k = 70, 136, 520
    a = _round((rng.standard_normal((m, k)) / np.sqrt(k)).astype(np.float32), dtype)
    b = _round(rng.standard_normal((k, n)).astype(np.float32), dtype)
    bias = _round((0.5 * rng.standard_normal(n)).astype(np.float32), dtype)
    res = _round(rng.standard_normal((m, n)).astype(np.float32), dtype)
    return dtype, rng, a, b, bias, res


@pytest.mark.parametrize("act", ["gelu", "silu", "none"])
@pytest.mark.parametrize("residual", [False, True])
def test_the_fused_math_passes_the_check(problem, act, residual):
    dtype, rng, a, b, bias, res = problem
    res = res if residual else None
    c = _fused_in_fp32(a, b, bias, res, act, dtype, rng)
    ref, pre, scale = fc.reference(np, a.astype(np.float64), b.astype(np.float64),
                                   bias.astype(np.float64), None if res is None else res.astype(np.float64),
                                   act)
    got = fc.check(np, c, ref, pre, scale, dtype, act)
    assert got["verdict"] == "OK", got
    assert got["rel_fro_error"] < 1e-2


@pytest.mark.parametrize("fault", ["bias shifted a column", "silu for gelu", "residual dropped",
                                   "one element NaN", "one element unwritten"])
def test_epilogue_mistakes_fail_the_check(problem, fault):
    dtype, rng, a, b, bias, res = problem
    act, bias_used, res_used = "gelu", bias, res
    if fault == "bias shifted a column":
        bias_used = np.roll(bias, 1)
    if fault == "silu for gelu":
        act = "silu"
    if fault == "residual dropped":
        res_used = None
    c = _fused_in_fp32(a, b, bias_used, res_used, act, dtype, rng)
    ref, pre, scale = fc.reference(np, a.astype(np.float64), b.astype(np.float64),
                                   bias.astype(np.float64), res.astype(np.float64), "gelu")
    if fault == "one element NaN":
        c[3, 5] = np.nan
    if fault == "one element unwritten":
        # C aliased the residual and one element kept it: the one where that shows most.
        i, j = np.unravel_index(np.argmax(np.abs(ref - res)), ref.shape)
        c[i, j] = res[i, j]
    assert fc.check(np, c, ref, pre, scale, dtype, "gelu")["verdict"] == "WRONG"


def test_reference_activations_are_the_textbook_ones():
    x = np.array([-3.0, -1.0, 0.0, 0.5, 2.0])
    gelu = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
    assert np.allclose(fc.gelu_tanh(np, x), gelu, rtol=0, atol=1e-15)
    assert np.allclose(fc.silu(np, x), x / (1 + np.exp(-x)), rtol=0, atol=1e-15)
    # The kernels' SiLU form: x * sigmoid(x) = 0.5x(1 + tanh(x/2)).
    assert np.allclose(0.5 * x * (1 + np.tanh(x / 2)), fc.silu(np, x), rtol=0, atol=1e-15)


# ------------------------------------------------------------------ the GPU check, end to end
class _Array(np.ndarray):
    """A numpy array with CuPy's ``.data.ptr``."""

    @property
    def data(self):
        return _Namespace(ptr=self.__array_interface__["data"][0])


class _Namespace:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def _host(ptr: int, shape: tuple[int, ...]) -> np.ndarray:
    """The fp16 array at a host address (the stand-in's "device" memory)."""
    count = int(np.prod(shape))
    raw = np.ctypeslib.as_array((ctypes.c_uint16 * count).from_address(ptr))
    return raw.view(np.float16).reshape(shape)


def _fake_cupy() -> object:
    import types

    cp = types.ModuleType("cupy")
    wrap = lambda a: np.asarray(a).view(_Array)  # noqa: E731
    for name in ("float16", "float32", "float64", "uint16", "int16", "uint32"):
        setattr(cp, name, getattr(np, name))
    cp.__version__ = "numpy stand-in"
    cp.empty = lambda shape, dtype=np.float32: wrap(np.empty(shape, dtype))
    cp.ones = lambda shape, dtype=np.float32: wrap(np.ones(shape, dtype))
    cp.full = lambda shape, value, dtype=np.float32: wrap(np.full(shape, value, dtype))
    cp.zeros = lambda shape, dtype=np.float32: wrap(np.zeros(shape, dtype))
    cp.ascontiguousarray = lambda a: wrap(np.ascontiguousarray(a))
    # perfscope.timing.L2Flush's read: compiled and launched, here a call that does nothing.
    cp.RawKernel = lambda source, name: lambda grid, block, args: None
    for name in ("abs", "tanh", "exp", "isfinite", "count_nonzero", "argmax"):
        setattr(cp, name, getattr(np, name))
    cp.linalg = np.linalg

    def matmul(a, b, out):
        out[...] = (a.astype(np.float32) @ b.astype(np.float32)).astype(out.dtype)

    cp.matmul = matmul

    class Rng:
        def __init__(self, seed):
            self.rng = np.random.default_rng(seed)

        def standard_normal(self, shape, dtype=np.float64):
            return wrap(self.rng.standard_normal(shape).astype(dtype))

    cp.random = _Namespace(default_rng=Rng)

    Event = DoneEvent

    def memcpy(dst, src, nbytes, kind, stream):
        ctypes.memmove(dst, src, nbytes)

    cp.cuda = _Namespace(
        Event=Event, get_elapsed_time=lambda s, e: 0.25,
        get_current_stream=lambda: _Namespace(ptr=0),
        Device=lambda *a: _Namespace(id=0, compute_capability="90",
                                     attributes={"MultiProcessorCount": 132}),
        runtime=_Namespace(memcpyAsync=memcpy, memcpyDeviceToDevice=3,
                           getDeviceProperties=lambda i: {"name": b"stand-in", "multiProcessorCount": 132,
                                                          "l2CacheSize": 60 << 20},
                           runtimeGetVersion=lambda: 13000, driverGetVersion=lambda: 13000))
    cp.get_default_memory_pool = lambda: _Namespace(free_all_blocks=lambda: None)
    return cp


class _EmulatingDriver:
    """Runs the fused stages' arithmetic (fp32, exact tanh) where cuLaunchKernelEx would run
    them, reading the operands at the addresses the launcher passes."""

    kernels: ClassVar[dict] = {}
    launches: ClassVar[list] = []

    def encode(self, plan, address):
        return _Namespace(plan=plan, address=address)

    def max_active_clusters(self, function, block, smem, cluster):
        return 1000

    def launch(self, function, geometry, stream, args, cluster=1):
        spec, _dtype = self.kernels[function]
        (grid, block, smem) = geometry
        assert len(args) == 9 and grid[0] % cluster == 0 and block == spec.block_dims()
        assert smem == spec.dynamic_smem_bytes()
        m, n, k = (x.value for x in args[4:7])
        assert args[3].value == args[2].address
        a = _host(args[0].address, (m, k))
        if spec.weight_layout == "strips64":   # B packed: read the strips, unpack them
            shape = strips_shape(k, n)
            b = unpack_strips(np, _host(args[1].address, shape), k, n)
            assert args[1].plan.dims == (shape[2], shape[0] * shape[1])
        else:
            b = _host(args[1].address, (k, n))
        c = _host(args[2].address, (m, n))
        bias = _host(args[7].value, (n,)) if args[7].value else np.zeros(n, np.float16)
        res = _host(args[8].value, (m, n)).astype(np.float32) if args[8].value else None   # before C
        acc = a.astype(np.float32) @ b.astype(np.float32) + bias.astype(np.float32)
        act = spec.param_dict["ACT"]
        if act == 1:
            acc = 0.5 * acc * (1 + np.tanh(0.7978845608028654 * (acc + 0.044715 * acc ** 3)))
        elif act == 2:
            acc = acc / (1 + np.exp(-acc))
        if res is not None:
            acc = acc + res
        c[...] = acc.astype(np.float16)
        self.launches.append((spec.name, grid, cluster))


def _elementwise(grid, block, args):
    y, bias, _residual, _vectors, per_row = args   # RESIDUAL = 0: the third is never read
    x = y.view(np.float16).reshape(-1, int(per_row) * 8).astype(np.float32) + bias.view(np.float16)
    y.view(np.float16).reshape(x.shape)[...] = fc.gelu_tanh(np, x).astype(np.float16)


def test_the_gpu_check_runs_end_to_end_on_a_stand_in(monkeypatch, tmp_path):
    import perfscope.kernels.launch as launch_mod
    import perfscope.kernels.tensormap as tensormap_mod

    cp = _fake_cupy()
    monkeypatch.setitem(sys.modules, "cupy", cp)
    monkeypatch.setitem(sys.modules, "torch", None)      # import torch -> ImportError
    monkeypatch.setitem(sys.modules, "nvmath", None)
    monkeypatch.setattr(launch_mod, "require_gpu", lambda: cp)
    monkeypatch.setattr(tensormap_mod, "Driver", _EmulatingDriver)
    monkeypatch.setattr(fc, "build_all", lambda timing, jobs: [])
    monkeypatch.setattr(fc, "nvidia_smi", lambda: {"clocks.sm": "1980"})
    monkeypatch.setattr(fc, "DTYPES", ("fp16",))
    monkeypatch.setattr(fc, "CHECK_SHAPES", {fc.BIAS_ACT: ((1, 8, 8), (127, 136, 72)),
                                             fc.SMALL_M: ((37, 1032, 1000), (200, 264, 512))})
    monkeypatch.setattr(fc, "TIMING_M", (16, 300))
    monkeypatch.setattr(fc, "TIMING_NK", ((256, 512),))
    monkeypatch.setattr(fc, "COPY_BYTES", 1 << 20)
    _EmulatingDriver.kernels, _EmulatingDriver.launches = {}, []

    def function(self, spec, dtype):
        key = len(_EmulatingDriver.kernels) + 1
        _EmulatingDriver.kernels[key] = (spec, dtype)
        return _Namespace(kernel=_Namespace(ptr=key))

    monkeypatch.setattr(fc.Gpu, "function", function)
    monkeypatch.setattr(fc.Gpu, "elementwise", lambda self, dtype: _elementwise)
    monkeypatch.setattr(fc.Gpu, "read_stream",
                        lambda self, kind="ldg": lambda grid, block, args, **launch: None)
    out = tmp_path / "fused.json"
    monkeypatch.setattr(sys, "argv", ["fused_check.py", "--json", str(out), "--flush-mib", "1"])
    assert fc.main() == 0
    record = __import__("json").loads(out.read_text())
    assert record["errors"] == [] and record["options"]["l2_flush"] == "read"
    checks = record["correctness"]
    assert len(checks) == 4 * 4 and all(r["verdict"] == "OK" for r in checks), checks
    # Splits as planned: 37 x 1032 x 1000 -> 9 tiles x 4; 200 x 264 x 512 -> BM 256, 3 tiles x 2.
    assert {(r["m"], r["cluster"]) for r in checks if r["stage"] == fc.SMALL_M} == {(37, 4), (200, 2)}
    timing = record["timing"]
    assert [(e["m"], e["n"], e["k"]) for e in timing] == [(16, 256, 512), (300, 256, 512)]
    small, large = (e["candidates"] for e in timing)
    assert set(small) == {fc.BIAS_ACT, fc.SMALL_M, fc.PACKED, fc.STREAMK, f"{fc.SMALL_M} BN=128",
                          "cublas+elementwise"}
    assert set(large) == {fc.BIAS_ACT, fc.PINGPONG, "cublas+elementwise"}
    # 16 x 256 x 512: 4 tiles x 8 k tiles = 32 units, 4 per CTA, so 8 CTAs.
    assert small[fc.STREAMK]["grid"] == [8, 1, 1] and small[fc.STREAMK]["cluster"] == 1
    for name in (fc.BIAS_ACT, fc.SMALL_M, fc.PACKED, fc.STREAMK, f"{fc.SMALL_M} BN=128"):
        row = small[name]
        assert row["verdict"] == "OK" and len(row["times_ms"]) == 3
        assert all(len(t) == 20 for t in row["times_ms"])
        assert row["speedup_per_round"] == {"cublas+elementwise": [1.0, 1.0, 1.0]}
        assert row["percent_of_copy"] > 0 and row["percent_of_stream"] > 0
    assert small["cublas+elementwise"]["verdict"] == "OK"
    assert timing[0]["stream"]["bytes"] == 512 * 256 * 2 and "stream" not in timing[1]
    assert set(timing[0]["stream"]["reads"]) == {"ldg", "bulk"}
    assert "percent_of_copy" not in large[fc.BIAS_ACT]
    assert record["copy_bandwidth"]["bytes"] == 1 << 20 and record["gpu"]["name"] == "stand-in"


def test_the_streamk_grid_probe_times_a_cta_per_tile_and_the_hosts_grid():
    """benchmarks/streamk_grid_probe.py's claims: at each shape its first grid gives every
    CTA one whole tile, it times the parent's own CTA count (one per tile, or two per tile
    where the parent splits K in two), and the host's grid of one CTA per SM."""
    probe = benchmark_script("streamk_grid_probe")
    for shape, grids in probe.GRIDS.items():
        spec = small_m_for(STREAMK, shape)
        tiles_n, tiles_m, k_tiles = small_m_tiles(spec.param_dict, shape)
        assert grids[0] == tiles_n * tiles_m
        parent = small_m_for(BY_NAME["hgemm_small_m"], shape)
        assert parent.grid_dims(shape)[0] in grids   # the parent's CTA count, cut the same
        assert spec.grid_dims(shape) == (H200_MULTIPROCESSORS, 1, 1)
        assert H200_MULTIPROCESSORS in grids and all(g <= tiles_n * tiles_m * k_tiles for g in grids)


def test_small_m_probes_patch_the_committed_kernel_and_nothing_else():
    """benchmarks/small_m_probe.py adds its six %globaltimer probes to hgemm_small_m in the
    committed fused.cu (and the bulk read's two), and the probed kernel still builds for
    sm_90a without spills; a source without the anchors is refused in one sentence."""
    probe = benchmark_script("small_m_probe")
    source = (KERNEL_DIR / "fused.cu").read_text()
    patched = probe.patch_probes(source)
    assert patched.count("ps_probe[") == 7 and "ps_gtime" in patched
    # The probes are all it adds: without them the text is the committed one.
    bare = [line for line in patched.replace(probe.PROBE_DECL, "").splitlines(keepends=True)
            if "ps_probe[" not in line and "const int ps_cta" not in line]
    assert "".join(bare) == source
    spec = small_m_for(BY_NAME["hgemm_small_m"], Shape(16, 4096, 4096))
    expr = spec.name_expression("bf16")
    mod = compile_cubin(CompileRequest(patched, "fused.cu", (expr,), ARCH, spec.flags, KERNEL_DIR))
    assert not mod.usage(expr).spills
    assert probe.probe_bulk_source(fc.BULK_SOURCE).count("ps_probe[") == 3
    # The launch-path variant: the same read with three tensor maps and THREADS threads.
    variants = probe.launch_variants_source(fc.BULK_SOURCE)
    assert variants.count("ps_probe[") == 5 and "const __grid_constant__ TensorMap2D tc" in variants
    tm = f"bulk_tm<{fc.BULK_STAGES}, {fc.BULK_CHUNK}, 256>"
    assert compile_cubin(CompileRequest(variants, "probe_launch.cu", (tm,), ARCH, (), KERNEL_DIR))
    with pytest.raises(ValueError, match="probe anchor found 0 times"):
        probe.patch_probes("__global__ void other() {}")


def test_small_m_ramp_probes_time_the_first_ring_and_nothing_else():
    """--ramp's probes: clock64 at the producer's start and after each of its first steps,
    and at the first consumer's landing; without them the kernel is the committed one."""
    probe = benchmark_script("small_m_probe")
    source = (KERNEL_DIR / "fused.cu").read_text()
    patched = probe.patch_ramp(source)
    for row in range(8):
        assert f"ps_ramp[{row}][ps_cta]" in patched
    # Unpatched back: the declaration and the probe lines out, the early loop as it was.
    loop = ("        for (int i = 0; i < early; ++i) {\n            issue(i);\n"
            "            if (i == 0) ps_ramp[3][ps_cta] = clock64();\n        }\n")
    assert patched.count(loop) == 1
    bare = patched.replace(probe.RAMP_DECL, "").replace(
        loop, "        for (int i = 0; i < early; ++i) issue(i);\n")
    assert "".join(line for line in bare.splitlines(keepends=True)
                   if "ps_ramp[" not in line and "const int ps_cta" not in line) == source
    with pytest.raises(ValueError, match="ramp anchor found 0 times"):
        probe.patch_ramp("__global__ void other() {}")


def test_small_m_probe_refuses_a_split_over_the_grid(capsys):
    """The probes index CTAs by x and y: the host's GSPLIT shapes are refused in a sentence
    before any GPU work."""
    probe = benchmark_script("small_m_probe")
    assert probe.main(["--shape", "256x4096x14336"]) == 2
    assert "splits K over the grid at 256x4096x14336" in capsys.readouterr().err


@pytest.mark.slow
def test_epilogue_cost_variants_patch_the_committed_epilogue():
    """benchmarks/epilogue_cost.py builds hgemm_fused_bias_act with parts of its epilogue
    taken out of the committed fused.cu; each builds for sm_90a without spills, and the SASS
    holds what each keeps: no global loads and no activation without the epilogue, no loads
    with a constant for the bias, the bias's 32 loads otherwise (BN / 8 pairs a thread), and
    tanh only with GELU."""
    import dataclasses

    cost = benchmark_script("epilogue_cost")
    counts = {}
    for name, (repl, act, _) in cost.VARIANTS.items():
        spec = dataclasses.replace(BY_NAME["hgemm_fused_bias_act"], kernel_dir=cost._variant_dir(repl))
        spec = spec.with_params(ACT=act)
        mod = compile_stage(spec, "bf16", ARCH)
        assert not mod.usage(spec.name_expression("bf16")).spills, name
        ops = Counter(disassemble(mod.cubin_path).kernel(mod.mangled(spec.name_expression("bf16"))).opcodes)
        counts[name] = (sum(v for k, v in ops.items() if k.startswith("LDG")),
                        sum(v for k, v in ops.items() if k.startswith("MUFU.TANH")))
    assert counts["none"] == (0, 0) and counts["constant"] == (0, 0)
    assert all(counts[v][0] >= 32 for v in ("bias-loaded", "bias-held", "gelu-loaded", "gelu-held"))
    assert counts["bias-held"][1] == 0 and counts["gelu-held"][1] > 0
    with pytest.raises(ValueError, match="probe anchor not found once"):
        cost.patched("// nothing here\n", cost.VARIANTS["none"][0])


def test_bench_fused_takes_the_tune_stores_best(tmp_path):
    """benchmarks/bench_fused.py --tuned: at a shape the committed fused tune store holds,
    hgemm_fused_bias_act at each dtype's best configuration; nothing where it holds none."""
    import lzma

    store = tmp_path / "tune-fused.sqlite"
    store.write_bytes(lzma.decompress((ROOT / "reports/reference/h200/fused/tune/"
                                       "tune-fused.sqlite.xz").read_bytes()))
    bf = benchmark_script("bench_fused")
    jobs = bf.tuned_jobs(store, Shape(4096, 8192, 8192))
    assert [(j.spec.name, j.dtype) for j in jobs] == [("hgemm_fused_bias_act", "fp16"),
                                                     ("hgemm_fused_bias_act", "bf16")]
    bf16 = jobs[1].spec.param_dict
    assert (bf16["STAGES"], bf16["GROUP"], bf16["BOXES"], bf16["STREAMK"], bf16["DEFER"]) == \
        (3, 16, 4, 3, 1)
    assert bf.tuned_jobs(store, Shape(16, 8192, 8192)) == []


def test_bench_fused_plans_every_shape_it_times():
    """benchmarks/bench_fused.py's whole run plans without a refusal: hgemm_small_m_streamk
    only where it takes M (up to 64), hgemm_small_m up to 256, the quantising stage at 4096."""
    bf = benchmark_script("bench_fused")
    jobs = bf.plan_jobs(bf.M_VALUES, None)
    by_m: dict[int, set[str]] = {}
    for job in jobs:
        by_m.setdefault(job.shape.m, set()).add(job.spec.name)
    small = {"hgemm_fused_bias_act", "hgemm_small_m", "hgemm_small_m_packed"}
    assert by_m[16] == by_m[64] == {*small, "hgemm_small_m_streamk"}
    assert by_m[256] == small
    assert by_m[4096] == {"hgemm_fused_bias_act", "hgemm_fused_pingpong", "hgemm_fused_quant"}
    assert len(jobs) == 2 * len(bf.NK) * (4 + 4 + 3 + 4)   # fp8 and int8 quant jobs at 4096


def test_small_m_tiles_decode_mode_plans_each_width_with_the_split_that_fills_the_sms():
    """benchmarks/small_m_tiles.py --decode: at every M <= 64 shape the host's choice and
    64, 128 and 256 columns, each planned without a refusal; a wider tile splits K more
    ways so the grid still covers the SMs (fused/small-m-decode.json measured them)."""
    from perfscope.kernels.fused_specs import fused_geometry

    tiles = benchmark_script("small_m_tiles")
    jobs = tiles.plan_jobs("decode")
    assert len(jobs) == 2 * len(tiles.DECODE_SHAPES) * len(tiles.DECODE_CONFIGS)
    assert all(j.refusal is None for j in jobs)
    grid = {(j.shape, j.spec.param_dict["BN"]): fused_geometry(j.spec, j.shape, 132)
            for j in jobs}
    assert grid[(Shape(16, 8192, 8192), 64)] == ((128, 1, 1), 1)
    assert grid[(Shape(16, 8192, 8192), 128)] == ((128, 1, 1), 2)
    assert grid[(Shape(16, 8192, 8192), 256)] == ((128, 1, 1), 4)
    assert grid[(Shape(64, 4096, 14336), 256)] == ((128, 1, 1), 8)


@pytest.mark.parametrize("shape, gsplit", [
    (Shape(256, 4096, 14336), 2),   # measured 1.05 of cublas+gelu against 0.93-0.95
    (Shape(200, 4104, 8200), 2),    # 66 pairs' CTAs x 2 parts: 132, every SM
    (Shape(256, 4096, 4096), 1),    # 64 k tiles: the 128 x 64 tiles stay (measured faster)
    (Shape(256, 8192, 8192), 1),    # the pairs alone fill the SMs
    (Shape(128, 4096, 14336), 1),   # one tile row: no pair to split
    (Shape(64, 4096, 14336), 1),    # M <= 64: the cluster's split stays (mixed when timed)
])
def test_small_m_splits_pairs_over_the_grid_where_measured(shape, gsplit):
    spec = small_m_for(BY_NAME["hgemm_small_m"], shape)
    p = spec.param_dict
    assert p["GSPLIT"] == gsplit
    if gsplit > 1:
        assert (p["BM"], p["BN"], p["MPAIR"], p["STAGES"]) == (128, 128, 2, 6)
        grid, cluster = fused_geometry(spec, shape, H200_MULTIPROCESSORS)
        assert cluster == 2 and grid[2] == gsplit
        assert grid[0] * grid[1] * grid[2] <= H200_MULTIPROCESSORS
        # Part 0 waits for the other parts: a GPU that cannot hold every pair at once refuses.
        with pytest.raises(PerfscopeError, match="clusters of 2 resident at once"):
            fused_geometry(spec, shape, H200_MULTIPROCESSORS, lambda ctas, clusters: False)
        # A pinned tile parameter keeps the host's other choice; so does a GPU whose
        # multiprocessors do not hold both parts (an H100 PCIe's 114).
        assert small_m_for(BY_NAME["hgemm_small_m"].with_params(BN=64), shape,
                           {"BN": 64}).param_dict["GSPLIT"] == 1
        assert small_m_for(BY_NAME["hgemm_small_m"], shape, None, 114).param_dict["GSPLIT"] == 1


@pytest.mark.parametrize("shape, pinned, says", [
    (Shape(16, 4096, 4096), {"GSPLIT": 5}, "1 to 4 parts, not GSPLIT=5"),
    (Shape(256, 8192, 8192), {"BM": 256, "BN": 128, "GSPLIT": 2}, "not BM=256"),
    (Shape(16, 4096, 64), {"GSPLIT": 2}, "cannot split K=64 (1 k tiles)"),
    (Shape(16, 8192, 8192), {"GSPLIT": 2}, "needs 256 CTAs resident at once"),
])
def test_small_m_refuses_a_grid_split_it_cannot_run(shape, pinned, says):
    with pytest.raises(PerfscopeError, match=re.escape(says)):
        bench.plan(["hgemm_small_m"], ["bf16"], shape, pinned)


@pytest.mark.slow
def test_small_m_grid_split_pushes_and_adds_partials_without_spills():
    """GSPLIT=2 at the host's paired 128 x 128 tiles: the stream-K workspace's flag store
    (RED/ATOM) and the acquire load the finisher spins on, B multicast in the pair, no spill;
    GSPLIT=1 (the default) has neither the flag nor its wait."""
    tool = disassembler_or_skip()
    shape = Shape(256, 4096, 14336)
    split = small_m_for(BY_NAME["hgemm_small_m"], shape)
    plain = split.with_params(GSPLIT=1)
    counts = {}
    for spec in (split, plain):
        mod = compile_stage(spec, "bf16", ARCH)
        assert not mod.usage(spec.name_expression("bf16")).spills, mod.log
        ops = disassemble(mod.cubin_path, tool).kernel(mod.mangled(spec.name_expression("bf16"))).opcodes
        counts[spec.param_dict["GSPLIT"]] = (
            sum(v for op, v in ops.items() if op.startswith(("ATOM", "RED"))),
            sum(v for op, v in ops.items() if op.startswith("LDG") and "STRONG.GPU" in op),
            sum(v for op, v in ops.items() if op.startswith("UTMALDG") and "MULTICAST" in op))
    assert counts[2][0] > 0 and counts[2][1] > 0 and counts[2][2] > 0, counts
    assert counts[1][0] == 0 and counts[1][1] == 0, counts


def test_fused_check_labels_say_how_k_is_split():
    """The check's tables tell a cluster's splits from a pair sharing an operand and from
    parts over the grid (its "S=2" once named a pair's cluster as two splits)."""
    assert fc._launch_label({"cluster": 2, "params": {"MPAIR": 2, "GSPLIT": 2}}) == " pair z=2"
    assert fc._launch_label({"cluster": 2, "params": {"MPAIR": 1}}) == " S=2"
    assert fc._launch_label({"cluster": 4, "params": {"MPAIR": 2}}) == " S=2 pair"
    assert fc._launch_label({"cluster": 1, "params": {}}) == ""


def test_fused_check_summary_gives_the_bound_of_a_kernel_at_the_reads_rate():
    """The summary's "bound" column is the speedup over cuBLAS + elementwise of a kernel
    moving its compulsory bytes at the same-size read's rate, as the fused page draws it
    (perfscope.bandwidth), on the committed H200 check."""
    import json
    import lzma

    from perfscope.bandwidth import read_panels

    fused = Path(__file__).resolve().parents[1] / "reports" / "reference" / "h200" / "fused"
    check = fused / "fused_check.json.xz"
    with lzma.open(check) as f:
        record = json.load(f)
    panels = {(p.dtype, p.m, p.n, p.k): p for p in read_panels(check)}
    for e in record["timing"]:
        key = (e["dtype"], e["m"], e["n"], e["k"])
        if key in panels:
            assert fc.read_bound(e) == pytest.approx(panels[key].stream_bound())
    every = fc.summary(record).splitlines()
    # Two tables: the row-major stages, then with hgemm_small_m_packed; the first here.
    lines = every[:every.index("")]
    assert lines[1].split()[-2:] == ["bound", "%copy"]
    assert every[every.index("") + 1].startswith("summary (bias + GELU) with hgemm_small_m_packed")
    (decode,) = [line for line in lines if line.split()[:4] == ["bf16", "16", "8192", "8192"]]
    assert "1.16" in decode.split()
    # No read timed (M = 4096 rows, or an older check): no bound, said as "-".
    big = next(e for e in record["timing"] if e["m"] == 4096)
    assert fc.read_bound(big) is None
    (line,) = [x for x in lines if x.split()[:4] == [big["dtype"], "4096", str(big["n"]), str(big["k"])]]
    assert line.split()[-1] == "-"


def test_small_m_probe_spans_are_each_ctas_own():
    """The probe's per-CTA spans subtract a CTA's own timestamps: a late CTA with a short
    epilogue does not read as a long one (the phases' medians over all CTAs would)."""
    import numpy as np

    probe = benchmark_script("small_m_probe")

    class FakeCupy:
        @staticmethod
        def asnumpy(a):
            return a

    ns = np.zeros((6, 4), dtype=np.uint64)
    # CTA c starts at c us; its first tile lands 1.5 us later, its last k tile 20 us after
    # that, its reduction takes c x 0.1 us and its epilogue 0.5 us.
    for c in range(3):   # the fourth column is a CTA slot the launch did not use
        t0 = 1000 * c
        ns[:, c] = [t0, t0 + 500, t0 + 1500, t0 + 21500, t0 + 21500 + 100 * c, t0 + 22000 + 100 * c]
    spans = probe._spans(FakeCupy, ns, 3)
    assert spans["ramp"] == {"min": 1.5, "median": 1.5, "max": 1.5}
    # A CTA that recorded no epilogue start (a split's part that hands its partial on) is
    # left out of the spans that need it, not read as a span from time zero.
    ns[4, 2] = 0
    assert probe._spans(FakeCupy, ns, 3)["epilogue"] == {"min": 0.5, "median": 0.5, "max": 0.5}
    ns[4, 2] = 21500 + 2000 + 200
    spans = probe._spans(FakeCupy, ns, 3)
    assert spans["epilogue"] == {"min": 0.5, "median": 0.5, "max": 0.5}
    assert spans["reduction"] == {"min": 0.0, "median": 0.1, "max": 0.2}
    assert spans["whole"]["max"] == 22.2
    # A bulk read records only its start and end: only the whole span.
    bulk = np.zeros((6, 2), dtype=np.uint64)
    bulk[0], bulk[5] = [0, 100], [8000, 9100]
    assert set(probe._spans(FakeCupy, bulk, 2)) == {"whole"}


def test_launch_gap_says_what_the_fused_readme_reads_from_it():
    """benchmarks/launch_gap.py at 256x4096x4096 on the H200 (fused/launch-gap.json): with an
    event between the flush and the launch the fused kernel takes longer than cuBLASLt's
    GELU_BIAS kernel, with the two bracketed together they tie within 1%, reading the
    operands' pages or setting the shared-memory carve-out after the flush moves its time
    by under 3%, and warm (the weight in L2) cuBLASLt's kernel is faster by over 5%. Every
    mode the script times is documented in its docstring."""
    import json

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import launch_gap

    assert all(f"``{mode}``" in launch_gap.__doc__ for mode in launch_gap.MODES)
    path = Path(__file__).resolve().parents[1] / "reports/reference/h200/fused/launch-gap.json"
    record = json.loads(path.read_text())
    (row,) = [r for r in record["shapes"] if r["shape"] == "256x4096x4096"]
    assert row["output_difference"] < 1e-2
    mine, lt = (row["candidates"][name] for name in launch_gap.CANDIDATES)

    def us(entry: dict, mode: str) -> float:
        return entry[mode]["median_us"]

    assert us(mine, "flushed") > 1.02 * us(lt, "flushed")
    assert us(mine, "flushed_joined") == pytest.approx(us(lt, "flushed_joined"), rel=0.01)
    for mode in ("flushed_touched", "flushed_smem"):
        assert us(mine, mode) == pytest.approx(us(mine, "flushed"), rel=0.03), mode
    assert us(mine, "warm_stream") > 1.05 * us(lt, "warm_stream")
