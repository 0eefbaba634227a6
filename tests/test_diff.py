"""perfscope diff: resolution, comparison, verdict and gates on real captures."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import FIXTURES, report
from typer.testing import CliRunner

from perfscope import diff as d
from perfscope.cli import app
from perfscope.diagnosis import ResolveOptions, resolve
from perfscope.errors import PerfscopeError
from perfscope.record import Diagnosed
from perfscope.structure import launch_shape

runner = CliRunner()
REFERENCE = Path(__file__).resolve().parents[1] / "reports" / "reference" / "h200"
EXTERNAL = Path(__file__).resolve().parent / "fixtures" / "external"


def side(name: str, regex: str | None = None) -> Diagnosed:
    arg = str(report(name)) + (f":{regex}" if regex else "")
    return resolve(arg)


def test_bank_conflicts_lead_the_verdict_for_the_transpose():
    result = d.compare(side("smem_transpose"), side("float4_copy"))
    assert result.verdict[0].code == "PS110"
    assert "bank conflicts" in result.verdict[0].sentence
    assert result.time[1].ratio > 2            # cycles
    assert "shared" in result.only_a


def test_instruction_families_only_in_b_are_named():
    result = d.compare(side("cublas_sgemm_4096"), side("cublas_hgemm_4096"))
    assert {"gmma", "tma"} <= set(result.only_b)
    sentences = " ".join(r.sentence for r in result.verdict)
    assert "HGMMA (wgmma)" in sentences and "UTMALDG (TMA)" in sentences


def test_unknown_shape_normalises_per_instruction_with_a_warning():
    result = d.compare(side("strided_copy"), side("float4_copy"))
    assert result.unit == "1k instructions"
    assert any("per executed instruction" in w for w in result.warnings)
    flops = d.compare(side("strided_copy"), side("float4_copy"), flops=2 * 64**3)
    assert flops.unit == "MFLOP" and not flops.warnings


def test_file_regex_picks_one_kernel_and_several_are_listed():
    assert side("spill", "_capped$").profile.name == "ps_regs_capped"
    with pytest.raises(PerfscopeError, match="ps_regs_capped, ps_regs_uncapped"):
        resolve(str(report("spill")))
    with pytest.raises(PerfscopeError, match="@N"):
        side("spill", "capped$")


def test_unknown_name_lists_stages():
    with pytest.raises(PerfscopeError, match="sgemm_naive"):
        resolve("no_such_stage_or_file")


def test_cublas_needs_a_manifest():
    with pytest.raises(PerfscopeError, match="run manifest"):
        resolve("cublas", like=side("float4_copy"))


def test_gates():
    result = d.compare(side("smem_transpose"), side("float4_copy"))
    assert d.check_gates(result, ["cycles_ratio>1.05"])
    assert not d.check_gates(result, ["cycles_ratio>100"])
    with pytest.raises(PerfscopeError, match="FIELD>NUMBER"):
        d.check_gates(result, ["cycles ratio is big"])
    with pytest.raises(PerfscopeError, match="duration_ratio"):
        d.check_gates(result, ["nonsense>1"])


def test_cli_gate_exits_1_with_the_reason():
    result = runner.invoke(app, ["diff", str(report("smem_transpose")), str(report("float4_copy")),
                                 "--fail-if", "cycles_ratio>1.05"])
    assert result.exit_code == 1
    assert "gate failed: cycles_ratio = 2.68" in result.output


def test_cli_fail_on_new_findings():
    result = runner.invoke(app, ["diff", str(report("smem_transpose")), str(report("float4_copy")),
                                 "--fail-on-new-findings", "--markdown"])
    assert result.exit_code == 1
    assert "PS110" in result.output
    ok = runner.invoke(app, ["diff", str(report("float4_copy")), str(report("smem_transpose")),
                             "--fail-on-new-findings", "--json"])
    assert ok.exit_code == 0, ok.output
    doc = json.loads(ok.output)
    assert doc["schema"] == "perfscope.diff/1" and doc["gate_failures"] == []


def test_cli_bad_input_is_one_sentence():
    result = runner.invoke(app, ["diff", str(report("spill")), str(report("float4_copy"))])
    assert result.exit_code == 2
    assert "pick one with" in result.output and "Traceback" not in result.output


# -- acceptance on the committed reference run ---------------------------------------

needs_reference = pytest.mark.skipif(
    not list(REFERENCE.glob("*.ncu-rep.xz")),
    reason="the reference run's reports are not committed yet (benchmarks/reference_run.py)")


def ref(stage: str, dtype: str) -> str:
    return str(REFERENCE / f"{stage}-{dtype}-4096x4096x4096.ncu-rep.xz")


@needs_reference
def test_reference_naive_vs_bcf_names_bank_conflicts_first():
    result = d.compare(resolve(ref("hgemm_naive", "fp16")), resolve(ref("hgemm_bcf", "fp16")))
    assert result.verdict[0].code in ("PS110", "PS111")


@needs_reference
def test_reference_rw_vs_cublas_names_wgmma_and_tma():
    a = resolve(ref("hgemm_bcf_dbf_rw", "fp16"))
    result = d.compare(a, resolve("cublas", ResolveOptions(reference=REFERENCE.parent), like=a))
    sentences = " ".join(r.sentence for r in result.verdict)
    assert "HGMMA" in sentences and "UTMALDG" in sentences


@needs_reference
def test_reference_sgemm_naive_vs_smem_names_coalescing_or_reuse():
    result = d.compare(resolve(ref("sgemm_naive", "fp32")), resolve(ref("sgemm_smem", "fp32")))
    tags = {f.tag for f in result.new_findings}
    assert tags & {"uncoalesced-global", "no-data-reuse"}
    assert result.verdict[0].code in ("PS101", "PS102", "PS103")


@needs_reference
def test_profiled_manifest_takes_its_timing_from_bench_json():
    """A profiled run is not timed; the bench.json beside it supplies the ratio to cuBLAS."""
    from perfscope.manifest import manifest_beside
    from perfscope.rules import evaluate

    path = ref("hgemm_bcf_dbf_rw", "fp16")
    manifest = manifest_beside(path)
    ratio = manifest.timing.ratio_to_reference.median
    assert 0.3 < ratio < 0.7
    ev = evaluate(resolve(path).profile, manifest)
    # The ratio bounds every estimate: the gap to cuBLAS plus the stated margin.
    assert ev.reference_cap == pytest.approx(1 - ratio + 0.05, abs=1e-6)
    legacy = next(f for f in ev.findings if f.code == "PS141")
    assert 0 < legacy.estimated_gain <= ev.reference_cap


# -- rough edges (issue 16, items 7 to 10) ------------------------------------------


def test_heading_follows_the_cycle_ratio():
    from perfscope.render.diff import verdict_heading

    slower = d.compare(side("smem_transpose"), side("float4_copy"))
    assert verdict_heading(slower).startswith("Why A is slower than B (2.68x")
    faster = d.compare(side("float4_copy"), side("smem_transpose"))
    assert "slower" not in verdict_heading(faster) and "(0.37x B's cycles)" in verdict_heading(faster)
    same = d.compare(side("float4_copy"), side("float4_copy"))
    assert verdict_heading(same).startswith("A and B take the same cycles")
    for fmt in ([], ["--markdown"]):
        out = runner.invoke(app, ["diff", str(report("float4_copy")), str(report("smem_transpose")),
                                  *fmt]).output
        assert verdict_heading(faster) in out and "Why A is slower" not in out


def test_ratio_gate_with_b_at_zero_says_undefined_and_names_the_absolute_field():
    result = d.compare(side("smem_transpose"), side("cublas_hgemm_4096"))
    assert result.fields()["shared_excess_b"] == 0 and result.fields()["shared_excess_ratio"] is None
    (why,) = d.check_gates(result, ["shared_excess_ratio>1"])
    assert "undefined because B's shared excess % is 0" in why
    assert "--fail-if 'shared_excess_a>N'" in why and "not collected" not in why
    assert not d.check_gates(result, ["shared_excess_a>2000"])
    cli = runner.invoke(app, ["diff", str(report("smem_transpose")), str(report("cublas_hgemm_4096")),
                              "--fail-if", "shared_excess_ratio>1"])
    assert cli.exit_code == 1 and "undefined because B's" in cli.stderr


@needs_reference
def test_shape_that_contradicts_a_manifest_is_refused():
    a, b = ref("hgemm_naive", "fp16"), ref("hgemm_bcf", "fp16")
    refused = runner.invoke(app, ["diff", a, b, "--shape", "4096x4096x512"])
    assert refused.exit_code == 2
    assert refused.output.count("\n") == 1
    assert "--shape 4096x4096x512 contradicts A's run manifest, which says 4096x4096x4096" in refused.output
    agreed = runner.invoke(app, ["diff", a, b, "--shape", "4096x4096x4096", "--json"])
    assert agreed.exit_code == 0, agreed.output
    assert json.loads(agreed.stdout)["unit"] == "MFLOP"
    # Without manifests --shape is what sets the unit.
    bare = runner.invoke(app, ["diff", str(report("strided_copy")), str(report("float4_copy")),
                               "--shape", "64x64x64", "--json"])
    assert bare.exit_code == 0 and json.loads(bare.stdout)["unit"] == "MFLOP"


@needs_reference
def test_reference_works_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["diff", "hgemm_bcf_dbf_rw", "cublas", "--reference", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["b"]["name"].startswith("nvjet_sm90")
    local = runner.invoke(app, ["diff", "hgemm_naive", "hgemm_bcf"])
    assert local.exit_code == 2
    assert str(tmp_path / "reports" / "local") in local.output and "--reference" in local.output
    missing = runner.invoke(app, ["diff", "hgemm_naive", "hgemm_bcf", "--reference-dir", "elsewhere"])
    assert missing.exit_code == 2
    assert "the reference run folder elsewhere does not exist" in missing.output


def test_no_reference_run_names_the_folders_searched(tmp_path, monkeypatch):
    from perfscope import locations

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(locations, "CHECKOUT", tmp_path / "site-packages")
    with pytest.raises(PerfscopeError) as err:
        locations.existing_reference_root()
    assert str(tmp_path / "reports" / "reference") in str(err.value)
    assert str(tmp_path / "site-packages" / "reports" / "reference") in str(err.value)
    assert "--reference-dir" in str(err.value)


# -- launch structure and the spread of the gap (issue 17) ------------------------------


def _claims_fit(result) -> None:
    """No reason claims more than the gap, and all of them together not more either."""
    claims = [r.estimated_gain for r in result.verdict if r.estimated_gain is not None]
    assert all(0 <= c <= result.gap + 1e-4 for c in claims)    # claims are rounded to 1e-4
    assert sum(claims) <= result.gap + 1e-3


def test_spread_scales_modelled_claims_and_shares_the_rest():
    def claim(modelled, open_, group):
        return d._Claim("lead", "", None, "fix", "finding", modelled, open_, group)

    # Modelled claims above the gap are scaled down to it; nothing is left for the open one.
    shares, rest = d._spread([claim(0.3, False, "a"), claim(0.1, False, "b"),
                              claim(None, True, "c")], 0.2)
    assert shares == [pytest.approx(0.15), pytest.approx(0.05), 0.0] and rest == 0.0
    # Below the gap, the open claims share what is left in equal parts.
    shares, _ = d._spread([claim(0.05, False, "a"), claim(None, True, "b"),
                           claim(0.02, True, "c")], 0.13)
    assert shares == [0.05, 0.03, 0.05]
    # Two findings of one overlap group share the larger one's estimate, not their sum;
    # with no open claim, the rest of the gap stays unexplained.
    shares, rest = d._spread([claim(0.2, False, "latency"), claim(0.1, False, "latency")], 0.5)
    assert sum(shares) == pytest.approx(0.2) and rest == pytest.approx(0.3)


@needs_reference
def test_reference_ws_vs_cublas_names_the_structure():
    a = resolve(ref("hgemm_tma_wgmma_ws", "fp16"))
    result = d.compare(a, resolve(ref("cublas_hgemm", "fp16")))
    assert not result.improved and result.gap == pytest.approx(1 - 285114 / 326980, abs=1e-3)
    aspects = {x.name: x for x in result.structure}
    grid = aspects["grid"]
    assert grid.differs and "3.88 waves" in grid.a and "1.00 wave" in grid.b and "persistent" in grid.b
    assert aspects["cluster"].differs and "2-CTA clusters" in aspects["cluster"].b
    assert "multicast" in aspects["cluster"].b
    # Both specialise warps with setmaxnreg: named side by side, not a difference.
    ws = aspects["warp specialisation"]
    assert not ws.differs and "setmaxnreg" in ws.a and "setmaxnreg" in ws.b
    assert aspects["epilogue"].differs and "UTMASTG" in aspects["epilogue"].b
    assert "STG" in aspects["epilogue"].a
    kinds = [r.kind for r in result.verdict]
    assert {"grid", "cluster", "epilogue"} <= set(kinds)
    assert "3.88 waves" in next(r.sentence for r in result.verdict if r.kind == "grid")
    _claims_fit(result)


@needs_reference
def test_reference_child_faster_leads_with_what_it_improved():
    from perfscope.render.diff import verdict_heading, verdict_sections

    a = resolve(ref("hgemm_tma_wgmma_ws", "fp16"))
    b = resolve(ref("hgemm_tma_wgmma", "fp16"))
    result = d.compare(a, b)
    assert result.improved and result.gap == pytest.approx(1 - 326751 / 502330, abs=1e-3)
    assert "improved" in verdict_heading(result)
    specialisation = next(r for r in result.verdict if r.kind == "warp specialisation")
    assert "setmaxnreg" in specialisation.sentence and "of B's time" in specialisation.sentence
    # B's findings A no longer has are what A improved; A's own are what remains.
    gone = {f.code for f in result.gone_findings}
    cited = " ".join(r.sentence for r in result.verdict)
    assert gone and all(code in cited for code in gone)
    assert [r.code for r in result.remaining] == [f.code for f in a.evaluation.findings][:5]
    headings = [h for h, _ in verdict_sections(result)]
    assert headings[0] == verdict_heading(result) and headings[1] == "What remains in A"
    _claims_fit(result)


@needs_reference
def test_reference_path_reason_carries_the_path_structure():
    a = resolve(ref("hgemm_bcf_dbf_rw", "fp16"))
    result = d.compare(a, resolve(ref("cublas_hgemm", "fp16")))
    path = [r for r in result.verdict if r.kind == "path"]
    assert len(path) == 1 and "HGMMA (wgmma)" in path[0].sentence
    # Clusters, setmaxnreg and the TMA store come with that path: no reasons of their own.
    assert not {"cluster", "warp specialisation", "epilogue"} & {r.kind for r in result.verdict}
    assert "warp specialisation" in path[0].sentence
    _claims_fit(result)


def test_structure_of_the_cublas_fixtures():
    from perfscope.structure import launch_shape

    h = side("cublas_hgemm_4096").profile
    shape = launch_shape(h, None)
    assert shape.cluster_size == 2 and shape.multicast and shape.tma_stores > 0
    assert shape.specialised and shape.warpgroups == 3
    # Without a manifest the shape is unknown, so persistence is not claimed either way.
    assert shape.persistent is None and shape.tile is None


@needs_reference
def test_reference_cluster_variant_is_not_told_to_add_clusters():
    """The cluster variant (2-CTA clusters, B multicast) is slower than the persistent
    stage it varies: the advice for its cluster is to drop or decouple it, never to launch
    the clusters it already has; the other way round (the persistent stage slower than a
    clustered kernel) the usual advice stands."""
    slow = resolve(ref("hgemm_tma_wgmma_cluster", "bf16"))
    fast = resolve(ref("hgemm_tma_wgmma_persistent", "bf16"))
    result = d.compare(slow, fast)
    (cluster,) = [r for r in result.verdict if r.kind == "cluster"]
    assert not result.improved and "without multicast" in cluster.fix
    assert "Launch 2-CTA clusters" not in cluster.fix
    assert d.WITHOUT_FIX["cluster"].startswith("{fast}")
    ws = resolve(ref("hgemm_tma_wgmma_ws", "fp16"))
    (usual,) = [r for r in d.compare(ws, resolve(ref("cublas_hgemm", "fp16"))).verdict
                if r.kind == "cluster"]
    assert usual.fix == d.STRUCTURE_FIX["cluster"]


@needs_reference
def test_a_ping_pong_kernel_is_told_what_its_own_tiles_cost():
    """hgemm_fused_pingpong is hgemm_fused_bias_act with each consumer warpgroup owning its
    64 x 256 tiles (1.06x the cycles on the H200): the reason is the consumers' tiles (one
    reason, not a second one for the smaller tile), its advice says what owning them costs,
    never to add the ping-pong it has, and PS124 (whose fix is ping-pong) is not cited; the
    other way round the usual advice stands."""
    fused = REFERENCE / "fused"
    pp = resolve(str(fused / "hgemm_fused_pingpong-bf16-4096x4096x4096.ncu-rep.xz"))
    coop = resolve(str(fused / "hgemm_fused_bias_act-bf16-4096x4096x4096.ncu-rep.xz"))
    result = d.compare(pp, coop)
    first = result.verdict[0]
    assert not result.improved and first.kind == "consumer tiles"
    assert "owns whole 64x256 tiles (ping-pong)" in first.sentence
    assert "share each 128x256 tile (cooperative)" in first.sentence
    assert first.fix.startswith("B's consumer warpgroups share each tile and it is faster")
    assert "PS124" not in {r.code for r in result.verdict}
    assert "tile" not in {r.kind for r in result.verdict}
    assert first.estimated_gain == pytest.approx(result.gap, abs=1e-4)
    back = d.compare(coop, pp)
    assert back.improved and back.verdict[0].kind == "consumer tiles"
    _claims_fit(result)


@needs_reference
@pytest.mark.parametrize(("shape", "lead"), [
    ("BN=64,{}STAGES=12-bf16-64x8192x8192", ({"finding", "grown"}, "PS170")),
    ("AROWS=256,BM=256,{}STAGES=4-bf16-256x8192x8192", ({"finding"}, "PS152")),
])
def test_a_kernel_that_multicasts_is_never_told_to_multicast(shape, lead):
    """hgemm_small_m with A multicast across pairs of N tiles (MCAST=2) is slower than
    without: at 64 x 8192^2 its DRAM stream is slower (PS170: 0.84 against 0.86 of the
    practical rate, where the other sits at the rule's threshold, so PS170 is A's alone or
    grew) and the cluster reason
    says why (the pair's lock step: drop or decouple the multicast); at 256 x 8192^2 a grid
    of 64 CTAs leads (its split-K clusters of 4 did not all fit: PS152). Both sides launch
    clusters at 256, so the feature the advice is about is the multicast, which only the
    slower side has."""
    fused = REFERENCE / "fused"
    pair = resolve(str(fused / f"hgemm_small_m@{shape.format('MCAST=2,')}.ncu-rep.xz"))
    alone = resolve(str(fused / f"hgemm_small_m@{shape.format('')}.ncu-rep.xz"))
    result = d.compare(pair, alone)
    kinds, code = lead
    assert not result.improved and result.verdict[0].code == code
    assert result.verdict[0].kind in kinds
    (cluster,) = [r for r in result.verdict if r.kind == "cluster"]
    assert "without multicast" in cluster.fix and "Launch 2-CTA clusters" not in cluster.fix
    _claims_fit(result)


@needs_reference
def test_tile_rows_that_share_b_beat_the_split_256_row_tile():
    """hgemm_small_m at 256 x 8192^2 with two 128-row tiles per cluster sharing B (MPAIR=2,
    2026-12-02) against the 256-row tile split over K in 2-CTA clusters (2026-12-01's kernel):
    A is faster, and the diff says so with the tile and the cluster's multicast (half of A's
    TMA loads, none of B's), each claim fitting the gap."""
    fused = REFERENCE / "fused"
    stem = "hgemm_small_m@AROWS={},BM={},{}STAGES={}-bf16-256x8192x8192.ncu-rep.xz"
    pair = resolve(str(fused / stem.format(128, 128, "MPAIR=2,", 6)))
    split = resolve(str(fused / stem.format(256, 256, "", 4)))
    result = d.compare(pair, split)
    assert result.improved
    kinds = [r.kind for r in result.verdict]
    assert "tile" in kinds and "cluster" in kinds
    (cluster,) = [r for r in result.verdict if r.kind == "cluster"]
    assert "50% of TMA loads multicast" in cluster.sentence and "0% of TMA loads" in cluster.sentence
    _claims_fit(result)


def test_a_larger_tile_on_as_many_ctas_is_not_told_about_its_grid():
    """hgemm_small_m at 256 x 8192^2, 2026-12-04 (probes/): paired 128 x 256 tiles split
    over the grid in two (GSPLIT=2) against paired 128 x 128 tiles, 128 CTAs in 0.97 waves
    each. The larger tile is slower, and the grid is not why: the advice says so and names
    the split's partial sums (STG beside the TMA stores) and the wider wgmma's feed."""
    probes = REFERENCE / "probes"
    stem = "hgemm_small_m@AROWS=128,BM=128,{}MPAIR=2,STAGES={}-bf16-256x8192x8192.ncu-rep.xz"
    wide = resolve(str(probes / stem.format("BN=256,GSPLIT=2,", 4)))
    narrow = resolve(str(probes / stem.format("", 6)))
    result = d.compare(wide, narrow)
    assert not result.improved
    (tile,) = [r for r in result.verdict if r.kind == "tile"]
    assert "on as many CTAs (128, 0.97 waves), so it is not the grid" in tile.fix
    assert "if it splits K" in tile.fix and "STG" in tile.fix and "wider wgmma" in tile.fix
    assert "fuller last wave" not in tile.fix
    _claims_fit(result)
    # Where the grid can be the reason, the usual advice stands: persistent CTAs (the tile
    # sets how many tiles each walks and its last round) or another count of waves.
    shapes = (launch_shape(wide.profile, wide.manifest), launch_shape(narrow.profile, narrow.manifest))
    same = SimpleNamespace(shapes=shapes, names=("A", "B"))
    assert "not the grid" in d._without_fix("tile", same)
    for slow, fast in ((dataclasses.replace(shapes[0], persistent=True), shapes[1]),
                       (shapes[0], dataclasses.replace(shapes[1], waves=0.5))):
        assert "fuller last wave" in d._without_fix("tile", SimpleNamespace(shapes=(slow, fast),
                                                                            names=("A", "B")))
    # A kernel without wgmma is not told about a wgmma's feed.
    hmma = dataclasses.replace(shapes[0], mma="HMMA.16816.F32.BF16")
    fix = d._without_fix("tile", SimpleNamespace(shapes=(hmma, shapes[1]), names=("A", "B")))
    assert "wgmma" not in fix and "operand feed per CTA" in fix


def _bm192_pair() -> tuple[Diagnosed, Diagnosed]:
    """The persistent template at BM 192 (three consumer warpgroups, each k16 step two wgmma
    m64n128k16) and the balanced stage (BM 128, m64n256k16) at 6144x4096x4096 fp16 on an
    H100, 128 CTAs each (probes/, 2026-12-07): 512 and 768 tiles, 4 and 6 a CTA."""
    probes = REFERENCE / "probes"
    wide = resolve(str(probes / ("hgemm_tma_wgmma_balanced@BM=192,BOXES=2,DEFER=0,STAGES=3-"
                                 "fp16-6144x4096x4096-h100.ncu-rep.xz")))
    narrow = resolve(str(probes / "hgemm_tma_wgmma_balanced-fp16-6144x4096x4096-h100.ncu-rep.xz"))
    return wide, narrow


def test_a_larger_persistent_tile_in_whole_rounds_is_not_told_about_its_grid():
    """The 192-row tile takes 1.02x the cycles of the 128-row one on as many persistent
    CTAs, each walking a whole number of tiles: no last round is short on either side, so
    the grid is not why, and what the larger tile costs is its narrower wgmma (ptxas would
    not compile m64n256 at 512 threads): 1.2x the shared-memory operand bytes a FLOP
    (L1/TEX 72% busy against 62%)."""
    wide, narrow = _bm192_pair()
    shapes = (launch_shape(wide.profile, wide.manifest), launch_shape(narrow.profile, narrow.manifest))
    assert [(s.tiles, s.ctas, s.whole_rounds) for s in shapes] == [(512, 128, True), (768, 128, True)]
    result = d.compare(wide, narrow)
    assert not result.improved
    (tile,) = [r for r in result.verdict if r.kind == "tile"]
    assert "on as many CTAs (128, each walking 4 and 6 tiles, no short last round)" in tile.fix
    assert "narrower wgmma (64x128 against 64x256: 1.20x the shared-memory operand bytes" in tile.fix
    assert "fuller last wave" not in tile.fix and "wider wgmma" not in tile.fix
    _claims_fit(result)
    # A persistent grid with a short last round (512 tiles on 132 CTAs) may be the reason.
    short = dataclasses.replace(shapes[0], ctas=132)
    fix = d._without_fix("tile", SimpleNamespace(shapes=(short, dataclasses.replace(shapes[1], ctas=132)),
                                                 names=("A", "B")))
    assert "fuller last wave" in fix


def test_clock_note_comes_from_one_percent_where_both_are_at_the_power_cap():
    """The 192-row tile ran at 1592 MHz and the 128-row one at 1566 (1.6% apart), both at
    the power cap: 1.02x the cycles is 1.01x the time, and the diff says so. Clocks as
    found that far apart without the cap on both sides say nothing (under 2%)."""
    wide, narrow = _bm192_pair()
    assert d.compare(wide, narrow).clock == (
        "A ran at 1592 MHz and B at 1566 MHz (B's clock 1.6% lower): A takes 1.01x B's time "
        "and 1.02x its cycles; A and B at the power cap (PS171).")
    ev = narrow.evaluation
    uncapped = dataclasses.replace(narrow, evaluation=dataclasses.replace(
        ev, findings=tuple(f for f in ev.findings if f.code != "PS171")))
    assert d.clock_note(wide, uncapped) is None


def test_parked_waits_are_no_wait_a_faster_kernel_removed():
    """hgemm_small_m at 64 x 4096^2 after its split's partial was pushed by st.async
    (probes/, 2026-12-04) against the 2026-12-02 kernel that reduced it between two cluster
    barriers (fused/): A is faster. B's membar stalls (13% of all) and most of its barrier
    stalls were its producer warpgroup's, parked at fused.cu:618 and, on their way out, at
    619: left out, B's working warps stall on barrier 18% of the time against A's 13% and
    on membar 1%, no stall moved by the 10% a claim needs, and the verdict names no wait
    (PS126 once named the fence; what the push removed, the consumers' barriers around the
    reduction, no rule reads yet)."""
    stem = "hgemm_small_m@BN=64-bf16-64x4096x4096.ncu-rep.xz"
    result = d.compare(resolve(str(REFERENCE / "probes" / stem)), resolve(str(REFERENCE / "fused" / stem)))
    assert result.improved
    assert not [r for r in result.verdict if r.kind == "stalls"]
    assert not [r for r in result.verdict if "membar" in r.sentence or "PS126" in r.sentence]
    barrier = next(s for s in result.stalls if s.reason == "barrier")
    assert 0.12 < barrier.share_a < 0.13 and 0.17 < barrier.share_b < 0.19
    (parked,) = result.b.profile.parked
    assert parked.line == 618 and 0x5E70 in parked.addresses   # fused.cu:619's wait


def test_a_stall_that_grew_names_the_instructions_that_carry_it():
    """The persistent template with its last tile rows cut into narrower pieces (probes/,
    2026-12-05: 1.18x the cycles) against the reference run's unsplit kernel: its consumers
    wait longer at the ring's full barrier, and the reason says where: the mbarrier wait's
    branch in the whole tiles' k loop and in the two piece loops."""
    split = REFERENCE / "probes" / "hgemm_tma_wgmma_persistent@STREAMK=4-bf16-4096x4096x4096.ncu-rep.xz"
    result = d.compare(resolve(str(split)), resolve(ref("hgemm_tma_wgmma_persistent", "bf16")))
    (grown,) = [r for r in result.verdict if r.kind == "stalls"]
    assert grown.sentence.startswith("A's warps stall on long_scoreboard 49% of their stall time "
                                     "against 38% in B")
    assert grown.fix == ("Look at A's instructions that carry it: 0x2640 BRA at hopper.cuh:251 "
                         "(3,888 samples), 0x7af0 BRA at hopper.cuh:251 (2,239 samples), 0x6da0 "
                         "BRA at hopper.cuh:251 (1,810 samples).")


def test_a_stall_without_hotspots_points_at_them_in_general():
    shift = d.StallShift("barrier", 0.4, 0.1, 3.0, 1.0)
    (reason,) = d._stall_claims([shift], (), cut=False)
    assert reason.fix == "See the hotspots: the instructions that carry these stalls."
    (cut,) = d._stall_claims([d.StallShift("barrier", 0.1, 0.4, 1.0, 3.0)], (), cut=True)
    assert cut.fix == "" and cut.sentence.endswith("a wait A cut.")


def test_the_consumers_tiles_are_read_off_the_tile_and_the_mma_shape():
    """A tile of one wgmma fragment cannot be shared by two consumer warpgroups (ping-pong);
    one fragment per consumer is a shared (cooperative) tile; anything else, or a launch
    without producer/consumer warpgroups, is not known."""
    from perfscope.structure import LaunchShape, mma_fragment

    assert mma_fragment("HGMMA.64x256x16.F32.BF16") == (64, 256)
    assert mma_fragment("HMMA.16816.F32.BF16") is None
    assert mma_fragment(None) is None

    def shape(tile, mma="HGMMA.64x256x16.F32.BF16", warpgroups=3, setmaxreg=True):
        return LaunchShape(ctas=132, waves=1.0, persistent=True, tile=tile, tile_source="run manifest",
                           mma=mma, cluster=None, multicast=None, warpgroups=warpgroups,
                           setmaxreg=setmaxreg, tma_stores=1.0, stg_stores=0.0, stsm=0.0)

    assert shape((64, 256)).consumers_own_tiles is True
    assert shape((128, 256)).consumers_own_tiles is False
    assert shape((256, 128), "HGMMA.64x128x16.F32.BF16").consumers_own_tiles is None
    # 128 x 128 with HGMMA.64x128: each consumer 64 rows, or each owning 128 (128 registers).
    assert shape((128, 128), "HGMMA.64x128x16.F32.BF16").consumers_own_tiles is None
    assert shape((64, 256), warpgroups=2).consumers_own_tiles is None      # one consumer
    assert shape((64, 256), setmaxreg=False).consumers_own_tiles is None   # not specialised
    assert shape(None).consumers_own_tiles is None


def test_a_serialized_wgmma_pipeline_is_the_reason_not_the_idle_it_causes():
    """hgemm_fused_quant (fp8) holding its bias across the k loop, which ptxas serialized
    (C7515), against the committed stage (fixtures/h200/wgmma-serialized): 1.11x the cycles
    with one WARPGROUP.DEPBAR per HGMMA against one per 3.9. The lead reason is the pipeline,
    with its own fix (keep wgmmas in flight; PS144 names ptxas's reason), PS124's larger idle
    folded into it rather than blamed; the other way round it is what A improved. Pipelined
    pairs show no such row."""
    folder = FIXTURES / "wgmma-serialized"
    held = resolve(str(folder / "held" / "hgemm_fused_quant-bf16-4096x4096x4096.ncu-rep.xz"))
    committed = resolve(str(folder / "committed" / "hgemm_fused_quant-bf16-4096x4096x4096.ncu-rep.xz"))
    result = d.compare(held, committed)
    first = result.verdict[0]
    assert not result.improved and first.kind == "wgmma pipeline"
    assert "1.00 waits (WARPGROUP.DEPBAR) per wgmma" in first.sentence
    assert "3.9 wgmmas per wait" in first.sentence
    assert first.fix.startswith("Keep several wgmmas in flight") and "PS144" in first.fix
    assert "PS124" not in {r.code for r in result.verdict[1:]}
    back = d.compare(committed, held)
    assert back.improved and back.verdict[0].kind == "wgmma pipeline"
    assert d.PIPELINE not in {a.name for a in d.compare(committed, committed).structure}
    _claims_fit(result)


@needs_reference
def test_a_finding_both_sides_have_is_a_reason_when_it_grew():
    """hgemm_fused_quant against its parent hgemm_fused_bias_act: both pay their epilogue
    math with the tensor pipe idle (PS124), the quantising one more (9% of its time against
    6%), and that growth, not the store path the two also differ in, is what the verdict
    leads with; the other way round it is what A improved."""
    fused = REFERENCE / "fused"
    quant = resolve(str(fused / "hgemm_fused_quant-bf16-4096x4096x4096.ncu-rep.xz"))
    parent = resolve(str(fused / "hgemm_fused_bias_act-bf16-4096x4096x4096.ncu-rep.xz"))
    result = d.compare(quant, parent)
    first = result.verdict[0]
    assert not result.improved and first.kind == "grown" and first.code == "PS124"
    assert "in both but larger in A" in first.sentence
    assert 0.01 <= first.estimated_gain <= result.gap + 1e-4   # shares are rounded to 4 places
    # The store path the two also differ in takes only what PS124 leaves of the gap.
    store = next(r for r in result.verdict if r.kind == "epilogue")
    assert store.estimated_gain <= result.gap - first.estimated_gain + 1e-4
    back = d.compare(parent, quant)
    assert back.improved and back.verdict[0].kind == "grown" and "larger in B" in back.verdict[0].sentence
    _claims_fit(result)


def test_a_one_dimensional_grid_names_no_tile_shape():
    """Triton launches one CTA per tile on a 1-D grid: that says how many tiles there are,
    not their shape, so the launch structure leaves the tile unknown (it used to read
    "4096x1 per CTA" off the grid) and no tile reason is claimed against cuBLAS's."""
    external = Path(__file__).resolve().parent / "fixtures" / "external"
    result = d.compare(resolve(str(external / "triton_fp32_ieee.ncu-rep.xz")),
                       resolve(str(external / "torch_fp32_4096.ncu-rep.xz")))
    tile = next(a for a in result.structure if a.name == "tile")
    assert tile.a.startswith("tile not known") and not tile.differs
    assert "x1 per CTA" not in " ".join(r.sentence for r in result.verdict)
    assert "128x256 per CTA (grid)" in tile.b     # cuBLAS's 2-D grid still gives its tile


@needs_reference
def test_a_grown_finding_is_compared_under_the_roofline_not_the_reference_gap():
    """hgemm_small_m at 64x4096x4096 against cuBLASLt's GELU_BIAS kernel (the external
    set's): both stream below the DRAM rate (PS170). cuBLASLt's estimate is capped at its
    5% gap to cuBLAS, which says nothing about how far its own stream is from its floor, so
    the diff compares the two shares under the roofline alone (its 17%, not its 5%; 37%
    before the launch's fixed time, PS173's, left the bandwidth gap)."""
    fused = REFERENCE / "fused"
    ours = resolve(str(fused / "hgemm_small_m@BN=64-bf16-64x4096x4096.ncu-rep.xz"))
    lt = resolve(str(EXTERNAL / "cublaslt_gelu_bias_m64_4096.ncu-rep.xz"))
    result = d.compare(ours, lt)
    (theirs,) = [f for f in result.b.evaluation.findings if f.code == "PS170"]
    (mine,) = [f for f in result.a.evaluation.findings if f.code == "PS170"]
    assert theirs.capped_by == "reference gap" and theirs.bounded_gain > 3 * theirs.estimated_gain
    assert mine.bounded_gain == mine.estimated_gain   # no reference gap binds ours
    grown = [r for r in result.verdict if r.code == "PS170" and r.kind == "grown"]
    for r in grown:
        assert f"against {theirs.bounded_gain:.0%} of B's" in r.sentence
    assert not any(f"against {theirs.estimated_gain:.0%} of B's" in r.sentence for r in grown)
    _claims_fit(result)


def test_reasons_equal_at_the_printed_percent_keep_their_order():
    # 2.9% and 3.1% both print as "about 3%": ranked equal, they keep the order they are
    # built in, so a re-profile's noise does not swap the verdict's lines; 2% ranks below.
    assert d._rank_share(0.029) == d._rank_share(0.031) > d._rank_share(0.02)
    assert d._rank_share(None) < d._rank_share(0.0)


def test_diff_says_how_much_of_the_time_is_the_clock():
    """The persistent stage's fp16 run against its bf16 one (the committed reference run):
    the same cycles within 1%, 4% more time, most of it the 3.5% lower clock, both at the
    power cap; the bf16 stage against cuBLAS bf16 ran close and nothing is said."""
    fp16 = resolve(str(REFERENCE / "hgemm_tma_wgmma_persistent-fp16-4096x4096x4096.ncu-rep.xz"))
    bf16 = resolve(str(REFERENCE / "hgemm_tma_wgmma_persistent-bf16-4096x4096x4096.ncu-rep.xz"))
    cublas = resolve(str(REFERENCE / "cublas_bgemm-bf16-4096x4096x4096.ncu-rep.xz"))
    note = d.compare(fp16, bf16).clock
    assert note == ("A ran at 1540 MHz and B at 1596 MHz (A's clock 3.5% lower): A takes 1.04x "
                    "B's time and 1.01x its cycles; A and B at the power cap (PS171).")
    assert d.compare(bf16, cublas).clock is None
    result = CliRunner().invoke(app, ["diff", str(fp16.path), str(bf16.path), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["clock"] == note


@needs_reference
def test_diff_names_descriptors_built_per_thread():
    """R2UR per warpgroup MMA tells per-thread MMA descriptors apart: the persistent stage
    before its descriptors were built uniform (probes/, 2.01 per HGMMA) against cuBLAS
    (0.01), and hgemm_small_m's paired tiles after (fused/) against before (probes/, 2.29):
    a cost the faster side cut. The reference run's persistent stage against cuBLAS: none."""
    probes, fused = REFERENCE / "probes", REFERENCE / "fused"
    old = resolve(str(probes / "hgemm_tma_wgmma_persistent@BOXES=1,DEFER=1,GROUP=16,STAGES=4-"
                               "bf16-4096x4096x4096.ncu-rep.xz"))
    cublas = resolve(ref("cublas_bgemm", "bf16"))
    [r] = [r for r in d.compare(old, cublas).verdict if r.kind == "descriptors"]
    assert r.sentence.startswith("A moves 2.01 per-thread values") and "0.01 in B" in r.sentence
    assert "lane-0 shuffle" in r.fix and r.estimated_gain is None
    pair = "hgemm_small_m@AROWS=128,BM=128,MPAIR=2,STAGES=6-bf16-256x8192x8192.ncu-rep.xz"
    result = d.compare(resolve(str(fused / pair)), resolve(str(probes / pair)))
    [r] = [r for r in result.verdict if r.kind == "descriptors"]
    assert result.improved and r.sentence.startswith("B moves 2.29") and "a cost A cut" in r.sentence
    now = resolve(ref("hgemm_tma_wgmma_persistent", "bf16"))
    assert not [r for r in d.compare(now, cublas).verdict if r.kind == "descriptors"]
    # The warp-specialised stage is faster than its single-warpgroup parent for its
    # producer and its ring, and builds its descriptors per thread where the parent does
    # not: listed among what A improved, the sentence says it is a cost A still carries.
    ws = d.compare(resolve(ref("hgemm_tma_wgmma_ws", "fp16")), resolve(ref("hgemm_tma_wgmma", "fp16")))
    [r] = [r for r in ws.verdict if r.kind == "descriptors"]
    assert ws.improved and r.sentence.startswith("A moves 2.00 per-thread values")
    assert "a cost A still carries" in r.sentence and "lane-0 shuffle" in r.fix


def test_a_stage_name_means_the_folders_own_report_before_a_subfolders(tmp_path):
    """The reference run holds the persistent stage at 4096^3 at its top level and at 8192^3
    in large/ (and its configurations in probes/). Named by stage, it is the top level's,
    whichever file a checkout wrote last; a report beside A at A's shape still wins for B."""
    import os
    import shutil

    stem = "hgemm_tma_wgmma_persistent-bf16-"
    top, large = tmp_path, tmp_path / "large"
    large.mkdir()
    for folder, shape in ((top, "4096x4096x4096"), (large, "8192x8192x8192")):
        src = (REFERENCE if folder is top else REFERENCE / "large") / f"{stem}{shape}.ncu-rep.xz"
        shutil.copy(src, folder / src.name)
        shutil.copy(src.with_name(f"{stem}{shape}.json"), folder / f"{stem}{shape}.json")
    newer = large / f"{stem}8192x8192x8192.ncu-rep.xz"
    os.utime(newer, (newer.stat().st_atime, newer.stat().st_mtime + 3600))
    options = ResolveOptions(reference=tmp_path)
    got = resolve("hgemm_tma_wgmma_persistent", options)
    assert got.path.parent == top and got.manifest.shape == "4096x4096x4096"
    a = resolve(str(newer), options)
    b = resolve("hgemm_tma_wgmma_persistent", options, like=a)
    assert b.path == newer   # B at A's shape: large/'s, not the top level's


def test_the_streamed_operands_boxes_are_a_structural_reason():
    """hgemm_small_m at 16 x 8192^2 with its 12-stage ring (A, 37.6 us under ncu) against the
    8-stage report told the packed stage's reads (B, a stand-in until hgemm_small_m_packed's
    own report is captured: it has not run on a GPU): the diff sets the streamed operand's
    boxes side by side (128-byte pieces against one 8 KB piece per box) and the reason takes
    A's PS172 in, with the fix that packs the weight. Without planned reads on both sides
    (cuBLAS, a program's kernel) there is no such row."""
    from perfscope.kernels import Shape, run_reads
    from perfscope.rules import Context, evaluate
    from perfscope.structure import BOXES

    fused = REFERENCE / "fused"
    deep = resolve(str(fused / "hgemm_small_m@AROWS=16,BN=64,STAGES=12-bf16-16x8192x8192.ncu-rep.xz"))
    plain = resolve(str(fused / "hgemm_small_m@AROWS=16,BN=64-bf16-16x8192x8192.ncu-rep.xz"))
    m = plain.manifest
    reads = run_reads("hgemm_small_m_packed", m.params, m.dtype, Shape(m.m, m.n, m.k))
    packed = dataclasses.replace(plain, reads=reads, evaluation=evaluate(
        plain.profile, m, Context(stage=plain.stage, reads=reads)))
    result = d.compare(deep, packed)
    (row,) = [a for a in result.structure if a.name == BOXES]
    assert row.differs and "reads B in 64 x 128 B boxes" in row.a
    assert "64 pieces of 128 B per box" in row.a
    assert "each box one contiguous piece" in row.b and "strips64" in row.b
    (reason,) = [r for r in result.verdict if r.kind == BOXES]
    assert "PS172" in reason.sentence and "strips one box wide" in reason.fix
    # Both sides row-major, or one side unknown: no row.
    assert not [a for a in d.compare(deep, plain).structure if a.name == BOXES]
    no_reads = dataclasses.replace(packed, reads=None)
    assert not [a for a in d.compare(deep, no_reads).structure if a.name == BOXES]


@needs_reference
def test_the_main_loops_side_by_side():
    """The best FP32 stage against cuBLAS's SGEMM (the H200's reports of 2026-12-05): no
    finding explains the 1.08x cycles, and the main loops show what does differ: the same
    LDGSTS and barrier per pass, half the FFMAs and LDS in cuBLAS's (a BK 8 pass to our 16)."""
    from perfscope.render.diff import table_rows

    a = resolve(ref("sgemm_stages4", "fp32"))
    b = resolve(str(REFERENCE / "cublas_sgemm-fp32-4096x4096x4096.ncu-rep.xz"))
    result = d.compare(a, b)
    rows = {r.name: (r.a, r.b) for r in result.loop}
    assert rows["main loop instructions"] == (2250, 1154)
    assert rows["main loop FFMA"] == (2048, 1024) and rows["main loop shared LDS/STS"] == (96, 48)
    assert rows["main loop async copy LDGSTS"] == (13, 13)
    assert rows["main loop barriers BAR/SYNCS"] == (1, 1)
    fields = result.fields()
    assert fields["main_loop_instructions_a"] == 2250 and fields["main_loop_ffma_ratio"] == 2.0
    text = table_rows(result)
    at = text.index(("[main loop]", "", "", ""))
    assert text[at + 1] == ("main loop instructions", "2,250", "1,154", "1.95x")
    # The persistent wgmma stage's consumer loop: its wgmmas and their waits.
    loop = resolve(ref("hgemm_tma_wgmma_persistent", "bf16")).profile.hot_loop
    assert loop is not None and loop.families.get("gmma", 0) > 0 and "ffma" not in loop.families


@needs_reference
def test_a_finding_just_under_the_line_on_the_other_side_is_compared_not_counted_whole():
    """hgemm_tma_wgmma against hgemm_bcf_dbf_rw (the H200's reports): A's step gets rid of
    B's PS112 (cp.async writes taking extra wavefronts, 0.028 of B's time), a reason of its
    own. Had A the same symptom with an estimate too small to be a finding (the engine's
    Evaluation.quiet; no committed pair has one where it matters, so it is set here), the
    reason is the difference of the two: under GROWN_MIN none, above it a "grown" reason
    that says A has it too."""
    import dataclasses

    a = resolve(ref("hgemm_tma_wgmma", "bf16"))
    b = resolve(ref("hgemm_bcf_dbf_rw", "bf16"))
    assert "PS112" in {r.code for r in d.compare(a, b).verdict if r.kind == "finding"}

    def with_quiet(gain: float):
        quiet = dataclasses.replace(a.evaluation, quiet=(("PS112", gain),))
        return d.compare(dataclasses.replace(a, evaluation=quiet), b)

    assert "PS112" not in {r.code for r in with_quiet(0.009).verdict}     # 0.028 - 0.009
    (grown,) = [r for r in with_quiet(0.001).verdict if r.code == "PS112"]
    assert grown.kind == "grown" and "in A too, under a finding's size" in grown.sentence


def test_the_engine_keeps_a_symptom_too_small_to_be_a_finding():
    """sgemm_tile8x16 (H200): its cp.async writes take extra wavefronts (PS112's symptom),
    worth 0.0055 of its time, under MIN_GAIN: silent, and in Evaluation.quiet."""
    r = resolve(ref("sgemm_tile8x16", "fp32"))
    assert "PS112" in r.evaluation.silent
    assert "PS112" not in {f.code for f in r.evaluation.findings}
    assert dict(r.evaluation.quiet)["PS112"] == pytest.approx(0.0055, abs=5e-4)


@needs_reference
def test_padding_that_never_runs_is_no_shared_load():
    """hgemm_ring with its copies spread over the k16 steps against hgemm_ring (probes/, one
    H100 call): ptxas puts three `@!PT LDS RZ, [RZ]` before each LDGSTS group, 12 in the
    spread loop and 3 in the ring's. They count as the loops' instructions (they take issue
    slots) and in no family: neither loop loads from shared memory but by ldmatrix."""
    probes = REFERENCE / "probes"
    result = d.compare(resolve(str(probes / "hgemm_ring_spread-bf16-4096x4096x4096-h100.ncu-rep.xz")),
                       resolve(str(probes / "hgemm_ring-bf16-4096x4096x4096-h100.ncu-rep.xz")))
    rows = {r.name: (r.a, r.b) for r in result.loop}
    assert rows["main loop instructions"] == (271, 309)
    assert rows["main loop mma.sync HMMA"] == (128, 128) and rows["main loop ldmatrix LDSM"] == (32, 32)
    assert "main loop shared LDS/STS" not in rows


def test_no_main_loop_rows_without_per_instruction_counts():
    """A report collected without the source counters has no main loop; the diff shows no
    such group rather than zeros."""
    narrow = side("narrow_sol_only")
    assert narrow.profile.hot_loop is None
    full = side("float4_copy")
    assert full.profile.hot_loop is not None
    result = d.compare(narrow, full)
    assert result.loop == () and "main_loop_instructions_a" not in result.fields()


@needs_reference
def test_reference_parked_warps_are_not_a_reason():
    """The cluster variant parks three warps per CTA at its exit barrier (KernelProfile.parked):
    its stall shares leave them out, so the diff against the persistent stage no longer
    names a barrier stall at that barrier as a reason (it read 44% against 30% with them, 23%
    without), and the table gives the parked warps' share of the samples on a row of its own."""
    from perfscope.render.diff import PARKED_ROW, table_rows

    result = d.compare(resolve(ref("hgemm_tma_wgmma_cluster", "bf16")),
                       resolve(ref("hgemm_tma_wgmma_persistent", "bf16")))
    assert not [r for r in result.verdict if "stall on barrier" in r.sentence]
    assert not any("UCGABAR_WAIT" in (r.fix or "") for r in result.verdict)
    barrier = next(s for s in result.stalls if s.reason == "barrier")
    assert 0.22 < barrier.share_a < 0.24 and 0.29 < barrier.share_b < 0.31
    (row,) = [r for r in table_rows(result) if r[0] == PARKED_ROW]
    assert row[1:3] == ("26%", "0%")
    from perfscope.render.jsondoc import diff_document

    doc = diff_document(result)
    assert 0.25 < doc["parked"]["a"] < 0.27 and doc["parked"]["b"] == 0.0
    plain = d.compare(resolve(ref("hgemm_tma_wgmma_persistent", "bf16")),
                      resolve(ref("cublas_bgemm", "bf16")))
    assert not [r for r in table_rows(plain) if r[0] == PARKED_ROW]


def test_a_gap_no_reason_explains_names_the_stall_shares_that_moved_as_leads():
    """torch._grouped_mm's GEMM takes 1.07x the cycles of torch.bmm of the same 8 products
    (H100) and no finding, path or structure accounts for it: the verdict says so and names
    the stall shares that moved most (5 points or more, under the 10 a reason needs) as
    where to look, without a claim."""
    from perfscope.render.diff import verdict_lines

    opts = ResolveOptions()
    a = resolve(f"{EXTERNAL / 'torch_grouped_moe.ncu-rep.xz'}:device_kernel", opts)
    b = resolve(str(EXTERNAL / "torch_bmm_moe.ncu-rep.xz"), opts)
    got = d.compare(a, b)
    assert not got.verdict and not got.improved
    (line,) = verdict_lines(got)
    assert line.startswith("No finding explains a difference; the stall shares that moved most: ")
    assert "long_scoreboard 30% of A's stall time against 20% in B" in line
    assert line.endswith(": compare the tables above.")


@needs_reference
def test_same_cycles_with_nothing_to_name_is_a_difference_not_an_improvement():
    """The stream-K stage at 4096^3 is the persistent stage (it splits only from 8 rounds):
    their fp16 reports take the same cycles, A a hair fewer. Under "the same cycles" the
    empty verdict speaks of a difference; an improvement of 12% with nothing to name keeps
    the word."""
    from perfscope.render.diff import verdict_heading, verdict_lines

    got = d.compare(resolve(ref("hgemm_tma_wgmma_streamk", "fp16")),
                    resolve(ref("hgemm_tma_wgmma_persistent", "fp16")))
    assert got.improved and not got.verdict
    assert verdict_heading(got).startswith("A and B take the same cycles")
    (line,) = verdict_lines(got)
    assert "accounts for a difference" in line and "improvement" not in line
    faster = dataclasses.replace(got, time=tuple(
        dataclasses.replace(r, a=0.88 * r.b) if r.name == "cycles" else r for r in got.time))
    (line,) = verdict_lines(faster)
    assert "accounts for the improvement" in line
