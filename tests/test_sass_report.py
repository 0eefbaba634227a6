"""`perfscope sass REPORT`: a static audit of the code that ran, from the cubins a report carries.

On the H200's committed reports (no GPU): cuBLAS's SGEMM (a 14 MB library module holding
241 kernels), a perfscope stage (its fingerprint from the run manifest beside the report),
a group of two launches from two modules (cuBLAS + the elementwise pass), and the edge
cases a real capture cannot produce (altered bytes), each a one-sentence refusal.
"""

from __future__ import annotations

import json
import lzma
import struct
from pathlib import Path

import pytest
from conftest import disassembler_or_skip
from typer.testing import CliRunner

from perfscope.audit import ReportAuditOptions, audit
from perfscope.cli import app
from perfscope.errors import PerfscopeError
from perfscope.profile import load
from perfscope.reader import decompressed
from perfscope.sass.embedded import EM_CUDA, _elf_length, cubins_for, embedded_cubins

REFERENCE = Path(__file__).resolve().parents[1] / "reports" / "reference" / "h200"
CUBLAS_SGEMM = REFERENCE / "cublas_sgemm-fp32-4096x4096x4096.ncu-rep.xz"
PERSISTENT = REFERENCE / "hgemm_tma_wgmma_persistent-bf16-4096x4096x4096.ncu-rep.xz"
GROUP = REFERENCE / "fused" / "cublas+gelu-bf16-4096x4096x4096.ncu-rep.xz"
TRITON = Path(__file__).resolve().parent / "fixtures" / "external" / "triton_64x64.ncu-rep.xz"

pytestmark = pytest.mark.usefixtures("private_cubin_cache")


def _plain(path: Path) -> bytes:
    return decompressed(path)[0].read_bytes()


def test_the_report_carries_cublas_whole_module_and_the_profiled_kernel_is_in_it():
    data = _plain(CUBLAS_SGEMM)
    cubins = embedded_cubins(data)
    assert len(cubins) == 1
    (c,) = cubins
    # The length the ELF's own headers give is the length of the report's field that holds it
    # (a protobuf bytes field: its varint length sits just before the image).
    varint, shift = 0, 0
    for b in data[c.offset - 4: c.offset]:
        varint |= (b & 0x7F) << shift
        shift += 7
    assert len(c.data) == varint == 14_007_616
    assert struct.unpack_from("<H", c.data, 0x12)[0] == EM_CUDA
    mangled = load(CUBLAS_SGEMM)[0].identity.mangled
    assert cubins_for(cubins, mangled) == (c,) and len(c.functions) > 200
    assert cubins_for(cubins, "no_such_kernel") == ()


def test_a_cut_image_or_a_bare_magic_is_not_taken_for_a_cubin():
    data = _plain(GROUP)
    (first, second) = embedded_cubins(data)
    assert _elf_length(first.data, 0) == len(first.data)
    assert _elf_length(first.data[:-1], 0) is None           # its sections run past the end
    assert _elf_length(b"\x7fELF" + bytes(60), 0) is None     # not a CUDA ELF
    # Found anywhere in a byte string, once each, however often it is stored.
    blob = b"junk\x7fELF" + first.data + bytes(7) + second.data + first.data
    found = embedded_cubins(blob)
    assert [c.data for c in found] == [first.data, second.data]


def test_sass_of_cublas_report_audits_the_code_that_ran():
    disassembler_or_skip()
    (a,) = audit(str(CUBLAS_SGEMM)).audits
    prof = load(CUBLAS_SGEMM)[0]
    assert a.kind == "report" and a.kernel == prof.identity.mangled and a.arch == "sm_90a"
    assert a.dtype == "fp32"                                   # from the run manifest
    # The same kernel the counters saw: its registers, and its FFMAs with their reuse flags,
    # which the report's own SASS view drops.
    assert a.sass.registers == prof.launch.registers_per_thread == 254
    ffma = [i for i in a.sass.instructions if i.split()[0] == "FFMA"]
    assert len(ffma) == 1280 and sum(".reuse" in i for i in ffma) > 600
    assert prof.correlation is not None
    assert ".reuse" not in prof.correlation.sass_of(min(prof.correlation.pc_samples()))
    # cuBLAS's copies carry the 128-byte L2 prefetch hint (LDGSTS.E.LTC128B).
    assert a.families["ldgsts"].get("LDGSTS.E.LTC128B") == 24
    assert a.fingerprint == () and a.resources is None


def test_sass_of_a_stage_report_holds_the_kernel_to_the_stage_fingerprint():
    disassembler_or_skip()
    (a,) = audit(str(PERSISTENT)).audits
    assert a.dtype == "bf16" and a.fingerprint_ok
    assert {c.name for c in a.fingerprint} >= {"tma", "gmma", "no hmma"}


def test_sass_of_a_group_report_audits_both_launches():
    disassembler_or_skip()
    audits = audit(str(GROUP)).audits
    assert [a.kernel for a in audits] == [p.identity.mangled for p in load(GROUP)]
    assert audits[0].kernel.startswith("nvjet_sm90") and "bias_act_inplace" in audits[1].kernel
    assert all(a.fingerprint == () for a in audits)   # cublas+gelu is not a stage with code


def test_sass_picks_a_launch_of_a_report_as_the_other_commands_name_it():
    """REPORT#ID, REPORT:REGEX and REPORT:REGEX@N audit only the launches they name (the
    group report: cuBLAS's nvjet kernel, then the elementwise pass), and the listing with them;
    a pick that names nothing is one sentence."""
    disassembler_or_skip()
    assert [a.kernel[:10] for a in audit(f"{GROUP}#1").audits] == [
        load(GROUP)[1].identity.mangled[:10]]
    (nvjet,) = audit(f"{GROUP}:nvjet").audits
    assert nvjet.kernel.startswith("nvjet_sm90")
    (second,) = audit(f"{GROUP}:.@1").audits
    assert "bias_act_inplace" in second.kernel
    (listed,) = audit(f"{GROUP}:nvjet", report=ReportAuditOptions(listing=True)).audits
    assert listed.listing is not None and listed.listing.rows
    for bad, why in ((f"{GROUP}#9", "has no kernel launch #9"),
                     (f"{GROUP}:nomatch", "no kernel matches 'nomatch'"),
                     (f"{GROUP}:.@4", "@4 is out of range (0 to 1)")):
        result = CliRunner().invoke(app, ["sass", bad])
        assert result.exit_code != 0 and why in result.output and "Traceback" not in result.output


def test_save_cubin_writes_the_module_that_cuobjdump_reads_as_a_cubin(tmp_path):
    disassembler_or_skip()
    runner = CliRunner()
    result = runner.invoke(app, ["sass", str(GROUP), "--save-cubin", str(tmp_path / "out"),
                                 "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    files = sorted((tmp_path / "out").glob("*.cubin"))
    assert len(files) == 2 and all(f.name.startswith("cublas+gelu-bf16-4096x4096x4096.") for f in files)
    assert [d["kind"] for d in doc] == ["report", "report"]
    assert all(any(str(tmp_path) in n for n in d["notes"]) for d in doc)
    # The saved file is a cubin like any other: audited as one, the same instructions.
    again = {a.kernel: a for f in files for a in audit(str(f)).audits}
    for d in doc:
        same = again[d["kernel"]]
        assert sum(same.sass.opcodes.values()) == d["instructions"]
        assert {k: sum(v.values()) for k, v in same.families.items()} == \
            {k: v["count"] for k, v in d["families"].items()}


def test_bad_input_is_one_sentence_and_exit_2(tmp_path):
    disassembler_or_skip()
    runner = CliRunner()
    # A report whose cubins were altered (a real capture always carries them).
    altered = tmp_path / "altered.ncu-rep"
    with lzma.open(GROUP) as src:
        altered.write_bytes(src.read().replace(b"\x7fELF", b"\x7fELG"))
    # The wrong --arch for the code that ran; --save-cubin for a stage; no such report.
    cases = [
        (["sass", str(altered)], "carries no cubin of its kernels"),
        (["sass", str(CUBLAS_SGEMM), "--arch", "sm_100a", "--save-cubin", str(tmp_path / "no")],
         "ran as sm_90a code, not sm_100a"),
        (["sass", "hgemm_bcf", "--save-cubin", str(tmp_path)], "is not one"),
        (["sass", str(tmp_path / "missing.ncu-rep.xz")], "does not exist"),
    ]
    for argv, words in cases:
        result = runner.invoke(app, argv)
        assert result.exit_code == 2, (argv, result.output)
        assert words in result.output and "Traceback" not in result.output
        assert len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "no").exists()   # refused before anything was written


def test_save_cubin_into_a_file_is_refused_in_a_sentence(tmp_path):
    disassembler_or_skip()
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(PerfscopeError, match="cannot write"):
        audit(str(GROUP), report=ReportAuditOptions(save_to=blocker / "sub"))


# ------------------------------------------------------------------ --listing


def test_listing_puts_the_reports_counts_on_the_cubins_instructions():
    disassembler_or_skip()
    (a,) = audit(str(CUBLAS_SGEMM), report=ReportAuditOptions(listing=True)).audits
    listing = a.listing
    prof = load(CUBLAS_SGEMM)[0]
    # The hot loop as the profile counts it, every row the cubin's own text at its offset.
    assert listing.note is None and len(listing.rows) == prof.hot_loop.instructions == 1154
    executed = [r.executed for r in listing.rows]
    assert min(executed) >= listing.hot_share * max(executed)
    for r in listing.rows[:50]:
        assert a.sass.instructions[r.address // 16] == r.sass
    assert sum(r.sass.split()[0] == "FFMA" for r in listing.rows) == 1024
    assert sum(".reuse" in r.sass for r in listing.rows) > 500
    assert 0.9 * listing.total_samples < listing.samples <= listing.total_samples
    # Stall reasons per instruction, "selected" (issuing) never among them.
    assert all(k != "selected" for r in listing.rows for k, _ in r.reasons)
    assert any(k == "short_scoreboard" for r in listing.rows for k, _ in r.reasons)


def test_listing_refuses_code_that_does_not_line_up_and_counts_that_were_not_collected():
    from perfscope.hotloop import hot_listing
    prof = load(CUBLAS_SGEMM)[0]
    shifted = ["NOP"] + [f"FFMA R{i}, R1, R2, R3" for i in range(20000)]
    out = hot_listing(prof, shifted)
    assert out.rows == () and "does not line up" in out.note and "not the code that ran" in out.note

    class NoCounts:
        correlation = None
    out = hot_listing(NoCounts(), [])
    assert out.rows == () and out.note.startswith("not collected")


def test_listing_in_json_and_refused_for_a_stage(tmp_path):
    disassembler_or_skip()
    runner = CliRunner()
    result = runner.invoke(app, ["sass", str(PERSISTENT), "--listing", "--json"])
    assert result.exit_code == 0, result.output
    (doc,) = json.loads(result.output)
    rows = doc["listing"]["rows"]
    assert len(rows) == 59 and {"address", "sass", "executed", "samples", "reasons"} <= set(rows[0])
    assert sum(r["sass"].startswith("HGMMA") for r in rows) == 4
    text = runner.invoke(app, ["sass", str(PERSISTENT), "--listing"]).output
    assert "hot loop: 59 instructions" in text and "HGMMA.64x256x16.F32.BF16" in text
    result = runner.invoke(app, ["sass", "hgemm_bcf", "--listing"])
    assert result.exit_code == 2 and "is not a report" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_listing_says_how_much_an_ffma_loop_is_held_at_dispatch():
    """PS133's fix compares two compiles of an FFMA loop by their FFMAs held at dispatch:
    the listing says the share and how many FFMAs are held on about every execution
    (sgemm_fma_order 0.149, 670 of 2048; sgemm_dyn, the same instructions row by row,
    0.081), in text and in JSON; a wgmma loop has no such line."""
    disassembler_or_skip()
    runner = CliRunner()
    order = str(REFERENCE / "sgemm_fma_order-fp32-4096x4096x4096.ncu-rep.xz")
    text = runner.invoke(app, ["sass", order, "--listing"]).output
    assert "FFMAs held at dispatch: 0.149 of the samples; 670 of the loop's 2,048 FFMAs" in text
    result = runner.invoke(app, ["sass", str(REFERENCE / "sgemm_dyn-fp32-4096x4096x4096.ncu-rep.xz"),
                                 "--listing", "--json"])
    (doc,) = json.loads(result.output)
    held = doc["listing"]["ffma_dispatch"]
    assert held["ffmas"] == 2048 and held["share"] == pytest.approx(0.081, abs=0.001)
    (doc,) = json.loads(runner.invoke(app, ["sass", str(PERSISTENT), "--listing", "--json"]).output)
    assert doc["listing"]["ffma_dispatch"] is None
    assert "held at dispatch" not in runner.invoke(app, ["sass", str(PERSISTENT), "--listing"]).output

def test_listing_share_zero_lists_every_instruction_that_ran():
    """--listing-share 0: the code around the loop too (the tile-end wgmma drain, the
    prologue), every instruction that ran, with nearly all of the kernel's samples."""
    disassembler_or_skip()
    runner = CliRunner()
    result = runner.invoke(app, ["sass", str(PERSISTENT), "--listing", "--listing-share", "0",
                                 "--json"])
    assert result.exit_code == 0, result.output
    (doc,) = json.loads(result.output)
    listing = doc["listing"]
    rows = listing["rows"]
    assert listing["hot_share"] == 0 and len(rows) > 10 * 59
    assert all(r["executed"] > 0 for r in rows)
    assert any("WARPGROUP.DEPBAR.LE gsb0, 0x0" in r["sass"] for r in rows)
    assert sum(r["samples"] for r in rows) >= 0.99 * listing["total_samples"]
    text = runner.invoke(app, ["sass", str(PERSISTENT), "--listing", "--listing-share", "0"]).output
    assert f"every instruction that ran: {len(rows):,}" in text
    for args, words in ((["--listing-share", "0.2"], "goes with --listing"),
                        (["--listing", "--listing-share", "2"], "not a share between 0 and 1")):
        bad = runner.invoke(app, ["sass", str(PERSISTENT), *args])
        assert bad.exit_code == 2 and words in bad.output
        assert len(bad.output.strip().splitlines()) == 1


def test_of_several_modules_with_the_kernels_name_the_one_that_ran_is_taken():
    """Triton's autotuner compiles tiled_matmul_kernel once per configuration and the
    capture carries every module; only the report's SASS says which one ran (the first in
    the file is not it)."""
    disassembler_or_skip()
    from perfscope.hotloop import code_check
    prof = load(TRITON)[0]
    candidates = cubins_for(embedded_cubins(_plain(TRITON)), prof.identity.mangled)
    assert len(candidates) > 1
    (a,) = audit(str(TRITON), report=ReportAuditOptions(listing=True)).audits
    assert code_check(prof, a.sass.instructions) is None
    assert a.listing.note is None and len(a.listing.rows) == prof.hot_loop.instructions
    assert not any("modules" in n for n in a.notes)
    # The first module's code is another configuration's: it does not line up.
    from perfscope.audit import _disassemble_one
    from perfscope.sass.disasm import find_tool
    other = _disassemble_one(candidates[0], prof.identity.mangled, find_tool())
    assert "does not line up" in code_check(prof, other.kernel().instructions)


def test_each_module_a_kernel_ran_is_audited_once_however_many_launches():
    disassembler_or_skip()
    fixtures = Path(__file__).resolve().parent / "fixtures" / "h200"
    many = audit(str(fixtures / "many_launches.ncu-rep.xz")).audits   # 24 launches, 4 kernels
    assert [a.kernel for a in many] == ["ps_strided_copy", "ps_float4_copy", "ps_smem_transpose",
                                        "ps_regs_capped"]
    (mlp,) = audit(str(fixtures / "torch_mlp.ncu-rep.xz")).audits      # 6 launches of one
    assert mlp.kernel.startswith("nvjet_sm90")
