"""The declared collection set: which ncu sections and metrics perfscope asks for.

``--set full`` costs 35-45 replay passes and ~1 MB of report per kernel, most of it for
views nobody reads here (PM sampling timelines, roofline charts, NVLink). This set holds
every section the report model's views come from, plus the metrics they read by name,
so a capture made with it loads with no "not collected" in any view. It is versioned:
a report records which set made it (in the run manifest), and a change here bumps it.
"""

from __future__ import annotations

from perfscope.profile import VIEW_METRICS

COLLECTION_VERSION = 1

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

EXTRA_METRICS: tuple[str, ...] = tuple(sorted(set(VIEW_METRICS) | {
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
