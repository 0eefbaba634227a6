"""Search spaces: the declared values, the static limits, and pruning on real ptxas output."""

from __future__ import annotations

import pytest

from perfscope.build import parse_ptxas_log
from perfscope.errors import PerfscopeError
from perfscope.kernels import REGISTRY, get_spec
from perfscope.stage import ResourceUsage
from perfscope.tune.compiling import CompileJob, compile_one
from perfscope.tune.space import (
    Config,
    compiled_prune,
    configurations,
    limits_for,
    static_prune,
    tunable_spec,
)

PERSISTENT = "hgemm_tma_wgmma_persistent"
H200 = limits_for("sm_90a")


def tunable():
    return [s for s in REGISTRY if s.space is not None]


def test_the_tunable_stages_declare_every_parameter_and_their_defaults():
    names = {s.name for s in tunable()}
    assert {"hgemm_tma_wgmma", "hgemm_tma_wgmma_ws", PERSISTENT, "hgemm_tma_wgmma_cluster",
            "sgemm_pipe", "hgemm_bcf_dbf_rw"} <= names
    for spec in tunable():
        assert spec.space.names == tuple(n for n, _ in spec.params), spec.name
        default = Config.of(spec, {})
        assert all(v in spec.space.choices(k) for k, v in default.values), spec.name
        # The configuration the registry runs today must survive its own space's pruning.
        assert static_prune(spec, default, spec.dtypes[0], limits_for(spec.archs[0])) is None, spec.name


def test_persistent_space_is_what_hopper_cu_supports():
    spec = get_spec(PERSISTENT)
    assert spec.space.choices("BM") == (128,)          # two 64-row consumer warpgroups
    assert spec.space.choices("BN") == (128, 256)      # Wgmma<T, 128> and <T, 256> only
    assert spec.space.choices("BK") == (64,)           # one 128-byte swizzled row
    legal = [c for c in configurations(spec) if static_prune(spec, c, "bf16", H200) is None]
    by_bn = {(bn, boxes): sorted({c.params["STAGES"] for c in legal
                                  if (c.params["BN"], c.params["BOXES"]) == (bn, boxes)
                                  and c.params["STREAMK"] == 0 and c.params["DEFER"] == 0})
             for bn in (128, 256) for boxes in (1, 2, 4)}
    # 227 KiB per block: BN=256 holds 3 ring slots beside a whole staged C tile and 4 beside
    # one or two staging boxes; BN=128 six (BOXES 4 is its whole tile, as 2 is).
    assert by_bn == {(128, 1): [2, 3, 4, 5, 6], (128, 2): [2, 3, 4, 5, 6], (128, 4): [2, 3, 4, 5, 6],
                     (256, 1): [2, 3, 4], (256, 2): [2, 3, 4], (256, 4): [2, 3]}
    # Each without stream-K, with it and with the tail split; each storing C between tiles
    # or deferring it into the next tile's k loop (the same shared memory).
    assert len(legal) == 2 * 3 * 115
    # Held at the whole tile without stream-K, the space is the one of the first sweep.
    whole = [c for c in configurations(spec, {"BOXES": 4, "STREAMK": 0, "DEFER": 0})
             if static_prune(spec, c, "bf16", H200) is None]
    assert len(whole) == 35


def test_shared_memory_over_the_opt_in_is_pruned_with_its_numbers():
    spec = get_spec(PERSISTENT)
    why = static_prune(spec, Config.of(spec, {"BN": 256, "STAGES": 4}), "bf16", H200)
    assert why is not None and "232448" in why and "shared memory" in why
    # The same configuration on a GPU that allows less is pruned for less.
    assert static_prune(spec, Config.of(spec, {"BN": 128, "STAGES": 6}), "bf16",
                        limits_for("sm_90a", smem_per_block=160 * 1024)) is not None


def test_space_rules_carry_their_reason():
    spec = get_spec("sgemm_pipe")
    bad = Config.of(spec, {"WM": 64, "WN": 128, "TM": 4, "TN": 4})   # 16 x 32 lanes
    assert "32 lanes" in static_prune(spec, bad, "fp32", H200)
    cluster = get_spec("hgemm_tma_wgmma_cluster")
    assert cluster.space.choices("GROUP") == (2, 4, 8, 16)


def test_tma_box_limit():
    spec = get_spec("hgemm_tma_wgmma")
    assert static_prune(spec, Config.of(spec, {"BM": 256}), "bf16", H200) is None
    # BM is the rows of A's box: 320 would exceed TMA's 256 (not declared, so built by hand).
    over = Config((("BM", 320), ("BN", 128), ("BK", 64), ("STAGES", 2)))
    assert "TMA box of A" in static_prune(spec, over, "bf16", H200)


def test_pins_are_checked_against_the_space():
    spec = get_spec(PERSISTENT)
    assert {c.params["BN"] for c in configurations(spec, {"BN": 128})} == {128}
    with pytest.raises(PerfscopeError, match="has no template parameter SPLITK"):
        configurations(spec, {"SPLITK": 2})
    with pytest.raises(PerfscopeError, match=r"BN=192 is not in .*BN takes 128, 256"):
        configurations(spec, {"BN": 192})


def test_a_fused_stage_holds_its_epilogue_unless_pinned():
    """hgemm_fused_bias_act searches its parent's options, never the epilogue: ACT and
    RESIDUAL stay at the stage's values unless --param pins another declared one."""
    spec = get_spec("hgemm_fused_bias_act")
    assert spec.space.held == ("ACT", "RESIDUAL")
    swept = configurations(spec, {"BN": 256, "GROUP": 8})
    assert {(c.params["ACT"], c.params["RESIDUAL"]) for c in swept} == {(1, 0)}
    assert {c.params["DEFER"] for c in swept} == {0, 1} and {c.params["STREAMK"] for c in swept} == {0, 1, 3}
    assert len(swept) == 5 * 3 * 3 * 2            # STAGES x BOXES x STREAMK x DEFER
    silu = configurations(spec, {"BN": 256, "GROUP": 8, "ACT": 2, "RESIDUAL": 1})
    assert {(c.params["ACT"], c.params["RESIDUAL"]) for c in silu} == {(2, 1)}
    with pytest.raises(PerfscopeError, match=r"ACT=3 is not in .*ACT takes 0, 1, 2"):
        configurations(spec, {"ACT": 3})
    # The parent's shared-memory limits hold: BN 256 keeps 3 slots beside a whole C tile.
    legal = [c for c in swept if static_prune(spec, c, "bf16", H200) is None]
    assert {c.params["STAGES"] for c in legal if c.params["BOXES"] == 4} == {2, 3}


def test_a_stage_without_a_space_is_refused():
    with pytest.raises(PerfscopeError, match="declares no search space; the stages perfscope can tune"):
        tunable_spec("hgemm_naive")


def test_config_keys_are_canonical():
    spec = get_spec(PERSISTENT)
    c = Config.of(spec, {"STAGES": 4, "BN": 128})
    assert c.key == '{"BK":64,"BM":128,"BN":128,"BOXES":4,"DEFER":0,"GROUP":8,"STAGES":4,"STREAMK":0}'
    assert Config.from_key(spec, c.key) == c
    assert c.label(spec.param_dict) == "BN=128 STAGES=4"
    assert Config.of(spec, {}).label(spec.param_dict) == "default"


# A ptxas -v report as NVRTC gives it for a kernel that spills (sgemm_reg8x8_capped's
# shape of report: -maxrregcount=64 on an 8x8 register tile).
SPILLING_LOG = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z5spillPfS_' for 'sm_90a'
ptxas info    : Function properties for _Z5spillPfS_
    168 bytes stack frame, 164 bytes spill stores, 164 bytes spill loads
ptxas info    : Used 64 registers, used 1 barriers, 8192 bytes smem, 376 bytes cmem[0]
"""


def test_compiled_prune_reads_spills_from_the_ptxas_report():
    spec = get_spec("sgemm_pipe")
    usage = parse_ptxas_log(SPILLING_LOG)["_Z5spillPfS_"]
    why = compiled_prune(spec, Config.of(spec, {}), usage, H200)
    assert why == "ptxas spills registers to local memory (164 B stores, 164 B loads)"
    assert compiled_prune(spec, Config.of(spec, {}), usage, H200, keep_spills=True) is None
    fine = ResourceUsage(registers=128, static_smem=8192, stack_frame=0, spill_stores=0, spill_loads=0)
    assert compiled_prune(spec, Config.of(spec, {}), fine, H200) is None
    # 384 threads of 255 registers need more than a multiprocessor's 65536.
    ws = get_spec("hgemm_tma_wgmma_ws")
    greedy = ResourceUsage(registers=255, static_smem=64, stack_frame=0, spill_stores=0, spill_loads=0)
    assert "255 registers x 384 threads" in compiled_prune(ws, Config.of(ws, {}), greedy, H200)


@pytest.mark.slow
@pytest.mark.usefixtures("private_cubin_cache")
def test_compile_prunes_a_spilling_configuration_on_real_ptxas_output():
    """hgemm_tma_wgmma with BM=256 and BN=256 holds 512 fp32 accumulators per thread in
    one warpgroup: ptxas must spill, and the tuner prunes it; the default compiles clean."""
    spec = get_spec("hgemm_tma_wgmma")
    spilling = compile_one(CompileJob(spec.name, "bf16", "sm_90a", Config.of(spec, {"BM": 256, "BN": 256})))
    assert spilling.usage is not None and spilling.usage.spills
    assert "spills registers" in compiled_prune(spec, spilling.job.config, spilling.usage, H200)
    clean = compile_one(CompileJob(spec.name, "bf16", "sm_90a", Config.of(spec, {})))
    assert clean.usage is not None and compiled_prune(spec, clean.job.config, clean.usage, H200) is None
    assert clean.seconds > 0 and not clean.from_cache
    again = compile_one(clean.job)
    assert again.from_cache


@pytest.mark.slow
@pytest.mark.usefixtures("private_cubin_cache")
def test_a_static_assert_becomes_a_pruning_reason():
    spec = get_spec("hgemm_bcf_dbf_rw")
    # BK=16 with BM=64: 64 * 2 chunks over 256 threads is not whole; the kernel's
    # static_assert says so, and the compile outcome carries it as the reason.
    out = compile_one(CompileJob(spec.name, "fp16", "sm_90a", Config.of(spec, {"BM": 64, "BK": 16})))
    assert out.usage is None
    assert out.reason.startswith("does not compile: ")
    assert "16-byte chunks" in out.reason or "static assertion" in out.reason
