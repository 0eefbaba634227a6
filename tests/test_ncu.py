"""perfscope.ncu: the argv builder, locating ncu, progress parsing, failure mapping."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from perfscope import ncu
from perfscope.collection import EXTRA_METRICS, SECTIONS
from perfscope.errors import PerfscopeError
from perfscope.metrics import VIEW_METRICS

FAKE = Path(__file__).parent / "fakes" / "fake_ncu.py"


def make_fake(tmp_path: Path, scenario: str = "ok") -> tuple[str, Path]:
    """An executable 'ncu' that runs fake_ncu.py with the scenario baked in."""
    log = tmp_path / "ncu-argv.log"
    exe = tmp_path / "bin" / "ncu"
    exe.parent.mkdir(exist_ok=True)
    exe.write_text(f"#!/bin/sh\nFAKE_NCU_SCENARIO={scenario} FAKE_NCU_LOG={log} "
                   f"exec {sys.executable} {FAKE} \"$@\"\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return str(exe), log


def test_default_argv_is_exact():
    opts = ncu.NcuOptions(output=Path("out/x.ncu-rep"))
    argv = ncu.build_argv("ncu", opts, ["python", "prog.py"])
    expected = ["ncu", "--target-processes", "all", "--replay-mode", "kernel",
                "--cache-control", "all", "--clock-control", "none"]
    for s in SECTIONS:
        expected += ["--section", s]
    expected += ["--metrics", ",".join(EXTRA_METRICS), "--import-source", "yes",
                 "--force-overwrite", "--export", "out/x.ncu-rep", "python", "prog.py"]
    assert argv == expected


def test_filtered_argv_is_exact():
    opts = ncu.NcuOptions(output=Path("r"), full_set=True, metrics=("a.sum",),
                          nvtx_include=("s1/", "s2/"), kernel_regex="gemm", launch_skip=2,
                          launch_count=3, replay_mode="application", cache_control="none",
                          clock_control="base", import_source=False, extra=("--verbose",))
    assert ncu.build_argv("/x/ncu", opts, ["./app"]) == [
        "/x/ncu", "--target-processes", "all", "--replay-mode", "application",
        "--cache-control", "none", "--clock-control", "base", "--set", "full",
        "--metrics", "a.sum", "--nvtx", "--nvtx-include", "s1/", "--nvtx-include", "s2/",
        "--kernel-name", "regex:gemm", "--launch-skip", "2", "--launch-count", "3",
        "--force-overwrite", "--export", "r", "--verbose", "./app"]


def test_clock_control_defaults_to_none():
    assert ncu.NcuOptions(output=Path("r")).clock_control == "none"


@pytest.mark.parametrize("kwargs", [{"clock_control": "lock"}, {"replay_mode": "x"},
                                    {"launch_count": 0}, {"launch_skip": -1}])
def test_bad_options_are_refused(kwargs):
    with pytest.raises(PerfscopeError):
        ncu.NcuOptions(output=Path("r"), **kwargs)


def test_collection_set_covers_the_views():
    assert set(VIEW_METRICS) <= set(EXTRA_METRICS)


def test_find_ncu_order(tmp_path, monkeypatch):
    exe, _ = make_fake(tmp_path)
    assert ncu.find_ncu({"PERFSCOPE_NCU": exe, "PATH": ""}) == exe
    assert ncu.find_ncu({"PATH": str(Path(exe).parent)}) == exe
    cuda = tmp_path / "cuda"
    (cuda / "bin").mkdir(parents=True)
    os.symlink(exe, cuda / "bin" / "ncu")
    monkeypatch.setattr(ncu.glob, "glob", lambda pattern: [])
    assert ncu.find_ncu({"PATH": "", "CUDA_HOME": str(cuda)}) == str(cuda / "bin" / "ncu")


def test_ncu_not_found_says_how_to_set_it(monkeypatch):
    monkeypatch.setattr(ncu.glob, "glob", lambda pattern: [])
    with pytest.raises(PerfscopeError, match="set PERFSCOPE_NCU"):
        ncu.find_ncu({"PATH": ""})
    with pytest.raises(PerfscopeError, match="not an executable"):
        ncu.find_ncu({"PERFSCOPE_NCU": "/nonexistent/ncu"})


def test_version_is_read_and_checked(tmp_path):
    exe, _ = make_fake(tmp_path)
    assert ncu.ncu_version(exe) == (2025, 3, 1)
    assert ncu.parse_version("Version 2022.4.0.0") == (2022, 4, 0)
    assert ncu.parse_version("nothing here") is None


def test_progress_parser_follows_passes_across_chunks():
    text = ('==PROF== Connected to process 7\n==PROF== Profiling "k_a": 0%....50%....100% '
            '- 38 passes\n==PROF== Profiling "k_b" - 1: 0%..')
    parser = ncu.ProgressParser()
    events = [e for i in range(0, len(text), 5) for e in parser.feed(text[i:i + 5])]
    done = [e for e in events if e.done]
    assert [(e.kernel, e.passes) for e in done] == [("k_a", 38)]
    a = [e.percent for e in events if e.kernel == "k_a"]
    assert a == sorted(a) and a[-1] == 100
    assert events[-1].kernel == "k_b" and not events[-1].done


@pytest.mark.parametrize(("output", "rc", "fragment"), [
    ("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission", 1, "administrator"),
    ("==WARNING== No kernels were profiled.", 0, "nothing matched"),
    ("==ERROR== The application returned an error code (1).\nillegal memory access", 1, "crashed"),
    ("==ERROR== The application returned an error code (3).", 3, "exit code 3"),
    ("==ERROR== Failed to find metric foo", 1, "Failed to find metric foo"),
])
def test_failures_become_one_sentence(output, rc, fragment):
    err = ncu.classify_failure(rc, output, report_written=False)
    assert err is not None and fragment in str(err)
    assert "\n" not in str(err)


def test_success_needs_a_report():
    assert ncu.classify_failure(0, "==PROF== Report: x", report_written=True) is None
    assert "no report" in str(ncu.classify_failure(0, "", report_written=False))


def test_progress_survives_the_programs_output_inside_the_line():
    text = ('==PROF== Profiling "k_a": 0%....50%..perfscope-runner: k_a ok\n..100% - 34 passes\n'
            '==PROF== Profiling "k_w": 0%\n==WARNING== Backing up device memory.\n....50%....100%'
            ' - 38 passes\n==PROF== Profiling "k_b": 0%....50%\n==ERROR== k_b failed\n')
    events = ncu.ProgressParser().feed(text)
    done = [(e.kernel, e.passes) for e in events if e.done]
    assert done == [("k_a", 34), ("k_w", 38), ("k_b", None)]


def test_profiled_kernels_names_the_one_that_did_not_finish():
    out = ('==PROF== Profiling "good": 0%....50%....100% - 38 passes\n'
           '==PROF== Profiling "bad" - 1: 0%....50%.\n'
           "==ERROR== An error was reported by the driver: CUDA_ERROR_ILLEGAL_ADDRESS\n")
    assert ncu.profiled_kernels(out) == [("good", 38), ("bad", None)]
    assert ncu.profiled_kernels('==PROF== Profiling "open": 0%..') == [("open", None)]
    assert ncu.profiled_kernels("no kernels here") == []


def test_interrupt_stops_ncu_and_hands_back_what_it_wrote(tmp_path, monkeypatch):
    exe, _ = make_fake(tmp_path, "interrupt")
    monkeypatch.setattr(ncu, "STOP_SELF_S", 0.1)
    monkeypatch.setenv("FAKE_NCU_REPORT", str(Path(__file__).parent / "fixtures" / "h200" / "README.md"))

    def ctrl_c(event):
        if event.done:
            raise KeyboardInterrupt

    opts = ncu.NcuOptions(output=tmp_path / "r.ncu-rep")
    with pytest.raises(ncu.NcuInterrupted) as stop:
        ncu.execute(exe, opts, ["./app"], on_progress=ctrl_c)
    kept = stop.value.run.report
    assert kept == tmp_path / "r.interrupted.ncu-rep" and kept.exists()
    assert not (tmp_path / "r.ncu-rep").exists() and not (tmp_path / "r.part.ncu-rep").exists()
    assert "Received signal" in stop.value.run.output


def test_pathfinder_is_the_last_place_ncu_is_looked_for(tmp_path, monkeypatch):
    exe, _ = make_fake(tmp_path)
    monkeypatch.setattr(ncu.glob, "glob", lambda pattern: [])
    monkeypatch.setattr(ncu, "_pathfinder_ncu", lambda: exe)
    assert ncu.find_ncu({"PATH": ""}) == exe
