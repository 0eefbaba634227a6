"""Reading many reports in worker processes: the profiles that come back judge alike with
no report behind them, and the caller's loop still owns every refusal."""

from __future__ import annotations

import dataclasses
import os
import pickle
import shutil
import subprocess
import sys
from collections import OrderedDict
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import pytest
from typer.testing import CliRunner

from perfscope import cli as cli_mod
from perfscope import loadpool
from perfscope import profile as profile_mod
from perfscope.cli import app
from perfscope.diagnosis import default_catalogue, diagnose, diagnose_profiles
from perfscope.errors import PerfscopeError
from perfscope.profile import load
from perfscope.rules import read_metrics
from perfscope.source import source_view

REF = Path(__file__).resolve().parent.parent / "reports" / "reference" / "h200"
# A kernel of each kind: FFMA, mma.sync, wgmma with roles, cuBLAS's nvjet.
SOME = ("sgemm_stages4-fp32-4096x4096x4096", "hgemm_ring-bf16-4096x4096x4096",
        "hgemm_tma_wgmma_balanced-fp16-4096x4096x4096", "cublas_bgemm-bf16-4096x4096x4096")


def _detached(profiles):
    # As a worker sends them: detached, pickled and read back.
    return pickle.loads(pickle.dumps([kp.detached(read_metrics()) for kp in profiles]))


def _no_report(where):
    raise AssertionError(f"reopened {where.source}: a metric the rules read was not sent along")


def test_workers_for():
    assert loadpool.workers_for(100, env={}) == 0               # a library call: not by itself
    assert loadpool.workers_for(100, env={loadpool.WORKERS_ENV: "0"}) == 0
    assert loadpool.workers_for(100, env={loadpool.WORKERS_ENV: "1"}) == 0
    assert loadpool.workers_for(100, env={loadpool.WORKERS_ENV: "3"}) == 3
    assert 0 < loadpool.workers_for(100, env={loadpool.WORKERS_ENV: "auto"}) <= loadpool.WORKERS_MAX \
        or (os.cpu_count() or 1) < 2
    assert loadpool.workers_for(loadpool.POOL_MIN_FILES - 1, env={loadpool.WORKERS_ENV: "4"}) == 0
    assert loadpool.workers_for(loadpool.POOL_MIN_FILES, env={loadpool.WORKERS_ENV: "64"}) == \
        loadpool.POOL_MIN_FILES
    with pytest.raises(PerfscopeError, match="is neither a whole number of workers nor 'auto'"):
        loadpool.workers_for(100, env={loadpool.WORKERS_ENV: "two"})


def test_main_importable():
    class Main:
        __spec__ = None
    stdin, script, named, interactive = Main(), Main(), Main(), Main()
    stdin.__file__ = "<stdin>"
    script.__file__ = __file__
    named.__spec__ = type("Spec", (), {"name": "perfscope.cli"})()
    assert not loadpool.main_importable(stdin)
    assert loadpool.main_importable(script)
    assert loadpool.main_importable(named)
    assert loadpool.main_importable(interactive)     # `python -c`, a notebook: no file to import


def test_a_program_read_from_stdin_reads_its_reports_here():
    # spawn would make each worker import "<stdin>" and die before its first report.
    program = (f"import logging; logging.basicConfig()\n"
               f"from pathlib import Path\nfrom perfscope.loadpool import prefetch\n"
               f"paths = sorted(Path({str(REF)!r}).glob('*.ncu-rep.xz'))[:{loadpool.POOL_MIN_FILES}]\n"
               f"print('read in workers:', prefetch(paths))\n")
    env = {**os.environ, loadpool.WORKERS_ENV: "2"}
    done = subprocess.run([sys.executable, "-"], input=program, capture_output=True, text=True,
                          env=env, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "read in workers: 0" in done.stdout
    assert "worker" not in done.stderr


def test_the_command_asks_for_workers_and_a_library_call_does_not(monkeypatch):
    # A worker imports the calling program as its main module: perfscope's own entry point
    # is guarded and says so; a script is not known to be.
    monkeypatch.delenv(loadpool.WORKERS_ENV, raising=False)
    seen = []
    monkeypatch.setattr(cli_mod, "app", lambda args, obj: seen.append(os.environ.get(loadpool.WORKERS_ENV)))
    cli_mod.main(["diagnose", "x.ncu-rep"])
    assert seen == ["auto"]
    monkeypatch.setenv(loadpool.WORKERS_ENV, "0")       # the user's own choice stands
    cli_mod.main(["diagnose", "x.ncu-rep"])
    assert seen == ["auto", "0"]


def test_every_reference_kernel_is_judged_alike_without_its_report(monkeypatch):
    # A profile read in a worker arrives with the metrics the views and rules read by name
    # (rules.read_metrics); every verdict on the reference folder must come from
    # those alone, and equal the verdict on the profile read here.
    catalogue = default_catalogue()
    judged = []
    for path in sorted(REF.glob("*.ncu-rep.xz")):
        profiles = load(path)
        judged.append((path, diagnose_profiles(path, profiles, catalogue), _detached(profiles)))
    monkeypatch.setattr(profile_mod, "_reattached", _no_report)
    for path, here, detached in judged:
        there = diagnose_profiles(path, detached, catalogue)
        assert [r.evaluation for r in there] == [r.evaluation for r in here], path.name
        assert detached == [r.profile for r in here]      # every view (metrics aside) alike


def test_a_page_s_source_view_read_in_the_worker_needs_no_report(monkeypatch):
    path = REF / f"{SOME[1]}.ncu-rep.xz"
    (kp,) = load(path)
    want = source_view(kp)
    kp.correlation.record()
    assert source_view(kp) == want
    (far,) = pickle.loads(pickle.dumps([kp.detached(read_metrics())]))
    kp.correlation._recording = None
    monkeypatch.setattr(profile_mod, "_reattached", _no_report)
    assert source_view(far) == want


def test_a_detached_profile_reopens_its_report_for_a_page():
    path = REF / f"{SOME[1]}.ncu-rep.xz"
    (kp,) = load(path)
    (far,) = _detached([kp])
    assert source_view(far) == source_view(kp)
    assert far.metrics.get("launch__grid_size") == kp.metrics.get("launch__grid_size")
    # Any metric, by reopening the report (repr: some derived metrics are NaN).
    assert repr(sorted(far.metrics.items())) == repr(sorted(kp.metrics.items()))


def test_prefetch_reads_in_workers_and_leaves_refusals_to_the_caller(tmp_path, monkeypatch):
    for name in SOME:
        shutil.copy(REF / f"{name}.ncu-rep.xz", tmp_path / f"{name}.ncu-rep.xz")
    (tmp_path / "broken.ncu-rep").write_bytes(b"not a report")
    monkeypatch.setattr(loadpool, "POOL_MIN_FILES", 2)
    monkeypatch.setattr(loadpool, "BATCH", 2)       # three batches over two workers
    monkeypatch.setenv(loadpool.WORKERS_ENV, "2")
    files = sorted(tmp_path.iterdir())
    assert loadpool.prefetch(files, pages=True) == len(SOME)
    for name in SOME:
        (kp,) = load(tmp_path / f"{name}.ncu-rep.xz")
        assert kp.correlation._live is None           # read in a worker, not here
        (ref,) = load(REF / f"{name}.ncu-rep.xz")
        assert dataclasses.replace(kp, identity=ref.identity) == ref
        # The page's source lines came along: the same as read here, with no report opened.
        (here,) = profile_mod._read(tmp_path / f"{name}.ncu-rep.xz", None)
        with monkeypatch.context() as m:
            m.setattr(profile_mod, "_reattached", _no_report)
            assert source_view(kp) == source_view(here)
    # Already held: nothing is read twice.
    assert loadpool.prefetch(files) == 0
    # The folder as the CLI reads it: the broken file refused by the caller, in one sentence.
    with pytest.raises(PerfscopeError, match=r"broken\.ncu-rep is not an Nsight Compute report"):
        diagnose([tmp_path])


def test_a_folder_larger_than_load_s_memory_is_read_once(tmp_path, monkeypatch):
    # Reports read in workers wait for their turn: none is forgotten and read again here.
    for name in SOME[:2]:
        shutil.copy(REF / f"{name}.ncu-rep.xz", tmp_path / f"{name}.ncu-rep.xz")
    monkeypatch.setattr(loadpool, "POOL_MIN_FILES", 2)
    monkeypatch.setattr(profile_mod, "LOADED_MAX", 1)
    monkeypatch.setattr(profile_mod, "_loaded", OrderedDict())
    monkeypatch.setenv(loadpool.WORKERS_ENV, "2")
    profiles = loadpool.load_many([tmp_path])
    assert len(profiles) == 2
    assert all(kp.correlation._live is None for kp in profiles)    # none read here


class _DyingPool:
    """A one-worker pool whose worker dies on its batch (the reader crashing)."""

    def __init__(self, *args, **kwargs) -> None:
        self.shut = False

    def submit(self, fn, *args):
        fut = Future()
        fut.set_exception(BrokenProcessPool("the worker died"))
        return fut

    def shutdown(self, wait=True, cancel_futures=False) -> None:
        self.shut = True


def test_a_dead_worker_leaves_its_reports_to_this_process(tmp_path, monkeypatch, caplog):
    for name in SOME[:2]:
        shutil.copy(REF / f"{name}.ncu-rep.xz", tmp_path / f"{name}.ncu-rep.xz")
    monkeypatch.setattr(loadpool, "POOL_MIN_FILES", 2)
    monkeypatch.setattr(loadpool, "ProcessPoolExecutor", _DyingPool)
    monkeypatch.setenv(loadpool.WORKERS_ENV, "2")
    files = sorted(tmp_path.iterdir())
    assert loadpool.prefetch(files) == 0
    assert "a worker stopped while reading" in caplog.text
    # The caller's loop reads them here.
    assert [kp.name for kp in loadpool.load_many([tmp_path])] == \
        [load(REF / f.name)[0].name for f in files]


def test_a_report_read_in_workers_is_the_report_read_here(tmp_path, monkeypatch):
    # Everything a page shows (views, metrics by name, source lines) comes back from the
    # workers: the same page and PR comment, with no report opened again.
    for name in SOME:
        shutil.copy(REF / f"{name}.ncu-rep.xz", tmp_path / f"{name}.ncu-rep.xz")
    monkeypatch.setattr(loadpool, "POOL_MIN_FILES", 2)
    monkeypatch.setattr(profile_mod, "_loaded", OrderedDict())   # this test's own memory
    pages = {}
    for workers in ("0", "2"):
        monkeypatch.setenv(loadpool.WORKERS_ENV, workers)
        with monkeypatch.context() as m:
            if workers != "0":
                m.setattr(profile_mod, "_reattached", _no_report)
            out = tmp_path / "page.html"
            result = CliRunner().invoke(app, ["report", str(tmp_path), "--html", str(out), "--markdown"])
            assert result.exit_code == 0, result.output
            pages[workers] = (out.read_text(), result.stdout)
        profile_mod._loaded.clear()       # the second run reads the files again
    assert pages["2"] == pages["0"]
