"""Bad input to `perfscope diagnose`: one clear sentence, a non-zero exit, no traceback."""

from __future__ import annotations

import lzma
import struct

import pytest
from conftest import report
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from perfscope.cli import app

runner = CliRunner()


def diagnose(*args: str):
    result = runner.invoke(app, ["diagnose", *args])
    return result


def assert_one_sentence(result, *fragments: str) -> None:
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    text = result.output.strip()
    assert "Traceback" not in text
    assert len(text.splitlines()) == 1, text
    assert text.startswith("perfscope: ")
    for f in fragments:
        assert f in text


def real_report_bytes(name: str = "narrow_sol_only") -> bytes:
    with lzma.open(report(name)) as f:
        return f.read()


def test_missing_path(tmp_path):
    assert_one_sentence(diagnose(str(tmp_path / "nope.ncu-rep")), "does not exist")


def test_directory_without_reports(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    assert_one_sentence(diagnose(str(tmp_path)), "holds no .ncu-rep")


def test_file_that_is_not_a_report(tmp_path):
    bad = tmp_path / "notes.ncu-rep"
    bad.write_text("this is a text file, not a profile\n" * 50)
    assert_one_sentence(diagnose(str(bad)), "not an Nsight Compute report")


def test_truncated_report(tmp_path):
    data = real_report_bytes()
    cut = tmp_path / "cut.ncu-rep"
    cut.write_bytes(data[: len(data) * 3 // 5])
    assert_one_sentence(diagnose(str(cut)), "truncated")


def test_truncated_xz(tmp_path):
    data = report("narrow_sol_only").read_bytes()
    cut = tmp_path / "cut.ncu-rep.xz"
    cut.write_bytes(data[: len(data) // 2])
    assert_one_sentence(diagnose(str(cut)), "truncated")


def test_report_with_zero_kernels(tmp_path):
    # ncu itself writes no file when nothing matched (fixtures/h200/zero_kernels.ncu.log),
    # so this one is the real capture's header record alone: complete, but no launch.
    data = real_report_bytes()
    (length,) = struct.unpack_from("<I", data, 10)
    empty = tmp_path / "empty.ncu-rep"
    empty.write_bytes(data[: 10 + 4 + length])
    assert_one_sentence(diagnose(str(empty)), "holds no profiled kernel launch")


def test_kernel_filter_matching_nothing():
    assert_one_sentence(diagnose(str(report("float4_copy")), "--kernel", "nothing_like_this"),
                        "no kernel matches")


def test_invalid_kernel_regex():
    assert_one_sentence(diagnose(str(report("float4_copy")), "--kernel", "(unclosed"),
                        "not a valid regular expression")


@pytest.mark.parametrize("fmt", [[], ["--json"], ["--markdown"]])
def test_missing_metrics_say_not_collected(fmt):
    result = diagnose(str(report("narrow_sol_only")), *fmt)
    assert result.exit_code == 0, result.output
    if fmt == ["--json"]:
        assert '"excess": null' in result.output
    else:
        assert "not collected" in result.output


def test_error_after_good_file_keeps_nothing_half_written(tmp_path):
    """A bad file among good ones fails before anything is printed (no partial table)."""
    bad = tmp_path / "bad.ncu-rep"
    bad.write_bytes(b"garbage")
    result = diagnose(str(report("float4_copy")), str(bad))
    assert_one_sentence(result, "bad.ncu-rep")


_NARROW = real_report_bytes()


def _record_ends(data: bytes) -> dict[int, bool]:
    """Where each record ends, and whether that record is a header announcing another."""
    from perfscope.reader import _announced_size

    ends, off = {}, 10
    while off + 4 <= len(data):
        size = struct.unpack_from("<I", data, off)[0]
        record = data[off + 4: off + 4 + size]
        off += 4 + size
        ends[off] = bool(_announced_size(record))
    return ends


@settings(max_examples=60)
@given(st.integers(min_value=14, max_value=len(_NARROW) - 1))
def test_any_cut_inside_a_record_is_called_truncated(cut):
    from perfscope.reader import framing_problem

    problem = framing_problem(_NARROW[:cut])
    ends = _record_ends(_NARROW)
    if cut in ends and not ends[cut]:
        assert problem is None
    else:
        assert problem is not None and problem.startswith("truncated")


def test_every_cut_after_a_header_is_called_truncated():
    """At a record boundary, the cuts right after a result's header are the detectable
    ones (the file then announces a result it does not hold)."""
    from perfscope.reader import framing_problem

    data = real_report_bytes("many_launches")
    ends = _record_ends(data)
    assert sum(ends.values()) >= 24            # one header before each of the 24 results
    for end, header in ends.items():
        problem = framing_problem(data[:end])
        if header:
            assert problem is not None and "after the header" in problem, end
        else:
            assert problem is None, end


def test_complete_report_has_no_framing_problem():
    from perfscope.reader import framing_problem

    assert framing_problem(_NARROW) is None


def test_reference_of_a_report_whose_manifest_cannot_be_read(tmp_path):
    """`diff A cublas` needs A's shape and dtype from its run manifest: a manifest that is
    there but unreadable is named as such, not called missing."""
    import shutil

    a = tmp_path / "mine.ncu-rep.xz"
    shutil.copy(report("cublas_hgemm_4096"), a)
    (tmp_path / "mine.json").write_text('{"stage": 3}')
    result = runner.invoke(app, ["diff", str(a), "cublas"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("perfscope: ") and "mine.json" in last and "cannot read" in last
