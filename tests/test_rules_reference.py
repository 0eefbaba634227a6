"""The validation matrix of issue 5 over the committed reference ladder reports.

For each stage: the tags that must fire and the tags that must not, judged on
``reports/reference/h200/<stage>-<dtype>-4096x4096x4096.ncu-rep.xz`` with the run manifest
``<same stem>.json`` beside it. Those reports come from the GPU reference run; until they
are committed this module is skipped.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from perfscope.manifest import manifest_beside, manifest_path
from perfscope.profile import load
from perfscope.reader import REPORT_SUFFIXES
from perfscope.rules import evaluate

REFERENCE = Path(__file__).resolve().parent.parent / "reports" / "reference" / "h200"
SHAPE = "4096x4096x4096"


def _reports_present() -> bool:
    return REFERENCE.is_dir() and any(
        p.name.endswith(REPORT_SUFFIXES) for p in REFERENCE.iterdir())


pytestmark = pytest.mark.skipif(
    not _reports_present(),
    reason=f"no .ncu-rep reports under {REFERENCE} yet: the reference ladder reports come "
           "from the GPU reference run (perfscope profile on the H200) and are committed afterwards")

# (stage, dtype) -> (tags that must fire, tags that must not fire)
MATRIX: dict[tuple[str, str], tuple[set[str], set[str]]] = {
    ("sgemm_naive", "fp32"): ({"uncoalesced-global"}, set()),
    ("sgemm_float4", "fp32"): (set(), {"uncoalesced-global"}),
    ("sgemm_reg8x8", "fp32"): (set(), {"register-spills"}),
    ("sgemm_reg8x8_capped", "fp32"): ({"register-spills"}, set()),
    ("hgemm_naive", "fp16"): ({"bank-conflicts", "legacy-mma", "no-tma"}, set()),
    ("hgemm_bcf", "fp16"): (set(), {"bank-conflicts"}),
    # Hopper stages (issue 8): the first drains its wgmmas behind a CTA barrier every K
    # tile (warp specialisation removes it); the first two store C from registers (the
    # persistent stage's TMA store removes that); none is on the legacy path any more.
    ("hgemm_tma_wgmma", "bf16"): ({"latency-exposed"}, {"legacy-mma", "no-tma"}),
    ("hgemm_tma_wgmma_ws", "bf16"): ({"store-inefficiency"},
                                     {"latency-exposed", "legacy-mma", "no-tma"}),
    ("hgemm_tma_wgmma_persistent", "bf16"): (set(), {"latency-exposed", "store-inefficiency",
                                                     "legacy-mma", "no-tma"}),
    ("hgemm_tma_wgmma_cluster", "bf16"): (set(), {"latency-exposed", "store-inefficiency",
                                                  "legacy-mma", "no-tma"}),
}
# References: no finding of warning severity or above.
CUBLAS = (("cublas_sgemm", "fp32"), ("cublas_hgemm", "fp16"), ("cublas_bgemm", "bf16"))


def _evaluate(stage: str, dtype: str):
    stem = f"{stage}-{dtype}-{SHAPE}"
    # Committed compressed; an uncompressed report from a fresh run is read the same way.
    path = REFERENCE / f"{stem}.ncu-rep.xz"
    if not path.is_file():
        path = REFERENCE / f"{stem}.ncu-rep"
    assert path.is_file(), f"{stem}.ncu-rep.xz is missing from the reference run"
    assert manifest_path(path).is_file(), f"{manifest_path(path).name} is missing beside it"
    manifest = manifest_beside(path)
    assert manifest is not None and manifest.stage == stage
    profiles = load(path)
    assert profiles, path
    return [evaluate(kp, manifest) for kp in profiles]


@pytest.mark.parametrize(("stage", "dtype"), sorted(MATRIX))
def test_stage_matrix(stage, dtype):
    must, must_not = MATRIX[(stage, dtype)]
    evaluations = _evaluate(stage, dtype)
    fired = set().union(*(e.tags for e in evaluations))
    assert must <= fired, (stage, must - fired)
    assert not (must_not & fired), (stage, must_not & fired)


def test_hgemm_naive_conflicts_are_on_shared_loads():
    evaluations = _evaluate("hgemm_naive", "fp16")
    assert any(f.code == "PS110" for e in evaluations for f in e.findings)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_persistent_stage_has_no_warning_like_cublas(dtype):
    for e in _evaluate("hgemm_tma_wgmma_persistent", dtype):
        assert e.at_least("warning") == (), [(f.code, f.title) for f in e.at_least("warning")]


@pytest.mark.parametrize(("stage", "dtype"), CUBLAS)
def test_cublas_has_no_warning(stage, dtype):
    for e in _evaluate(stage, dtype):
        assert e.at_least("warning") == (), [(f.code, f.title) for f in e.at_least("warning")]


def test_wgmma_barrier_drain_predicts_what_warp_specialisation_saved():
    """PS121 on the single-warpgroup wgmma stage: barrier share x (1 - SM %) is the share
    of time warp specialisation should save; the ws stage measured 29-30% (bench.json)."""
    import dataclasses

    (e,) = _evaluate("hgemm_tma_wgmma", "bf16")
    (f,) = [f for f in e.findings if f.code == "PS121"]
    assert [ev.metric for ev in f.evidence] == ["stall share of barrier",
                                                 "sm__throughput.avg.pct_of_peak_sustained_elapsed"]
    assert 0.2 < f.estimated_gain < 0.35, f.estimated_gain
    # The same kernel with its tensor pipe busy: nothing to win at the barrier.
    kp = load(REFERENCE / f"hgemm_tma_wgmma-bf16-{SHAPE}.ncu-rep.xz")[0]
    busy = dataclasses.replace(kp, sol=dataclasses.replace(kp.sol, sm_pct=85.0))
    assert "PS121" not in {f.code for f in evaluate(busy).findings}


def test_store_estimate_counts_the_operand_traffic_tma_moves():
    """PS105 on a TMA-fed stage: the per-instruction sectors hold only C's stores (TMA
    copies are no SASS load), so the share is taken of the L2's own sector count; C's
    2x sectors then cost ~1.5%, which is what replacing them gained here (persistent's
    11% came with overlapping the epilogue, not from the stores' sectors)."""
    import dataclasses

    from perfscope.metrics import M_L2_SECTORS

    kp = load(REFERENCE / f"hgemm_tma_wgmma_ws-bf16-{SHAPE}.ncu-rep.xz")[0]
    (f,) = [f for f in evaluate(kp).findings if f.code == "PS105"]
    assert f.evidence[-1].metric.startswith(M_L2_SECTORS)
    assert 0.005 < f.estimated_gain < 0.03, f.estimated_gain
    # Without the L2 count a TMA-fed kernel's share cannot be sized: no estimate at all.
    blind = dataclasses.replace(kp, metrics={k: v for k, v in kp.metrics.items()
                                             if k != M_L2_SECTORS})
    (g,) = [g for g in evaluate(blind).findings if g.code == "PS105"]
    assert g.estimated_gain is None
