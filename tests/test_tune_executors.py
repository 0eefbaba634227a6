"""The executors on the CPU: local workers (fake ones, and the real one in --dry mode) and
Ray with a local instance and fake GPU resources."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from perfscope.errors import PerfscopeError
from perfscope.kernels import parse_shape
from perfscope.manifest import ERROR, OK
from perfscope.tune import workflow
from perfscope.tune.executors import LocalExecutor, LocalOptions, visible_devices
from perfscope.tune.store import DRY_GPU, Store
from perfscope.tune.tasks import TrialTask

TESTS = Path(__file__).parent
FAKE_WORKER = (sys.executable, str(TESTS / "fakes" / "fake_tune_worker.py"))
STAGE = "hgemm_tma_wgmma_persistent"


@pytest.fixture
def fake_env(monkeypatch):
    """The fake worker imports tests/fakes; set what it should misbehave on per test."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    return monkeypatch


def tasks(n: int, stages=(2, 3, 4, 5, 6)) -> list[TrialTask]:
    return [TrialTask(i + 1, STAGE, "bf16", 4096, 4096, 4096,
                      {"BM": 128, "BN": 128, "BK": 64, "STAGES": stages[i % len(stages)], "GROUP": 8},
                      "sm_90a") for i in range(n)]


def drain(ex: LocalExecutor, submitted: list[TrialTask], limit: float = 60.0) -> dict[int, object]:
    for t in submitted:
        ex.submit(t)
    got: dict[int, object] = {}
    end = time.monotonic() + limit
    while len(got) < len(submitted) and time.monotonic() < end:
        for outcome in ex.results(0.5):
            assert outcome.task_id not in got, "a task was answered twice"
            got[outcome.task_id] = outcome
    return got


def test_one_worker_per_gpu_each_with_its_own_device(fake_env):
    ex = LocalExecutor(LocalOptions(("0", "1"), command=FAKE_WORKER))
    infos = ex.start()
    try:
        assert [i.name for i in infos] == ["fake gpu 0", "fake gpu 1"]
        assert ex.capacity == 4
        got = drain(ex, tasks(12))
    finally:
        ex.close()
    assert len(got) == 12 and all(o.verdict == OK for o in got.values())
    assert {o.worker for o in got.values()} == {"fake gpu 0", "fake gpu 1"}


def test_a_crashing_configuration_is_an_error_and_the_worker_is_replaced(fake_env):
    fake_env.setenv("FAKE_TUNE_CRASH", json.dumps({"STAGES": 2}))
    ex = LocalExecutor(LocalOptions(("0",), command=FAKE_WORKER))
    ex.start()
    try:
        got = drain(ex, tasks(10))
    finally:
        ex.close()
    assert len(got) == 10
    crashed = [o for o in got.values() if o.verdict == ERROR]
    assert len(crashed) == 2
    assert all("exited with code 11 while running it" in o.detail for o in crashed)


def test_a_hang_is_killed_at_the_task_timeout(fake_env):
    fake_env.setenv("FAKE_TUNE_HANG", json.dumps({"STAGES": 4}))
    ex = LocalExecutor(LocalOptions(("0", "1"), command=FAKE_WORKER, task_timeout=2.0))
    ex.start()
    try:
        got = drain(ex, tasks(5))
    finally:
        ex.close()
    hung = [o for o in got.values() if o.verdict == ERROR]
    assert len(got) == 5 and len(hung) == 1 and "2 s task timeout" in hung[0].detail


def test_a_broken_context_replaces_the_worker(fake_env):
    fake_env.setenv("FAKE_TUNE_FATAL", json.dumps({"STAGES": 3}))
    ex = LocalExecutor(LocalOptions(("0",), command=FAKE_WORKER))
    ex.start()
    try:
        got = drain(ex, tasks(6))
    finally:
        ex.close()
    fatal = [o for o in got.values() if o.fatal]
    assert len(got) == 6 and len(fatal) == 1 and fatal[0].detail == "CUDA_ERROR_ILLEGAL_ADDRESS"


def test_a_worker_that_cannot_start_is_one_sentence(fake_env):
    fake_env.setenv("FAKE_TUNE_FAIL_START", "1")
    ex = LocalExecutor(LocalOptions(("0",), command=FAKE_WORKER))
    with pytest.raises(PerfscopeError, match="the tune worker for GPU 0 could not start: no GPU"):
        ex.start()


def test_no_gpu_is_refused_at_start():
    with pytest.raises(PerfscopeError, match="no GPU to tune on"):
        LocalExecutor(LocalOptions(())).start()


def test_visible_devices_follow_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, 3")
    assert visible_devices() == ("2", "3")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert visible_devices() == ()


def test_the_gpu_worker_and_the_coordinator_never_load_the_report_reader():
    # The worker runs CuPy, and the coordinator may start Ray: both abort beside the reader.
    code = ("import sys, perfscope.tune.worker, perfscope.tune.executors, perfscope.tune.workflow, "
            "perfscope.cli; "
            "print(','.join(m for m in ('ncu_report', 'perfscope.profile', 'matplotlib', 'cupy') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


# ------------------------------------------------------------------ real worker, dry


def _small(store: Path, **kw) -> workflow.TuneRequest:
    # BN=128 and GROUP=8 pinned: STAGES 2..6, five configurations to compile.
    return workflow.TuneRequest(stages=(STAGE,), shapes=(parse_shape("4096x4096x4096"),
                                                         parse_shape("2048x8192x8192")),
                                dtypes=("bf16",),
                                pins={"BN": 128, "GROUP": 8, "BOXES": 4, "STREAMK": 0, "DEFER": 0},
                                store=store, **kw)


@pytest.mark.slow
def test_the_real_worker_in_dry_mode_compiles_and_records(tmp_path):
    store = tmp_path / "tune.sqlite"
    ex = LocalExecutor(LocalOptions(("0", "1"), dry=True, compile_jobs=2))
    doc = workflow.run(_small(store), ex)
    assert [len(r.timed) for r in doc.results] == [5, 5]
    assert dict(doc.environment)["gpu"] == DRY_GPU
    assert doc.stats.compiled == 5 and doc.stats.workers == 2
    with Store.open(store) as s:
        assert s.count("trials") == 10
        assert s.best(STAGE, "bf16", parse_shape("4096x4096x4096")) is None   # dry never counts


RAY_SWEEP = """
import json, sys
from pathlib import Path
import ray
from perfscope.kernels import parse_shape
from perfscope.tune import workflow
from perfscope.tune.executors import RayExecutor, RayOptions

ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False)
request = workflow.TuneRequest(
    stages=("hgemm_tma_wgmma_persistent",), dtypes=("bf16",),
    pins={"BN": 128, "GROUP": 8, "BOXES": 4, "STREAMK": 0, "DEFER": 0},
    shapes=(parse_shape("4096x4096x4096"), parse_shape("2048x8192x8192")), store=Path(sys.argv[1]))
doc = workflow.run(request, RayExecutor(RayOptions(dry=True)), workflow.RunOptions(executor_name="ray"))
still = ray.is_initialized()
ray.shutdown()
print(json.dumps({"still_running": still, "workers": doc.stats.workers, "executor": doc.stats.executor,
                  "results": [[[t.config, t.ratio.median] for t in r.trials] for r in doc.results]}))
"""


@pytest.mark.slow
def test_ray_executor_on_a_local_instance_with_fake_gpus(tmp_path):
    """One Ray actor with num_gpus=1 per GPU of a local instance that declares 2, compiles as
    Ray tasks: the dry worker compiles, the coordinator prunes and records, and the store
    holds what the local executor records for the same sweep. In a child process: this one
    has Nsight Compute's report reader loaded (conftest), and ray.init aborts beside it."""
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed (the 'cluster' extra)")
    ray_store, local_store = tmp_path / "ray.sqlite", tmp_path / "local.sqlite"
    proc = subprocess.run([sys.executable, "-c", RAY_SWEEP, str(ray_store)], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["still_running"] and got["workers"] == 2 and got["executor"] == "ray"
    assert [len(r) for r in got["results"]] == [5, 5]
    local = workflow.run(_small(local_store), LocalExecutor(LocalOptions(("0",), dry=True)))
    assert got["results"] == [[[t.config, t.ratio.median] for t in r.trials] for r in local.results]
    with Store.open(ray_store) as s:
        rows = s.trials(STAGE, "bf16", parse_shape("4096x4096x4096"))
    assert len(rows) == 5 and all(r.worker.startswith("ray ") for r in rows)
    # Each actor was given one GPU of its own.
    assert {r.worker.rsplit(" ", 1)[-1] for r in rows} <= {"0", "1"}
    assert got["workers"] == 2
