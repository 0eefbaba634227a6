"""The tune coordinator end to end on fake workers: store, pruning, WRONG, resume, crash."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
from fakes.tune_fakes import FakeExecutor, fake_timing

from perfscope.errors import PerfscopeError
from perfscope.kernels import parse_shape
from perfscope.manifest import OK, WRONG
from perfscope.render import tune as render_tune
from perfscope.tune import workflow
from perfscope.tune.store import Store
from perfscope.tune.worker import synthetic_ratio

STAGE = "hgemm_tma_wgmma_persistent"
SHAPES = (parse_shape("4096x4096x4096"), parse_shape("1024x8192x8192"))
# With BOXES held at the whole tile and no stream-K: 35 of the 50 configurations left (see test_tune_space).
PINS = {"BOXES": 4, "STREAMK": 0, "DEFER": 0}
LEGAL = 35
TESTS = Path(__file__).parent


def request(store: Path, **kw) -> workflow.TuneRequest:
    base = {"stages": (STAGE,), "shapes": SHAPES, "dtypes": ("bf16",), "store": store,
            "pins": PINS}
    return workflow.TuneRequest(**{**base, **kw})


def counts(path: Path) -> dict[str, int]:
    db = sqlite3.connect(path)
    try:
        out = {t: db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
               for t in ("configs", "trials", "timings")}
        out["distinct"] = db.execute(
            "SELECT COUNT(*) FROM (SELECT DISTINCT stage, params, m, n, k, dtype, gpu, driver, "
            "toolchain, source FROM trials)").fetchone()[0]
        return out
    finally:
        db.close()


def test_exhaustive_sweep_measures_every_legal_configuration_per_shape(tmp_path):
    store = tmp_path / "tune.sqlite"
    ex = FakeExecutor(gpus=2)
    doc = workflow.run(request(store), ex)
    assert ex.closed
    assert len(ex.compiled) == LEGAL            # compiled once, for both shapes
    assert len(ex.submitted) == 2 * LEGAL
    assert counts(store) == {"configs": 50, "trials": 70, "timings": 70, "distinct": 70}
    assert [r.shape for r in doc.results] == ["4096x4096x4096", "1024x8192x8192"]
    for r in doc.results:
        assert len(r.timed) == LEGAL and len(r.pruned) == 15
        assert r.best is not None and r.best.label == "default"   # the synthetic optimum
        ratios = [t.ratio.median for t in r.timed]
        assert ratios == sorted(ratios, reverse=True)
    assert doc.stats.trials_run == 70 and doc.stats.compiled == LEGAL
    assert doc.stats.compile_serial_s == pytest.approx(0.25 * LEGAL)
    assert dict(doc.environment)["gpu"] == "FAKE H200"


def test_a_wrong_configuration_is_recorded_and_never_timed(tmp_path):
    store = tmp_path / "tune.sqlite"
    doc = workflow.run(request(store, shapes=SHAPES[:1]), FakeExecutor(wrong=[{"STAGES": 2}],
                                                                       fail=[{"STAGES": 5}]))
    r = doc.results[0]
    wrong = [t for t in r.trials if t.verdict == WRONG]
    assert len(wrong) == 10 and all(t.ratio is None and t.tflops is None for t in wrong)
    assert r.count("error") == 5
    assert r.best.verdict == OK
    with Store.open(store) as s:
        rows = s.trials(STAGE, "bf16", SHAPES[0])
    assert all(not r.timings for r in rows if r.verdict != OK)
    assert counts(store)["timings"] == LEGAL - 15


def test_configurations_ptxas_prunes_never_reach_a_gpu(tmp_path):
    ex = FakeExecutor(spill=[{"BN": 128, "STAGES": 6}])
    doc = workflow.run(request(tmp_path / "t.sqlite", shapes=SHAPES[:1]), ex)
    assert not [t for t in ex.submitted if t.params["BN"] == 128 and t.params["STAGES"] == 6]
    assert doc.stats.pruned_compiled == 5
    assert any("spills" in why for _, why in doc.results[0].pruned)


def test_keep_spills_measures_what_ptxas_spills_and_says_so(tmp_path):
    """--keep-spills: the configurations ptxas spills are timed like the rest, each trial
    carries its spill; without it they are pruned and a note says how many and what
    would measure them. A resumed run with the flag measures just those, judged again from
    the ptxas report the store kept, and compiles only them (for their cubins)."""
    spill = [{"BN": 128, "STAGES": 6}]
    store = tmp_path / "t.sqlite"
    plain = workflow.run(request(store, shapes=SHAPES[:1]), FakeExecutor(spill=spill))
    assert len(plain.results[0].timed) == LEGAL - 5
    assert any("5 configuration(s) pruned because ptxas spills" in n and "--keep-spills" in n
               for n in plain.notes)
    again = FakeExecutor(spill=spill)
    doc = workflow.run(request(store, shapes=SHAPES[:1], resume=True, keep_spills=True), again)
    assert sorted(str(j.config.params) for j in again.compiled) == sorted(
        str(t.params) for t in again.submitted)
    assert sorted(t.params["GROUP"] for t in again.submitted) == [1, 2, 4, 8, 16]
    assert all(t.params["STAGES"] == 6 and t.params["BN"] == 128 for t in again.submitted)
    (r,) = doc.results
    assert len(r.timed) == LEGAL and len(r.pruned) == 15 and not doc.notes   # static prunes only
    spilled = [t for t in r.timed if t.spill_bytes]
    assert len(spilled) == 5 and all(t.spill_bytes == 64 for t in spilled)
    fresh = workflow.run(request(tmp_path / "f.sqlite", shapes=SHAPES[:1], keep_spills=True),
                         FakeExecutor(spill=[{}]))
    best = fresh.results[0].best
    assert best.spill_bytes == 64
    assert render_tune.result_row(fresh.results[0])[3] == best.config + " (spills 64 B)"


def test_every_configuration_pruned_after_compiling_is_refused(tmp_path):
    store = tmp_path / "t.sqlite"
    with pytest.raises(PerfscopeError, match=r"no configuration of .* is left after pruning: all 35 .*"
                                             "spills"):
        workflow.run(request(store), FakeExecutor(spill=[{}]))
    assert counts(store)["configs"] == 50          # what was learnt is kept


def test_a_second_run_is_refused_without_resume_and_repeats_nothing_with_it(tmp_path):
    store = tmp_path / "tune.sqlite"
    first = workflow.run(request(store), FakeExecutor())
    before = counts(store)
    with pytest.raises(PerfscopeError, match=r"already holds 70 result.*--resume"):
        workflow.run(request(store), FakeExecutor())
    assert counts(store) == before
    again = FakeExecutor()
    doc = workflow.run(request(store, resume=True), again)
    assert again.submitted == [] and again.compiled == []
    assert doc.stats.trials_resumed == 70
    assert [r.best.config for r in doc.results] == [r.best.config for r in first.results]
    assert counts(store) == before


def test_resume_after_an_interruption_measures_only_the_rest(tmp_path):
    store = tmp_path / "tune.sqlite"
    with pytest.raises(KeyboardInterrupt):
        workflow.run(request(store), FakeExecutor(interrupt_after=24))
    assert counts(store)["trials"] == 24
    rest = FakeExecutor()
    workflow.run(request(store, resume=True), rest)
    assert len(rest.submitted) == 70 - 24
    # What is left to time is compiled again (its cubin may not be in this host's cache);
    # what every shape already holds is not.
    compiled = {str(j.config.params) for j in rest.compiled}
    assert {str(t.params) for t in rest.submitted} == compiled
    assert counts(store) == {"configs": 50, "trials": 70, "timings": 70, "distinct": 70}


def test_a_resumed_confirmation_compiles_what_it_times_again(tmp_path):
    """Screened in one run, confirmed in a resumed one (on another host, say): the
    configurations it times again are compiled for their cubins, and nothing else."""
    store = tmp_path / "tune.sqlite"
    workflow.run(request(store, shapes=SHAPES[:1]), FakeExecutor())
    later = FakeExecutor()
    workflow.run(request(store, shapes=SHAPES[:1], confirm=2, resume=True), later)
    # The best 2, the default (the synthetic optimum) among them.
    assert len(later.submitted) == 2 and {t.phase for t in later.submitted} == {"confirm"}
    assert sorted(str(j.config.params) for j in later.compiled) == sorted(
        str(t.params) for t in later.submitted)


def test_resume_after_a_crash_mid_sweep(tmp_path):
    """The coordinator dies without cleanup (os._exit) after 30 results: the store opens,
    holds those 30, and a resumed run measures exactly the other 40."""
    store = tmp_path / "tune.sqlite"
    script = textwrap.dedent(f"""
        from pathlib import Path
        from fakes.tune_fakes import FakeExecutor, fake_timing
        from perfscope.kernels import parse_shape
        from perfscope.tune import workflow
        shapes = tuple(parse_shape(s) for s in {[str(s) for s in SHAPES]!r})
        req = workflow.TuneRequest(stages=({STAGE!r},), shapes=shapes, dtypes=("bf16",),
                                   store=Path({str(store)!r}), pins={PINS!r})
        workflow.run(req, FakeExecutor(crash_after=30))
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert proc.returncode == 9, proc.stderr
    assert counts(store)["trials"] == 30
    rest = FakeExecutor()
    doc = workflow.run(request(store, resume=True), rest)
    assert len(rest.submitted) == 40
    assert doc.stats.trials_resumed == 30
    assert counts(store) == {"configs": 50, "trials": 70, "timings": 70, "distinct": 70}


def test_confirm_times_the_best_again_and_the_table_shows_it(tmp_path):
    store = tmp_path / "t.sqlite"
    ex = FakeExecutor()
    doc = workflow.run(request(store, shapes=SHAPES[:1], confirm=3), ex)
    confirms = [t for t in ex.submitted if t.phase == "confirm"]
    assert len(confirms) == 3 and all(not t.verify and t.runs == 20 and t.rounds == 5 for t in confirms)
    assert doc.results[0].best.phase == "confirm"
    assert doc.stats.confirmed == 3
    # Resumed, the confirmations are not repeated either.
    again = FakeExecutor()
    workflow.run(request(store, shapes=SHAPES[:1], confirm=3, resume=True), again)
    assert again.submitted == []


class _ShrinkingConfirmations(FakeExecutor):
    """The longer confirmation measures each of the best screens 10% slower, below the
    configurations that were screened only (the luckiest short screens win the screening)."""

    def outcome(self, task):
        out = super().outcome(task)
        if task.phase != "confirm" or out.timing is None:
            return out
        return replace(out, timing=fake_timing(task, 0.9 * synthetic_ratio(task.stage, task.params,
                                                                           task.shape)))


def test_the_document_and_config_best_name_the_same_configuration(tmp_path):
    """A confirmation outranks a screening (perfscope.tune.store.rank) in the document's order
    as in Store.best, so the table's best is the one `--config best` runs, even where a
    configuration screened only has the higher ratio."""
    store = tmp_path / "t.sqlite"
    doc = workflow.run(request(store, shapes=SHAPES[:1], confirm=2), _ShrinkingConfirmations())
    (result,) = doc.results
    screened = [t for t in result.timed if t.phase != "confirm"]
    assert max(t.ratio.median for t in screened) > result.best.ratio.median   # the trap is set
    assert result.best.phase == "confirm"
    with Store.open(store) as s:
        best = s.best(result.stage, result.dtype, SHAPES[0])
    assert best.phase == "confirm" and best.ratio == pytest.approx(result.best.ratio.median)
    assert [t.phase for t in result.timed[:2]] == ["confirm", "confirm"]


def test_a_deadline_stops_the_search_and_resume_finishes_it(tmp_path):
    store = tmp_path / "t.sqlite"
    doc = workflow.run(request(store, deadline_s=0.0), FakeExecutor())
    assert doc.stats.stopped and "--resume" in doc.notes[-1]
    assert counts(store)["trials"] < 70
    workflow.run(request(store, resume=True), FakeExecutor())
    assert counts(store)["trials"] == 70


def test_bayes_measures_its_budget_per_shape(tmp_path):
    pytest.importorskip("optuna")
    ex = FakeExecutor(gpus=2)
    doc = workflow.run(request(tmp_path / "t.sqlite", strategy="bayes", budget=8), ex)
    assert [len(r.timed) for r in doc.results] == [8, 8]
    assert all(r.strategy == "bayes" and r.default is not None for r in doc.results)
    # Only what was proposed is compiled.
    assert len(ex.compiled) < LEGAL


def test_random_search_compiles_its_draws_in_one_batch_ahead_of_the_search(tmp_path):
    """Random's draws are known before it proposes them: one parallel batch compiles them
    all, where a batch per step had compiled one or two configurations at a time."""
    serial = FakeExecutor()
    workflow.run(request(tmp_path / "a.sqlite", strategy="random", budget=8), serial)
    ahead = FakeExecutor(processes=16)
    doc = workflow.run(request(tmp_path / "b.sqlite", strategy="random", budget=8), ahead)
    assert [len(r.timed) for r in doc.results] == [8, 8]
    assert len(ahead.batches) == 1                       # nothing compiled during the search
    first = [dict(j.config.params) for j in ahead.batches[0]]
    assert all(t.params in first for t in ahead.submitted)
    assert len({str(t.params) for t in ahead.submitted}) == len(first) <= 16   # shared draws once
    # Compiling ahead changes what is compiled when, not what is measured.
    assert [(t.m, t.params) for t in ahead.submitted] == [(t.m, t.params) for t in serial.submitted]


def test_a_step_that_must_compile_fills_its_batch_with_likely_proposals(tmp_path):
    """A random study whose draws ptxas prunes asks for replacements mid-search; that
    step's batch is filled up to the compiler processes with what comes next."""
    ex = FakeExecutor(processes=4, spill=[{"STAGES": 2}, {"STAGES": 3}])
    doc = workflow.run(request(tmp_path / "t.sqlite", shapes=SHAPES[:1], strategy="random",
                               budget=8), ex)
    assert [len(r.timed) for r in doc.results] == [8]
    assert len(ex.batches) > 1
    assert all(len(b) >= 4 for b in ex.batches[1:-1])


def test_bayes_guesses_ahead_only_on_spare_compiler_processes(tmp_path):
    pytest.importorskip("optuna")
    one = FakeExecutor()
    workflow.run(request(tmp_path / "a.sqlite", shapes=SHAPES[:1], strategy="bayes", budget=8), one)
    # One process: nothing compiled that was not measured (the default, guessed first, is).
    assert sorted(str(j.config.params) for j in one.compiled) == sorted(str(t.params)
                                                                       for t in one.submitted)
    four = FakeExecutor(processes=4)
    doc = workflow.run(request(tmp_path / "b.sqlite", shapes=SHAPES[:1], strategy="bayes",
                               budget=8), four)
    assert [len(r.timed) for r in doc.results] == [8]
    # Four processes: every step that compiles uses all four (TPE may propose elsewhere).
    assert len(four.batches[0]) == 4 and all(len(b) >= 4 for b in four.batches[:-1])


def test_workers_on_different_gpus_are_refused(tmp_path):
    with pytest.raises(PerfscopeError, match="different GPUs"):
        workflow.run(request(tmp_path / "t.sqlite"),
                     FakeExecutor(gpus=2, gpu_names=["NVIDIA H200", "NVIDIA H100 80GB HBM3"]))


def test_another_gpu_is_another_key(tmp_path):
    store = tmp_path / "t.sqlite"
    workflow.run(request(store, shapes=SHAPES[:1]), FakeExecutor())
    other = FakeExecutor(gpu_names=["NVIDIA H100"])
    workflow.run(request(store, shapes=SHAPES[:1]), other)   # no refusal: nothing of it is held
    assert len(other.submitted) == LEGAL
    assert counts(store)["trials"] == 2 * LEGAL


def test_shapes_file(tmp_path):
    f = tmp_path / "shapes.txt"
    f.write_text("# the issue's shapes\n4096x4096x4096\n\n 8192x2048x8192  # tall\n4096x4096x4096\n")
    assert [str(s) for s in workflow.read_shapes(f)] == ["4096x4096x4096", "8192x2048x8192"]
    f.write_text("4096x4096x4096\n4096x4096\n")
    with pytest.raises(PerfscopeError, match=r"shapes.txt line 2: shape '4096x4096' is not of the form"):
        workflow.read_shapes(f)


@pytest.mark.slow
def test_profile_best_diffs_best_against_worst_through_ncu(tmp_path, monkeypatch):
    """--profile-best 1 with a fake ncu whose reports are the committed persistent-stage
    capture: one ncu run over the best and the worst configuration, diffed in the child
    process, the verdict stored and shown; a resumed run profiles nothing again."""
    import lzma
    import shutil

    from test_ncu import make_fake

    from perfscope.locations import reference_root

    plain = tmp_path / "persistent.ncu-rep"
    src = reference_root() / "h200" / "hgemm_tma_wgmma_persistent-bf16-4096x4096x4096.ncu-rep.xz"
    with lzma.open(src) as f, open(plain, "wb") as out:
        shutil.copyfileobj(f, out)
    exe, log = make_fake(tmp_path)
    monkeypatch.setenv("PERFSCOPE_NCU", exe)
    monkeypatch.setenv("FAKE_NCU_REPORT", str(plain))
    store = tmp_path / "t.sqlite"
    req = request(store, shapes=SHAPES[:1], profile_best=1, profile_out=tmp_path / "profiles")
    doc = workflow.run(req, FakeExecutor())
    assert not doc.notes, doc.notes
    d = doc.results[0].diff
    assert d is not None and not d.error
    assert d.best == "default" and d.worst == doc.results[0].worst.label
    assert d.verdict and d.best_report.endswith(".ncu-rep")
    assert (tmp_path / "profiles" / Path(d.best_report).name).is_file()
    runs = [line for line in log.read_text().splitlines() if "perfscope.runner" in line]
    assert len(runs) == 1                      # both configurations in one ncu process
    workflow.run(workflow.TuneRequest(**{**req.__dict__, "resume": True}), FakeExecutor())
    assert len([line for line in log.read_text().splitlines() if "perfscope.runner" in line]) == 1


def test_a_large_space_is_searched_not_enumerated_by_default(tmp_path):
    pytest.importorskip("optuna")
    big = workflow.plan_tune(workflow.TuneRequest(stages=("sgemm_pipe",), shapes=SHAPES[:1],
                                                  store=tmp_path / "t.sqlite"))
    sp = big.stages[0]
    assert len(sp.legal) > 64 and sp.strategy == "bayes" and sp.budget == 64
    small = workflow.plan_tune(request(tmp_path / "t.sqlite"))
    assert small.stages[0].strategy == "exhaustive" and small.stages[0].budget is None
    asked = workflow.plan_tune(workflow.TuneRequest(stages=("sgemm_pipe",), shapes=SHAPES[:1],
                                                    strategy="exhaustive", store=tmp_path / "t.sqlite"))
    assert asked.stages[0].strategy == "exhaustive" and asked.stages[0].budget is None
