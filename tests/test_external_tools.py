"""The external set's CPU tools: merge.py keeps each partial capture's machine, and the run
manifests manifests.py writes name the card and layout each workload ran with."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import benchmark_script

from perfscope.manifest import LAYOUT, TN_LAYOUT, read_manifest

EXTERNAL = Path(__file__).resolve().parent / "fixtures" / "external"


def _write(path, doc) -> None:
    path.write_text(json.dumps(doc))


def test_merge_keeps_each_partial_capture_machine(tmp_path):
    merge = benchmark_script("external/merge")
    into, new = tmp_path / "set", tmp_path / "new"
    into.mkdir()
    new.mkdir()
    _write(into / "capture.json", {"groups": {}, "workloads": {"old": {"report": None}}})
    _write(into / "timing.json", {"environment": {"gpu": "NVIDIA H200"},
                                  "workloads": {"old": {"ratio": 1.0}}})
    _write(new / "capture.json", {"time": "2026-12-06 05:02:21 UTC", "command": "capture",
                                  "groups": {}, "workloads": {"w": {"report": None}}})
    _write(new / "timing.json", {"time": "2026-12-06 05:02:14 UTC", "command": "time",
                                 "environment": {"gpu": "NVIDIA H100 80GB HBM3"},
                                 "workloads": {"w": {"ratio": 0.5}}})
    assert merge.merge(new, into) == ["w"]
    timing = json.loads((into / "timing.json").read_text())
    assert timing["environment"]["gpu"] == "NVIDIA H200"      # the set's own, untouched
    assert timing["workloads"]["old"] == {"ratio": 1.0}
    run = timing["workloads"]["w"]["run"]
    assert run["environment"]["gpu"] == "NVIDIA H100 80GB HBM3"
    assert run["time"] == "2026-12-06 05:02:14 UTC"


def test_manifests_name_the_card_and_layout_each_workload_ran_with():
    """The captures of 2026-12-06 came from an H100 into a set made on the H200; the int8
    workload given B K-major says TN, the rest the set's row-major layout."""
    h100 = read_manifest(EXTERNAL / "torch_int8_4096.json")
    assert h100.environment.gpu == "NVIDIA H100 80GB HBM3" and h100.layout == LAYOUT
    assert h100.created.startswith("2026-12-06")
    assert read_manifest(EXTERNAL / "torch_bf16_4096.json").environment.gpu == "NVIDIA H200"
    tn = read_manifest(EXTERNAL / "torch_int8_tn.json")
    assert tn.layout == TN_LAYOUT and tn.dtype == "int8"


def test_layout_fix_refuses_bad_rounds_in_one_sentence(tmp_path, capsys):
    fix = benchmark_script("external/layout_fix")
    out = tmp_path / "f.json"
    assert fix.main(["--out", str(out), "--rounds", "0"]) == 2
    err = capsys.readouterr().err
    assert "--rounds and --runs must be at least 1" in err and err.count("\n") == 1
    assert not out.exists()
    assert set(fix.PAIRS) == {"unaligned_rows", "operand_layout"}
