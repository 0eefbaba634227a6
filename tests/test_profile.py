"""The report model against real H200 captures.

Every view is compared with the committed `ncu --import --page raw --csv` export of the
same report (an oracle that does not go through perfscope's metric reads), and the
purpose-built kernels must show what they were written to show.
"""

from __future__ import annotations

import math
import re

import pytest
from conftest import FIXTURES, csv_number, raw_csv, report

import perfscope
from perfscope.metrics import OCCUPANCY_LIMITS, SOL_METRICS
from perfscope.profile import KernelProfile

ALL = ["strided_copy", "float4_copy", "smem_transpose", "spill", "cublas_sgemm_4096",
       "cublas_hgemm_4096", "cublas_bgemm_4096", "many_launches", "narrow_sol_only"]


def close(value, expected) -> bool:
    if expected is None:
        return value is None
    # The CSV prints two decimals; counters print in full.
    return value is not None and math.isclose(value, expected, rel_tol=1e-6, abs_tol=0.0051)


@pytest.fixture(scope="module", params=ALL)
def loaded(request) -> tuple[str, list[KernelProfile]]:
    return request.param, perfscope.load(report(request.param))


def pairs(loaded):
    name, profiles = loaded
    rows = raw_csv(name)
    assert len(rows) == len(profiles), "one profile per profiled launch"
    return list(zip(profiles, rows, strict=True))


def test_identity_matches_oracle(loaded):
    for kp, row in pairs(loaded):
        assert row["Kernel Name"][0] in (kp.identity.demangled, kp.identity.name)
        assert row["Grid Size"][0] == str(kp.identity.grid).replace(" ", "").replace(",", ", ")
        assert row["Block Size"][0] == str(kp.identity.block).replace(" ", "").replace(",", ", ")
        assert row["CC"][0] == kp.identity.compute_capability
        assert close(kp.identity.sm_clock_hz, csv_number(row, "gpc__cycles_elapsed.avg.per_second"))
        assert close(kp.identity.cycles, csv_number(row, "gpc__cycles_elapsed.max"))
        assert close(kp.identity.mem_clock_hz, csv_number(row, "dram__cycles_elapsed.avg.per_second"))


def test_sol_matches_oracle(loaded):
    for kp, row in pairs(loaded):
        assert close(kp.sol.duration_ns, csv_number(row, "gpu__time_duration.sum"))
        for field, metric in SOL_METRICS.items():
            assert close(getattr(kp.sol, field), csv_number(row, metric)), field


def test_stalls_match_oracle(loaded):
    for kp, row in pairs(loaded):
        by_reason = {s.reason: s for s in kp.stalls.reasons}
        for col in row:
            m = re.match(r"^smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$", col)
            if m and m.group(1) != "selected":
                assert close(by_reason[m.group(1)].cycles_per_issue, csv_number(row, col)), col
            m = re.match(r"^smsp__pcsamp_warps_issue_stalled_(\w+)$", col)
            if m and not col.endswith("_not_issued"):
                reason = "no_instruction" if m.group(1) == "no_instructions" else m.group(1)
                if reason != "selected":
                    assert close(by_reason[reason].samples, csv_number(row, col)), col
        cycles = [s.cycles_per_issue or 0 for s in kp.stalls.reasons]
        assert cycles == sorted(cycles, reverse=True), "ranked by cycles"


def test_memory_matches_oracle(loaded):
    for kp, row in pairs(loaded):
        m = kp.memory
        assert close(m.shared.actual, csv_number(row, "memory_l1_wavefronts_shared"))
        assert close(m.shared.ideal, csv_number(row, "memory_l1_wavefronts_shared_ideal"))
        assert close(m.global_.actual, csv_number(row, "memory_l2_theoretical_sectors_global"))
        assert close(m.global_.ideal, csv_number(row, "memory_l2_theoretical_sectors_global_ideal"))
        # Nsight Compute's own derived excess is an independent check of the per-PC sum.
        assert close(m.shared.excess, csv_number(row, "derived__memory_l1_wavefronts_shared_excessive"))
        assert close(m.global_.excess,
                     csv_number(row, "derived__memory_l2_theoretical_sectors_global_excessive"))
        assert close(m.bank_conflicts_ld,
                     csv_number(row, "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"))
        assert close(m.bank_conflicts_st,
                     csv_number(row, "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"))
        assert close(m.l1_hit_rate_pct, csv_number(row, "l1tex__t_sector_hit_rate.pct"))
        assert close(m.l2_hit_rate_pct, csv_number(row, "lts__t_sector_hit_rate.pct"))
        ld = csv_number(row, "l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum")
        assert close(m.local_load_bytes, None if ld is None else 32 * ld)
        assert close(m.local_load_requests, csv_number(row, "l1tex__t_requests_pipe_lsu_mem_local_op_ld.sum"))
        assert close(m.spill_instructions, csv_number(row, "sass__inst_executed_register_spilling"))
        if m.shared.by_opcode:
            assert close(sum(o.actual for o in m.shared.by_opcode), m.shared.actual)


def test_launch_matches_oracle(loaded):
    for kp, row in pairs(loaded):
        la = kp.launch
        assert close(la.registers_per_thread, csv_number(row, "launch__registers_per_thread"))
        assert close(la.shared_static_bytes, csv_number(row, "launch__shared_mem_per_block_static"))
        assert close(la.shared_dynamic_bytes, csv_number(row, "launch__shared_mem_per_block_dynamic"))
        assert close(la.shared_driver_bytes, csv_number(row, "launch__shared_mem_per_block_driver"))
        assert close(la.block_size, csv_number(row, "launch__block_size"))
        assert close(la.grid_size, csv_number(row, "launch__grid_size"))
        assert close(la.theoretical_occupancy_pct, csv_number(row, "sm__maximum_warps_per_active_cycle_pct"))
        assert close(la.achieved_occupancy_pct,
                     csv_number(row, "sm__warps_active.avg.pct_of_peak_sustained_active"))
        assert close(la.waves_per_sm, csv_number(row, "launch__waves_per_multiprocessor"))
        for key, metric in OCCUPANCY_LIMITS.items():
            assert close(la.occupancy_limits.get(key), csv_number(row, metric)), key


def test_opcodes_match_oracle(loaded):
    for kp, row in pairs(loaded):
        total = csv_number(row, "sass__inst_executed_per_opcode")
        assert close(kp.opcodes.total, total if total else None)
        mod = csv_number(row, "sass__inst_executed_per_opcode_with_modifier_all")
        if mod:
            assert close(sum(kp.opcodes.with_modifiers.values()), mod)


def test_raw_metrics_match_oracle(loaded):
    """The long table carries the same numbers as ncu's own export."""
    for kp, row in pairs(loaded)[:2]:
        checked = 0
        for col in row:
            expected = csv_number(row, col)
            if expected is None or "__" not in col or col not in kp.metrics:
                continue
            value = kp.metrics[col][0]
            if isinstance(value, float):
                assert close(value, expected), col
                checked += 1
        assert checked > 100


# -- what the purpose-built kernels must show ------------------------------------------


def one(name: str, kernel: str | None = None) -> KernelProfile:
    (kp,) = perfscope.load(report(name), kernel)
    return kp


def test_transpose_shows_32_way_shared_excess_on_loads():
    kp = one("smem_transpose")
    (lds,) = kp.memory.shared.of_kind("load")
    assert lds.opcode == "LDS"
    assert 31 <= lds.ratio <= 33
    (sts,) = kp.memory.shared.of_kind("store")
    assert sts.excess == 0
    assert kp.memory.shared.excess_pct > 1000


def test_strided_copy_has_excess_global_sectors_and_float4_none():
    strided = one("strided_copy")
    assert strided.memory.global_.excess > 0
    (ldg,) = strided.memory.global_.of_kind("load")
    assert ldg.ratio == pytest.approx(8.0)
    vec = one("float4_copy")
    assert vec.memory.global_.excess == 0
    assert [o.opcode for o in vec.memory.global_.of_kind("load")] == ["LDG.E.128.CONSTANT"]


def test_capped_kernel_spills_and_uncapped_does_not():
    capped, uncapped = one("spill", "ps_regs_capped$"), one("spill", "uncapped")
    assert capped.memory.local_bytes > 0 and capped.memory.spill_instructions > 0
    assert {"LDL", "STL"} <= set(capped.opcodes.executed)
    assert capped.opcodes.has("local")
    assert capped.launch.registers_per_thread == 32
    assert uncapped.memory.local_bytes == 0 and not uncapped.opcodes.has("local")


def test_cublas_kernels_show_their_instructions():
    sgemm = one("cublas_sgemm_4096")
    assert sgemm.opcodes.has("ffma") and sgemm.opcodes.has("ldgsts")
    assert not sgemm.opcodes.has("gmma")
    for name in ("cublas_hgemm_4096", "cublas_bgemm_4096"):
        kp = one(name)
        assert kp.name.startswith("nvjet_sm90")
        assert kp.opcodes.has("gmma") and kp.opcodes.has("tma") and kp.opcodes.has("setmaxreg")
        assert not kp.opcodes.has("hmma")
        assert kp.identity.cluster == (2, 1, 1) and kp.launch.cluster_size == 2


def test_hotspots_point_at_source_lines():
    kp = one("smem_transpose")
    assert kp.hotspots and kp.hotspots[0].samples >= kp.hotspots[-1].samples
    lds = next(h for h in kp.hotspots if h.opcode == "LDS")
    assert lds.line is not None and lds.reasons


def test_ncu_rules_are_kept():
    kp = one("smem_transpose")
    ids = {r.identifier for r in kp.ncu_rules}
    assert "SharedMemoryConflicts" in ids
    conflict = next(r for r in kp.ncu_rules if r.identifier == "SharedMemoryConflicts")
    assert conflict.type == "optimization" and conflict.speedup_pct > 0


def test_narrow_report_leaves_views_none_not_zero():
    kp = one("narrow_sol_only")
    assert kp.sol.duration_ns is not None and kp.sol.sm_pct is not None
    assert kp.memory.shared.actual is None and kp.memory.shared.excess is None
    assert kp.memory.l2_hit_rate_pct is None and kp.memory.local_bytes is None
    assert kp.stalls.reasons == () and kp.hotspots == ()
    assert kp.opcodes.total is None and kp.opcodes.families == {}
    assert kp.launch.achieved_occupancy_pct is None


def test_many_launches_capture_has_24():
    profiles = perfscope.load(report("many_launches"))
    assert len(profiles) == 24
    assert len({(p.identity.range_index, p.identity.action_index) for p in profiles}) == 24


def test_load_many_filters_and_expands_folders(tmp_path):
    from conftest import FIXTURES

    profiles = perfscope.load_many([FIXTURES], kernel="nvjet")
    assert {p.name.split("_")[0] for p in profiles} == {"nvjet"}
    # cublas_hgemm_4096, cublas_bgemm_4096, torch_mlp's six GEMM launches, and the GEMM of
    # each cublas+gelu group in fused/ (a subfolder: folders are searched recursively).
    assert len(profiles) == 10


def test_a_report_loaded_again_is_not_read_again(tmp_path, monkeypatch):
    """The report reader leaks every report it reads per-instruction metrics from
    (IMetric.correlation_ids), so a process gets the profiles it already has for the same
    file: not opened again, equal launches, a list of its own; another path to the same
    bytes, a changed file or another kernel filter is read anew."""
    import os
    import shutil

    from perfscope import profile as prof_mod

    src = tmp_path / "float4_copy.ncu-rep.xz"
    shutil.copyfile(report("float4_copy"), src)
    first = prof_mod.load(src)
    opened = []
    real = prof_mod.open_report
    monkeypatch.setattr(prof_mod, "open_report", lambda p: opened.append(p) or real(p))
    again = prof_mod.load(src)
    assert opened == [] and again == first and again is not first
    again.clear()
    assert prof_mod.load(src) == first                      # the cache keeps its own list
    other = tmp_path / "copy.ncu-rep.xz"
    shutil.copyfile(src, other)
    assert prof_mod.load(other)[0].identity.source == str(other) and opened == [other]
    st = src.stat()
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    prof_mod.load(src)
    prof_mod.load(src, kernel="no_such_kernel")
    assert opened == [other, src, src]


def test_main_loop_operand_waits_tell_a_shallow_ring_from_a_deep_one():
    """HotLoop.operand_waits: long-scoreboard samples at the main loop's PCs over all samples
    (the consumers at the full barrier). The persistent stage's 3-stage ring waits 0.31; its
    4-stage tuned configuration 0.043, as cuBLAS's nvjet (0.037); no samples, None."""
    from perfscope.profile import load

    ref = FIXTURES.parents[2] / "reports" / "reference" / "h200"
    waits = {name: load(path)[0].hot_loop.operand_waits for name, path in (
        ("default", ref / "hgemm_tma_wgmma_persistent-bf16-4096x4096x4096.ncu-rep.xz"),
        ("tuned", ref / "probes" / "hgemm_tma_wgmma_persistent@BOXES=1,DEFER=1,STAGES=4-bf16-"
                                   "4096x4096x4096.ncu-rep.xz"),
        ("cublas", ref / "cublas_bgemm-bf16-4096x4096x4096.ncu-rep.xz"))}
    assert 0.30 < waits["default"] < 0.32
    assert 0.03 < waits["tuned"] < 0.05 and 0.03 < waits["cublas"] < 0.05
    assert load(report("narrow_sol_only"))[0].hot_loop is None


def test_never_run_padding_is_in_the_issued_total_and_in_no_opcode():
    """ptxas's `@!PT LDS RZ, [RZ]` before each LDGSTS group is issued and counted by the
    opcode histogram, but loads nothing: the spread stage's only shared loads are its
    epilogue's LDS.128 (16 a warp a tile: 65,536), and the padding stays in the total."""
    from perfscope.profile import load

    ref = FIXTURES.parents[2] / "reports" / "reference" / "h200"
    op = load(ref / "probes" / "hgemm_ring_spread-bf16-4096x4096x4096-h100.ncu-rep.xz")[0].opcodes
    assert op.executed["LDS"] == 65_536 and op.with_modifiers["LDS.128"] == 65_536
    assert op.padding > 10 * op.executed["LDS"]
    assert op.total == sum(op.executed.values()) + op.padding
    # cuBLAS's wgmma kernel has no padding of this kind.
    assert load(ref / "cublas_bgemm-bf16-4096x4096x4096.ncu-rep.xz")[0].opcodes.padding == 0


def test_parked_warps_are_told_from_waits_of_the_work():
    """KernelProfile.parked: an instruction outside the main loop that each warp passes at
    most once and that holds at least a whole warp's life of samples per CTA. The clustered
    stages park a producer warpgroup's three spare warps at their exit barrier (the cluster
    variant: 3.1 warps per CTA, 26% of its samples, every one a barrier stall; hgemm_small_m's
    pairs 3.0, their 4 producer warps passing the barrier's fence, arrive and wait at one
    source line); the persistent stage and cuBLAS park none.
    Without them the cluster variant's barrier stall falls from 44% of its stall cycles to 23%,
    below the persistent stage's 30%."""
    from perfscope.profile import load

    ref = FIXTURES.parents[2] / "reports" / "reference" / "h200"
    cluster = load(ref / "hgemm_tma_wgmma_cluster-bf16-4096x4096x4096.ncu-rep.xz")[0]
    (p,) = cluster.parked
    assert p.opcode == "UCGABAR_WAIT" and p.line == 887 and p.file.endswith("hopper.cuh")
    assert p.addresses == (p.address,)
    assert p.passes == 1584 and 3.0 < p.warps_per_cta < 3.2
    assert p.reasons == (("barrier", p.samples),)
    assert 0.25 < cluster.parked_share < 0.27
    assert 0.43 < cluster.stalls.share("barrier") < 0.44
    assert 0.22 < cluster.working_stall_share("barrier") < 0.24
    assert math.isclose(sum(cluster.working_stall_share(s.reason) or 0.0
                            for s in cluster.stalls.reasons), 1.0)
    pairs = load(ref / "fused" / "hgemm_small_m@AROWS=128,BM=128,MPAIR=2,STAGES=6-bf16-"
                               "256x8192x8192.ncu-rep.xz")[0]
    (q,) = pairs.parked
    assert q.passes == 512 and 3.0 < q.warps_per_cta < 3.1 and q.line == 899
    assert len(q.addresses) == 3 and q.address in q.addresses
    assert dict(q.reasons) == {"barrier": 1047, "membar": 175}
    for name in ("hgemm_tma_wgmma_persistent-bf16", "cublas_bgemm-bf16"):
        kp = load(ref / f"{name}-4096x4096x4096.ncu-rep.xz")[0]
        assert kp.parked == () and kp.parked_share == 0.0
        assert kp.working_stall_share("barrier") == kp.stalls.share("barrier")
    narrow = load(report("narrow_sol_only"))[0]
    assert narrow.parked == () and narrow.working_stall_share("barrier") is None
