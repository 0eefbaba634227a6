"""Which general registers a SASS instruction writes and reads, from its text.

    ops = operands("IMAD.WIDE.U32 R240, R213, UR14, R220")
    ops.writes   # frozenset({240, 241}): a .WIDE result is a register pair
    ops.reads    # frozenset({213, 220, 221})

Enough of the instruction set to follow a register between an L1TEX instruction (a global,
local or generic load, store, atomic or LDGSTS copy: the ops whose register dependencies
ride the long scoreboard) and the instructions around it, in either disassembler's operand
order (the report's SASS text puts an LDGSTS's global address first, cuobjdump its shared
one). Uniform registers, predicates and RZ are not general registers and are left out;
widths come from the opcode's modifiers (.64, .128, .WIDE, an LDSM's .2/.4) and a bracketed
address's .64. An instruction this does not know keeps its first bare register as the one
it writes and every other as read: a guess on the side of reads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Base opcodes whose operands go through L1TEX: their register reads are held on the long
# scoreboard until the unit takes them, and a load's result arrives on it.
L1TEX_OPS = frozenset({"LDG", "STG", "LDGSTS", "LDL", "STL", "LD", "ST", "ATOMG", "ATOM",
                       "RED", "REDG", "TEX", "TLD", "TLD4", "SULD", "SUST", "SURED"})
# ... of those, the ones that write a result register.
L1TEX_LOADS = frozenset({"LDG", "LDL", "LD", "ATOMG", "ATOM", "TEX", "TLD", "TLD4", "SULD"})
# Variable-latency results that are not L1TEX's but may share its scoreboard (constant and
# special-register reads): counted as loaded, so a wait on them is never called a reuse.
OTHER_LOADS = frozenset({"LDC", "S2R", "S2UR"})

_REGISTER = re.compile(r"(?<![A-Z_])R(\d+)(\.64|\.128)?\b")
_BARE = re.compile(r"^[-|~!]*R(\d+)(?:\.reuse)?$")


@dataclass(frozen=True)
class Operands:
    """An instruction's base opcode and the general registers it writes and reads."""

    base: str
    writes: frozenset[int]
    reads: frozenset[int]

    @property
    def l1tex(self) -> bool:
        """It goes through L1TEX (its register reads ride the long scoreboard)."""
        return self.base in L1TEX_OPS

    @property
    def loads(self) -> bool:
        """Its result comes back on a scoreboard (an L1TEX load, a constant or special register)."""
        return self.base in L1TEX_LOADS or self.base in OTHER_LOADS


def _width(modifiers: tuple[str, ...], base: str) -> int:
    if "128" in modifiers:
        return 4
    if "64" in modifiers or "WIDE" in modifiers:
        return 2
    if base == "LDSM" and modifiers and modifiers[-1] in ("2", "4"):
        return int(modifiers[-1])
    if base == "HMMA":
        return 4 if "F32" in modifiers else 2
    return 1


def _registers(operand: str, width: int = 1) -> set[int]:
    out: set[int] = set()
    for m in _REGISTER.finditer(operand):
        n = int(m.group(1))
        w = {".64": 2, ".128": 4}.get(m.group(2) or "", width)
        out.update(range(n, n + w))
    return out


def operands(text: str) -> Operands:
    """The registers one instruction (either disassembler's text, predicate and trailing
    ``;`` allowed) writes and reads."""
    body = text.strip().rstrip(";").strip()
    if body.startswith("@"):
        body = body.split(None, 1)[1] if " " in body else ""
    opcode, _, rest = body.partition(" ")
    base, *mods = opcode.split(".")
    modifiers = tuple(mods)
    parts = [p.strip() for p in rest.split(",")] if rest.strip() else []
    width = _width(modifiers, base)
    writes: set[int] = set()
    first = _BARE.match(parts[0]) if parts else None
    if first and not base.startswith(("ST", "RED")):
        n = int(first.group(1))
        writes = set(range(n, n + width))
        parts = parts[1:]
    reads: set[int] = set()
    for i, part in enumerate(parts):
        bracketed = "[" in part
        # A store's data and a .WIDE multiply-add's addend are as wide as the opcode says.
        wide = not bracketed and (base.startswith(("ST", "RED", "ATOM"))
                                  or ("WIDE" in modifiers and i == len(parts) - 1))
        reads |= _registers(part, width if wide else 1)
    return Operands(base, frozenset(writes), frozenset(reads))
