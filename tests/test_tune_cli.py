"""`perfscope tune` and --config best from the command line: bad input is one sentence and
exit 2 with the store untouched; a dry sweep, its resume, and the tuned configuration fed
back to bench, profile and diff."""

from __future__ import annotations

import json
import logging
import shutil
import sqlite3
from pathlib import Path

import pytest
from fakes.tune_fakes import FakeExecutor, fake_timing
from typer.testing import CliRunner

from perfscope.cli import app
from perfscope.errors import PerfscopeError
from perfscope.kernels import parse_shape
from perfscope.locations import reference_root
from perfscope.manifest import OK
from perfscope.tune import configured, workflow
from perfscope.tune.store import Measured, Store, TrialKey, run_key
from perfscope.tune.tasks import TrialTask

runner = CliRunner()
STAGE = "hgemm_tma_wgmma_persistent"


def tune(*args: str):
    return runner.invoke(app, ["tune", *args])


def assert_one_sentence(result, *fragments: str) -> None:
    assert result.exit_code == 2, result.output
    text = result.output.strip()
    assert "Traceback" not in text
    assert len(text.splitlines()) == 1, text
    assert text.startswith("perfscope: ")
    for f in fragments:
        assert f in text, text


@pytest.fixture
def held_store(tmp_path) -> Path:
    """A store that already holds a sweep, to show that bad input loses none of it."""
    path = tmp_path / "tune.sqlite"
    workflow.run(workflow.TuneRequest(stages=(STAGE,), shapes=(parse_shape("4096x4096x4096"),),
                                      dtypes=("bf16",), store=path), FakeExecutor())
    return path


def snapshot(path: Path) -> list:
    db = sqlite3.connect(path)
    try:
        return [db.execute(f"SELECT * FROM {t} ORDER BY id").fetchall()
                for t in ("configs", "trials", "timings", "sessions")]
    finally:
        db.close()


@pytest.mark.parametrize("args, fragments", [
    (["nope"], ["unknown stage 'nope'"]),
    (["hgemm_naive"], ["hgemm_naive declares no search space", STAGE]),
    ([STAGE, "--param", "SPLITK=2"],
     ["has no template parameter SPLITK", "BM, BN, BK, STAGES, GROUP, BOXES, STREAMK, DEFER"]),
    ([STAGE, "--param", "BN=192"], ["BN=192 is not in", "BN takes 128, 256"]),
    ([STAGE, "--param", "BN"], ["'BN' is not of the form NAME=INTEGER"]),
    ([STAGE, "--param", "BN=256", "--param", "STAGES=5"],
     ["no configuration of hgemm_tma_wgmma_persistent (bf16) is left after pruning",
      "all 90 break a limit before compiling", "shared memory"]),
    ([STAGE, "--shape", "4096x4100x4096"], ["multiple of 8"]),
    ([STAGE, "--shape", "4096x4096"], ["is not of the form MxNxK"]),
    ([STAGE, "--dtype", "fp32"], ["does not support dtype fp32"]),
    ([STAGE, "--strategy", "exhaustive", "--budget", "3"], ["exhaustive measures all 690"]),
    ([STAGE, "--strategy", "bayes"], ["needs --budget"]),
    ([STAGE, "--budget", "0", "--strategy", "random"], ["at least 1"]),
    ([STAGE, "--confirm", "2", "--confirm-until", "0"], ["--until is a fraction of the ratio"]),
    ([STAGE, "--confirm", "2", "--confirm-until", "0.01", "--confirm-rounds", "20"],
     ["--max-rounds (15) is below --rounds (20)"]),
])
def test_bad_input_is_one_sentence_and_the_store_keeps_everything(held_store, args, fragments):
    before = snapshot(held_store)
    result = tune(*args, "--dtype", "bf16", "--store", str(held_store), "--dry") \
        if "--dtype" not in args else tune(*args, "--store", str(held_store), "--dry")
    assert_one_sentence(result, *fragments)
    assert snapshot(held_store) == before


def test_a_shapes_file_with_a_bad_line(held_store, tmp_path):
    shapes = tmp_path / "shapes.txt"
    shapes.write_text("4096x4096x4096\n# next one is wrong\n8192 x 8192\n")
    before = snapshot(held_store)
    result = tune(STAGE, "--shapes", str(shapes), "--store", str(held_store), "--dry")
    assert_one_sentence(result, "shapes.txt line 3:", "'8192 x 8192' is not of the form MxNxK")
    assert snapshot(held_store) == before


def test_a_file_that_is_not_a_store(tmp_path):
    bogus = tmp_path / "notes.sqlite"
    bogus.write_text("not a database\n" * 200)
    result = tune(STAGE, "--store", str(bogus), "--dry")
    assert_one_sentence(result, "is not a perfscope tune store")
    assert bogus.read_text() == "not a database\n" * 200


def test_profile_best_without_ncu_is_refused_before_tuning(held_store, monkeypatch):
    monkeypatch.setenv("PERFSCOPE_NCU", "/nonexistent/ncu")
    before = snapshot(held_store)
    result = tune(STAGE, "--profile-best", "1", "--store", str(held_store), "--dry")
    assert_one_sentence(result, "--profile-best needs Nsight Compute", "PERFSCOPE_NCU")
    assert snapshot(held_store) == before


def test_an_unknown_executor_is_refused_before_any_worker_starts(held_store):
    before = snapshot(held_store)
    result = tune(STAGE, "--dtype", "bf16", "--store", str(held_store), "--executor", "slurm")
    assert_one_sentence(result, "unknown executor 'slurm'; use one of local, ray")
    assert snapshot(held_store) == before


# ------------------------------------------------------------------ --config best


def _store_with_best(path: Path, params: dict, shape: str = "4096x4096x4096",
                     source: str = "src") -> None:
    spec_defaults = {"BM": 128, "BN": 256, "BK": 64, "STAGES": 3, "GROUP": 8}
    full = {**spec_defaults, **params}
    task = TrialTask(1, STAGE, "bf16", *parse_shape(shape).__dict__.values(), full, "sm_90a")
    from fakes.tune_fakes import FAKE_ENV

    with Store.open(path) as s:
        key = TrialKey(STAGE, json.dumps(dict(sorted(full.items())), separators=(",", ":")),
                       parse_shape(shape), "bf16", run_key(FAKE_ENV), source)
        s.record_trial(key, Measured(OK, timing=fake_timing(task, 1.03)))


def test_config_best_reads_the_store(tmp_path):
    path = tmp_path / "t.sqlite"
    _store_with_best(path, {"STAGES": 4})
    choice = configured.ConfigChoice(("GROUP=16",), "best", path, (STAGE,), ("bf16",), "4096x4096x4096")
    assert configured.chosen_params(choice) == {"BM": 128, "BN": 256, "BK": 64, "STAGES": 4, "GROUP": 16}
    with pytest.raises(PerfscopeError, match="name exactly one stage"):
        configured.chosen_params(configured.ConfigChoice((), "best", path, ("all",), (), "4096x4096x4096"))
    with pytest.raises(PerfscopeError, match="--config 'worst' is not known"):
        configured.chosen_params(configured.ConfigChoice((), "worst", path, (STAGE,), (), "1x1x1"))
    with pytest.raises(PerfscopeError, match="--store is read by --config best"):
        configured.chosen_params(configured.ConfigChoice((), None, path, (STAGE,), (), "1x1x1"))


def test_config_best_measured_on_another_source_is_taken_with_a_warning(tmp_path, caplog):
    """The store's trials carry the hash of the stage's source and headers they ran: a best
    configuration of another version (a comment edit changes it too) is still taken, and a
    warning says which hashes differ; of the current source, nothing is said."""
    from perfscope.digest import source_hash
    from perfscope.kernels import get_spec

    spec = get_spec(STAGE)
    now = source_hash(spec.source_path().read_text(), spec.kernel_dir)
    choice = lambda p: configured.ConfigChoice((), "best", p, (STAGE,), ("bf16",), "4096x4096x4096")  # noqa: E731
    old, same = tmp_path / "old.sqlite", tmp_path / "same.sqlite"
    _store_with_best(old, {"STAGES": 4}, source="0123456789abcdef")
    _store_with_best(same, {"STAGES": 4}, source=now)
    with caplog.at_level(logging.WARNING, logger="perfscope.tune.configured"):
        assert configured.chosen_params(choice(old))["STAGES"] == 4
    (rec,) = caplog.records
    assert "measured on another version of hopper.cu" in rec.getMessage()
    assert "0123456789abcdef" in rec.getMessage() and now in rec.getMessage()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="perfscope.tune.configured"):
        assert configured.chosen_params(choice(same))["STAGES"] == 4
    assert not caplog.records


@pytest.mark.parametrize("command", ["bench", "profile"])
def test_bench_and_profile_config_best_without_a_store(tmp_path, command):
    result = runner.invoke(app, [command, STAGE, "--dtype", "bf16", "--config", "best", "--store",
                                 str(tmp_path / "none.sqlite")])
    assert_one_sentence(result, "no tune store at", "run `perfscope tune` first")


def test_bench_config_best_with_nothing_tuned_at_that_shape(tmp_path):
    path = tmp_path / "t.sqlite"
    _store_with_best(path, {"STAGES": 4})
    result = runner.invoke(app, ["bench", STAGE, "--dtype", "bf16", "--shape", "8192x8192x8192",
                                 "--config", "best", "--store", str(path)])
    assert_one_sentence(result, "holds no verified, timed configuration", "8192x8192x8192")


def test_diff_config_best_names_the_tuned_report(tmp_path):
    """diff resolves the stage to the report profiled with the store's best parameters."""
    ref = reference_root() / "h200"
    run = tmp_path / "run"
    run.mkdir()
    for name in ("cublas_bgemm-bf16-4096x4096x4096", "hgemm_tma_wgmma_persistent-bf16-4096x4096x4096"):
        shutil.copy(ref / f"{name}.ncu-rep.xz", run / f"{name}.ncu-rep.xz")
        shutil.copy(ref / f"{name}.json", run / f"{name}.json")
    tuned = "hgemm_tma_wgmma_persistent@STAGES=4-bf16-4096x4096x4096"
    default = "hgemm_tma_wgmma_persistent-bf16-4096x4096x4096"
    shutil.copy(ref / f"{default}.ncu-rep.xz", run / f"{tuned}.ncu-rep.xz")
    manifest = json.loads((ref / f"{default}.json").read_text())
    manifest["params"]["STAGES"] = 4
    (run / f"{tuned}.json").write_text(json.dumps(manifest))
    store = tmp_path / "t.sqlite"
    _store_with_best(store, {"STAGES": 4})
    result = runner.invoke(app, ["diff", STAGE, "cublas", "--reference-dir", str(run), "--config", "best",
                                 "--store", str(store), "--shape", "4096x4096x4096", "--dtype", "bf16",
                                 "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["a"]["report"].endswith(f"{tuned}.ncu-rep.xz")
    # An explicit --param that was never profiled says how to make its report.
    result = runner.invoke(app, ["diff", STAGE, "cublas", "--reference-dir", str(run), "--param",
                                 "BN=128", "--shape", "4096x4096x4096", "--dtype", "bf16"])
    assert_one_sentence(result, "no report of hgemm_tma_wgmma_persistent@BN=128-bf16-4096x4096x4096",
                        "perfscope profile hgemm_tma_wgmma_persistent --dtype bf16 --shape "
                        "4096x4096x4096 --param BN=128")


# ------------------------------------------------------------------ a dry sweep


@pytest.mark.slow
def test_a_dry_sweep_from_the_command_line_and_its_resume(tmp_path):
    store = tmp_path / "tune.sqlite"
    page = tmp_path / "tune.html"
    args = [STAGE, "--shape", "4096x4096x4096", "--shape", "1024x8192x8192", "--dtype", "bf16",
            "--param", "BN=128", "--param", "GROUP=8", "--param", "BOXES=4", "--param", "STREAMK=0",
            "--param", "DEFER=0",
            "--store", str(store),
            "--dry", "--jobs", "2"]
    result = tune(*args, "--json", "--html", str(page))
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["schema"] == "perfscope.tune/1"
    assert [len(r["trials"]) for r in doc["results"]] == [5, 5]
    assert doc["stats"]["trials_run"] == 10 and doc["stats"]["compiled"] == 5
    assert "<svg" in page.read_text() and "Tuning" in page.read_text()
    again = tune(*args)
    assert again.exit_code == 2 and "already holds 10 result(s)" in again.output
    resumed = tune(*args, "--resume", "--markdown")
    assert resumed.exit_code == 0, resumed.output
    assert "| hgemm_tma_wgmma_persistent | bf16 | 4096x4096x4096 |" in resumed.stdout
    assert "10 already in the store" in resumed.stdout


def test_confirm_until_travels_to_the_worker_in_the_task():
    """--confirm-until is bench --until for the confirming trials: the task carries it to the
    worker (JSON and back) and the worker's timing options stop on it; screening is as
    before."""
    plan = workflow.TimingPlan(20, 5, 3, until=0.005)
    task = TrialTask(id=1, stage=STAGE, dtype="bf16", m=4096, n=4096, k=4096, params={},
                     arch="sm_90a", phase="confirm", runs=plan.runs, rounds=plan.rounds,
                     warmup=plan.warmup, until=plan.until, max_rounds=plan.max_rounds)
    again = TrialTask.from_dict(task.to_dict())
    opts = again.bench_options()
    assert (opts.rounds, opts.until, opts.max_rounds) == (5, 0.005, 15)
    assert TrialTask(id=2, stage=STAGE, dtype="bf16", m=1, n=8, k=8, params={},
                     arch="sm_90a").bench_options().until is None


def test_the_confirming_trials_carry_confirm_until(tmp_path):
    """Only the confirm phase's tasks stop on --confirm-until; the screening ones run their
    fixed rounds."""
    fake = FakeExecutor()
    workflow.run(workflow.TuneRequest(
        stages=(STAGE,), shapes=(parse_shape("4096x4096x4096"),), dtypes=("bf16",),
        budget=4, strategy="random", confirm=2, store=tmp_path / "t.sqlite",
        confirm_timing=workflow.TimingPlan(20, 5, 3, until=0.005)), fake)
    phases = {t.phase: t for t in fake.submitted}
    assert phases["confirm"].until == 0.005 and phases["screen"].until is None
