"""perfscope.sass.loops on SASS fragments a real build cannot be made to show one at a time:
the branch forms cuobjdump prints, the backward branches that are not loops of the
kernel's code, and which TMA loop is the one that runs most often. The real builds (a
producer dividing per k tile, and every committed TMA stage) are in test_sass.py and
test_rules.py."""

from __future__ import annotations

from perfscope.sass.loops import Loop, loops, opcode, tma_leaf_loops, tma_loops


def _at(index: int) -> str:
    return f"0x{index * 16:x}"


def _kernel(body: list[str]) -> list[str]:
    return [*body, "EXIT", "BRA " + _at(len(body) + 1)]


def test_opcodes_lose_their_guard():
    assert opcode("@!P0 BRA P4, 0x1f10") == "BRA"
    assert opcode("@P0 BRA.U.ANY 0x1280") == "BRA.U.ANY"
    assert opcode("I2F.U32.RP R5, UR8") == "I2F.U32.RP"
    assert opcode("@UP0 UTMALDG.2D [UR12], [UR6]") == "UTMALDG.2D"


def test_a_backward_branch_closes_a_loop_in_any_of_its_forms():
    body = ["NOP", "UTMALDG.2D [UR12], [UR6]", f"@!P0 BRA P4, {_at(0)}",
            "NOP", f"@P1 BRA {_at(3)}", f"BRA {_at(6)}", "NOP"]
    assert loops(_kernel(body)) == (Loop(0, 2), Loop(3, 4))


def test_per_lane_replays_and_retries_after_exit_are_not_loops():
    # BRA.U.ANY replays one TMA issue per distinct uniform operand; the retry of an
    # mbarrier wait sits after the last EXIT and branches back to the wait's continuation.
    body = ["SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R1+URZ], R2", "@!P0 BRA " + _at(6),
            "UTMALDG.2D [UR12], [UR6]", f"@P0 BRA.U.ANY {_at(2)}", "EXIT"]
    retry = ["YIELD", "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R1+URZ], R2", f"@!P0 BRA {_at(5)}",
             f"BRA {_at(2)}"]
    sass = body + retry
    assert loops(sass) == ()
    assert tma_loops(sass) == ()


def test_the_leaf_loop_is_judged_not_the_one_around_it():
    # An unrolled k loop (two loads per k tile) inside a per-tile loop that divides once and
    # issues the unrolled loop's remainder: only the k loop is judged, and it does not divide.
    sass = _kernel([
        "I2F.RP R7, R9", "MUFU.RCP R7, R7",                         # per tile: 0-1
        "UTMALDG.2D [UR12], [UR6]", "UTMALDG.2D [UR12], [UR4]",     # remainder: 2-3
        "UTMALDG.2D [UR12], [UR6]", "UTMALDG.2D [UR12], [UR4]",     # k loop: 4-6
        f"@P0 BRA {_at(4)}",
        f"@P1 BRA {_at(0)}",                                         # tile loop: 0-7
    ])
    assert tma_loops(sass)[0].loop == Loop(0, 7) and tma_loops(sass)[0].divisions == 1
    (leaf,) = tma_leaf_loops(sass)
    assert (leaf.loop, leaf.loads, leaf.divisions) == (Loop(4, 6), 2, 0)


def test_a_division_per_k_tile_is_counted_in_the_leaf_loop():
    sass = _kernel([
        "UTMALDG.2D [UR12], [UR6]", "I2F.U32.RP R5, UR8", "MUFU.RCP R5, R5",
        "UTMALDG.2D [UR12], [UR4]", f"@!P0 BRA P4, {_at(0)}",
    ])
    (leaf,) = tma_leaf_loops(sass)
    assert (leaf.loads, leaf.divisions) == (2, 1)
    # A float conversion that is not the division idiom (no .RP) counts nothing.
    plain = [ins.replace("I2F.U32.RP", "I2F.U32") for ins in sass]
    assert tma_leaf_loops(plain)[0].divisions == 0


def test_labels_give_no_loops():
    # nvdisasm prints branch targets as labels: no address, so no loop (PS146 then sees no
    # TMA loop and stays silent rather than guess).
    sass = _kernel(["UTMALDG.2D [UR12], [UR6]", "@P0 BRA `(.L_x_3)"])
    assert loops(sass) == () and tma_leaf_loops(sass) == ()
