"""The hot loop of a profiled kernel, instruction by instruction: the cubin's SASS, the report's counts.

    listing = hot_listing(profile, sass.instructions)   # sass: the kernel out of the cubin
    for row in listing.rows:                              # the report carries (sass/embedded.py)
        print(hex(row.address), row.executed, row.samples, row.reasons, row.sass)

What a kernel engineer reads Nsight Compute's Source page for, in a terminal or as JSON:
every instruction of the main loop (the PCs executed at least HOT_LOOP_SHARE as often as
the most executed one, as ``KernelProfile.hot_loop`` counts them) with its warp-level
executions, its warp-state samples and its top stall reasons, each instruction written as
the cubin's own disassembly writes it: with the ``.reuse`` flags of its register operands,
which the report's SASS text (``IAction.sass_by_pc``) leaves out. Instruction i of the
cubin's listing sits at offset 16 i; the report's PCs are absolute, and its lowest executed
PC is the kernel's first instruction (every launched thread runs it). The two are checked
against each other opcode by opcode before a row is written: a cubin that is not the
code that ran gives a note, never a listing of other code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from perfscope.profile import HOT_LOOP_SHARE, FfmaDispatch, KernelProfile
from perfscope.sass.disasm import opcode_with_modifiers
from perfscope.sass.loops import INSTRUCTION_BYTES
from perfscope.source import top_reasons

TOP_REASONS = 2          # stall reasons named per instruction


@dataclass(frozen=True)
class ListingRow:
    """One instruction of the hot loop."""

    address: int                            # offset from the kernel's first instruction
    sass: str                               # as the cubin's disassembly writes it
    executed: int                           # warp-level executions
    samples: int                            # warp-state samples at it ("selected" included)
    reasons: tuple[tuple[str, int], ...]    # its top stall reasons ("selected" left out)


@dataclass(frozen=True)
class HotListing:
    """A kernel's hot loop; ``note`` says why there is no row when there is none."""

    rows: tuple[ListingRow, ...]
    total_samples: int                      # the kernel's, over every PC
    note: str | None = None
    hot_share: float = HOT_LOOP_SHARE       # a row executed at least this share of the top
    # An FFMA loop's FFMAs held at dispatch (PS133's reading), to compare two compiles by.
    ffma_dispatch: FfmaDispatch | None = None

    @property
    def samples(self) -> int:
        """Samples at the hot loop's instructions."""
        return sum(r.samples for r in self.rows)


def _opcode(text: str) -> str:
    return opcode_with_modifiers(text).rstrip(";")


NOT_COLLECTED = "not collected: executions per instruction (sass__inst_executed per PC)"


def code_check(profile: KernelProfile, instructions: Sequence[str]) -> str | None:
    """None when ``instructions`` (a disassembly in address order) are the code the report
    profiled, opcode for opcode at every PC it executed; else why not, in a sentence
    (NOT_COLLECTED when the report holds no executions to check them against). A report
    can carry several modules with a kernel of the same name (Triton's autotuner compiles
    one per configuration): this tells which one ran."""
    corr = profile.correlation
    executed = corr.executed() if corr is not None else {}
    if not executed:
        return NOT_COLLECTED
    base = min(executed)
    for pc in sorted(executed):
        i = (pc - base) // INSTRUCTION_BYTES
        theirs = _opcode(corr.sass_of(pc))
        ours = _opcode(instructions[i]) if 0 <= i < len(instructions) else ""
        if (pc - base) % INSTRUCTION_BYTES or theirs != ours:
            return (f"the cubin's code does not line up with the report's at offset "
                    f"{pc - base:#x} ({ours or 'nothing'} against {theirs}): not the code "
                    "that ran")
    return None


def hot_listing(profile: KernelProfile, instructions: Sequence[str],
                share: float = HOT_LOOP_SHARE) -> HotListing:
    """The hot loop of a profiled kernel, each instruction as ``instructions`` (the cubin's
    disassembly of the same kernel, in address order) writes it, with the report's counts:
    the instructions executed at least ``share`` as often as the most executed one (0: every
    instruction that ran, the code around the loop too)."""
    why = code_check(profile, instructions)
    corr = profile.correlation
    samples = corr.pc_samples() if corr is not None else {}
    if why is not None:
        return HotListing((), int(sum(samples.values())), why)
    executed = corr.executed()
    base, top = min(executed), max(executed.values())
    hot = sorted(pc for pc, n in executed.items() if n > 0 and n >= share * top)
    reasons = corr.reason_samples(set(hot))
    rows = tuple(
        ListingRow(address=pc - base, sass=instructions[(pc - base) // INSTRUCTION_BYTES],
                   executed=int(executed[pc]), samples=int(samples.get(pc, 0)),
                   reasons=top_reasons({r: per.get(pc, 0.0) for r, per in reasons.items()},
                                       TOP_REASONS))
        for pc in hot)
    loop = profile.hot_loop
    return HotListing(rows, int(sum(samples.values())), hot_share=share,
                      ffma_dispatch=loop.ffma_dispatch if loop is not None else None)
