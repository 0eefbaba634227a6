"""The decompressed-report cache: keyed by content, capped in size, and left clean by an
interrupted decompression (issue 16, items 3 and 6)."""

from __future__ import annotations

import shutil

import pytest
from conftest import report

from perfscope import profile as profile_mod
from perfscope import reader
from perfscope.profile import load


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("PERFSCOPE_CACHE", str(root))
    return root / "reports"


def _entries(folder):
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def _size(folder):
    return sum(p.stat().st_size for p in folder.iterdir())


def test_interrupted_decompression_leaves_no_part_file(cache, monkeypatch):
    def interrupted(src, dst, length=0):
        dst.write(src.read(1 << 16))       # some bytes are out, then Ctrl-C
        raise KeyboardInterrupt

    monkeypatch.setattr(shutil, "copyfileobj", interrupted)
    with pytest.raises(KeyboardInterrupt):
        reader.decompressed(report("float4_copy"))
    assert _entries(cache) == []
    monkeypatch.undo()


def test_a_stale_part_file_is_swept_and_a_live_one_kept(cache):
    """A dead process's .part goes; one another perfscope is writing now stays."""
    import os
    import time

    cache.mkdir(parents=True)
    stale, live = cache / "tmpold.part", cache / "tmpnew.part"
    stale.write_bytes(b"x" * 1000)
    live.write_bytes(b"y" * 1000)
    old = time.time() - reader.STALE_PART_S - 60
    os.utime(stale, (old, old))
    reader.decompressed(report("float4_copy"))
    assert not stale.exists() and live.exists()


def test_same_content_under_two_paths_is_one_entry(cache, tmp_path):
    copy = tmp_path / "elsewhere" / "renamed.ncu-rep.xz"
    copy.parent.mkdir()
    shutil.copy(report("float4_copy"), copy)
    a, _ = reader.decompressed(report("float4_copy"))
    b, _ = reader.decompressed(copy)
    assert a == b
    assert _entries(cache) == [a.name]


def test_repeated_loads_stay_under_the_cap(cache, monkeypatch):
    fixtures = ["float4_copy", "strided_copy", "smem_transpose", "spill", "many_launches"]
    plain = {n: reader.decompressed(report(n))[0].stat().st_size for n in fixtures}
    shutil.rmtree(cache)
    # Room for the two largest, not for all five.
    cap = sorted(plain.values())[-1] + sorted(plain.values())[-2]
    monkeypatch.setenv(reader.CACHE_CAP_ENV, str(cap / 2**20))
    # Every load decompresses here: the process keeps no report it has read
    # (perfscope.profile keeps the last LOADED_MAX).
    monkeypatch.setattr(profile_mod, "LOADED_MAX", 0)
    monkeypatch.setattr(profile_mod, "_loaded", type(profile_mod._loaded)())
    for _ in range(3):
        for n in fixtures:
            profiles = load(report(n))
            assert profiles                   # the one just made is never evicted under it
            assert _size(cache) <= cap
    assert len(_entries(cache)) < len(fixtures)


def test_bad_cap_setting_falls_back_to_the_default(monkeypatch, caplog):
    monkeypatch.setenv(reader.CACHE_CAP_ENV, "lots")
    assert reader.cache_cap_bytes() == reader.DEFAULT_CACHE_MB * 2**20
    assert "not a number" in caplog.text


def test_a_page_names_an_install_reader_by_its_version(monkeypatch):
    """Without a wheel (the GPU machines) the reader is the install's copy, and a page or a
    profile names it by the version in its path, not as "not installed"."""
    import sys
    import types

    fake = types.ModuleType("ncu_report")
    fake.__file__ = "/opt/nvidia/nsight-compute/2025.3.1/extras/python/ncu_report.py"
    monkeypatch.setitem(sys.modules, "ncu_report", fake)
    monkeypatch.setattr(reader, "reader_version", lambda: None)
    assert reader.reader_label() == "2025.3.1 (Nsight Compute install)"
    fake.__file__ = "/somewhere/else/ncu_report.py"
    assert reader.reader_label() == "Nsight Compute install"
    monkeypatch.setattr(reader, "reader_version", lambda: "2025.3.1")
    assert reader.reader_label() == "2025.3.1"


def test_a_copy_evicted_before_it_is_read_is_decompressed_again(cache, monkeypatch):
    """Another process's eviction may delete the shared copy between decompressed()
    handing it over and its reading: the report is decompressed again, once."""
    real = reader.decompressed
    calls = []

    def evicted_first(path):
        plain, private = real(path)
        calls.append(plain)
        if len(calls) == 1:
            plain.unlink()                  # evicted by another process just now
        return plain, private

    monkeypatch.setattr(reader, "decompressed", evicted_first)
    handle, warning = reader.open_report(report("float4_copy"))
    assert len(calls) == 2 and warning is None
    assert list(handle.actions())
