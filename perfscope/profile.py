"""KernelProfile: one profiled kernel launch, read from an Nsight Compute report.

``load(path)`` opens a ``.ncu-rep`` (or ``.ncu-rep.xz``) through Nsight Compute's own
Python report interface (``ncu_report``: the PyPI wheel, or the module inside a local
Nsight Compute install) and returns one KernelProfile per profiled launch. Views are
derived from the raw metrics once, at load:

- ``identity``: names, launch geometry, device, measured SM and memory clocks;
- ``sol``: speed-of-light percentages and duration;
- ``stalls``: warp stall cycles per issued instruction and sampled counts, ranked;
- ``memory``: excess shared wavefronts and global sectors from the per-instruction
  source counters (actual against ideal), split by SASS opcode; raw bank-conflict
  counters beside them; hit rates; local-memory (spill) traffic;
- ``launch``: registers, shared memory, occupancy and its limiter, waves;
- ``opcodes``: the executed SASS histogram and its opcode families;
- ``hotspots``: the instructions with the most warp-state samples;
- ``ncu_rules``: Nsight Compute's own rule results.

A metric the report lacks (another chip, another ncu version, a narrow section set) is
None in every view, never 0; renderers print "not collected".
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import importlib
import logging
import lzma
import os
import re
import shutil
import struct
import sys
import tempfile
import weakref
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfscope.cache import cache_root
from perfscope.errors import PerfscopeError
from perfscope.sass.families import base_opcode, group_families

# Seen with ncu-report 2025.3.1 on Python 3.11/3.12: once one of these C++ extensions is
# loaded, the reader's first string call (a metric's unit) kills the process; loaded
# after the reader they are harmless (CuPy aside on a GPU machine, where the two cannot
# share a process at all: kernels run in processes that read no report). So the reader
# is loaded here, when this module is imported, and perfscope.render imports this
# module before matplotlib.
READER_CONFLICTS = ("cupy._core.core", "matplotlib", "kiwisolver")
if not any(m in sys.modules for m in READER_CONFLICTS):
    with contextlib.suppress(ImportError):
        import ncu_report  # noqa: F401

log = logging.getLogger(__name__)

REPORT_SUFFIXES = (".ncu-rep", ".ncu-rep.xz")
# Every .ncu-rep starts with these bytes; anything else is not a report at all.
REPORT_MAGIC = b"NVR\x00"
HOTSPOT_COUNT = 10

# -- metric names (the ones the views read; the collection set must contain them) --
M_DURATION = "gpu__time_duration.sum"
M_SM_CLOCK = "gpc__cycles_elapsed.avg.per_second"
M_CYCLES = "gpc__cycles_elapsed.max"
M_MEM_CLOCK = "dram__cycles_elapsed.avg.per_second"
SOL_METRICS = {
    "sm_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "memory_pct": "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "dram_pct": "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "l1tex_pct": "l1tex__throughput.avg.pct_of_peak_sustained_active",
    "l2_pct": "lts__throughput.avg.pct_of_peak_sustained_elapsed",
}
STALL_AVG_RE = re.compile(r"^smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")
STALL_SAMPLE_RE = re.compile(r"^smsp__pcsamp_warps_issue_stalled_(\w+)$")
M_PC_SAMPLES = "smsp__pcsamp_sample_count"
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
M_OPCODES = "sass__inst_executed_per_opcode"
M_OPCODES_MOD = "sass__inst_executed_per_opcode_with_modifier_all"
M_INST_EXECUTED = "smsp__inst_executed.sum"
M_ELIGIBLE = "smsp__warps_eligible.avg.per_cycle_active"
M_ISSUE_ACTIVE = "smsp__issue_active.avg.pct_of_peak_sustained_active"
OCCUPANCY_LIMITS = {
    "registers": "launch__occupancy_limit_registers",
    "shared memory": "launch__occupancy_limit_shared_mem",
    "warps": "launch__occupancy_limit_warps",
    "blocks": "launch__occupancy_limit_blocks",
    "barriers": "launch__occupancy_limit_barriers",
}
SECTOR_BYTES = 32

# Which kind of shared-memory traffic an opcode is: cp.async writes land in shared
# memory too, and their excess means something else than a bank conflict on a load.
SHARED_KIND = {"LDS": "load", "LDSM": "load", "LDSU": "load", "STS": "store", "STSM": "store",
               "LDGSTS": "async-copy", "ATOMS": "atomic"}
GLOBAL_KIND = {"LDG": "load", "STG": "store", "LDGSTS": "async-copy", "ATOMG": "atomic",
               "RED": "atomic"}

# The metrics the views read, for the collection set and its CPU test.
VIEW_METRICS: tuple[str, ...] = (
    M_DURATION, M_SM_CLOCK, M_CYCLES, M_MEM_CLOCK, *SOL_METRICS.values(), M_PC_SAMPLES,
    M_SHARED_WAVEFRONTS, M_SHARED_IDEAL, M_GLOBAL_SECTORS, M_GLOBAL_IDEAL, M_BANK_LD, M_BANK_ST,
    M_L1_HIT, M_L2_HIT, M_LOCAL_LD_REQ, M_LOCAL_ST_REQ, M_LOCAL_LD_SECT, M_LOCAL_ST_SECT,
    M_SPILL_INST, M_OPCODES, M_OPCODES_MOD, M_INST_EXECUTED, M_ELIGIBLE, M_ISSUE_ACTIVE,
    *OCCUPANCY_LIMITS.values(),
)


# ----------------------------------------------------------------------------- views


@dataclass(frozen=True)
class Identity:
    name: str                      # function name without parameters
    mangled: str
    demangled: str
    grid: tuple[int, int, int] | None
    block: tuple[int, int, int] | None
    cluster: tuple[int, int, int] | None   # None: not a cluster launch
    device: str | None
    compute_capability: str | None         # "9.0"
    sm_count: int | None
    sm_clock_hz: float | None      # measured during the kernel, not the rating
    cycles: float | None           # elapsed GPC cycles of the kernel
    mem_clock_hz: float | None
    reader_version: str | None     # the ncu_report module that read it
    source: str                    # the report file
    range_index: int
    action_index: int


@dataclass(frozen=True)
class SpeedOfLight:
    duration_ns: float | None
    sm_pct: float | None
    memory_pct: float | None
    dram_pct: float | None
    l1tex_pct: float | None
    l2_pct: float | None


@dataclass(frozen=True)
class Stall:
    reason: str
    cycles_per_issue: float | None   # warp cycles stalled for this reason per issued inst
    samples: int | None              # warp-state samples for this reason


@dataclass(frozen=True)
class Stalls:
    reasons: tuple[Stall, ...]       # ranked, most cycles first; "selected" excluded
    selected_cycles_per_issue: float | None
    total_samples: int | None
    eligible_warps_per_cycle: float | None
    issue_active_pct: float | None

    @property
    def total_cycles_per_issue(self) -> float | None:
        vals = [s.cycles_per_issue for s in self.reasons if s.cycles_per_issue is not None]
        return sum(vals) if vals else None

    def top(self, n: int = 3) -> tuple[Stall, ...]:
        return self.reasons[:n]

    def share(self, reason: str) -> float | None:
        """This reason's part of all stall cycles (0..1), None if not collected."""
        total = self.total_cycles_per_issue
        for s in self.reasons:
            if s.reason == reason and s.cycles_per_issue is not None and total:
                return s.cycles_per_issue / total
        return None


@dataclass(frozen=True)
class OpcodeTraffic:
    """Actual against ideal traffic of every instruction of one SASS opcode."""

    opcode: str          # with modifiers, as the SASS shows it: LDS.128, LDGSTS.E.BYPASS.128
    kind: str            # load / store / async-copy / atomic / other
    instructions: int    # how many distinct SASS instructions (PCs) contribute
    actual: float
    ideal: float

    @property
    def excess(self) -> float:
        return max(0.0, self.actual - self.ideal)

    @property
    def ratio(self) -> float | None:
        """actual / ideal: 1.0 is perfect, 32.0 a 32-way conflict."""
        return self.actual / self.ideal if self.ideal else None


@dataclass(frozen=True)
class Traffic:
    """Per-instruction actual-vs-ideal totals and their split by opcode."""

    actual: float | None
    ideal: float | None
    excess: float | None
    by_opcode: tuple[OpcodeTraffic, ...]

    @property
    def excess_pct(self) -> float | None:
        """Excess as a percentage of the ideal; None with no ideal traffic."""
        if self.excess is None or not self.ideal:
            return None
        return 100.0 * self.excess / self.ideal

    def of_kind(self, kind: str) -> tuple[OpcodeTraffic, ...]:
        return tuple(o for o in self.by_opcode if o.kind == kind)


@dataclass(frozen=True)
class Memory:
    shared: Traffic                 # L1 wavefronts for shared memory
    global_: Traffic                # L2 theoretical sectors for global memory
    bank_conflicts_ld: float | None  # raw hardware counters, kept beside the excess
    bank_conflicts_st: float | None
    l1_hit_rate_pct: float | None
    l2_hit_rate_pct: float | None
    local_load_requests: float | None
    local_store_requests: float | None
    local_load_bytes: float | None
    local_store_bytes: float | None
    spill_instructions: float | None

    @property
    def local_bytes(self) -> float | None:
        parts = [b for b in (self.local_load_bytes, self.local_store_bytes) if b is not None]
        return sum(parts) if parts else None

    @property
    def local_load_sectors_per_request(self) -> float | None:
        if not self.local_load_requests or self.local_load_bytes is None:
            return None
        return self.local_load_bytes / SECTOR_BYTES / self.local_load_requests


@dataclass(frozen=True)
class Launch:
    registers_per_thread: int | None
    shared_static_bytes: int | None
    shared_dynamic_bytes: int | None
    shared_driver_bytes: int | None
    block_size: int | None
    grid_size: int | None
    cluster_size: int | None        # None: not a cluster launch
    theoretical_occupancy_pct: float | None
    achieved_occupancy_pct: float | None
    occupancy_limiter: str | None   # registers / shared memory / warps / blocks / barriers
    occupancy_limits: Mapping[str, float]   # blocks per SM each resource allows
    waves_per_sm: float | None


@dataclass(frozen=True)
class Opcodes:
    executed: Mapping[str, float]           # base opcode -> warp-level instructions
    with_modifiers: Mapping[str, float]     # LDG.E.128 -> ...
    families: Mapping[str, float]           # family key (perfscope.sass) -> instructions

    @property
    def total(self) -> float | None:
        return sum(self.executed.values()) if self.executed else None

    def has(self, family: str) -> bool:
        return self.families.get(family, 0.0) > 0


@dataclass(frozen=True)
class Hotspot:
    address: int                    # offset from the kernel's first instruction
    sass: str
    opcode: str
    file: str | None
    line: int | None
    samples: int
    reasons: tuple[tuple[str, int], ...]   # top stall reasons at this instruction


@dataclass(frozen=True)
class NcuRule:
    """One of Nsight Compute's own rule results, kept as Nsight Compute said it."""

    identifier: str
    section: str
    title: str
    type: str                       # ok / optimization / warning / error
    message: str
    speedup_pct: float | None
    speedup_type: str | None        # local / global


class RawMetrics(Mapping[str, tuple[Any, str]]):
    """Every metric of one launch, read from the report on first use: name -> (value, unit).

    The views read only what they need at load; this table exists for the exports, and
    reading all ~2000 metrics of every kernel up front would triple the load time.
    """

    def __init__(self, handle: _ReportHandle | None, action: Any) -> None:
        self._handle = handle
        self._action = action
        self._data: dict[str, tuple[Any, str]] | None = None

    def _load(self) -> dict[str, tuple[Any, str]]:
        if self._data is None:
            data = {}
            if self._action is not None:
                for name in self._action.metric_names():
                    m = self._action.metric_by_name(name)
                    if m is not None and m.has_value():
                        data[name] = (_scalar(m), m.unit() or "")
            self._data = data
            self._action = self._handle = None   # the report file may now go away
        return self._data

    def __getitem__(self, key: str) -> tuple[Any, str]:
        return self._load()[key]

    def get(self, key: str, default: Any = None) -> Any:
        # One metric by name (the rules read a few) need not read all ~2000.
        if self._data is None and self._action is not None:
            m = self._action.metric_by_name(key)
            return (_scalar(m), m.unit() or "") if m is not None and m.has_value() else default
        return self._load().get(key, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._load())

    def __len__(self) -> int:
        return len(self._load())


@dataclass(frozen=True)
class KernelProfile:
    identity: Identity
    sol: SpeedOfLight
    stalls: Stalls
    memory: Memory
    launch: Launch
    opcodes: Opcodes
    hotspots: tuple[Hotspot, ...]
    ncu_rules: tuple[NcuRule, ...]
    metrics: RawMetrics = field(repr=False, compare=False, hash=False)

    @property
    def name(self) -> str:
        return self.identity.name

    @property
    def duration_ns(self) -> float | None:
        return self.sol.duration_ns

    def metric(self, name: str) -> float | None:
        """One numeric metric by name, None when the report lacks it."""
        entry = self.metrics.get(name)
        return entry[0] if entry is not None and isinstance(entry[0], float) else None


# ------------------------------------------------------------------- metric helpers


def _scalar(m: Any) -> Any:
    """A metric's aggregate value: float for numbers, str for strings."""
    if m.kind() == m.ValueKind_STRING:
        return m.as_string()
    v = m.value()
    return float(v) if isinstance(v, (int, float)) else v


class _Reader:
    """Typed reads of one action's metrics; anything absent is None."""

    def __init__(self, action: Any) -> None:
        self.action = action
        self.names = set(action.metric_names())

    def raw(self, name: str) -> Any:
        if name not in self.names:
            return None
        m = self.action.metric_by_name(name)
        if m is None or not m.has_value():
            return None
        return m

    def num(self, name: str) -> float | None:
        m = self.raw(name)
        if m is None or m.kind() == m.ValueKind_STRING:
            return None
        v = m.value()
        return float(v) if isinstance(v, (int, float)) else None

    def int_(self, name: str) -> int | None:
        v = self.num(name)
        return int(v) if v is not None else None

    def text(self, name: str) -> str | None:
        m = self.raw(name)
        return m.as_string() if m is not None and m.kind() == m.ValueKind_STRING else None

    def instances(self, name: str) -> dict[Any, float] | None:
        """Instanced metric: correlation id (PC or opcode) -> value."""
        m = self.raw(name)
        if m is None or not m.num_instances():
            return None
        corr = m.correlation_ids()
        as_str = corr.kind() == corr.ValueKind_STRING
        out: dict[Any, float] = {}
        for i in range(m.num_instances()):
            key = corr.as_string(i) if as_str else corr.as_uint64(i)
            out[key] = out.get(key, 0.0) + float(m.value(i))
        return out

    def instances_at(self, name: str, keys: set[int]) -> dict[int, float]:
        """Values of an instanced metric at a few PCs only.

        The warp-state sampling metrics hold one instance per sampled PC; reading all of
        them for 20 reasons costs more than the rest of a profile, and hotspots need ten.
        """
        m = self.raw(name)
        if m is None or not m.num_instances():
            return {}
        corr = m.correlation_ids()
        out: dict[int, float] = {}
        for i in range(m.num_instances()):
            pc = corr.as_uint64(i)
            if pc in keys:
                out[pc] = out.get(pc, 0.0) + float(m.value(i))
        return out

    def dim3(self, prefix: str) -> tuple[int, int, int] | None:
        vals = [self.int_(f"{prefix}_{axis}") for axis in "xyz"]
        if any(v is None for v in vals):
            return None
        return (vals[0], vals[1], vals[2])  # type: ignore[return-value]


class _Sass:
    """SASS text and source lines by PC, read lazily (the disassembler is slow to start)."""

    def __init__(self, action: Any) -> None:
        self.action = action
        self._text: dict[int, str] = {}

    def text(self, pc: int) -> str:
        if pc not in self._text:
            self._text[pc] = (self.action.sass_by_pc(pc) or "").strip()
        return self._text[pc]

    def opcode(self, pc: int) -> str:
        """The opcode with modifiers, without predicate or operands."""
        words = self.text(pc).split()
        if words and words[0].startswith("@"):
            words = words[1:]
        return words[0].rstrip(";") if words else "?"

    def source(self, pc: int) -> tuple[str | None, int | None]:
        info = self.action.source_info(pc)
        if info is None:
            return None, None
        return info.file_name() or None, int(info.line()) or None


# --------------------------------------------------------------------- view builders


def _identity(r: _Reader, where: tuple[str, int, int], version: str | None) -> Identity:
    a = r.action
    major = r.int_("device__attribute_compute_capability_major")
    minor = r.int_("device__attribute_compute_capability_minor")
    cluster = r.dim3("launch__cluster_dim")
    if cluster is not None and cluster[0] * cluster[1] * cluster[2] <= 1:
        cluster = None
    return Identity(
        name=a.name(a.NameBase_FUNCTION), mangled=a.name(a.NameBase_MANGLED),
        demangled=a.name(a.NameBase_DEMANGLED),
        grid=r.dim3("launch__grid_dim"), block=r.dim3("launch__block_dim"), cluster=cluster,
        device=r.text("device__attribute_display_name"),
        compute_capability=f"{major}.{minor}" if major is not None and minor is not None else None,
        sm_count=r.int_("device__attribute_multiprocessor_count"),
        sm_clock_hz=r.num(M_SM_CLOCK), cycles=r.num(M_CYCLES), mem_clock_hz=r.num(M_MEM_CLOCK),
        reader_version=version, source=where[0], range_index=where[1], action_index=where[2],
    )


def _sol(r: _Reader) -> SpeedOfLight:
    return SpeedOfLight(duration_ns=r.num(M_DURATION),
                        **{k: r.num(v) for k, v in SOL_METRICS.items()})


def _stall_key(reason: str) -> str:
    # The sampling metric says "no_instructions", the average one "no_instruction".
    return "no_instruction" if reason == "no_instructions" else reason


def _stalls(r: _Reader) -> Stalls:
    cycles: dict[str, float | None] = {}
    samples: dict[str, int | None] = {}
    for name in r.names:
        if (m := STALL_AVG_RE.match(name)) is not None:
            cycles[_stall_key(m.group(1))] = r.num(name)
        elif (m := STALL_SAMPLE_RE.match(name)) is not None and not name.endswith("_not_issued"):
            v = r.num(name)
            samples[_stall_key(m.group(1))] = int(v) if v is not None else None
    reasons = [Stall(k, cycles.get(k), samples.get(k)) for k in set(cycles) | set(samples)
               if k != "selected"]
    reasons.sort(key=lambda s: (-(s.cycles_per_issue or 0.0), -(s.samples or 0), s.reason))
    total = r.num(M_PC_SAMPLES)
    return Stalls(reasons=tuple(reasons), selected_cycles_per_issue=cycles.get("selected"),
                  total_samples=int(total) if total is not None else None,
                  eligible_warps_per_cycle=r.num(M_ELIGIBLE), issue_active_pct=r.num(M_ISSUE_ACTIVE))


def _traffic(r: _Reader, sass: _Sass, names: tuple[str, str], kinds: Mapping[str, str]) -> Traffic:
    actual = r.instances(names[0])
    ideal = r.instances(names[1])
    if actual is None or ideal is None:
        # An aggregate without source counters still tells the totals.
        a, i = r.num(names[0]), r.num(names[1])
        excess = max(0.0, a - i) if a is not None and i is not None else None
        return Traffic(actual=a, ideal=i, excess=excess, by_opcode=())
    groups: dict[str, list[float]] = {}
    for pc, act in actual.items():
        opcode = sass.opcode(pc)
        g = groups.setdefault(opcode, [0, 0.0, 0.0])
        g[0] += 1
        g[1] += act
        g[2] += ideal.get(pc, 0.0)
    by_opcode = [OpcodeTraffic(op, kinds.get(base_opcode(op), "other"), int(n), act, idl)
                 for op, (n, act, idl) in groups.items()]
    by_opcode.sort(key=lambda o: (-o.excess, -o.actual, o.opcode))
    # Excess is summed per instruction: one instruction's surplus is not cancelled by
    # another's shortfall (ideal can exceed actual when lanes are predicated off).
    excess = sum(max(0.0, act - ideal.get(pc, 0.0)) for pc, act in actual.items())
    return Traffic(actual=sum(actual.values()), ideal=sum(ideal.values()), excess=excess,
                   by_opcode=tuple(by_opcode))


def _memory(r: _Reader, sass: _Sass) -> Memory:
    def bytes_of(name: str) -> float | None:
        v = r.num(name)
        return v * SECTOR_BYTES if v is not None else None

    return Memory(
        shared=_traffic(r, sass, (M_SHARED_WAVEFRONTS, M_SHARED_IDEAL), SHARED_KIND),
        global_=_traffic(r, sass, (M_GLOBAL_SECTORS, M_GLOBAL_IDEAL), GLOBAL_KIND),
        bank_conflicts_ld=r.num(M_BANK_LD), bank_conflicts_st=r.num(M_BANK_ST),
        l1_hit_rate_pct=r.num(M_L1_HIT), l2_hit_rate_pct=r.num(M_L2_HIT),
        local_load_requests=r.num(M_LOCAL_LD_REQ), local_store_requests=r.num(M_LOCAL_ST_REQ),
        local_load_bytes=bytes_of(M_LOCAL_LD_SECT), local_store_bytes=bytes_of(M_LOCAL_ST_SECT),
        spill_instructions=r.num(M_SPILL_INST),
    )


def _launch(r: _Reader) -> Launch:
    limits = {k: v for k, name in OCCUPANCY_LIMITS.items() if (v := r.num(name)) is not None}
    limiter = min(limits, key=lambda k: limits[k]) if limits else None
    cluster = r.int_("launch__cluster_size")
    return Launch(
        registers_per_thread=r.int_("launch__registers_per_thread"),
        shared_static_bytes=r.int_("launch__shared_mem_per_block_static"),
        shared_dynamic_bytes=r.int_("launch__shared_mem_per_block_dynamic"),
        shared_driver_bytes=r.int_("launch__shared_mem_per_block_driver"),
        block_size=r.int_("launch__block_size"), grid_size=r.int_("launch__grid_size"),
        cluster_size=cluster if cluster and cluster > 1 else None,
        theoretical_occupancy_pct=r.num("sm__maximum_warps_per_active_cycle_pct"),
        achieved_occupancy_pct=r.num("sm__warps_active.avg.pct_of_peak_sustained_active"),
        occupancy_limiter=limiter, occupancy_limits=limits,
        waves_per_sm=r.num("launch__waves_per_multiprocessor"),
    )


def _opcodes(r: _Reader) -> Opcodes:
    executed = r.instances(M_OPCODES) or {}
    with_mod = r.instances(M_OPCODES_MOD) or {}
    return Opcodes(executed=dict(sorted(executed.items(), key=lambda kv: -kv[1])),
                   with_modifiers=dict(sorted(with_mod.items(), key=lambda kv: -kv[1])),
                   families=group_families(executed or with_mod))


def _hotspots(r: _Reader, sass: _Sass, count: int = HOTSPOT_COUNT) -> tuple[Hotspot, ...]:
    samples = r.instances(M_PC_SAMPLES)
    if not samples:
        return ()
    top = sorted(samples.items(), key=lambda kv: -kv[1])[:count]
    wanted = {pc for pc, _ in top}
    per_reason: dict[str, dict[int, float]] = {}
    for name in r.names:
        m = STALL_SAMPLE_RE.match(name)
        if m is not None and not name.endswith("_not_issued"):
            per_reason[_stall_key(m.group(1))] = r.instances_at(name, wanted)
    starts = r.instances("launch__function_pcs")
    base = min(starts.values()) if starts else min(samples)
    out = []
    for pc, n in top:
        # Ties broken by name: per_reason follows a set's order, which changes per process.
        reasons = sorted(((k, int(v[pc])) for k, v in per_reason.items() if v.get(pc)),
                         key=lambda kv: (-kv[1], kv[0]))[:3]
        file, line = sass.source(pc)
        out.append(Hotspot(address=int(pc - base), sass=sass.text(pc), opcode=sass.opcode(pc),
                           file=file, line=line, samples=int(n), reasons=tuple(reasons)))
    return tuple(out)


_MSG_TYPES = {0: "none", 1: "ok", 2: "optimization", 3: "warning", 4: "error"}
_SPEEDUP_TYPES = {0: None, 1: "local", 2: "global"}


def _ncu_rules(action: Any) -> tuple[NcuRule, ...]:
    out = []
    for d in action.rule_results_as_dicts():
        msg = d.get("rule_message") or {}
        text = (msg.get("message") or "").strip()
        if not text:
            continue
        sp = d.get("speedup_estimation") or {}
        out.append(NcuRule(identifier=d.get("rule_identifier", ""),
                           section=d.get("section_identifier", ""),
                           title=(msg.get("title") or d.get("name") or "").strip(),
                           type=_MSG_TYPES.get(msg.get("type", 0), "none"), message=text,
                           speedup_pct=sp.get("speedup"),
                           speedup_type=_SPEEDUP_TYPES.get(sp.get("type", 0))))
    return tuple(out)


def profile_from_action(action: Any, where: tuple[str, int, int],
                        version: str | None = None, handle: _ReportHandle | None = None
                        ) -> KernelProfile:
    """Build the KernelProfile of one ncu_report action (a profiled launch)."""
    r = _Reader(action)
    sass = _Sass(action)
    return KernelProfile(
        identity=_identity(r, where, version), sol=_sol(r), stalls=_stalls(r),
        memory=_memory(r, sass), launch=_launch(r), opcodes=_opcodes(r),
        hotspots=_hotspots(r, sass), ncu_rules=_ncu_rules(action),
        metrics=RawMetrics(handle, action),
    )


# --------------------------------------------------------------------------- loading


def _conflicting_modules() -> list[str]:
    return [m for m in READER_CONFLICTS if m in sys.modules]


def _ncu_report_module() -> Any:
    """The ncu_report module: the PyPI wheel, else a local Nsight Compute install's copy."""
    if "ncu_report" not in sys.modules and (early := _conflicting_modules()):
        raise PerfscopeError(f"{', '.join(early)} was imported before Nsight Compute's report "
                             "reader, and in that order the reader crashes the process: import "
                             "perfscope.profile first.")
    try:
        return importlib.import_module("ncu_report")
    except ImportError:
        pass
    candidates = [os.environ.get("PERFSCOPE_NCU_PYTHON", "")]
    ncu = shutil.which("ncu")
    if ncu:
        candidates.append(str(Path(ncu).resolve().parent / "extras" / "python"))
    for root in filter(None, (os.environ.get("CUDA_HOME"), "/usr/local/cuda")):
        candidates += glob.glob(f"{root}/nsight-compute*/extras/python")
    candidates += sorted(glob.glob("/opt/nvidia/nsight-compute/*/extras/python"), reverse=True)
    for path in filter(None, candidates):
        if (Path(path) / "ncu_report.py").exists() or (Path(path) / "ncu_report").exists():
            sys.path.insert(0, path)
            try:
                return importlib.import_module("ncu_report")
            except ImportError:
                sys.path.remove(path)
    raise PerfscopeError("Nsight Compute's report reader is missing: install it with "
                         "'pip install ncu-report' (or set PERFSCOPE_NCU_PYTHON to the "
                         "extras/python folder of an Nsight Compute install).")


def _decompressed(path: Path) -> tuple[Path, bool]:
    """A plain .ncu-rep for path: itself, or an xz-decompressed copy (cached by content).

    Returns the path and whether it is a private temporary file the caller must delete
    (when the cache cannot be written).
    """
    if not path.name.endswith(".xz"):
        return path, False
    st = path.stat()
    key = hashlib.sha256(f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:24]
    cached = cache_root() / "reports" / f"{key}.ncu-rep"
    if cached.exists():
        return cached, False
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cached.parent, suffix=".part")
        private = False
    except OSError:
        fd, tmp = tempfile.mkstemp(suffix=".ncu-rep")
        private = True
    try:
        with os.fdopen(fd, "wb") as out, lzma.open(path) as src:
            shutil.copyfileobj(src, out, 1 << 22)
    except (lzma.LZMAError, EOFError) as exc:
        os.unlink(tmp)
        raise PerfscopeError(f"{path} is not a valid xz file or is truncated ({exc}).") from None
    if private:
        return Path(tmp), True
    os.replace(tmp, cached)
    return cached, False


def framing_problem(data: bytes) -> str | None:
    """Why bytes that Nsight Compute's reader loaded as empty are broken, or None.

    A .ncu-rep is a 4-byte signature, a 4-byte version, a 2-byte field and then records
    each led by a 4-byte little-endian length, the last one ending at end of file.
    """
    if not data.startswith(REPORT_MAGIC):
        return "not an Nsight Compute report (it does not start with the report signature)"
    off = 10
    while off + 4 <= len(data):
        off += 4 + struct.unpack_from("<I", data, off)[0]
    if off != len(data):
        return f"truncated: its last record runs past the end of the file ({len(data)} bytes)"
    return None


class _ReportHandle:
    """Keeps the report context and its decompressed file alive while metrics are read."""

    def __init__(self, ctx: Any, tmp: Path | None) -> None:
        self.ctx = ctx
        # The reader's range proxies own their actions: drop a range and its actions
        # dangle, so every range stays referenced for as long as the handle lives.
        self.ranges = [ctx.range_by_idx(i) for i in range(ctx.num_ranges())]
        if tmp is not None:
            weakref.finalize(self, _unlink, tmp)


def _unlink(p: Path) -> None:
    with contextlib.suppress(OSError):
        p.unlink()


def _open(path: Path) -> _ReportHandle:
    mod = _ncu_report_module()
    plain, private = _decompressed(path)
    try:
        ctx = mod.load_report(str(plain))
    except Exception as exc:
        raise PerfscopeError(f"{path} could not be read as an Nsight Compute report: {exc}") from None
    handle = _ReportHandle(ctx, plain if private else None)
    if ctx.num_ranges() == 0 or all(ctx.range_by_idx(i).num_actions() == 0
                                    for i in range(ctx.num_ranges())):
        why = framing_problem(plain.read_bytes())
        if why is not None:
            raise PerfscopeError(f"{path} is {why}.")
        raise PerfscopeError(f"{path} holds no profiled kernel launch.")
    return handle


def _reader_version() -> str | None:
    # Not IContext.get_version(): it crashes the process when CuPy was imported first.
    from importlib import metadata

    try:
        return metadata.version("ncu-report")
    except metadata.PackageNotFoundError:
        return None


def find_reports(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Expand files and directories into report files, in a stable order."""
    out: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise PerfscopeError(f"{p} does not exist.")
        if p.is_dir():
            found = sorted(q for q in p.rglob("*") if q.is_file() and q.name.endswith(REPORT_SUFFIXES))
            if not found:
                raise PerfscopeError(f"{p} holds no .ncu-rep or .ncu-rep.xz report.")
            out += found
        else:
            out.append(p)
    return out


def load(path: str | os.PathLike[str], kernel: str | None = None) -> list[KernelProfile]:
    """Every profiled launch in one report, optionally only those whose name matches kernel."""
    p = Path(path)
    if not p.exists():
        raise PerfscopeError(f"{p} does not exist.")
    if p.is_dir():
        raise PerfscopeError(f"{p} is a directory; use load_many for folders of reports.")
    pattern = _compile(kernel)
    handle = _open(p)
    version = _reader_version()
    out = []
    for ri, rng in enumerate(handle.ranges):
        for ai in range(rng.num_actions()):
            action = rng.action_by_idx(ai)
            if pattern is not None and not (
                    pattern.search(action.name(action.NameBase_FUNCTION))
                    or pattern.search(action.name(action.NameBase_DEMANGLED))):
                continue
            out.append(profile_from_action(action, (str(p), ri, ai), version, handle))
    return out


def load_many(paths: Iterable[str | os.PathLike[str]], kernel: str | None = None
              ) -> list[KernelProfile]:
    """All launches of all reports under paths (files or folders); kernel filters by name."""
    profiles: list[KernelProfile] = []
    for p in find_reports(paths):
        profiles += load(p, kernel)
    if kernel is not None and not profiles:
        raise PerfscopeError(f"no kernel matches {kernel!r} in the given reports.")
    return profiles


def _compile(kernel: str | None) -> re.Pattern[str] | None:
    if kernel is None:
        return None
    try:
        return re.compile(kernel)
    except re.error as exc:
        raise PerfscopeError(f"--kernel {kernel!r} is not a valid regular expression ({exc}).") from None
