"""The tune store: one row per key, WAL, refusals in one sentence, best and export."""

from __future__ import annotations

import json
import sqlite3

import pytest
from fakes.tune_fakes import FAKE_ENV, fake_timing

from perfscope.errors import PerfscopeError
from perfscope.kernels import parse_shape
from perfscope.manifest import OK, WRONG
from perfscope.tune.store import (
    DRY_GPU,
    ConfigKey,
    ConfigRow,
    Measured,
    RunKey,
    Store,
    TrialKey,
    best_params,
    run_key,
)
from perfscope.tune.tasks import TrialTask

SHAPE = parse_shape("4096x4096x4096")
RUN = run_key(FAKE_ENV)


def key(params: str, run: RunKey = RUN) -> TrialKey:
    return TrialKey("hgemm_tma_wgmma_persistent", params, SHAPE, "bf16", run, "abc123")


def timing(ratio: float):
    task = TrialTask(1, "hgemm_tma_wgmma_persistent", "bf16", 4096, 4096, 4096, {}, "sm_90a")
    return fake_timing(task, ratio)


def test_wal_mode_and_one_row_per_key(tmp_path):
    path = tmp_path / "deep" / "tune.sqlite"
    with Store.open(path) as s:
        first = s.record_trial(key('{"BN":128}'), Measured(OK, timing=timing(0.97)))
        # The same key again is ignored: no duplicate row, no overwrite.
        again = s.record_trial(key('{"BN":128}'), Measured(OK, timing=timing(1.5)))
        assert first == again
        assert s.count("trials") == 1 and s.count("timings") == 1
        assert s.trial(key('{"BN":128}')).ratio == pytest.approx(0.97)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_wrong_trial_carries_no_timing(tmp_path):
    with Store.open(tmp_path / "t.sqlite") as s:
        with pytest.raises(ValueError):
            s.record_trial(key("{}"), Measured(WRONG, timing=timing(1.0)))
        s.record_trial(key("{}"), Measured(WRONG, detail="3 elements outside the bound"))
        assert s.trial(key("{}")).timing is None
        assert s.count("trials") == 1   # the refused insert left nothing behind


def test_best_prefers_a_confirmation_and_never_a_dry_run(tmp_path):
    path = tmp_path / "t.sqlite"
    with Store.open(path) as s:
        s.record_trial(key('{"BN":128}'), Measured(OK, timing=timing(1.04)))
        trial = s.record_trial(key('{"BN":256}'), Measured(OK, timing=timing(1.01)))
        s.record_timing(trial, "confirm", timing(1.02))
        s.record_trial(key('{"BN":64}', RunKey(DRY_GPU, "none", "x")), Measured(OK, timing=timing(2.0)))
        best = s.best("hgemm_tma_wgmma_persistent", "bf16", SHAPE)
        assert best.params == {"BN": 256} and best.phase == "confirm"
    assert best_params(path, "hgemm_tma_wgmma_persistent", "bf16", SHAPE) == {"BN": 256}
    with pytest.raises(PerfscopeError, match="holds no verified, timed configuration of "
                                             "hgemm_tma_wgmma_persistent in bf16 at 8192x8192x8192"):
        best_params(path, "hgemm_tma_wgmma_persistent", "bf16", parse_shape("8192x8192x8192"))


def test_configs_upsert_and_export(tmp_path):
    with Store.open(tmp_path / "t.sqlite") as s:
        k = ConfigKey("sgemm_pipe", "fp32", '{"BM":64}', "sm_90a", "abc", "13.0")
        s.record_config(ConfigRow(k, "pruned", "too much shared memory"))
        s.record_config(ConfigRow(k, "ok", "", 128, 0, 0, 8192, 0, 0.3, False))
        assert s.count("configs") == 1 and s.config(k).ok
        s.record_trial(key("{}"), Measured(OK, timing=timing(1.0)))
        session = s.begin_session("perfscope tune x", {"a": 1})
        s.end_session(session, {"gpu": "FAKE"}, {"wall_s": 1.0})
        data = s.export()
    assert data["schema"] == "perfscope.tune-store/1"
    assert data["timings"][0]["timing"]["ratio_to_reference"]["median"] == 1.0
    assert data["sessions"][0]["stats"] == {"wall_s": 1.0}
    json.dumps(data)   # JSON-ready


def test_backup_is_a_whole_store(tmp_path):
    with Store.open(tmp_path / "t.sqlite") as s:
        s.record_trial(key("{}"), Measured(OK, timing=timing(1.0)))
        s.backup(tmp_path / "copy" / "tune.sqlite")
    with Store.open(tmp_path / "copy" / "tune.sqlite") as c:
        assert c.count("trials") == 1 and c.count("timings") == 1


@pytest.mark.parametrize("content, fragment", [
    (b"this is a text file\n" * 100, "is not a perfscope tune store"),
    (None, r"an SQLite database but not a perfscope tune store \(its tables: cats\)"),
])
def test_not_a_store(tmp_path, content, fragment):
    path = tmp_path / "x.sqlite"
    if content is None:
        db = sqlite3.connect(path)
        db.execute("CREATE TABLE cats (name TEXT)")
        db.commit()
        db.close()
    else:
        path.write_bytes(content)
    before = path.read_bytes()
    with pytest.raises(PerfscopeError, match=fragment):
        Store.open(path)
    assert path.read_bytes() == before


def test_missing_store_when_reading(tmp_path):
    with pytest.raises(PerfscopeError, match=r"no tune store at .*run `perfscope tune` first"):
        Store.open(tmp_path / "none.sqlite", create=False)
    assert not (tmp_path / "none.sqlite").exists()


def test_a_store_of_another_schema_is_refused(tmp_path):
    path = tmp_path / "t.sqlite"
    Store.open(path).close()
    db = sqlite3.connect(path)
    db.execute("UPDATE meta SET value='7' WHERE key='schema'")
    db.commit()
    db.close()
    with pytest.raises(PerfscopeError, match="schema 7, and this perfscope reads schema 1"):
        Store.open(path)


def test_a_trial_timed_after_another_l2_flush_has_another_key():
    """--resume must not reuse trials timed after the old write flush."""
    assert run_key(FAKE_ENV) == run_key(FAKE_ENV, "read")
    assert run_key(FAKE_ENV, "write").toolchain != RUN.toolchain
    assert RUN.toolchain.endswith("l2 flush read")
