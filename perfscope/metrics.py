"""The ncu metric names perfscope reads: the ground floor every other module builds on.

One name, one constant. The report views (perfscope.profile), the rules (perfscope.rules)
and the collection set (perfscope.collection) all read their metric names from here, so a
name that drifts across ncu versions is fixed in one place. Nothing here imports anything
of perfscope's.
"""

from __future__ import annotations

import re

# -- identity and time --
M_DURATION = "gpu__time_duration.sum"
M_SM_CLOCK = "gpc__cycles_elapsed.avg.per_second"
# The chip's highest SM clock (kHz), a device attribute: what the clock during the kernel
# is held against.
M_SM_CLOCK_MAX = "device__attribute_max_gpu_frequency_khz"
M_MEM_CLOCK_MAX = "device__attribute_max_mem_frequency_khz"
M_REPLAY_PASSES = "profiler__replayer_passes"
M_CYCLES = "gpc__cycles_elapsed.max"
M_MEM_CLOCK = "dram__cycles_elapsed.avg.per_second"
CC_METRICS = ("device__attribute_compute_capability_major",
              "device__attribute_compute_capability_minor")
M_SM_COUNT = "device__attribute_multiprocessor_count"
M_DEVICE_NAME = "device__attribute_display_name"

# -- speed of light: field name in the SpeedOfLight view -> metric --
SOL_METRICS = {
    "sm_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "memory_pct": "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "dram_pct": "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "l1tex_pct": "l1tex__throughput.avg.pct_of_peak_sustained_active",
    "l2_pct": "lts__throughput.avg.pct_of_peak_sustained_elapsed",
}
MEMORY_FIELDS = ("l1tex_pct", "l2_pct", "dram_pct")
MEMORY_PCT_METRICS = tuple(SOL_METRICS[f] for f in MEMORY_FIELDS)

# -- warp states --
STALL_REASONS: tuple[str, ...] = (
    "barrier", "branch_resolving", "dispatch_stall", "drain", "gmma", "imc_miss",
    "lg_throttle", "long_scoreboard", "math_pipe_throttle", "membar", "mio_throttle", "misc",
    "no_instruction", "not_selected", "short_scoreboard", "sleeping", "tex_throttle", "wait",
)
STALL_METRICS: tuple[str, ...] = tuple(
    f"smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio" for r in STALL_REASONS)
STALL_AVG_RE = re.compile(r"^smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")
STALL_SAMPLE_RE = re.compile(r"^smsp__pcsamp_warps_issue_stalled_(\w+)$")
M_PC_SAMPLES = "smsp__pcsamp_sample_count"
M_LONG_SCOREBOARD_SAMPLES = "smsp__pcsamp_warps_issue_stalled_long_scoreboard"
# Warp-level executions per SASS instruction (SourceCounters, instanced by PC).
M_INST_EXECUTED_PC = "inst_executed"
M_ELIGIBLE = "smsp__warps_eligible.avg.per_cycle_active"
M_ISSUE_ACTIVE = "smsp__issue_active.avg.pct_of_peak_sustained_active"
M_INST_EXECUTED = "smsp__inst_executed.sum"

# -- memory --
SECTOR_BYTES = 32
M_SHARED_WAVEFRONTS = "memory_l1_wavefronts_shared"
M_SHARED_IDEAL = "memory_l1_wavefronts_shared_ideal"
M_GLOBAL_SECTORS = "memory_l2_theoretical_sectors_global"
M_GLOBAL_IDEAL = "memory_l2_theoretical_sectors_global_ideal"
M_BANK_LD = "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"
M_BANK_ST = "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"
M_L1_HIT = "l1tex__t_sector_hit_rate.pct"
M_L2_HIT = "lts__t_sector_hit_rate.pct"
M_LOCAL_LD_REQ = "l1tex__t_requests_pipe_lsu_mem_local_op_ld.sum"
M_LOCAL_ST_REQ = "l1tex__t_requests_pipe_lsu_mem_local_op_st.sum"
M_LOCAL_LD_SECT = "l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum"
M_LOCAL_ST_SECT = "l1tex__t_sectors_pipe_lsu_mem_local_op_st.sum"
M_SPILL_INST = "sass__inst_executed_register_spilling"
# Every L2 sector the SMs asked for, TMA copies included (MemoryWorkloadAnalysis_Tables);
# the plain lts__t_sectors.sum also counts traffic between the two L2 partitions.
M_L2_SECTORS = "lts__t_sectors_srcunit_tex.sum"
# The same, reads only: the operand bytes L2 sends to the SMs (tile reuse is judged on it).
M_L2_READ_SECTORS = "lts__t_sectors_srcunit_tex_op_read.sum"
# The requests those sectors came in (MemoryWorkloadAnalysis_Tables): a TMA box row of 128
# bytes that starts on a line is one request of 4 sectors, one that straddles two lines two.
M_L2_READ_REQUESTS = "lts__t_requests_srcunit_tex_op_read.sum"
# Sectors the crossbar delivers into each SM's L1TEX / shared memory (TMA tiles, multicast
# ones once per receiving CTA, cp.async, loads), as a share of its peak rate; with the L1TEX
# cycles and that rate (hardware.XBAR_TO_L1_SECTORS_PER_SM_CLOCK) the count itself. Both sit
# in MemoryWorkloadAnalysis; the raw .sum does not.
M_XBAR_IN_PCT = "l1tex__m_xbar2l1tex_read_sectors.sum.pct_of_peak_sustained_elapsed"
M_L1TEX_CYCLES = "l1tex__cycles_elapsed.sum"
M_DRAM_READ = "dram__bytes_read.sum"
M_DRAM_WRITE = "dram__bytes_write.sum"
TRAFFIC_METRICS_GLOBAL = (M_GLOBAL_SECTORS, M_GLOBAL_IDEAL, M_LOCAL_LD_SECT, M_LOCAL_ST_SECT)

# -- instructions and pipes --
M_OPCODES = "sass__inst_executed_per_opcode"
M_OPCODES_MOD = "sass__inst_executed_per_opcode_with_modifier_all"
OPCODE_METRICS = (M_OPCODES, M_OPCODES_MOD)
# Busy cycles of the tensor pipe (HMMA, HGMMA, ...) and of the FMA pipe, as a share of
# the elapsed cycles: how close the math unit the kernel uses is to its own peak.
M_TENSOR_PIPE = "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed"
M_FMA_PIPE = "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_elapsed"
PIPE_METRICS = (M_TENSOR_PIPE, M_FMA_PIPE)

# -- launch --
OCCUPANCY_LIMITS = {
    "registers": "launch__occupancy_limit_registers",
    "shared memory": "launch__occupancy_limit_shared_mem",
    "warps": "launch__occupancy_limit_warps",
    "blocks": "launch__occupancy_limit_blocks",
    "barriers": "launch__occupancy_limit_barriers",
}
M_REGISTERS = "launch__registers_per_thread"
M_BLOCK_SIZE = "launch__block_size"
M_GRID_SIZE = "launch__grid_size"
M_SMEM_STATIC = "launch__shared_mem_per_block_static"
M_SMEM_DYNAMIC = "launch__shared_mem_per_block_dynamic"
M_SMEM_DRIVER = "launch__shared_mem_per_block_driver"
M_WAVES = "launch__waves_per_multiprocessor"
# Cycles each SM had work: the busiest, the average and the idlest SM of the launch.
M_SM_ACTIVE_AVG = "sm__cycles_active.avg"
M_SM_ACTIVE_MAX = "sm__cycles_active.max"
M_SM_ACTIVE_MIN = "sm__cycles_active.min"
M_CLUSTER_SIZE = "launch__cluster_size"
CLUSTER_DIMS = ("launch__cluster_dim_x", "launch__cluster_dim_y", "launch__cluster_dim_z")
M_THEORETICAL_OCCUPANCY = "sm__maximum_warps_per_active_cycle_pct"
M_ACHIEVED_OCCUPANCY = "sm__warps_active.avg.pct_of_peak_sustained_active"
M_PERSISTING = "launch__persisting_l2_cache_size"
M_PASSES = "profiler__replayer_passes"
LAUNCH_METRICS = (M_REGISTERS, M_BLOCK_SIZE, M_GRID_SIZE, M_SMEM_STATIC, M_SMEM_DYNAMIC,
                  M_SMEM_DRIVER, M_WAVES, M_THEORETICAL_OCCUPANCY, M_ACHIEVED_OCCUPANCY,
                  *OCCUPANCY_LIMITS.values())

# The metrics the report views read (the collection set must hold them all).
VIEW_METRICS: tuple[str, ...] = (
    M_DURATION, M_SM_CLOCK, M_SM_CLOCK_MAX, M_CYCLES, M_MEM_CLOCK, *CC_METRICS, *SOL_METRICS.values(),
    M_PC_SAMPLES, M_SHARED_WAVEFRONTS, M_SHARED_IDEAL, M_GLOBAL_SECTORS, M_GLOBAL_IDEAL,
    M_BANK_LD, M_BANK_ST, M_L1_HIT, M_L2_HIT, M_LOCAL_LD_REQ, M_LOCAL_ST_REQ, M_LOCAL_LD_SECT,
    M_LOCAL_ST_SECT, M_SPILL_INST, *OPCODE_METRICS, M_INST_EXECUTED, M_ELIGIBLE, M_ISSUE_ACTIVE,
    *LAUNCH_METRICS, M_CLUSTER_SIZE, *CLUSTER_DIMS,
    *PIPE_METRICS,      # the engine's headroom reads the busier pipe
)
# What the pages read of every report besides: ncu writes these itself (device attributes,
# its own replay count), so they are never asked for by name; a profile read in a worker
# carries them (perfscope.loadpool).
PAGE_METRICS: tuple[str, ...] = (M_SM_CLOCK_MAX, M_MEM_CLOCK_MAX, M_REPLAY_PASSES)
