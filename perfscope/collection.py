"""The declared collection set: which ncu sections and metrics perfscope asks for.

``--set full`` costs 35-45 replay passes and ~1 MB of report per kernel, most of it for
views nobody reads here (PM sampling timelines, roofline charts, NVLink). This set holds
every section the report model's views come from, plus the metrics they read by name,
so a capture made with it loads with no "not collected" in any view. It is versioned
(COLLECTION_VERSION): a change here bumps it and re-runs the committed reference run.
"""

from __future__ import annotations

from perfscope.profile import VIEW_METRICS

COLLECTION_VERSION = 2

SECTIONS: tuple[str, ...] = (
    "SpeedOfLight",                 # sol
    "LaunchStats",                  # launch geometry, registers, shared memory, waves
    "Occupancy",                    # theoretical/achieved occupancy and its limits
    "WarpStateStats",               # stall cycles per issued instruction
    "SchedulerStats",               # eligible warps, issue activity
    "ComputeWorkloadAnalysis",      # pipe utilisation (tensor, FMA) for the rules
    "MemoryWorkloadAnalysis",       # hit rates, DRAM throughput
    "MemoryWorkloadAnalysis_Tables",  # bank conflicts, local-memory traffic
    "SourceCounters",               # per-instruction wavefronts/sectors, stall sampling
    "InstructionStats",             # executed opcode histogram
)

# What the rules (perfscope/rules) read by name beyond the views. Sections bring most of
# them already; naming them keeps a rule's inputs in the set whatever a section holds
# in another ncu version. tests/test_rules.py checks every rule's metrics against this.
RULE_METRICS: tuple[str, ...] = (
    "device__attribute_compute_capability_major", "device__attribute_compute_capability_minor",
    "launch__block_size", "launch__grid_size", "launch__registers_per_thread",
    "launch__shared_mem_per_block_static", "launch__shared_mem_per_block_dynamic",
    "launch__waves_per_multiprocessor", "launch__persisting_l2_cache_size",
    "sm__maximum_warps_per_active_cycle_pct",
    # PS105: L2 sectors the SMs requested, TMA copies included (version 2).
    "lts__t_sectors_srcunit_tex.sum",
    *(f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio" for reason in (
        "barrier", "branch_resolving", "dispatch_stall", "drain", "gmma", "imc_miss",
        "lg_throttle", "long_scoreboard", "math_pipe_throttle", "membar", "mio_throttle",
        "misc", "no_instruction", "not_selected", "short_scoreboard", "sleeping",
        "tex_throttle", "wait")),
)

EXTRA_METRICS: tuple[str, ...] = tuple(sorted(set(VIEW_METRICS) | set(RULE_METRICS) | {
    "sass__inst_executed_per_opcode_with_modifier_all",
    "launch__cluster_dim_x", "launch__cluster_dim_y", "launch__cluster_dim_z",
    "launch__cluster_size",
}))


def ncu_collection_args() -> list[str]:
    """The ncu arguments that request this set."""
    args: list[str] = []
    for section in SECTIONS:
        args += ["--section", section]
    args += ["--metrics", ",".join(EXTRA_METRICS)]
    return args
