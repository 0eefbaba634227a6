"""The rule table: one explicit tuple. Adding a rule is adding one entry here and its tests."""

from __future__ import annotations

from dataclasses import dataclass

from perfscope.metrics import VIEW_METRICS
from perfscope.rules.cache import NO_GRID_SWIZZLE, PERSISTING_MISUSE
from perfscope.rules.clock import CLOCK_HELD
from perfscope.rules.correctness import INCORRECT, UNVERIFIED
from perfscope.rules.instructions import (
    ISSUE_OVERHEAD,
    LEGACY_MMA,
    NO_TENSOR_CORES,
    NO_TMA,
    PRODUCER_DIVISION,
    WGMMA_SERIALIZED,
)
from perfscope.rules.latency import (
    BARRIER_BOUND,
    EPILOGUE_EXPOSED,
    EPILOGUE_MATH_EXPOSED,
    FENCE_BOUND,
    FFMA_DISPATCH,
    FRAGMENT_BURSTS,
    K_LOOP_MATH,
    LOADS_NOT_OVERLAPPED,
    MATH_GAP,
    MMA_SERIALIZED,
    PARTLY_EXPOSED,
    REGISTER_REUSE,
)
from perfscope.rules.launch import SMALL_GRID, TAIL, TILE_WASTE, UNEVEN_SMS
from perfscope.rules.layout import OPERAND_LAYOUT, UNALIGNED_ROWS
from perfscope.rules.memory import (
    AT_SMEM_ROOF,
    BANK_CONFLICTS_LOADS,
    BANK_CONFLICTS_STORES,
    MISALIGNED_TMA,
    NO_DATA_REUSE,
    SCALAR_LOADS,
    SMALL_TILE,
    SMEM_BANDWIDTH,
    STORE_INEFFICIENCY,
    UNCOALESCED_GLOBAL,
    UNCOALESCED_SHARED,
    WGMMA_SMEM_ROOF,
)
from perfscope.rules.model import Rule
from perfscope.rules.registers import REGISTER_OCCUPANCY, SMEM_OCCUPANCY, SPILLS, SPILLS_STATIC
from perfscope.rules.roofline import DRAM_BOUND, FIXED_TIME, SHORT_RUNS

REGISTRY: tuple[Rule, ...] = (
    UNCOALESCED_GLOBAL,      # PS101
    SCALAR_LOADS,            # PS102
    NO_DATA_REUSE,           # PS103
    SMALL_TILE,              # PS104
    STORE_INEFFICIENCY,      # PS105
    MISALIGNED_TMA,          # PS106
    UNALIGNED_ROWS,          # PS107
    OPERAND_LAYOUT,          # PS108
    BANK_CONFLICTS_LOADS,    # PS110
    BANK_CONFLICTS_STORES,   # PS111
    UNCOALESCED_SHARED,      # PS112
    SMEM_BANDWIDTH,          # PS113
    WGMMA_SMEM_ROOF,         # PS114
    AT_SMEM_ROOF,            # PS115
    LOADS_NOT_OVERLAPPED,    # PS120
    BARRIER_BOUND,           # PS121
    PARTLY_EXPOSED,          # PS122
    EPILOGUE_EXPOSED,        # PS123
    EPILOGUE_MATH_EXPOSED,   # PS124
    K_LOOP_MATH,             # PS125
    FENCE_BOUND,             # PS126
    MATH_GAP,                # PS127
    REGISTER_REUSE,          # PS128
    FRAGMENT_BURSTS,         # PS129
    SPILLS,                  # PS130
    REGISTER_OCCUPANCY,      # PS131
    SMEM_OCCUPANCY,          # PS132
    FFMA_DISPATCH,           # PS133
    NO_TENSOR_CORES,         # PS140
    LEGACY_MMA,              # PS141
    NO_TMA,                  # PS142
    ISSUE_OVERHEAD,          # PS143
    MMA_SERIALIZED,          # PS145
    TAIL,                    # PS150
    TILE_WASTE,              # PS151
    SMALL_GRID,              # PS152
    UNEVEN_SMS,              # PS153
    NO_GRID_SWIZZLE,         # PS160
    PERSISTING_MISUSE,       # PS161
    DRAM_BOUND,              # PS170
    CLOCK_HELD,              # PS171
    SHORT_RUNS,              # PS172
    FIXED_TIME,              # PS173
    INCORRECT,               # PS190
    UNVERIFIED,              # PS191
)

# Rules only the compiler's report can decide (ptxas's own words, or the SASS's loops), so
# only the static audit runs them: an ncu report carries no ptxas log, and perfscope reads
# no loops from a report's SASS.
COMPILER_ONLY: tuple[Rule, ...] = (
    WGMMA_SERIALIZED,        # PS144
    PRODUCER_DIVISION,       # PS146 (the SASS's loops, which perfscope reads only statically)
)

# The rules that need no counters, for `perfscope sass` (static SASS + ptxas resource
# usage + the compile target): the same rules as above, PS130 reading ptxas's spill
# report instead of executed spill instructions, and the compiler-only ones.
STATIC_REGISTRY: tuple[Rule, ...] = (
    SPILLS_STATIC,           # PS130
    NO_TENSOR_CORES,         # PS140
    LEGACY_MMA,              # PS141
    NO_TMA,                  # PS142
    *COMPILER_ONLY,
)

BY_CODE: dict[str, Rule] = {r.code: r for r in (*REGISTRY, *COMPILER_ONLY)}
if len(BY_CODE) != len(REGISTRY) + len(COMPILER_ONLY):
    raise ImportError("two rules share a code")


def rule_metrics() -> frozenset[str]:
    """Every metric any rule reads (the collection set must hold them all)."""
    return frozenset(m for r in REGISTRY for m in r.metrics)


def read_metrics() -> frozenset[str]:
    """Every metric the views and the rules read by name: what ncu is asked for by name
    (collection), and what a profile read in another process carries (loadpool)."""
    return frozenset((*VIEW_METRICS, *rule_metrics()))


@dataclass(frozen=True)
class RuleTable:
    """What `perfscope rules` shows."""

    rules: tuple[Rule, ...] = (*REGISTRY, *COMPILER_ONLY)
    kind: str = "rules"
