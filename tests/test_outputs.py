"""Where `perfscope report --html` writes: nothing is replaced that is not a plain file,
links survive, and a capture is never overwritten with HTML (issue 16, items 1, 2, 15)."""

from __future__ import annotations

import os
import shutil
import threading

import pytest
from conftest import report
from typer.testing import CliRunner

from perfscope.cli import app
from perfscope.errors import PerfscopeError
from perfscope.render.html import write_atomic

runner = CliRunner()


def _report_html(*args: str):
    return runner.invoke(app, ["report", str(report("float4_copy")), "--html", *args])


def test_symlink_survives_and_its_target_gets_the_page(tmp_path):
    target = tmp_path / "pages" / "index.html"
    target.parent.mkdir()
    target.write_text("old")
    link = tmp_path / "latest.html"
    link.symlink_to(target)
    result = _report_html(str(link))
    assert result.exit_code == 0, result.output
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text().startswith("<!DOCTYPE html>")
    # Where it wrote goes to stderr (stdout may be the page), with the kernel count.
    assert f"wrote {link}" in result.stderr and "1 kernel" in result.stderr
    assert result.stdout == ""


def test_dangling_symlink_gets_a_target(tmp_path):
    link = tmp_path / "latest.html"
    link.symlink_to(tmp_path / "made.html")
    write_atomic(link, "<p>x</p>\n")
    assert link.is_symlink() and (tmp_path / "made.html").read_text() == "<p>x</p>\n"


def test_fifo_is_written_through_not_replaced(tmp_path):
    fifo = tmp_path / "page.fifo"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    result = _report_html(str(fifo))
    reader.join(timeout=60)
    assert result.exit_code == 0, result.output
    assert received and received[0].startswith(b"<!DOCTYPE html>")
    assert fifo.is_fifo()                 # still the FIFO, not a regular file in its place


def test_dev_null_is_written_through_not_replaced():
    before = os.stat("/dev/null")
    result = _report_html("/dev/null")
    assert result.exit_code == 0, result.output
    after = os.stat("/dev/null")
    assert (after.st_ino, after.st_mode, after.st_rdev) == (before.st_ino, before.st_mode, before.st_rdev)


def test_dev_stdout_like_link_to_a_redirect_target_is_not_renamed_over(tmp_path):
    """/dev/stdout is a link through /proc/self/fd: a rename would orphan the shell's
    redirect. Writing through keeps the same inode."""
    out = tmp_path / "redirected.html"
    out.write_text("")
    inode = out.stat().st_ino
    with open(out, "w") as f:
        write_atomic(f"/proc/self/fd/{f.fileno()}", "<p>page</p>\n")
    assert out.stat().st_ino == inode
    assert out.read_text() == "<p>page</p>\n"


def test_a_folder_is_refused_in_one_sentence(tmp_path):
    result = _report_html(str(tmp_path))
    assert result.exit_code == 2
    assert "is a folder" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("name", ["x.ncu-rep", "x.ncu-rep.xz"])
def test_report_file_names_are_refused(tmp_path, name):
    result = _report_html(str(tmp_path / name))
    assert result.exit_code == 2
    assert "report file name" in result.output
    assert not (tmp_path / name).exists()


def test_an_input_is_never_overwritten(tmp_path):
    """`report glob/*.ncu-rep.xz --html ...` after the shell expanded the glob, and the
    plain `report X --html X`: the capture keeps its bytes."""
    first = tmp_path / "a.ncu-rep.xz"
    second = tmp_path / "b.ncu-rep.xz"
    shutil.copy(report("float4_copy"), first)
    shutil.copy(report("strided_copy"), second)
    before = first.read_bytes(), second.read_bytes()
    for args in (["report", str(second), "--html", str(first)],
                 ["report", str(first), "--html", str(first)]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, result.output
        assert len(result.output.strip().splitlines()) == 1
    assert (first.read_bytes(), second.read_bytes()) == before


def test_an_input_named_through_a_link_is_refused(tmp_path):
    capture = tmp_path / "page.html"       # a report under an innocent name
    shutil.copy(report("float4_copy"), capture)
    link = tmp_path / "alias.html"
    link.symlink_to(capture)
    from perfscope.render.html import check_output

    with pytest.raises(PerfscopeError, match="one of the inputs"):
        check_output(link, [capture])
