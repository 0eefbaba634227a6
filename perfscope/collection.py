"""The declared collection set: which ncu sections and metrics perfscope asks for.

``--set full`` costs 35-45 replay passes and ~1 MB of report per kernel, most of it for
views nobody reads here (PM sampling timelines, roofline charts, NVLink). This set holds
every section the report model's views come from, plus the metrics they read by name,
so a capture made with it loads with no "not collected" in any view. It is versioned
(COLLECTION_VERSION): a change here bumps it and re-runs the committed reference run.
"""

from __future__ import annotations

from perfscope.rules import read_metrics

# 3: device__attribute_max_gpu_frequency_khz asked for by name (PS171). ncu writes every
# device attribute into every report, so the version-2 captures committed hold it already
# (tests/test_rules_reference.py judges PS171 on each of them).
# 4: l1tex__m_xbar2l1tex_read_sectors.sum.pct_of_peak_sustained_elapsed and
# l1tex__cycles_elapsed.sum asked for by name (the bytes into the SMs PS104 and PS114 count).
# Both come
# with MemoryWorkloadAnalysis, so the version-3 captures committed hold them already and the
# rule reads them there (tests/test_rules.py checks the count against the tiles' bytes).
# 5: lts__t_requests_srcunit_tex_op_read.sum and smsp__pcsamp_warps_issue_stalled_long_scoreboard
# asked for by name (PS106: the sectors per L2 request of TMA box rows, and the main loop's
# operand waits). They come with MemoryWorkloadAnalysis_Tables and SourceCounters, so every
# version-4 capture committed holds them already (all but the narrow fixture).
COLLECTION_VERSION = 5

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

# Every metric the views and the rules read by name (the rules declare theirs, Rule.metrics),
# named explicitly so a section that holds other metrics in another ncu version cannot drop
# one of them. Static-audit rules read the compiler, not ncu, and are not asked for here.
EXTRA_METRICS: tuple[str, ...] = tuple(sorted(m for m in read_metrics() if " " not in m))


def ncu_collection_args() -> list[str]:
    """The ncu arguments that request this set."""
    args: list[str] = []
    for section in SECTIONS:
        args += ["--section", section]
    args += ["--metrics", ",".join(EXTRA_METRICS)]
    return args
