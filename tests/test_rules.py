"""The rule table (issue 5): every rule fires on a case that shows its symptom and stays
silent on one that does not, judged on the real H200 captures wherever one shows the
symptom. Synthetic profiles (``dataclasses.replace`` on a real one) are used only where
no capture has the symptom; each such case says so in its docstring.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections import ChainMap
from collections.abc import Mapping
from functools import cache

import pytest
from conftest import report
from typer.testing import CliRunner

from perfscope.cli import app
from perfscope.collection import EXTRA_METRICS
from perfscope.manifest import RunManifest, Verification
from perfscope.metrics import VIEW_METRICS
from perfscope.profile import KernelProfile, Stall, Traffic, load
from perfscope.rules import BY_CODE, REGISTRY, SEVERITIES, TAGS, Context, evaluate
from perfscope.rules.model import DOC_SECTIONS

ISSUE_TAGS = {
    "uncoalesced-global", "no-data-reuse", "smem-bandwidth", "bank-conflicts",
    "uncoalesced-shared", "latency-exposed", "register-spills", "occupancy-limited",
    "no-tensor-cores", "legacy-mma", "no-tma", "tail-effect", "l2-locality",
    "store-inefficiency", "incorrect-result",
}


@cache
def kernels(name: str) -> tuple[KernelProfile, ...]:
    return tuple(load(report(name)))


def one(name: str, index: int = 0) -> KernelProfile:
    return kernels(name)[index]


def codes(kp: KernelProfile, **kw) -> set[str]:
    return {f.code for f in evaluate(kp, **kw).findings}


def manifest(verdict: str = "ok", m: int = 4096, n: int = 4096, k: int = 4096,
             params: dict | None = None, stage: str = "hgemm_naive", dtype: str = "fp16") -> RunManifest:
    return RunManifest(stage=stage, family="hgemm", dtype=dtype, m=m, n=n, k=k,
                       params=params if params is not None else {"BM": 128, "BN": 128, "BK": 32},
                       verification=Verification(verdict=verdict, rel_fro_error=0.5, tolerance=1e-2))


# --------------------------------------------------------------- synthetic helpers


def with_stalls(kp: KernelProfile, issue_active: float | None = None, eligible: float | None = None,
                **cycles: float) -> KernelProfile:
    reasons = tuple(Stall(r, c, None) for r, c in sorted(cycles.items(), key=lambda kv: -kv[1]))
    st = dataclasses.replace(kp.stalls, reasons=reasons)
    if issue_active is not None:
        st = dataclasses.replace(st, issue_active_pct=issue_active)
    if eligible is not None:
        st = dataclasses.replace(st, eligible_warps_per_cycle=eligible)
    return dataclasses.replace(kp, stalls=st)


def with_sol(kp: KernelProfile, **pcts: float) -> KernelProfile:
    return dataclasses.replace(kp, sol=dataclasses.replace(kp.sol, **pcts))


def with_families(kp: KernelProfile, families: dict[str, float], executed: dict[str, float] | None = None,
                  cc: str | None = None) -> KernelProfile:
    ops = dataclasses.replace(kp.opcodes, families=families,
                              executed=executed if executed is not None else kp.opcodes.executed)
    out = dataclasses.replace(kp, opcodes=ops)
    if cc is not None:
        out = dataclasses.replace(out, identity=dataclasses.replace(out.identity, compute_capability=cc))
    return out


def with_metric(kp: KernelProfile, name: str, value: float) -> KernelProfile:
    return dataclasses.replace(kp, metrics=ChainMap({name: (value, "")}, kp.metrics))


def idle_uncapped() -> KernelProfile:
    """The uncapped FFMA kernel made latency-bound: nothing busy, issue slots idle."""
    kp = with_sol(one("spill", 0), sm_pct=20.0, l1tex_pct=20.0, l2_pct=20.0, dram_pct=10.0)
    return with_stalls(kp, issue_active=20.0, eligible=0.3, long_scoreboard=6.0, wait=1.0,
                       not_selected=0.5)


def hmma_kernel(cc: str = "9.0") -> KernelProfile:
    """An mma.sync + cp.async + ldmatrix GEMM (the hgemm ladder's fingerprint), built from
    the nvjet capture's profile: no capture holds an HMMA kernel."""
    fams = {"hmma": 2.0e6, "ldgsts": 5.0e5, "ldsm": 1.0e6, "barrier": 1.0e5, "stg": 3.0e4}
    executed = {"HMMA": 2.0e6, "LDGSTS": 5.0e5, "LDSM": 1.0e6, "BAR": 1.0e5, "STG": 3.0e4,
                "IMAD": 1.0e6}
    return with_families(one("cublas_hgemm_4096"), fams, executed, cc=cc)


# ------------------------------------------------------------- cases: fire / silent
# Each entry: code -> (firing case, silent case); a case is a function returning
# (profile, evaluate() keyword arguments).

def _ps101_fire():
    """Real: the strided copy reads 8x its ideal sectors."""
    return one("strided_copy"), {}


def _ps101_silent():
    """Real: the float4 copy moves 16-byte vectors at ideal sectors."""
    return one("float4_copy"), {}


def _ps102_fire():
    """Synthetic: the uncapped FFMA kernel (scalar LDG.E.CONSTANT) made to wait on its loads;
    no capture holds a GEMM waiting on scalar loads."""
    return with_stalls(one("spill", 0), long_scoreboard=5.0, lg_throttle=2.0, not_selected=1.0), {}


def _ps102_silent():
    """Real: the same kernel as captured is compute-bound (3% long-scoreboard stalls)."""
    return one("spill", 0), {}


def _ps103_fire():
    """Synthetic: the uncapped FFMA kernel with two LDGs per FFMA (a naive GEMM's mix) and
    long-scoreboard stalls; no capture holds a naive GEMM."""
    kp = one("spill", 0)
    fams = dict(kp.opcodes.families, ldg=2 * kp.opcodes.families["ffma"])
    return with_stalls(with_families(kp, fams), long_scoreboard=5.0, not_selected=1.0), {}


def _ps103_silent():
    """Real: cuBLAS's SGEMM issues one LDG per 260k FFMAs."""
    return one("cublas_sgemm_4096"), {}


def _ps105_fire():
    """Synthetic: the strided copy with the excess moved from its loads to its stores."""
    kp = one("strided_copy")
    g = kp.memory.global_
    ops = tuple(dataclasses.replace(o, actual=o.ideal * (1 if o.kind == "load" else 8.0))
                for o in g.by_opcode)
    mem = dataclasses.replace(kp.memory, global_=dataclasses.replace(g, by_opcode=ops))
    return dataclasses.replace(kp, memory=mem), {}


def _ps105_silent():
    """Real: the strided copy's STG.E stores are at ideal sectors."""
    return one("strided_copy"), {}


def _ps110_fire():
    """Real: the transpose's LDS read 32x the ideal wavefronts."""
    return one("smem_transpose"), {}


def _ps110_silent():
    """Real: nvjet's shared loads (LDS, HGMMA operands) are at ideal wavefronts."""
    return one("cublas_hgemm_4096"), {}


def _ps111_fire():
    """Synthetic: the transpose with its 32-way excess on the STS instead of the LDS; the
    conflicting-store capture does not exist."""
    kp = one("smem_transpose")
    s = kp.memory.shared
    ops = tuple(dataclasses.replace(o, actual=o.ideal * (32.0 if o.kind == "store" else 1.0))
                for o in s.by_opcode)
    mem = dataclasses.replace(kp.memory, shared=dataclasses.replace(s, by_opcode=ops))
    return dataclasses.replace(kp, memory=mem), {}


def _ps111_silent():
    """Real: nvjet has 130k raw store "conflicts" but its STS/STSM wavefronts are ideal."""
    return one("cublas_hgemm_4096"), {}


def _ps112_fire():
    """Real: cuBLAS's SGEMM writes shared memory with 4-byte cp.async at 3x ideal."""
    return one("cublas_sgemm_4096"), {}


def _ps112_silent():
    """Real: the transpose's excess is on LDS loads, which is a bank conflict, not this."""
    return one("smem_transpose"), {}


def _ps113_fire():
    """Synthetic: the uncapped FFMA kernel given two LDS per FFMA and MIO-throttle stalls;
    no capture holds an unblocked shared-memory GEMM."""
    kp = one("spill", 0)
    executed = dict(kp.opcodes.executed, LDS=2 * kp.opcodes.families["ffma"])
    return with_stalls(with_families(kp, dict(kp.opcodes.families), executed),
                       mio_throttle=4.0, short_scoreboard=2.0, not_selected=1.0), {}


def _ps113_silent():
    """Real: cuBLAS's SGEMM reads LDS.128 fragments, 0.05 shared loads per FFMA."""
    return one("cublas_sgemm_4096"), {}


def _ps120_fire():
    """Synthetic: the uncapped FFMA kernel with nothing busy and warps on long scoreboard."""
    return idle_uncapped(), {}


def _ps120_silent():
    """Synthetic: the same, but L2 at 90%: bandwidth-bound kernels need less traffic, not
    more overlap."""
    return with_sol(idle_uncapped(), l2_pct=90.0), {}


def _ps121_fire():
    """Synthetic: the uncapped FFMA kernel idling at CTA barriers."""
    kp = with_sol(one("spill", 0), sm_pct=20.0, l1tex_pct=20.0, l2_pct=20.0, dram_pct=10.0)
    return with_stalls(kp, issue_active=20.0, barrier=5.0, long_scoreboard=1.0, not_selected=0.5), {}


def _ps121_silent():
    """Real: nvjet waits at barriers 32% of its stall time, by design (warp-specialised)."""
    return one("cublas_hgemm_4096"), {}


def _ps130_fire():
    """Real: the kernel built with --maxrregcount=32 spills."""
    return one("spill", 1), {}


def _ps130_silent():
    """Real: the same code uncapped (80 registers) does not."""
    return one("spill", 0), {}


def _ps131_fire():
    """Synthetic: the uncapped kernel (registers limit it to 37.5%) made latency-bound."""
    return idle_uncapped(), {}


def _ps131_silent():
    """Real: cuBLAS's SGEMM at 254 registers and 12.5% occupancy keeps its FMA pipe busy."""
    return one("cublas_sgemm_4096"), {}


def smem_limited(kp: KernelProfile) -> KernelProfile:
    return dataclasses.replace(kp, launch=dataclasses.replace(kp.launch, occupancy_limiter="shared memory"))


def _ps132_fire():
    """Synthetic: as PS131's case, with shared memory as the limiter."""
    return smem_limited(idle_uncapped()), {}


def _ps132_silent():
    """Synthetic: nvjet with shared memory as the limiter and its stalls: still silent,
    it is warp-specialised and its tensor pipe is busy."""
    return smem_limited(one("cublas_hgemm_4096")), {}


def _ps140_fire():
    """Synthetic input: the FFMA-only uncapped kernel declared as an fp16 GEMM."""
    return one("spill", 0), {"context": Context(dtype="fp16")}


def _ps140_silent():
    """Real: nvjet computes fp16 with HGMMA."""
    return one("cublas_hgemm_4096"), {"context": Context(dtype="fp16")}


def _ps141_fire():
    """Synthetic: an HMMA kernel on sm_90."""
    return hmma_kernel("9.0"), {}


def _ps141_silent():
    """Synthetic: the same HMMA kernel on sm_89, where mma.sync is the right path."""
    return hmma_kernel("8.9"), {}


def _ps142_fire():
    """Synthetic: an HMMA kernel fed by LDGSTS on sm_90."""
    return hmma_kernel("9.0"), {}


def _ps142_silent():
    """Real: nvjet loads its tiles with UTMALDG."""
    return one("cublas_hgemm_4096"), {}


def _ps150_fire():
    """Real: a 256-CTA transpose in the 24-launch capture fills a quarter of one wave."""
    return one("many_launches", 14), {}


def _ps150_silent():
    """Real: cuBLAS's SGEMM runs 3.88 waves (3% idle)."""
    return one("cublas_sgemm_4096"), {}


def _ps151_fire():
    """Manifest: 4100x4100 on 128x128 tiles pads 5.8% of the work."""
    return one("cublas_hgemm_4096"), {"manifest": manifest(m=4100, n=4100)}


def _ps151_silent():
    """Manifest: 4096x4096 on 128x128 tiles."""
    return one("cublas_hgemm_4096"), {"manifest": manifest()}


def _low_l2(carve: float) -> KernelProfile:
    kp = with_sol(one("spill", 0), dram_pct=70.0)
    kp = dataclasses.replace(kp, memory=dataclasses.replace(kp.memory, l2_hit_rate_pct=30.0))
    return with_metric(kp, "launch__persisting_l2_cache_size", carve)


def _ps160_fire():
    """Synthetic: the FFMA kernel with 30% L2 hits, DRAM at 70%, no persisting carve-out."""
    return _low_l2(0.0), {}


def _ps160_silent():
    """Real: cuBLAS's SGEMM hits L2 91% of the time."""
    return one("cublas_sgemm_4096"), {}


def _ps161_fire():
    """Synthetic: the same low-hit kernel with the captures' real 11.25 MiB carve-out."""
    return _low_l2(11796480.0), {}


def _ps161_silent():
    """Synthetic: the same without a carve-out (PS160 answers instead)."""
    return _low_l2(0.0), {}


def _ps190_fire():
    return one("cublas_hgemm_4096"), {"manifest": manifest("WRONG")}


def _ps190_silent():
    return one("cublas_hgemm_4096"), {"manifest": manifest("ok")}


def _ps191_fire():
    return one("cublas_hgemm_4096"), {"manifest": manifest("error")}


def _ps191_silent():
    return one("cublas_hgemm_4096"), {"manifest": manifest("ok")}


CASES = {"PS" + name[3:6]: (fn, globals()[name.replace("_fire", "_silent")])
         for name, fn in list(globals().items()) if name.startswith("_ps") and name.endswith("_fire")}


def test_every_rule_has_a_firing_and_a_silent_case():
    assert set(CASES) == set(BY_CODE)


@pytest.mark.parametrize("code", sorted(BY_CODE))
def test_rule_fires(code):
    kp, kw = CASES[code][0]()
    ev = evaluate(kp, **kw)
    found = [f for f in ev.findings if f.code == code]
    assert found, (code, [f.code for f in ev.findings], ev.not_evaluated)
    f = found[0]
    assert f.tag == BY_CODE[code].tag and f.evidence and f.fix
    assert "{" not in f.fix, f.fix   # every placeholder filled
    assert f.estimated_gain is None or 0 < f.estimated_gain <= 0.95


@pytest.mark.parametrize("code", sorted(BY_CODE))
def test_rule_silent(code):
    kp, kw = CASES[code][1]()
    ev = evaluate(kp, **kw)
    assert code in ev.silent, (code, [f.code for f in ev.findings], ev.not_evaluated)


# ------------------------------------------------------------------- the table itself


def test_tag_vocabulary_is_closed_and_covered():
    assert set(TAGS) == ISSUE_TAGS
    assert {r.tag for r in REGISTRY} == ISSUE_TAGS


def test_rule_metrics_are_in_the_collection_set():
    declared = set(VIEW_METRICS) | set(EXTRA_METRICS)
    for rule in REGISTRY:
        assert set(rule.metrics) <= declared, (rule.code, set(rule.metrics) - declared)


def test_rules_are_documented_data():
    for rule in REGISTRY:
        assert rule.severity in SEVERITIES
        for section in DOC_SECTIONS:
            assert f"{section}:" in rule.doc, (rule.code, section)
        assert rule.reference and rule.fix and rule.title
        # A pure predicate of one argument.
        assert list(inspect.signature(rule.check).parameters) == ["inputs"]


def test_fingerprint_fixes_name_the_compile_target():
    for code, target in (("PS141", "sm_90a"), ("PS142", "sm_90a")):
        f = next(f for f in evaluate(hmma_kernel("9.0")).findings if f.code == code)
        assert target in f.fix
    f = next(f for f in evaluate(hmma_kernel("10.0")).findings if f.code == "PS141")
    assert "sm_100a" in f.fix and "tcgen05" in f.fix
    f = next(f for f in evaluate(one("spill", 0), context=Context(dtype="bf16")).findings
             if f.code == "PS140")
    assert "sm_90a" in f.fix


@pytest.mark.parametrize("cc", ["8.0", "8.6", "8.9", "12.0"])
def test_mma_sync_is_right_on_ampere_ada_and_consumer_blackwell(cc):
    assert "legacy-mma" not in evaluate(hmma_kernel(cc)).tags


@pytest.mark.parametrize("cc", ["9.0", "10.0", "10.3"])
def test_mma_sync_is_legacy_on_hopper_and_datacenter_blackwell(cc):
    assert "legacy-mma" in evaluate(hmma_kernel(cc)).tags


# ----------------------------------------------------------------- the real captures


@pytest.mark.parametrize("name", ["cublas_sgemm_4096", "cublas_hgemm_4096", "cublas_bgemm_4096"])
def test_cublas_has_no_warning_or_worse(name):
    kp = one(name)
    dtype = {"cublas_sgemm_4096": "fp32"}.get(name, "fp16")
    for kw in ({}, {"context": Context(dtype=dtype)}):
        assert evaluate(kp, **kw).at_least("warning") == ()


def test_nvjet_raw_store_conflicts_are_not_bank_conflicts():
    kp = one("cublas_hgemm_4096")
    assert kp.memory.bank_conflicts_st > 100_000      # the misleading raw counter
    ev = evaluate(kp)
    assert "bank-conflicts" not in ev.tags and "occupancy-limited" not in ev.tags


def test_transpose_is_bank_conflicts_on_lds():
    ev = evaluate(one("smem_transpose"))
    f = next(f for f in ev.findings if f.tag == "bank-conflicts")
    assert f.code == "PS110" and f.severity == "warning"
    assert any(e.metric.startswith("LDS ") and e.value == 32.0 for e in f.evidence)
    assert f.ncu_rule.startswith("SharedMemoryConflicts") and f.ncu_speedup_pct > 50
    assert "uncoalesced-shared" not in ev.tags


def test_strided_is_uncoalesced_global_and_float4_is_clean():
    ev = evaluate(one("strided_copy"))
    assert [f.tag for f in ev.findings] == ["uncoalesced-global"]
    assert ev.findings[0].estimated_gain > 0.5
    assert evaluate(one("float4_copy")).findings == ()


def test_spill_capped_and_uncapped():
    capped = evaluate(one("spill", 1))
    assert "register-spills" in capped.tags
    assert {f.tag for f in capped.at_least("warning")} == {"register-spills"}
    assert evaluate(one("spill", 0)).findings == ()


def test_cpasync_excess_is_uncoalesced_shared_not_bank_conflicts():
    ev = evaluate(one("cublas_sgemm_4096"))
    assert "bank-conflicts" not in ev.tags
    f = next(f for f in ev.findings if f.tag == "uncoalesced-shared")
    assert f.severity == "optimization" and "LDGSTS" in f.fix


def test_many_launches_judged_per_launch():
    for kp in kernels("many_launches"):
        tags = evaluate(kp).tags
        if kp.name == "ps_strided_copy":
            assert "uncoalesced-global" in tags
        if kp.name == "ps_float4_copy":
            assert "uncoalesced-global" not in tags
        if kp.name == "ps_regs_capped":
            assert "register-spills" in tags


def test_narrow_report_fires_nothing():
    ev = evaluate(one("narrow_sol_only"))
    assert ev.findings == ()
    skipped = {n.code for n in ev.not_evaluated}
    assert {"PS101", "PS110", "PS120", "PS130", "PS141"} <= skipped
    assert all("not collected" in n.reason for n in ev.not_evaluated)


def _blank(view):
    """A view with every value missing, as a report from another chip would have it."""
    out = {}
    for f in dataclasses.fields(view):
        v = getattr(view, f.name)
        if isinstance(v, Traffic):
            out[f.name] = Traffic(None, None, None, ())
        elif isinstance(v, tuple):
            out[f.name] = ()
        elif isinstance(v, Mapping):
            out[f.name] = {}
        else:
            out[f.name] = None
    return dataclasses.replace(view, **out)


def test_missing_metrics_never_fire():
    """Blank each view of each capture in turn: a rule either stays silent or is not
    evaluated, it never fires on a None read as zero."""
    for name in ("strided_copy", "smem_transpose", "spill", "cublas_sgemm_4096", "cublas_hgemm_4096"):
        for kp in kernels(name):
            baseline = {f.code for f in evaluate(kp).findings}
            for view in ("stalls", "memory", "opcodes", "sol", "launch"):
                blank = dataclasses.replace(kp, **{view: _blank(getattr(kp, view))})
                fired = {f.code for f in evaluate(blank).findings}
                assert fired <= baseline, (name, view, fired - baseline)


def test_without_manifest_manifest_rules_are_not_evaluated():
    ev = evaluate(one("cublas_hgemm_4096"))
    assert {"PS151", "PS190", "PS191"} <= {n.code for n in ev.not_evaluated}


def test_wrong_result_is_an_error_above_everything():
    ev = evaluate(hmma_kernel(), manifest=manifest("WRONG"))
    assert ev.findings[0].code == "PS190" and ev.findings[0].severity == "error"


# ------------------------------------------------------------------------ the CLI

runner = CliRunner()


def test_rules_command_lists_the_table():
    result = runner.invoke(app, ["rules"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    for rule in REGISTRY:
        assert rule.code in result.output and rule.tag in result.output


def test_diagnose_shows_findings_above_nsight_computes():
    result = runner.invoke(app, ["diagnose", str(report("smem_transpose"))], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    out = result.output
    assert "perfscope findings" in out and "PS110" in out and "bank-conflicts" in out
    assert out.index("PS110") < out.index("Nsight Compute's own findings")
    assert "Nsight Compute SharedMemoryConflicts" in out     # its estimate beside ours


def test_diagnose_json_findings():
    import json

    result = runner.invoke(app, ["diagnose", "--json", str(report("spill"))])
    assert result.exit_code == 0, result.output
    uncapped, capped = json.loads(result.output)["kernels"]
    assert uncapped["findings"] == []
    f = capped["findings"][0]
    assert set(f) >= {"code", "tag", "title", "severity", "estimated_gain", "evidence", "fix"}
    assert f["tag"] == "register-spills"
    assert set(f["evidence"][0]) == {"metric", "value", "threshold"}
    assert any(n["code"] == "PS190" for n in capped["rules_not_evaluated"])


def test_diagnose_markdown_findings():
    result = runner.invoke(app, ["diagnose", "--markdown", str(report("strided_copy"))])
    assert result.exit_code == 0
    assert "**perfscope findings**" in result.output and "PS101" in result.output


def test_diagnose_reads_the_manifest_beside_the_report(tmp_path):
    import json
    import shutil

    rep = tmp_path / "hgemm_naive-fp16-4096x4096x4096.ncu-rep.xz"
    shutil.copy(report("float4_copy"), rep)
    (tmp_path / "hgemm_naive-fp16-4096x4096x4096.json").write_text(
        json.dumps(manifest("WRONG").to_dict()))
    result = runner.invoke(app, ["diagnose", "--json", str(rep)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["kernels"][0]["findings"][0]["code"] == "PS190"
    # A broken manifest is logged and the report is still diagnosed.
    (tmp_path / "hgemm_naive-fp16-4096x4096x4096.json").write_text("{broken")
    result = runner.invoke(app, ["diagnose", "--json", str(rep)])
    assert result.exit_code == 0
