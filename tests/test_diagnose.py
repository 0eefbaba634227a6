"""`perfscope diagnose` output and the exports, on real captures."""

from __future__ import annotations

import json

from conftest import FIXTURES, report
from typer.testing import CliRunner

import perfscope
from perfscope.cli import app
from perfscope.export import to_dataframe, to_json
from perfscope.render.jsondoc import DIAGNOSE_SCHEMA as SCHEMA

REFERENCE = FIXTURES.parents[2] / "reports" / "reference" / "h200"
runner = CliRunner()

KERNEL_KEYS = {"name", "duration_ns", "sol", "stalls", "memory", "launch", "opcodes",
               "opcode_families", "hotspots", "ncu_rules"}


def test_console_shows_every_section():
    result = runner.invoke(app, ["diagnose", str(report("smem_transpose"))], terminal_width=120)
    assert result.exit_code == 0, result.output
    for text in ("Speed of light", "Top stalls", "mio_throttle", "LDS (load)", "32.0x ideal",
                 "100.0% theoretical (the most an SM holds)", "Opcode families", "Hotspots",
                 "Nsight Compute's own findings", "SharedMemoryConflicts"):
        assert text in result.output, text


def test_memory_bound_work_says_how_far_above_its_floor_it_runs():
    """The floor caps a memory-bound kernel's estimates, so its headroom line names it: the
    transpose runs 60.2% above its floor, its bank conflicts capped there; a copy at its
    floor says only that (no "0.0% above")."""
    from perfscope.diagnosis import diagnose
    from perfscope.render.summary import above_floor_text, headroom_text

    (transpose,) = diagnose([report("smem_transpose")])
    (copy,) = diagnose([report("float4_copy")])
    line = headroom_text(transpose.evaluation)
    assert "60.2% above its floor (33.8 us: fixed time + bytes at the practical DRAM rate)" in line
    (f,) = [f for f in transpose.evaluation.findings if f.code == "PS110"]
    assert f.estimated_gain == 0.6023 and f.capped_by == "gap to the floor"
    assert above_floor_text(copy.evaluation) is None
    assert "above its floor" not in headroom_text(copy.evaluation)
    assert "at its floor" in headroom_text(copy.evaluation)


def test_json_document_follows_schema():
    result = runner.invoke(app, ["diagnose", "--json", str(report("cublas_hgemm_4096")),
                                 str(report("spill"))])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["schema"] == SCHEMA
    assert len(doc["kernels"]) == 3
    for k in doc["kernels"]:
        assert set(k) >= KERNEL_KEYS
    hgemm = doc["kernels"][0]
    assert hgemm["opcode_families"]["gmma"] > 0
    assert hgemm["identity"]["cluster"] == [2, 1, 1]
    capped = doc["kernels"][2]
    assert capped["memory"]["local_load_bytes"] > 0


def test_markdown_is_a_pr_comment():
    result = runner.invoke(app, ["diagnose", "--markdown", str(report("strided_copy"))])
    assert result.exit_code == 0
    assert result.output.startswith("### `ps_strided_copy`")
    assert "| LDG.E.CONSTANT (load) |" in result.output
    assert "<details>" in result.output


def test_folder_and_kernel_filter():
    result = runner.invoke(app, ["diagnose", "--json", str(FIXTURES), "--kernel", "ps_regs"])
    assert result.exit_code == 0
    names = {k["name"] for k in json.loads(result.output)["kernels"]}
    assert names == {"ps_regs_capped", "ps_regs_uncapped"}


def test_dataframe_is_long_and_complete():
    profiles = perfscope.load(report("spill"))
    df = to_dataframe(profiles)
    assert list(df.columns) == ["kernel", "launch", "source", "metric", "value", "unit"]
    assert set(df["kernel"]) == {"ps_regs_capped", "ps_regs_uncapped"}
    per_kernel = df.groupby("kernel").size()
    assert (per_kernel == [len(p.metrics) for p in sorted(profiles, key=lambda p: p.name)]).all()
    regs = df[(df.metric == "launch__registers_per_thread")].set_index("kernel")["value"]
    assert regs["ps_regs_capped"] == 32


def test_json_has_findings_only_when_rules_were_evaluated():
    from perfscope.diagnosis import diagnose
    from perfscope.render.jsondoc import diagnose_document

    profiles = perfscope.load(report("strided_copy"))
    assert "findings" not in to_json(profiles)["kernels"][0]
    doc = diagnose_document(diagnose([report("strided_copy")]))
    assert doc["kernels"][0]["findings"][0]["code"] == "PS101"
    assert doc["kernels"][0]["rules_not_evaluated"]
    # Memory-bound work carries its floor (a launch's fixed time plus its useful bytes at
    # the rate a copy reaches); math-bound work has none.
    room = doc["kernels"][0]["headroom"]
    assert room["bound"] == "DRAM" and room["t_floor_ns"] > 2500 + room["t_bytes_ns"]
    doc = diagnose_document(diagnose([report("cublas_hgemm_4096")]))
    assert doc["kernels"][0]["headroom"]["t_floor_ns"] is None


# -- a report cut at a record boundary (issue 16, item 17) ---------------------------


def _records(data: bytes):
    """(end offset, record) of every record: 10 bytes of file header, then records each
    led by a 4-byte little-endian length."""
    import struct

    off = 10
    while off + 4 <= len(data):
        size = struct.unpack_from("<I", data, off)[0]
        yield off + 4 + size, data[off + 4: off + 4 + size]
        off += 4 + size


def _result_bounds(data: bytes) -> list[tuple[int, int]]:
    """(end of its header, end of the result) of each result, in file order: a result is
    the block a header with field 1 = 0 announces (field 1 = 1 announces a module)."""
    from perfscope.reader import _announced_size

    out, header_end = [], None
    for end, record in _records(data):
        if header_end is not None:
            out.append((header_end, end))
            header_end = None
        elif _announced_size(record) and record.startswith(b"\x08\x00"):
            header_end = end
    return out


def _many_launches() -> bytes:
    import lzma

    return lzma.open(report("many_launches")).read()


def _with_capture_manifest(path, launches: int) -> None:
    from perfscope.manifest import (
        PROGRAM,
        UNVERIFIED,
        Capture,
        RunManifest,
        Verification,
        manifest_path,
    )

    m = RunManifest(stage=PROGRAM, family=PROGRAM, dtype="", m=0, n=0, k=0, params={},
                    verification=Verification(UNVERIFIED),
                    capture=Capture(command=("python3", "many.py"), launches=launches))
    manifest_path(path).write_text(json.dumps(m.to_dict()))


def test_cut_after_a_result_is_said_once_in_every_format(tmp_path):
    """Cut after the 9th whole result, the file's framing ends cleanly and the reader loads
    9 launches: the run manifest's count (24) is what says the file is incomplete."""
    data = _many_launches()
    bounds = _result_bounds(data)
    assert len(bounds) == 24
    cut = tmp_path / "cut.ncu-rep"
    cut.write_bytes(data[:bounds[8][1]])
    _with_capture_manifest(cut, 24)
    text = runner.invoke(app, ["diagnose", str(cut)], env={"COLUMNS": "250"})
    assert text.exit_code == 0, text.output
    assert text.output.count("is incomplete") == 1
    assert "holds 9 of the 24 launches" in text.output
    assert text.output.count(f"{cut}#") == 9
    doc = json.loads(runner.invoke(app, ["diagnose", "--json", str(cut)]).stdout)
    assert len(doc["kernels"]) == 9
    assert len(doc["warnings"]) == 1 and "holds 9 of the 24" in doc["warnings"][0]
    assert all(k["incomplete"] == doc["warnings"][0] for k in doc["kernels"])
    md = runner.invoke(app, ["diagnose", "--markdown", str(cut)]).output
    assert md.startswith("> warning: ") and md.count("is incomplete") == 1
    page = tmp_path / "index.html"
    result = runner.invoke(app, ["report", str(cut), "--html", str(page)])
    assert result.exit_code == 0, result.output
    assert "is incomplete" in result.stderr and "holds 9 of the 24" in page.read_text()
    result = runner.invoke(app, ["diff", f"{cut}#0", str(report("float4_copy"))])
    assert result.exit_code == 0, result.output
    assert result.output.count("is incomplete") == 1


def test_cut_after_a_header_is_one_sentence(tmp_path):
    """Cut after a result's header, the reader loads nothing; the framing says why."""
    data = _many_launches()
    cut = tmp_path / "cut.ncu-rep"
    cut.write_bytes(data[:_result_bounds(data)[9][0]])
    result = runner.invoke(app, ["diagnose", str(cut)])
    assert result.exit_code == 2
    assert result.output.count("\n") == 1
    assert "truncated: it ends after the header of a result whose data is missing" in result.output


def test_complete_report_has_no_warning(tmp_path):
    doc = json.loads(runner.invoke(app, ["diagnose", "--json", str(report("many_launches"))]).stdout)
    assert doc["warnings"] == [] and len(doc["kernels"]) == 24
    whole = tmp_path / "whole.ncu-rep"
    whole.write_bytes(_many_launches())
    _with_capture_manifest(whole, 24)
    doc = json.loads(runner.invoke(app, ["diagnose", "--json", str(whole)]).stdout)
    assert doc["warnings"] == [] and doc["kernels"][0]["incomplete"] is None


def test_a_setting_shared_by_every_launch_is_reported_once_as_the_machines():
    """On the H200 every launch of every program carries an 11.25 MiB persisting carve-out:
    diagnose says so once, for the machine, and no kernel gets a finding for it."""
    result = runner.invoke(app, ["diagnose", "--json", str(report("torch_mlp"))])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    (note,) = doc["machine_settings"]
    assert note.startswith("persisting L2 carve-out 11.25 MiB on all 6 launches here")
    assert not any(f["code"] == "PS161" for k in doc["kernels"] for f in k["findings"])
    text = runner.invoke(app, ["diagnose", str(report("torch_mlp"))], terminal_width=200).output
    assert text.count("persisting L2 carve-out") == 1


def test_a_setting_that_differs_between_launches_is_no_machine_setting():
    import dataclasses
    from collections import ChainMap

    from perfscope.diagnosis import diagnose
    from perfscope.record import machine_notes, machine_settings

    records = diagnose([report("torch_mlp")])
    first = records[0].profile
    own = dataclasses.replace(first, metrics=ChainMap({"launch__persisting_l2_cache_size": (0.0, "")},
                                                      first.metrics))
    assert machine_settings([first, own]) == {}
    assert machine_settings([first]) == {"launch__persisting_l2_cache_size": 11.25 * 2**20}
    mixed = [records[0], dataclasses.replace(records[1], profile=own)]
    assert machine_notes(mixed) == ()


def test_each_gpu_model_has_its_own_machine_settings():
    """An H100's driver default carve-out is 9.375 MiB, an H200's 11.25: captures of both
    judged together (the probes folder holds two H100 reports beside the H200's) leave each
    model's launches their own machine setting, so none gets PS161 for it, and the notes
    name the model when there are several."""
    from perfscope.diagnosis import diagnose
    from perfscope.record import machine_notes

    h100 = REFERENCE / "probes" / "column-split-h100.ncu-rep.xz"
    records = diagnose([report("torch_mlp"), h100, h100.with_name("column-split-aligned-h100.ncu-rep.xz")])
    assert {r.profile.identity.device for r in records} == {"NVIDIA H200", "NVIDIA H100 80GB HBM3"}
    assert not any(f.code == "PS161" for r in records for f in r.evaluation.findings)
    notes = machine_notes(records)
    assert len(notes) == 2
    assert notes[0].startswith("persisting L2 carve-out 11.25 MiB on all 6 NVIDIA H200 launches")
    assert notes[1].startswith("persisting L2 carve-out 9.375 MiB on all 2 NVIDIA H100 80GB HBM3")


def test_one_launch_by_the_id_every_view_prints():
    """diagnose tells users to name one launch as FILE#ID; diagnose itself takes it: the
    second launch of the 24-launch capture alone, its panel, and one sentence (exit 2) for
    an id the report does not hold or a launch --kernel leaves out."""
    many = report("many_launches")
    doc = json.loads(runner.invoke(app, ["diagnose", "--json", f"{many}#1"]).stdout)
    assert [k["launch_index"] for k in doc["kernels"]] == [1]
    panel = runner.invoke(app, ["diagnose", f"{many}#1"], terminal_width=200)
    assert panel.exit_code == 0 and f"{many.name}#1" in panel.output
    missing = runner.invoke(app, ["diagnose", f"{many}#99"])
    assert missing.exit_code == 2 and "has no launch #99" in missing.output
    assert "Traceback" not in missing.output
    left_out = runner.invoke(app, ["diagnose", f"{many}#1", "--kernel", "no_such_kernel"])
    assert left_out.exit_code == 2 and "leaves out" in left_out.output


def test_every_view_shows_the_tma_boxes_a_stage_was_launched_with():
    """An ncu report holds no tensor map; for a stage of ours the loader plans the run's
    boxes from its manifest, and the console, markdown and JSON say them: hgemm_small_m at
    16 x 8192^2 reads B in 64 rows of 128 bytes, 16 KB apart. cuBLAS's TMA kernel (no stage,
    no maps recorded) has none to show: the view says they are unknown and how to record
    them, and its JSON says null, not an empty list."""
    small_m = str(FIXTURES.parents[2] / "reports" / "reference" / "h200" / "fused"
                  / "hgemm_small_m@AROWS=16,BN=64-bf16-16x8192x8192.ncu-rep.xz")
    out = runner.invoke(app, ["diagnose", small_m], terminal_width=200).output
    assert "TMA boxes of B" in out and "64 rows x 128 B, 16,384 B apart (row-major); 128 B" in out
    md = runner.invoke(app, ["diagnose", "--markdown", small_m]).output
    assert "| TMA boxes of B |" in md
    doc = json.loads(runner.invoke(app, ["diagnose", "--json", small_m]).output)
    (k,) = doc["kernels"]
    b = k["operand_reads"][1]
    assert (b["operand"], b["row_bytes"], b["box_rows"], b["run_bytes"]) == ("B", 16384, 64, 128)
    cublas = json.loads(runner.invoke(app, ["diagnose", "--json", str(report("cublas_hgemm_4096"))]).output)
    assert cublas["kernels"][0]["operand_reads"] is None
    shown = runner.invoke(app, ["diagnose", str(report("cublas_hgemm_4096"))], terminal_width=200).output
    assert "TMA boxes of" not in shown and "TMA boxes" in shown and "--tensor-maps" in shown
    # A kernel that loads no operand by TMA has no such row.
    plain = runner.invoke(app, ["diagnose", str(report("cublas_sgemm_4096"))], terminal_width=200).output
    assert "TMA boxes" not in plain
