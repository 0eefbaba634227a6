"""Loops in a kernel's static SASS, from its backward branches, and what they hold.

cuobjdump prints each branch's target as an absolute address and every instruction of a
function in address order, one per 16 bytes on sm_70 and later, so a branch to a lower
address closes a loop over the instructions between its target and itself. Two kinds of
backward branch are not loops of the kernel's own code and are left out: ``BRA.U.ANY``,
the compiler's replay of one instruction (a TMA issue) for each distinct uniform operand
among the lanes, and the retry of an mbarrier wait, whose out-of-line block (the wait
again, then a branch back) sits after the function's last EXIT. nvdisasm prints targets as
labels; its branches give no loops here (the callers then say "not evaluated").
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from perfscope.sass.disasm import base_opcode
from perfscope.sass.disasm import opcode_with_modifiers as opcode

INSTRUCTION_BYTES = 16
# "@!P0 BRA 0x1f10", "@!P0 BRA P4, 0x1f10" (taken while P4 holds too), "BRA.U.ANY 0x1280"
_BRANCH = re.compile(r"^(?:@!?U?P\w+\s+)?BRA(?P<mods>(?:\.[A-Z0-9_]+)*)\s+(?:!?U?P\w+,\s*)?"
                     r"0x(?P<target>[0-9a-fA-F]+)")
# The float conversion that starts an integer division or modulo by a value the compiler
# does not know: I2F with round-toward-+infinity (I2F.RP, I2F.U32.RP), then MUFU.RCP.
_DIVISION = re.compile(r"^I2F(?:\.[A-Z0-9]+)*\.RP$")
TMA_LOAD = "UTMALDG"


@dataclass(frozen=True)
class Loop:
    """Instructions first..last (indices into the function's list), last the back-edge."""

    first: int
    last: int

    def __contains__(self, index: int) -> bool:
        return self.first <= index <= self.last

    @property
    def size(self) -> int:
        """Instructions in the loop, the back-edge included."""
        return self.last - self.first + 1


def loops(instructions: Sequence[str]) -> tuple[Loop, ...]:
    """Every loop a backward branch of the function's body closes (up to its last EXIT),
    but BRA.U.ANY's per-lane replays."""
    ops = [opcode(ins) for ins in instructions]
    body_end = max((i for i, op in enumerate(ops) if op == "EXIT"), default=len(ops) - 1)
    out = []
    for i, ins in enumerate(instructions[:body_end + 1]):
        m = _BRANCH.match(ins.strip())
        if m is None or ".U.ANY" in m.group("mods"):
            continue
        target = int(m.group("target"), 16) // INSTRUCTION_BYTES
        if target <= i:
            out.append(Loop(target, i))
    return tuple(out)


def innermost(all_loops: Sequence[Loop], index: int) -> Loop | None:
    """The smallest loop holding instruction ``index`` (None: it runs once)."""
    holding = [lp for lp in all_loops if index in lp]
    return min(holding, key=lambda lp: lp.size) if holding else None


@dataclass(frozen=True)
class TmaLoop:
    """An innermost loop that issues TMA loads: its span, its loads, and the integer
    divisions (or modulos) by a runtime value in its body."""

    loop: Loop
    loads: int
    divisions: int


def tma_loops(instructions: Sequence[str]) -> tuple[TmaLoop, ...]:
    """The innermost loops holding UTMALDG, in address order, with what they hold; empty
    where no TMA load sits in a loop (or no branch target is an address)."""
    all_loops = loops(instructions)
    ops = [opcode(ins) for ins in instructions]
    found: dict[Loop, int] = {}
    for i, op in enumerate(ops):
        if base_opcode(op) == TMA_LOAD and (lp := innermost(all_loops, i)) is not None:
            found[lp] = found.get(lp, 0) + 1
    return tuple(TmaLoop(lp, n, sum(1 for op in ops[lp.first:lp.last + 1] if _DIVISION.match(op)))
                 for lp, n in sorted(found.items(), key=lambda kv: kv[0].first))


def tma_leaf_loops(instructions: Sequence[str]) -> tuple[TmaLoop, ...]:
    """tma_loops without those that hold another: the loops that run most often (a k loop
    unrolled by the compiler leaves its remainder's loads in the loop around it, whose once
    per tile or piece work is not per k tile)."""
    found = tma_loops(instructions)
    return tuple(t for t in found
                 if not any(o is not t and o.loop.first >= t.loop.first and o.loop.last <= t.loop.last
                            for o in found))
