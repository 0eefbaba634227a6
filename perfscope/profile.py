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
- ``hot_loop``: the most executed instructions (the main loop as the counters see it):
  how many, and how many of each opcode family;
- ``parked``: instructions outside the main loop where warps wait out the kernel (a
  producer warpgroup's spare warps at a cluster's exit barrier), whose samples every stall
  share counts as if they were waits of the work;
- ``ncu_rules``: Nsight Compute's own rule results.

A metric the report lacks (another chip, another ncu version, a narrow section set) is
None in every view, never 0; renderers print "not collected".
"""

from __future__ import annotations

import logging
import os
import re
import statistics
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

from perfscope.errors import PerfscopeError
from perfscope.families import GLOBAL_KIND, SHARED_KIND, base_opcode, family_of, group_families
from perfscope.metrics import (
    CC_METRICS,
    CLUSTER_DIMS,
    M_ACHIEVED_OCCUPANCY,
    M_BANK_LD,
    M_BANK_ST,
    M_BLOCK_SIZE,
    M_CLUSTER_SIZE,
    M_CYCLES,
    M_DEVICE_NAME,
    M_DURATION,
    M_ELIGIBLE,
    M_GLOBAL_IDEAL,
    M_GLOBAL_SECTORS,
    M_GRID_SIZE,
    M_INST_EXECUTED_PC,
    M_ISSUE_ACTIVE,
    M_L1_HIT,
    M_L2_HIT,
    M_LOCAL_LD_REQ,
    M_LOCAL_LD_SECT,
    M_LOCAL_ST_REQ,
    M_LOCAL_ST_SECT,
    M_LONG_SCOREBOARD_SAMPLES,
    M_MEM_CLOCK,
    M_OPCODES,
    M_OPCODES_MOD,
    M_PC_SAMPLES,
    M_REGISTERS,
    M_SHARED_IDEAL,
    M_SHARED_WAVEFRONTS,
    M_SM_CLOCK,
    M_SM_CLOCK_MAX,
    M_SM_COUNT,
    M_SMEM_DRIVER,
    M_SMEM_DYNAMIC,
    M_SMEM_STATIC,
    M_SPILL_INST,
    M_THEORETICAL_OCCUPANCY,
    M_WAVES,
    OCCUPANCY_LIMITS,
    SECTOR_BYTES,
    SOL_METRICS,
    STALL_AVG_RE,
    STALL_SAMPLE_RE,
)
from perfscope.reader import (
    ReportHandle,
    load_reader_first,
    open_report,
    reader_label,
)
from perfscope.sass.loops import INSTRUCTION_BYTES
from perfscope.sass.operands import operands

# The reader must be loaded before matplotlib or CuPy (ncu-report 2025.3; see reader.py),
# and every module that reads reports imports this one first.
load_reader_first()

log = logging.getLogger(__name__)

HOTSPOT_COUNT = 10
WARP_SIZE = 32


# ----------------------------------------------------------------------------- views


@dataclass(frozen=True)
class Identity:
    """Which kernel a launch ran, its launch shape, the device and clocks it ran at, and the
    report it came from."""

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
    # Position among all launches of the report file: the id `FILE#ID` names.
    launch_index: int = 0
    # Set when the report file is cut short (only the launches before the cut exist).
    incomplete: str | None = None
    sm_clock_max_hz: float | None = None   # the chip's highest SM clock (its attribute)


class Where(NamedTuple):
    """Where a launch sits: its report file, range, action and flat launch index."""

    source: str
    range_index: int
    action_index: int
    launch_index: int = 0
    incomplete: str | None = None


@dataclass(frozen=True)
class SpeedOfLight:
    """The kernel's duration and each unit's throughput as a percentage of its peak."""

    duration_ns: float | None
    sm_pct: float | None
    memory_pct: float | None
    dram_pct: float | None
    l1tex_pct: float | None
    l2_pct: float | None


@dataclass(frozen=True)
class Stall:
    """One warp stall reason: its cycles per issued instruction and its warp-state samples."""

    reason: str
    cycles_per_issue: float | None   # warp cycles stalled for this reason per issued inst
    samples: int | None              # warp-state samples for this reason


@dataclass(frozen=True)
class Stalls:
    """Where the warps waited: every stall reason, ranked, and how often the scheduler could issue."""

    reasons: tuple[Stall, ...]       # ranked, most cycles first; "selected" excluded
    selected_cycles_per_issue: float | None
    total_samples: int | None
    eligible_warps_per_cycle: float | None
    issue_active_pct: float | None

    @property
    def total_cycles_per_issue(self) -> float | None:
        """Stall cycles per issued instruction over every collected reason ("selected" excluded)."""
        vals = [s.cycles_per_issue for s in self.reasons if s.cycles_per_issue is not None]
        return sum(vals) if vals else None

    def top(self, n: int = 3) -> tuple[Stall, ...]:
        """The n reasons with the most stall cycles."""
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
        """Traffic beyond the ideal (never negative)."""
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
        """The opcodes of one kind (load, store, async-copy, atomic, other)."""
        return tuple(o for o in self.by_opcode if o.kind == kind)


@dataclass(frozen=True)
class Memory:
    """Shared and global traffic against its ideal, cache hit rates, and local-memory (spill) traffic."""

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
        """Bytes loaded and stored in local memory; None when neither was collected."""
        parts = [b for b in (self.local_load_bytes, self.local_store_bytes) if b is not None]
        return sum(parts) if parts else None

    @property
    def local_load_sectors_per_request(self) -> float | None:
        """32-byte sectors per local load request: 1 when each request touches a single sector."""
        if not self.local_load_requests or self.local_load_bytes is None:
            return None
        return self.local_load_bytes / SECTOR_BYTES / self.local_load_requests


@dataclass(frozen=True)
class Launch:
    """The launch's resources (registers, shared memory, block and grid), its occupancy and what limits it."""

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
    """Executed warp-level instructions by opcode, with and without modifiers, and by family."""

    executed: Mapping[str, float]           # base opcode -> warp-level instructions
    with_modifiers: Mapping[str, float]     # LDG.E.128 -> ...
    families: Mapping[str, float]           # family key (perfscope.sass) -> instructions
    # ptxas's never-run padding (`@!PT LDS RZ, [RZ]`): issued, so in total, but in no opcode
    # above (it accesses nothing); 0 where the report has no executions per PC.
    padding: float = 0.0

    @property
    def total(self) -> float | None:
        """Every executed warp-level instruction, padding included (it takes issue slots);
        None when the opcode counts were not collected."""
        return sum(self.executed.values()) + self.padding if self.executed else None

    def has(self, family: str) -> bool:
        """Whether any instruction of a family (a perfscope.sass key) executed."""
        return self.families.get(family, 0.0) > 0

    @property
    def tma_multicast_share(self) -> float | None:
        """The share of executed TMA loads (UTMALDG) that multicast to a cluster; None with
        no TMA load."""
        loads = {op: n for op, n in self.with_modifiers.items() if op.startswith("UTMALDG")}
        total = sum(loads.values())
        return sum(n for op, n in loads.items() if ".MULTICAST" in op) / total if total else None


@dataclass(frozen=True)
class Hotspot:
    """One of the most sampled SASS instructions, with its source line and its top stall reasons."""

    address: int                    # offset from the kernel's first instruction
    sass: str
    opcode: str
    file: str | None
    line: int | None
    samples: int
    reasons: tuple[tuple[str, int], ...]   # top stall reasons at this instruction


# A PC is in the main loop when it executed at least this share of the most executed PC's
# count: a loop body runs once per pass, its prologue and the epilogue once per tile. On the
# H200's reports this takes cuBLAS's FP32 loop whole (1,154 PCs, every one executed the same
# number of times) and the persistent wgmma stage's consumer loop (59 PCs).
HOT_LOOP_SHARE = 0.5


@dataclass(frozen=True)
class HotLoop:
    """The kernel's most executed instructions: its main loop as the counters see it (for a
    warp-specialised kernel, the role with the most warp executions: its consumers')."""

    instructions: int                 # PCs executed at least HOT_LOOP_SHARE of the most
    families: Mapping[str, int]       # perfscope.families key -> PCs of that family in it
    # Long-scoreboard samples at its PCs over all warp samples: the main loop's warps
    # waiting for their operands (a warp-specialised kernel's consumers at the full
    # barrier; its producer's waits for a free slot lie outside it). None if not sampled.
    operand_waits: float | None = None
    # The longest stretch of the loop with no math in it, where its math is synchronous
    # (FFMA or mma.sync); None for other loops or without samples.
    math_gap: MathGap | None = None
    # Its long-scoreboard waits on registers an L1TEX instruction still holds (a register
    # rewritten under an LDGSTS, load or store that reads it); None without samples.
    reuse_waits: ReuseWaits | None = None
    # How an FFMA loop issues its shared-memory fragment loads: in runs with no FFMA between,
    # and what warps wait at them; None for other loops or without samples.
    fragment_bursts: FragmentBursts | None = None
    # Where an FFMA loop's FFMAs are held at dispatch; None for other loops or without samples.
    ffma_dispatch: FfmaDispatch | None = None


@dataclass(frozen=True)
class FfmaDispatch:
    """An FFMA main loop's dispatch stalls at its FFMAs: the warp's FFMA was ready and the
    dispatcher held it back (by the NCU guide, a conflict or event; at an FFMA the suspects
    are its register-file reads). Per PC they come in quanta: an FFMA is held on nearly every
    execution or on almost none, so which FFMAs stall is a property of the compiled loop."""

    ffmas: int                        # the loop's FFMAs
    # Of them, those held on about every execution or more: dispatch samples at least half
    # the loop's per-execution quantum (the median of its FFMAs' samples of every reason).
    stalling: int
    share: float                      # dispatch samples at the loop's FFMAs / all samples
    first: int                        # the FFMA with the most, from the kernel's start


@dataclass(frozen=True)
class FragmentBursts:
    """An FFMA main loop's shared loads (LDS) in bursts: runs of the loop, in address order
    between two FFMAs, holding at least BURST_LOADS_MIN of them. A warp issues in order, so
    at a burst it issues loads back to back into the shared pipe's queue while its next
    FFMAs wait behind them."""

    loads: int                        # the loop's shared loads
    in_bursts: int                    # of them, those in bursts
    bursts: int
    # The samples of warps held at the bursts' loads for their own sake (not the waits on
    # memory or a barrier that the latency rules read, nor `not_selected`: another warp
    # issued), over all the kernel's samples.
    waits: float
    first: int                        # the burst holding the most of those, from the kernel's start
    reasons: tuple[tuple[str, int], ...]   # those samples by reason, most first


@dataclass(frozen=True)
class MathGap:
    """The run of a main loop's instructions, in address order between two of its math
    instructions (FFMA or HMMA), whose warp samples add up to the most: a warp in it issues
    no math."""

    math: str                         # the loop's math family key: "ffma" or "hmma"
    first: int                        # the run's first instruction, from the kernel's start
    instructions: int                 # how many the run holds
    share: float                      # its warp samples over all the kernel's samples
    # Of those, the samples of warps waiting on memory, a barrier or a fence (what the
    # latency rules read), over all the kernel's samples.
    waiting: float
    reasons: tuple[tuple[str, int], ...]   # its stall samples by reason, most first
    copies: int                       # of its instructions, global loads and copies


@dataclass(frozen=True)
class ReuseWaits:
    """The main loop's long-scoreboard waits that are no load's: at instructions that read
    no register a load (or a constant or special-register read) writes anywhere in the
    kernel, but write one that an L1TEX instruction (LDGSTS, LDG, STG, ...) reads. Such a
    wait is write-after-read: the register is still held by an earlier copy or store that
    its unit has not taken yet (sass/operands.py reads the registers)."""

    share: float                      # their long_scoreboard samples / all samples
    instructions: int                 # main-loop instructions that have them
    first: int                        # the most waited of them, from the kernel's start
    sass: str                         # ... its text
    samples: int                      # ... its long_scoreboard samples
    # The L1TEX instruction before it (in program order, around the loop) that reads a
    # register it writes: what holds the register. None if no such instruction is found.
    holder: int | None = None         # from the kernel's start
    holder_sass: str = ""


# Warps are parked at a source line when its waiting instructions lie outside the main loop,
# each warp passes each of them at most once, and their samples add up to at least this many
# whole warp lives per CTA (the kernel's samples over the warps it launched). In the H200's
# committed reports our clustered stages park 2.6-3.2 warps per CTA at their exit barriers (a
# producer warpgroup's three spare warps; 23-37% of their samples, 14 launches); none of the
# other 144, cuBLAS's 2-CTA clusters among them, parks any.
PARKED_WARPS_MIN = 1.0
# ... counting, at one source line, the instructions whose samples are mostly waits of these
# kinds, each holding at least this share of the kernel's samples.
PARKED_REASONS = ("barrier", "membar", "sleeping")
PARKED_PC_MIN = 0.01
# A parked warp leaving its barrier may wait again on its way out (the pulled split-K
# hgemm_small_m: a second cluster barrier one source line on, 29 instructions later, before
# EXIT): the waits that follow, passed by as many warps with nothing but these in between,
# are the same parking. Looked for this many instructions on.
PARKED_FOLLOW_MAX = 64
_NO_WORK = frozenset({"BRA", "UMOV", "NOP", "BSYNC", "BSSY", "WARPSYNC", "CCTL", "MEMBAR",
                      "ERRBAR", "CGAERRBAR", "UCGABAR_ARV", "UCGABAR_WAIT", "BAR",
                      "NANOSLEEP", "SYNCS"})


@dataclass(frozen=True)
class Parked:
    """Where warps wait out the kernel: a source line's waiting instructions outside the
    main loop, each passed at most once per warp, holding at least PARKED_WARPS_MIN whole
    warp lives of samples per CTA between them, with the waits the same warps reach next on
    their way out (PARKED_FOLLOW_MAX)."""

    address: int                            # its most sampled instruction (from the first)
    opcode: str                             # ... and that instruction's opcode
    file: str | None
    line: int | None
    samples: int                            # warp-state samples at them ("selected" included)
    passes: int                             # warp-level executions of the most passed one
    warps_per_cta: float                    # their samples in whole warp lives, per CTA
    reasons: tuple[tuple[str, int], ...]    # every stall reason's samples at them, most first
    addresses: tuple[int, ...] = ()         # every one of them, from the first instruction


@dataclass(frozen=True)
class NcuRule:
    """One of Nsight Compute's own rule results, as Nsight Compute said it, its markup
    (``@section:Id:Label@``, ``@url:Label:https://...@``) turned into plain words."""

    identifier: str
    section: str
    title: str
    type: str                       # ok / optimization / warning / error
    message: str                    # plain text: a reference reads as its label
    speedup_pct: float | None
    speedup_type: str | None        # local / global
    links: tuple[tuple[str, str], ...] = ()   # (label, url) of the message's @url@ references


_NCU_MARKUP = re.compile(r"@(section|url):([^@]*)@")


def plain_message(text: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """Nsight Compute's rule text without its markup, and the links it held."""
    links: list[tuple[str, str]] = []

    def repl(m: re.Match[str]) -> str:
        kind, body = m.group(1), m.group(2)
        if kind == "section":
            return body.split(":", 1)[-1]
        label, _, url = body.partition(":")
        if url.startswith("http"):
            links.append((label, url))
            return label
        return body
    return _NCU_MARKUP.sub(repl, text), tuple(links)


class RawMetrics(Mapping[str, tuple[Any, str]]):
    """Every metric of one launch, read from the report on first use: name -> (value, unit).

    The views read only what they need at load; this table exists for the exports, and
    reading all ~2000 metrics of every kernel up front would triple the load time.

    Detached (a loading worker's result, perfscope.loadpool), the table carries the
    metrics the views and rules read by name and reopens its report only for any other.
    """

    def __init__(self, handle: ReportHandle | None, action: Any, where: Where | None = None) -> None:
        self._handle = handle
        self._action = action
        self._where = where
        self._data: dict[str, tuple[Any, str]] | None = None
        # Detached: the names the table was sent with (those absent from the report too).
        self._asked: frozenset[str] | None = None

    def _load(self) -> dict[str, tuple[Any, str]]:
        if self._asked is not None:
            self._data = dict(_reattached(self._where).metrics._load())
            self._asked = None
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
        """One metric as (value, unit), or default when the report lacks it."""
        # One metric by name (the rules read a few) need not read all ~2000.
        if self._data is None and self._action is not None:
            m = self._action.metric_by_name(key)
            return (_scalar(m), m.unit() or "") if m is not None and m.has_value() else default
        if self._asked is not None and key in self._asked:
            return self._data.get(key, default)
        return self._load().get(key, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._load())

    def __len__(self) -> int:
        return len(self._load())

    def detached(self, names: Iterable[str]) -> RawMetrics:
        """A copy that needs no report: these metrics read now (the views' and rules'),
        any other read from the report reopened where the copy is used."""
        if self._asked is None and self._data is not None:
            asked, data = None, self._data
        else:
            asked = frozenset(names) | (self._asked or frozenset())
            data = {k: v for k in asked if (v := self.get(k)) is not None}
        copy = RawMetrics(None, None, self._where)
        copy._data, copy._asked = data, asked
        return copy


class Correlation:
    """The report action behind a profile, for the readers that want more than the views.

    The views read at load what every command needs. The source view (perfscope.source)
    wants every sampled PC with its source line, its stall reasons and its SASS text, for
    a page only: it reads them here, on demand, through the reader and disassembler the
    views used (which keeps the report file open for as long as the profile lives).
    """

    def __init__(self, handle: ReportHandle | None, reader: _Reader | None, sass: _Sass | None,
                 where: Where | None = None, answers: dict[tuple[Any, ...], Any] | None = None
                 ) -> None:
        self._handle = handle
        self._live = (reader, sass) if reader is not None and sass is not None else None
        self._where = where
        # Detached: what was asked where the report was open (a worker building the page's
        # source view), answered again here without it.
        self._answers = answers
        self._recording: dict[tuple[Any, ...], Any] | None = None

    @property
    def _reader(self) -> _Reader:
        return self._attach()[0]

    @property
    def _sass(self) -> _Sass:
        return self._attach()[1]

    def _attach(self) -> tuple[_Reader, _Sass]:
        # Detached: the report is opened here for what it was not asked where it was open.
        if self._live is None:
            other = _reattached(self._where).correlation
            self._handle, self._live = other._handle, other._attach()
        return self._live

    def record(self) -> None:
        """Keep every answer from now on, for detached() to carry (a worker reading what a
        page will ask)."""
        self._recording = {}

    def detached(self) -> Correlation:
        """A copy that needs no report: what was asked since record() answered from memory,
        anything else from the report, opened where the copy is used on first use."""
        answers = {**(self._answers or {}), **(self._recording or {})}
        return Correlation(None, None, None, self._where, answers or None)

    def _ask(self, key: tuple[Any, ...], read: Callable[[], Any]) -> Any:
        if self._answers is not None and key in self._answers:
            return self._answers[key]
        value = read()
        if self._recording is not None:
            self._recording[key] = value
        return value

    def pc_samples(self) -> dict[int, float]:
        """Warp-state samples per PC (empty when the report has no sampling)."""
        return self._ask(("pc_samples",), lambda: self._reader.instances(M_PC_SAMPLES) or {})

    def executed(self) -> dict[int, float]:
        """Warp-level executions per PC (empty when the report did not collect them)."""
        return self._ask(("executed",), lambda: self._reader.instances(M_INST_EXECUTED_PC) or {})

    def reason_samples(self, pcs: set[int]) -> dict[str, dict[int, float]]:
        """Samples per stall reason at the given PCs: reason -> PC -> samples (reasons with
        no sample anywhere in the kernel are left out: reading their PCs costs time)."""
        return self._ask(("reason_samples", frozenset(pcs)), lambda: self._reasons_at(pcs))

    def _reasons_at(self, pcs: set[int]) -> dict[str, dict[int, float]]:
        out = {}
        for name in sorted(self._reader.names):
            m = STALL_SAMPLE_RE.match(name)
            if m is not None and not name.endswith("_not_issued") and self._reader.num(name):
                out[_stall_key(m.group(1))] = self._counts_at(name, pcs)
        return out

    def _counts_at(self, name: str, pcs: set[int]) -> dict[int, float]:
        # _Reader.instances_at, for integer sample counts: the kind is read once, not per
        # instance (a page reads ~100k instances, and the per-call dispatch doubled it).
        m = self._reader.raw(name)
        if m is None or not m.num_instances():
            return {}
        ids = m.correlation_ids()
        pc_at = ids.as_uint64
        read = m.as_uint64 if m.kind() in (m.ValueKind_UINT64, m.ValueKind_UINT32) else m.value
        out: dict[int, float] = {}
        for i in range(m.num_instances()):
            pc = pc_at(i)
            if pc in pcs:
                out[pc] = out.get(pc, 0.0) + float(read(i))
        return out

    def source_of(self, pc: int) -> tuple[str | None, int | None]:
        """(file, line) of a PC as the compiler's line table names it, or (None, None)."""
        return self._ask(("source_of", pc), lambda: self._sass.source(pc))

    def sass_of(self, pc: int) -> str:
        """The SASS text of the instruction at a PC."""
        return self._ask(("sass_of", pc), lambda: self._sass.text(pc))

    def function_start(self) -> int | None:
        """The kernel's first PC, so addresses read as offsets (None when not collected)."""
        def read() -> int | None:
            starts = self._reader.instances("launch__function_pcs")
            return int(min(starts.values())) if starts else None
        return self._ask(("function_start",), read)

    def embedded_sources(self) -> dict[str, str]:
        """File name -> text of the sources the report embeds (ncu --import-source);
        a file ncu could not import is named with empty text."""
        def read() -> dict[str, str]:
            files = self._reader.action.source_files()
            return {str(k): str(v) for k, v in files.items()} if files is not None else {}
        return self._ask(("embedded_sources",), read)


@dataclass(frozen=True)
class KernelProfile:
    """One profiled kernel launch: the views the commands read, and every metric on demand."""

    identity: Identity
    sol: SpeedOfLight
    stalls: Stalls
    memory: Memory
    launch: Launch
    opcodes: Opcodes
    hotspots: tuple[Hotspot, ...]
    ncu_rules: tuple[NcuRule, ...]
    metrics: RawMetrics = field(repr=False, compare=False, hash=False)
    # The report behind the views, for the source view; None for a static profile.
    correlation: Correlation | None = field(default=None, repr=False, compare=False, hash=False)
    # None where the report has no per-instruction execution counts (or a static profile).
    hot_loop: HotLoop | None = None
    # Empty where no warp is parked, or the report lacks per-instruction samples or counts.
    parked: tuple[Parked, ...] = ()

    @property
    def name(self) -> str:
        """The kernel's function name, without parameters."""
        return self.identity.name

    @property
    def duration_ns(self) -> float | None:
        """The kernel's duration in nanoseconds, None when not collected."""
        return self.sol.duration_ns

    @property
    def parked_samples(self) -> int:
        """Warp-state samples at the instructions where warps are parked."""
        return sum(p.samples for p in self.parked)

    @property
    def parked_reasons(self) -> dict[str, int]:
        """The parked warps' samples by stall reason, over every place they park."""
        out: dict[str, int] = {}
        for p in self.parked:
            for r, n in p.reasons:
                out[r] = out.get(r, 0) + n
        return out

    @property
    def parked_share(self) -> float | None:
        """The parked warps' part of all warp-state samples (0..1); None without samples."""
        total = self.stalls.total_samples
        return self.parked_samples / total if total else None

    def working_stall_cycles(self) -> dict[str, float]:
        """Stall cycles per issued instruction by reason, the parked warps' waits left out.
        Samples fall on a warp's states in proportion to the cycles it spends in them, so
        each reason keeps the share of its samples that do not sit at a parked instruction;
        with no warp parked these are the stalls as collected."""
        parked = self.parked_reasons
        out: dict[str, float] = {}
        for s in self.stalls.reasons:
            if s.cycles_per_issue is None:
                continue
            away = parked.get(s.reason, 0) / s.samples if s.samples else 0.0
            out[s.reason] = s.cycles_per_issue * max(0.0, 1 - away)
        return out

    def working_stall_share(self, reason: str) -> float | None:
        """This reason's part of working_stall_cycles (0..1), None if not collected: what
        stalls.share says once the parked warps' waits are left out."""
        if not self.parked:
            return self.stalls.share(reason)
        cycles = self.working_stall_cycles()
        total = sum(cycles.values())
        return cycles[reason] / total if reason in cycles and total else None

    def detached(self, names: Iterable[str]) -> KernelProfile:
        """The same profile with no open report behind it, to send to another process: its
        metrics those named (what the views and rules read), the rest and the source view
        read from the report reopened where they are asked for."""
        corr = self.correlation.detached() if self.correlation is not None else None
        return replace(self, metrics=self.metrics.detached(names), correlation=corr)

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
        # Per-instruction metrics are read by several views (hotspots, hot loop, parked
        # warps): once each while they are built, since every read leaks a correlation-id
        # metric (see load); forget() lets them go once the views hold what they need.
        self._instances: dict[str, dict[Any, float] | None] = {}

    def forget(self) -> None:
        self._instances.clear()

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
        if name not in self._instances:
            self._instances[name] = self._read_instances(name)
        return self._instances[name]

    def _read_instances(self, name: str) -> dict[Any, float] | None:
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

    def never_runs(self, pc: int) -> bool:
        """Predicated on !PT, never true: ptxas's padding (``@!PT LDS RZ, [RZ]`` beside a
        kernel's LDGSTS), issued but moving no data."""
        return self.text(pc).startswith("@!PT ")

    def source(self, pc: int) -> tuple[str | None, int | None]:
        info = self.action.source_info(pc)
        if info is None:
            return None, None
        return info.file_name() or None, int(info.line()) or None


# --------------------------------------------------------------------- view builders


def _identity(r: _Reader, where: Where, version: str | None) -> Identity:
    a = r.action
    major = r.int_(CC_METRICS[0])
    minor = r.int_(CC_METRICS[1])
    cluster = r.dim3(CLUSTER_DIMS[0][:-2])
    if cluster is not None and cluster[0] * cluster[1] * cluster[2] <= 1:
        cluster = None
    return Identity(
        name=a.name(a.NameBase_FUNCTION), mangled=a.name(a.NameBase_MANGLED),
        demangled=a.name(a.NameBase_DEMANGLED),
        grid=r.dim3("launch__grid_dim"), block=r.dim3("launch__block_dim"), cluster=cluster,
        device=r.text(M_DEVICE_NAME),
        compute_capability=f"{major}.{minor}" if major is not None and minor is not None else None,
        sm_count=r.int_(M_SM_COUNT),
        sm_clock_hz=r.num(M_SM_CLOCK), cycles=r.num(M_CYCLES), mem_clock_hz=r.num(M_MEM_CLOCK),
        reader_version=version, source=where.source, range_index=where.range_index,
        action_index=where.action_index, launch_index=where.launch_index,
        incomplete=where.incomplete, sm_clock_max_hz=_khz(r.num(M_SM_CLOCK_MAX)),
    )


def _khz(v: float | None) -> float | None:
    return v * 1e3 if v is not None else None


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
    cluster = r.int_(M_CLUSTER_SIZE)
    return Launch(
        registers_per_thread=r.int_(M_REGISTERS),
        shared_static_bytes=r.int_(M_SMEM_STATIC),
        shared_dynamic_bytes=r.int_(M_SMEM_DYNAMIC),
        shared_driver_bytes=r.int_(M_SMEM_DRIVER),
        block_size=r.int_(M_BLOCK_SIZE), grid_size=r.int_(M_GRID_SIZE),
        cluster_size=cluster if cluster and cluster > 1 else None,
        theoretical_occupancy_pct=r.num(M_THEORETICAL_OCCUPANCY),
        achieved_occupancy_pct=r.num(M_ACHIEVED_OCCUPANCY),
        occupancy_limiter=limiter, occupancy_limits=limits,
        waves_per_sm=r.num(M_WAVES),
    )


def _opcodes(r: _Reader, sass: _Sass) -> Opcodes:
    executed = dict(r.instances(M_OPCODES) or {})
    with_mod = dict(r.instances(M_OPCODES_MOD) or {})
    # ptxas's never-run padding (`@!PT LDS RZ, [RZ]` before each LDGSTS group) is issued and
    # counted, but loads nothing: where the report has executions per PC, its counts come
    # off its opcode (the shared family holds only shared-memory accesses) and stay in the
    # issued total.
    padding = 0.0
    for pc, n in (r.instances(M_INST_EXECUTED_PC) or {}).items():
        if n > 0 and sass.never_runs(pc):
            op = sass.opcode(pc)
            taken = min(n, executed.get(base_opcode(op), 0.0))
            padding += taken
            executed[base_opcode(op)] = executed.get(base_opcode(op), 0.0) - taken
            if op in with_mod:
                with_mod[op] = max(0.0, with_mod[op] - n)
    executed = {k: v for k, v in executed.items() if v > 0}
    with_mod = {k: v for k, v in with_mod.items() if v > 0}
    return Opcodes(executed=dict(sorted(executed.items(), key=lambda kv: -kv[1])),
                   with_modifiers=dict(sorted(with_mod.items(), key=lambda kv: -kv[1])),
                   families=group_families(executed or with_mod), padding=padding)


def _reasons_at(r: _Reader, pcs: set[int]) -> dict[int, tuple[tuple[str, int], ...]]:
    """Every stall reason's samples at each of a few PCs, most first (ties by name: the
    metric names come as a set, whose order changes per process)."""
    per_reason: dict[str, dict[int, float]] = {}
    for name in r.names:
        m = STALL_SAMPLE_RE.match(name)
        if m is not None and not name.endswith("_not_issued"):
            per_reason[_stall_key(m.group(1))] = r.instances_at(name, pcs)
    return {pc: tuple(sorted(((k, int(v[pc])) for k, v in per_reason.items() if v.get(pc)),
                             key=lambda kv: (-kv[1], kv[0]))) for pc in pcs}


def _base_pc(r: _Reader, samples: Mapping[int, float]) -> int:
    starts = r.instances("launch__function_pcs")
    return int(min(starts.values()) if starts else min(samples))


def _hotspots(r: _Reader, sass: _Sass, count: int = HOTSPOT_COUNT) -> tuple[Hotspot, ...]:
    samples = r.instances(M_PC_SAMPLES)
    if not samples:
        return ()
    top = sorted(samples.items(), key=lambda kv: -kv[1])[:count]
    reasons = _reasons_at(r, {pc for pc, _ in top})
    base = _base_pc(r, samples)
    out = []
    for pc, n in top:
        file, line = sass.source(pc)
        out.append(Hotspot(address=int(pc - base), sass=sass.text(pc), opcode=sass.opcode(pc),
                           file=file, line=line, samples=int(n), reasons=reasons[pc][:3]))
    return tuple(out)


def _parked(r: _Reader, sass: _Sass, launch: Launch) -> tuple[Parked, ...]:
    """The source lines where warps wait out the kernel (PARKED_WARPS_MIN): samples and
    executions per PC against the warps launched, so a one-wave kernel's warp life is its
    samples over its warps. A line's waiting instructions count together: a cluster
    barrier's fence, arrive and wait (ERRBAR, UCGABAR_ARV, UCGABAR_WAIT) share its wait."""
    samples = r.instances(M_PC_SAMPLES)
    executed = r.instances(M_INST_EXECUTED_PC)
    grid, block = launch.grid_size, launch.block_size
    if not samples or not executed or not grid or not block:
        return ()
    warps = grid * -(-block // WARP_SIZE)
    total = sum(samples.values())
    life = total / warps                        # samples per warp over its life
    top = max(executed.values())
    if life <= 0 or top <= 0:
        return ()
    # Outside the main loop, passed at most once per warp, and enough samples to matter.
    outside = {pc: n for pc, n in samples.items()
               if 0 < executed.get(pc, 0.0) <= warps and executed[pc] < HOT_LOOP_SHARE * top
               and n >= PARKED_PC_MIN * total}
    if sum(outside.values()) / life / grid < PARKED_WARPS_MIN:
        return ()
    reasons = _reasons_at(r, set(outside))
    lines: dict[tuple[str | None, int | None] | int, list[int]] = {}
    for pc in outside:
        if reasons[pc] and reasons[pc][0][0] in PARKED_REASONS:
            file, line = sass.source(pc)
            lines.setdefault((file, line) if line else pc, []).append(pc)
    base = _base_pc(r, samples)
    out = []
    for pcs in lines.values():
        held = sum(outside[pc] for pc in pcs)
        if held / life / grid < PARKED_WARPS_MIN:
            continue
        pcs = pcs + _waits_after(max(pcs), max(executed[pc] for pc in pcs), samples, executed,
                                 sass)
        held = sum(samples[pc] for pc in pcs)
        reasons.update(_reasons_at(r, {pc for pc in pcs if pc not in reasons}))
        head = max(pcs, key=lambda pc: (samples[pc], -pc))
        merged: dict[str, int] = {}
        for pc in pcs:
            for k, n in reasons[pc]:
                merged[k] = merged.get(k, 0) + n
        file, line = sass.source(head)
        out.append(Parked(address=int(head - base), opcode=sass.opcode(head), file=file,
                          line=line, samples=int(held), passes=int(max(executed[pc] for pc in pcs)),
                          warps_per_cta=held / life / grid,
                          addresses=tuple(sorted(int(pc - base) for pc in pcs)),
                          reasons=tuple(sorted(merged.items(), key=lambda kv: (-kv[1], kv[0])))))
    return tuple(sorted(out, key=lambda p: -p.samples))


def _waits_after(last: int, passes: float, samples: Mapping[int, float],
                 executed: Mapping[int, float], sass: _Sass) -> list[int]:
    """The sampled waits that the warps leaving a parked line reach next: instructions
    passed as often as it was, up to the first executed EXIT or the first executed
    instruction that does work (anything but branches, moves of uniform constants,
    fences, barriers and sleeps)."""
    found = []
    for i in range(1, PARKED_FOLLOW_MAX + 1):
        pc = last + i * INSTRUCTION_BYTES
        ran = executed.get(pc, 0.0)
        if not ran:
            continue
        op = base_opcode(sass.opcode(pc))
        if op not in _NO_WORK:
            break
        if ran == passes and samples.get(pc):
            found.append(pc)
    return found


def _hot_loop(r: _Reader, sass: _Sass) -> HotLoop | None:
    executed = r.instances(M_INST_EXECUTED_PC)
    if not executed:
        return None
    top = max(executed.values())
    if top <= 0:
        return None
    hot = sorted(pc for pc, n in executed.items() if n >= HOT_LOOP_SHARE * top)
    # Each PC counts once: the loop's static mix, not its executions. Padding that never
    # runs is in the instruction count (it takes issue slots) but in no family: three
    # `@!PT LDS` before each LDGSTS group are no shared-memory loads.
    families = group_families((sass.opcode(pc), 1) for pc in hot if not sass.never_runs(pc))
    samples = r.instances(M_PC_SAMPLES)
    waits = gap = reuse = bursts = dispatch = None
    total = sum(samples.values()) if samples else 0.0
    if total > 0:
        at = r.instances_at(M_LONG_SCOREBOARD_SAMPLES, set(hot))
        waits = sum(at.values()) / total
        base = _base_pc(r, samples)
        gap = _math_gap(r, hot, families, sass, base)
        reuse = _reuse_waits(at, executed, sass, total, base)
        if gap and gap.math == "ffma":
            bursts = _fragment_bursts(r, hot, sass, total, base)
            dispatch = _ffma_dispatch(r, hot, sass, total, base)
    return HotLoop(instructions=len(hot), families={k: int(v) for k, v in families.items()},
                   operand_waits=waits, math_gap=gap, reuse_waits=reuse, fragment_bursts=bursts,
                   ffma_dispatch=dispatch)


def _reuse_waits(waits: Mapping[int, float], executed: Mapping[int, float], sass: _Sass,
                 total: float, base: int) -> ReuseWaits:
    """Of the main loop's long-scoreboard samples (waits, by PC), those at write-after-read
    waits (ReuseWaits); loaded and held registers from every executed instruction."""
    ops = {pc: operands(sass.text(pc)) for pc in executed if not sass.never_runs(pc)}
    loaded = frozenset().union(*(o.writes for o in ops.values() if o.loads))
    held = frozenset().union(*(o.reads for o in ops.values() if o.l1tex))
    reuse = {pc: n for pc, n in waits.items() if n > 0 and pc in ops
             and ops[pc].writes & held and not ops[pc].reads & loaded}
    if not reuse or total <= 0:
        return ReuseWaits(share=0.0, instructions=0, first=0, sass="", samples=0)
    top = max(reuse, key=lambda pc: (reuse[pc], -pc))
    # Back from it in address order, wrapping once (the loop's copies may sit after it).
    order = sorted(ops)
    at = order.index(top)
    holder = next((pc for pc in order[:at][::-1] + order[at + 1:][::-1]
                   if ops[pc].l1tex and ops[pc].reads & ops[top].writes), None)
    return ReuseWaits(share=sum(reuse.values()) / total, instructions=len(reuse),
                      first=top - base, sass=sass.text(top), samples=int(reuse[top]),
                      holder=holder - base if holder is not None else None,
                      holder_sass=sass.text(holder) if holder is not None else "")


# Synchronous math: a warp issues it and its result is the warp's own, so a warp that is
# elsewhere in its loop issues none (wgmma runs on while its warps do other work).
SYNC_MATH = ("ffma", "hmma")


# Stall reasons that are waits on memory or on other warps: the latency rules' evidence.
WAITING_REASONS = ("long_scoreboard", "barrier", "membar", "sleeping")
# Instructions that bring operand tiles in from global memory.
COPY_FAMILIES = ("ldgsts", "ldg", "tma")


def _math_gap(r: _Reader, hot: list[int], families: Mapping[str, float], sass: _Sass,
              base: int) -> MathGap | None:
    math = max(SYNC_MATH, key=lambda k: families.get(k, 0))
    if not families.get(math) or any(families.get(k) for k in ("gmma", "utcmma")):
        return None
    samples = r.instances(M_PC_SAMPLES) or {}
    total = sum(samples.values())
    best: tuple[float, int, int] | None = None       # samples, first PC, instructions
    run: list[int] = []
    for pc in [*hot, None]:
        if pc is not None and family_of(sass.opcode(pc)) != math:
            run.append(pc)
            continue
        if run:
            held = sum(samples.get(q, 0.0) for q in run)
            if best is None or held > best[0]:
                best = (held, run[0], len(run))
            run = []
    if best is None:
        return None
    first = hot.index(best[1])
    pcs = set(hot[first:first + best[2]])
    by_reason: dict[str, int] = {}
    for reasons in _reasons_at(r, pcs).values():
        for reason, n in reasons:
            by_reason[reason] = by_reason.get(reason, 0) + n
    waiting = sum(by_reason.get(k, 0) for k in WAITING_REASONS)
    copies = sum(family_of(sass.opcode(q)) in COPY_FAMILIES for q in pcs)
    return MathGap(math=math, first=best[1] - base, instructions=best[2], share=best[0] / total,
                   waiting=waiting / total,
                   reasons=tuple(sorted(by_reason.items(), key=lambda kv: (-kv[1], kv[0]))),
                   copies=copies)


# Shared loads in one run between two FFMAs from which the run is a burst: a warp tile's
# next k step loads its A and B fragments in 4 to 6 LDS.128 (an 8 x 16 thread tile: 2 + 4),
# so from four on, one step's fragments or more go out back to back.
BURST_LOADS_MIN = 4
_SHARED_LOADS = ("LDS", "LDSM")
# A warp at a load is neither waiting on memory or a barrier (WAITING_REASONS: the latency
# rules') nor passed over for another warp (not_selected) nor issuing (selected).
_NOT_ITS_OWN = (*WAITING_REASONS, "not_selected", "selected")


def _fragment_bursts(r: _Reader, hot: list[int], sass: _Sass, total: float,
                     base: int) -> FragmentBursts | None:
    runs: list[list[int]] = []
    run: list[int] = []
    for pc in [*hot, None]:
        if pc is not None and family_of(sass.opcode(pc)) != "ffma":
            if base_opcode(sass.opcode(pc)) in _SHARED_LOADS and not sass.never_runs(pc):
                run.append(pc)
            continue
        if run:
            runs.append(run)
            run = []
    loads = sum(len(x) for x in runs)
    if not loads or total <= 0:
        return None
    bursts = [x for x in runs if len(x) >= BURST_LOADS_MIN]
    reasons = _reasons_at(r, {pc for x in bursts for pc in x})
    own = {pc: [(k, n) for k, n in reasons.get(pc, ()) if k not in _NOT_ITS_OWN] for pc in reasons}
    merged: dict[str, int] = {}
    for pairs in own.values():
        for k, n in pairs:
            merged[k] = merged.get(k, 0) + n
    held = [sum(n for pc in x for _, n in own.get(pc, ())) for x in bursts]
    first = bursts[held.index(max(held))][0] - base if bursts else 0
    return FragmentBursts(loads=loads, in_bursts=sum(len(x) for x in bursts), bursts=len(bursts),
                          waits=sum(held) / total, first=first,
                          reasons=tuple(sorted(merged.items(), key=lambda kv: (-kv[1], kv[0]))))


def _ffma_dispatch(r: _Reader, hot: list[int], sass: _Sass, total: float,
                   base: int) -> FfmaDispatch | None:
    ffmas = [pc for pc in hot if family_of(sass.opcode(pc)) == "ffma"]
    if not ffmas or total <= 0:
        return None
    reasons = _reasons_at(r, set(ffmas))
    held = {pc: dict(reasons.get(pc, ())).get("dispatch_stall", 0) for pc in ffmas}
    # Every FFMA of the loop executes as often, so the median FFMA's samples (all reasons)
    # are the loop's samples per execution: the unit a stall on every execution costs.
    each = statistics.median(sum(n for _, n in reasons.get(pc, ())) for pc in ffmas)
    top = max(ffmas, key=lambda pc: (held[pc], -pc))
    return FfmaDispatch(ffmas=len(ffmas),
                        stalling=sum(1 for pc in ffmas if each and held[pc] >= 0.5 * each),
                        share=sum(held.values()) / total, first=top - base)


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
        plain, links = plain_message(text)
        out.append(NcuRule(identifier=d.get("rule_identifier", ""),
                           section=d.get("section_identifier", ""),
                           title=(msg.get("title") or d.get("name") or "").strip(),
                           type=_MSG_TYPES.get(msg.get("type", 0), "none"), message=plain,
                           speedup_pct=sp.get("speedup"),
                           speedup_type=_SPEEDUP_TYPES.get(sp.get("type", 0)), links=links))
    return tuple(out)


def profile_from_action(action: Any, where: Where,
                        version: str | None = None, handle: ReportHandle | None = None
                        ) -> KernelProfile:
    """Build the KernelProfile of one ncu_report action (a profiled launch)."""
    r = _Reader(action)
    sass = _Sass(action)
    launch = _launch(r)
    profile = KernelProfile(
        identity=_identity(r, where, version), sol=_sol(r), stalls=_stalls(r),
        memory=_memory(r, sass), launch=launch, opcodes=_opcodes(r, sass),
        hotspots=_hotspots(r, sass), ncu_rules=_ncu_rules(action),
        metrics=RawMetrics(handle, action, where), correlation=Correlation(handle, r, sass, where),
        hot_loop=_hot_loop(r, sass), parked=_parked(r, sass, launch),
    )
    r.forget()      # the source view (Correlation) reads again what a page needs
    return profile


# --------------------------------------------------------------------------- loading


# The reports this process has loaded, by the path as given, the file's identity (device,
# inode, size, modification time) and the kernel filter, least recently used first. Why:
# the report reader never frees a report it has read per-instruction metrics from.
# IMetric.correlation_ids() "returns a new IMetric" that Python is not given to own
# (thisown False; handing it over and freeing it corrupts the reader's next load), and it
# keeps its report's whole context alive: sgemm_stages4's 3 MB report costs 29 MB more
# each time it is loaded, the test suite reached 14.3 GB loading the same reports again
# and again. A process that asks for a report again gets the profiles it already has
# (frozen values; their lazy readers are shared).
LOADED_MAX = 256
_loaded: OrderedDict[tuple[Any, ...], list[KernelProfile]] = OrderedDict()


def load(path: str | os.PathLike[str], kernel: str | None = None) -> list[KernelProfile]:
    """Every profiled launch in one report, optionally only those whose name matches kernel."""
    p = Path(path)
    if not p.exists():
        raise PerfscopeError(f"{p} does not exist.")
    if p.is_dir():
        raise PerfscopeError(f"{p} is a directory; use load_many for folders of reports.")
    pattern = compile_kernel_regex(kernel)
    key = load_key(p, kernel)
    if key in _loaded:
        _loaded.move_to_end(key)
        return list(_loaded[key])
    out = _handed.pop(key, None)
    if out is None:
        out = _read(p, pattern)
    remember(key, out)
    return list(out)


def load_key(path: Path, kernel: str | None) -> tuple[Any, ...]:
    """What load remembers a report's profiles by: the path as given, the file's identity
    (device, inode, size, modification time) and the kernel filter."""
    st = path.stat()
    return (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, kernel)


def loaded(key: tuple[Any, ...]) -> bool:
    """Whether load already holds the profiles of this key (load_key's), or has them
    handed over."""
    return key in _loaded or key in _handed


# Profiles read in another process (perfscope.loadpool), waiting for load to ask for them:
# a hand-over, not a cache, so a folder of more than LOADED_MAX reports loses none of them
# to eviction before its turn (each would be read again here). Detached profiles are small.
_handed: dict[tuple[Any, ...], list[KernelProfile]] = {}


def hand_over(key: tuple[Any, ...], profiles: list[KernelProfile]) -> None:
    """Give load a report's profiles read elsewhere, to return when it is asked for it."""
    _handed[key] = profiles


def remember(key: tuple[Any, ...], profiles: list[KernelProfile]) -> None:
    """Keep a report's profiles for load to return again."""
    _loaded[key] = profiles
    _loaded.move_to_end(key)
    while len(_loaded) > LOADED_MAX:
        _loaded.popitem(last=False)


def _read(p: Path, pattern: re.Pattern[str] | None) -> list[KernelProfile]:
    handle, warning = open_report(p)
    version = reader_label()
    out = []
    for index, (ri, ai, action) in enumerate(handle.actions()):
        if pattern is not None and not (
                pattern.search(action.name(action.NameBase_FUNCTION))
                or pattern.search(action.name(action.NameBase_DEMANGLED))):
            continue
        out.append(profile_from_action(action, Where(str(p), ri, ai, index, warning), version,
                                       handle))
    return out


# Reports reopened for profiles that were read in another process (a loading worker) and
# now want what only the report holds: a source page, a metric no rule names. Kept apart
# from _loaded, whose entries for those files are the detached profiles themselves.
_attached: OrderedDict[str, list[KernelProfile]] = OrderedDict()


def _reattached(where: Where | None) -> KernelProfile:
    if where is None:
        raise PerfscopeError("this profile was built without a report to read more from.")
    if where.source not in _attached:
        _attached[where.source] = _read(Path(where.source), None)
        while len(_attached) > LOADED_MAX:
            _attached.popitem(last=False)
    _attached.move_to_end(where.source)
    for kp in _attached[where.source]:
        if kp.identity.launch_index == where.launch_index:
            return kp
    raise PerfscopeError(f"{where.source} no longer holds launch {where.launch_index} "
                         "(the file changed since it was read).")


def compile_kernel_regex(kernel: str | None) -> re.Pattern[str] | None:
    """--kernel's pattern, or one sentence when it is not a regular expression."""
    if kernel is None:
        return None
    try:
        return re.compile(kernel)
    except re.error as exc:
        raise PerfscopeError(f"--kernel {kernel!r} is not a valid regular expression ({exc}).") from None
