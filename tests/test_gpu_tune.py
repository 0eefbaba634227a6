"""`perfscope tune` on a real GPU: a small sweep through the real worker, then --config best.

Run on its own on a GPU machine (``python -m pytest -m gpu tests/test_gpu_tune.py``). This
process never imports CuPy: the sweep runs in the tune's worker processes and bench in a
child, so the report reader and CuPy never meet.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from perfscope.kernels import parse_shape
from perfscope.manifest import OK
from perfscope.tune import workflow
from perfscope.tune.executors import ExecutorChoice, make_executor
from perfscope.tune.store import Store

pytestmark = [pytest.mark.gpu, pytest.mark.cupy]


def _sweep(tmp_path, stage: str, dtype: str, pins: dict, shape: str = "2048x2048x2048"):
    store = tmp_path / "tune.sqlite"
    request = workflow.TuneRequest(stages=(stage,), shapes=(parse_shape(shape),), dtypes=(dtype,),
                                   pins=pins, store=store, confirm=1,
                                   screen=workflow.TimingPlan(runs=5, rounds=2, warmup=1))
    doc = workflow.run(request, make_executor(ExecutorChoice("local", compile_jobs=4,
                                                             task_timeout=120)))
    return store, doc.results[0]


def test_persistent_stage_sweep_verifies_times_and_feeds_bench(tmp_path):
    stage = "hgemm_tma_wgmma_persistent"
    # STAGES 2 and 3, each with and without the deferred store (the BOXES / STREAMK options
    # held at the stage's defaults).
    store, result = _sweep(tmp_path, stage, "bf16", {"BN": 256, "GROUP": 8, "BOXES": 4,
                                                     "STREAMK": 0})
    assert [t.verdict for t in result.trials] == [OK] * 4
    assert all(t.ratio is not None and 0.3 < t.ratio.median < 2.0 for t in result.trials)
    assert result.best.phase == "confirm"
    with Store.open(store) as s:
        best = s.best(stage, "bf16", parse_shape("2048x2048x2048"))
    assert best is not None and best.key.run.gpu.startswith("NVIDIA")
    out = subprocess.run([sys.executable, "-m", "perfscope.cli", "bench", stage, "--dtype", "bf16",
                          "--shape", "2048x2048x2048", "--config", "best", "--store", str(store),
                          "--runs", "3", "--rounds", "1", "--json"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    manifests = json.loads(out.stdout)["manifests"]
    assert manifests[0]["params"] == best.params


def test_pointer_abi_stage_sweep(tmp_path):
    # sgemm_pipe at its default tile with 2, 3 and 4 stages: the pointer launch path.
    pins = {"BM": 128, "BN": 128, "BK": 8, "WM": 32, "WN": 64, "TM": 8, "TN": 8}
    _, result = _sweep(tmp_path, "sgemm_pipe", "fp32", pins, "1024x1024x1024")
    assert len(result.trials) == 3 and all(t.verdict == OK for t in result.trials)


def test_fused_stage_sweep_is_timed_against_its_group(tmp_path):
    # hgemm_fused_bias_act's stream-K modes with and without the deferred store (STAGES 3,
    # GROUP 8, BN 256, BOXES 4 held; ptxas spills, and so prunes, two of the six):
    # every trial is verified on its own epilogue inputs and timed against cublas+gelu, not
    # against the plain cuBLAS GEMM (time_stage refuses a reference of another epilogue).
    stage = "hgemm_fused_bias_act"
    store, result = _sweep(tmp_path, stage, "fp16", {"BN": 256, "GROUP": 8, "STAGES": 3,
                                                     "BOXES": 4}, "1024x4096x2048")
    assert len(result.trials) == 4 and all(t.verdict == OK for t in result.trials)
    assert all(t.ratio is not None and 0.3 < t.ratio.median < 2.0 for t in result.trials)
    with Store.open(store) as s:
        best = s.best(stage, "fp16", parse_shape("1024x4096x2048"))
    assert best is not None and best.timing.reference == "cublas+gelu"
