"""sass/operands.py: the registers an instruction writes and reads, in both disassemblers' text."""

from __future__ import annotations

import pytest

from perfscope.sass.operands import operands

CASES = [
    # text, base, writes, reads, l1tex, loads
    ("IMAD.WIDE.U32 R240, R213, UR14, R220", "IMAD", {240, 241}, {213, 220, 221}, False, False),
    ("@!P5 IADD3 R232, R233, UR6, RZ", "IADD3", {232}, {233}, False, False),
    ("IADD3 R234, P5, R226, UR15, RZ", "IADD3", {234}, {226}, False, False),
    # The report's operand order (global address first) and cuobjdump's (shared first).
    ("LDGSTS.E.BYPASS.LTC128B.128.ZFILL desc[UR20][R4.64], P5, [R10+0x3000]", "LDGSTS", set(),
     {4, 5, 10}, True, False),
    ("LDGSTS.E.BYPASS.LTC128B.128 [R196+0x2000], desc[UR12][R198.64], !P2 ;", "LDGSTS", set(),
     {196, 198, 199}, True, False),
    ("STG.E.128 desc[UR4][R2.64], R8", "STG", set(), {2, 3, 8, 9, 10, 11}, True, False),
    ("LDG.E.128 R4, desc[UR4][R2.64+0x10]", "LDG", {4, 5, 6, 7}, {2, 3}, True, True),
    ("LDSM.16.MT88.4 R16, [R220+UR35+0x4000]", "LDSM", {16, 17, 18, 19}, {220}, False, False),
    ("HMMA.16816.F32.BF16 R44, R96, R76, R44", "HMMA", {44, 45, 46, 47}, {44, 76, 96}, False, False),
    ("ISETP.NE.AND P0, PT, R3, RZ, PT", "ISETP", set(), {3}, False, False),
    ("@!PT LDS RZ, [RZ]", "LDS", set(), set(), False, False),
    ("S2R R201, SR_TID.X", "S2R", {201}, set(), False, True),
    ("STS [R3+0x10], R5", "STS", set(), {3, 5}, False, False),
]


@pytest.mark.parametrize("text,base,writes,reads,l1tex,loads", CASES, ids=[c[0][:32] for c in CASES])
def test_registers(text, base, writes, reads, l1tex, loads):
    ops = operands(text)
    assert (ops.base, set(ops.writes), set(ops.reads)) == (base, writes, reads)
    assert (ops.l1tex, ops.loads) == (l1tex, loads)


def test_uniform_registers_and_rz_are_not_general_registers():
    ops = operands("UIADD3 UR9, UR4, -0xc000, URZ")
    assert not ops.writes and not ops.reads
