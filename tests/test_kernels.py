"""The KernelSpec registry and the compile path every stage takes (CPU only, as in CI)."""

from __future__ import annotations

import re

import pytest

from perfscope.build import CompileRequest, compile_cubin
from perfscope.errors import PerfscopeError
from perfscope.families import FAMILY_BY_KEY
from perfscope.kernels import (
    DTYPES,
    KERNEL_DIR,
    REFERENCE_FOR_DTYPE,
    REGISTRY,
    Shape,
    get_spec,
    names,
    parse_shape,
)
from perfscope.kernels.launch import compile_stage

LADDER = [s for s in REGISTRY if not s.is_reference]
ARCHS = ("sm_80", "sm_90a")
# Largest shared memory one block may take (static + dynamic opt-in), per target.
SMEM_LIMIT = {"sm_80": 163 * 1024, "sm_90a": 227 * 1024}


pytestmark = pytest.mark.usefixtures("private_cubin_cache")


def test_names_are_unique():
    from perfscope.kernels.registry import EPILOGUE_STAGES, FP8_STAGES, GROUP_REFERENCES

    runnable = REGISTRY + EPILOGUE_STAGES + GROUP_REFERENCES + FP8_STAGES
    assert len(set(names())) == len(names()) == len(runnable)


def test_parents_exist_in_the_same_family():
    by_name = {s.name: s for s in REGISTRY}
    for spec in REGISTRY:
        if spec.parent is not None:
            assert spec.parent in by_name, spec.name
            assert by_name[spec.parent].family == spec.family, spec.name
    # Each ladder has exactly one root.
    for family in ("sgemm", "hgemm"):
        roots = [s.name for s in REGISTRY if s.family == family and s.parent is None]
        assert len(roots) == 1, roots


def test_no_parent_cycle():
    by_name = {s.name: s for s in REGISTRY}
    for spec in REGISTRY:
        seen, cur = set(), spec
        while cur.parent is not None:
            assert cur.name not in seen, f"cycle through {cur.name}"
            seen.add(cur.name)
            cur = by_name[cur.parent]


def test_every_spec_is_described():
    for spec in REGISTRY:
        assert spec.family in ("sgemm", "hgemm", "cublas")
        assert spec.dtypes and set(spec.dtypes) <= set(DTYPES), spec.name
        assert spec.change.endswith(".") and spec.seed, spec.name
        assert spec.fingerprint and set(spec.fingerprint) <= set(FAMILY_BY_KEY), spec.name
        assert len({k for k, _ in spec.params}) == len(spec.params), spec.name


def test_every_dtype_has_a_reference_that_takes_it():
    for dtype, ref in REFERENCE_FOR_DTYPE.items():
        spec = get_spec(ref)
        assert spec.is_reference and dtype in spec.dtypes
    for spec in LADDER:
        for dtype in spec.dtypes:
            assert dtype in REFERENCE_FOR_DTYPE


def test_variants_are_declared():
    assert get_spec("sgemm_reg8x8_capped").variant
    assert not get_spec("sgemm_reg8x8").variant


def test_issue_shapes_handled_where_promised():
    """cuBLAS refs, sgemm_naive, sgemm_smem and hgemm_naive take every shape."""
    for name in ("cublas_sgemm", "cublas_hgemm", "cublas_bgemm", "sgemm_naive", "sgemm_smem",
                 "hgemm_naive"):
        for shape in (Shape(1, 1, 1), Shape(2, 3, 5), Shape(127, 129, 65)):
            get_spec(name).check_shape(shape)


def test_unknown_stage_lists_valid_names():
    with pytest.raises(PerfscopeError) as exc:
        get_spec("sgemm_fast")
    msg = str(exc.value)
    assert "sgemm_fast" in msg and "hgemm_bcf_dbf_rw" in msg and "\n" not in msg


@pytest.mark.parametrize("text", ["4096", "4x4", "axbxc", "1x2x3x4x5", "", "2.5x3x3", "x2x3x4"])
def test_malformed_shape(text):
    with pytest.raises(PerfscopeError, match="MxNxK"):
        parse_shape(text)


@pytest.mark.parametrize("text", ["0x4x4", "4x-1x4", "4x4x0", "0x4x4x4", "-2x4x4x4"])
def test_non_positive_shape(text):
    with pytest.raises(PerfscopeError, match="positive"):
        parse_shape(text)


def test_batched_shape_reads_batch_first_and_counts_every_product():
    s = parse_shape("8x1024x2048x64")
    assert (s.batch, s.m, s.n, s.k) == (8, 1024, 2048, 64)
    assert str(s) == "8x1024x2048x64" and s.lead == (8,)
    assert s.flops == 8 * 2 * 1024 * 2048 * 64
    # A batch of one is the plain GEMM, named as before (stems, manifests).
    one = parse_shape("1x4096x4096x4096")
    assert one == Shape(4096, 4096, 4096) and str(one) == "4096x4096x4096" and one.lead == ()


def test_only_the_cublas_references_take_a_batch():
    batched = parse_shape("4x512x512x512")
    for name in ("cublas_sgemm", "cublas_hgemm", "cublas_bgemm"):
        get_spec(name).check_shape(batched)
    with pytest.raises(PerfscopeError, match="one GEMM a launch, not a batch") as exc:
        get_spec("hgemm_tma_wgmma_balanced").check_shape(batched)
    assert "\n" not in str(exc.value) and "cublas_bgemm" in str(exc.value)
    with pytest.raises(PerfscopeError, match="not a batch"):
        get_spec("cublaslt_bgemm").check_shape(batched)


def test_constraint_refusal_is_one_sentence():
    with pytest.raises(PerfscopeError) as exc:
        get_spec("hgemm_bcf").check_shape(Shape(128, 128, 65))
    assert "K" in str(exc.value) and "65" in str(exc.value)


def test_dtype_refusal():
    with pytest.raises(PerfscopeError, match="takes fp32"):
        get_spec("sgemm_naive").check_dtype("bf16")


def test_with_params_checks_names():
    pipe = get_spec("sgemm_pipe")
    assert pipe.with_params(STAGES=4).param_dict["STAGES"] == 4
    with pytest.raises(PerfscopeError, match="no template parameter"):
        pipe.with_params(STAGEZ=4)


def test_grid_covers_the_output():
    for spec in LADDER:
        p = spec.param_dict
        shape = Shape(1000, 2000, 500)
        gx, gy, gz = spec.grid_dims(shape)
        bm = p.get("BM", p.get("TILE"))
        bn = p.get("BN", p.get("TILE"))
        if spec.persistent:
            # One tile per CTA (a cluster pairs tile rows, an odd last row included) before
            # the launch caps the grid at what runs at once.
            rows = -(-shape.m // (bm * spec.cluster)) * spec.cluster
            assert (gx, gy, gz) == (rows * -(-shape.n // bn), 1, 1), spec.name
            assert gx % spec.cluster == 0, spec.name
            continue
        assert gx * bn >= shape.n and gy * bm >= shape.m and gz == 1, spec.name


def _compile_cases():
    return [(s, a) for s in LADDER for a in ARCHS if a in s.archs]


@pytest.mark.slow
@pytest.mark.parametrize("spec, arch", _compile_cases(), ids=lambda x: getattr(x, "name", x))
def test_every_stage_compiles(spec, arch):
    for dtype in spec.dtypes:
        mod = compile_stage(spec, dtype, arch)
        use = mod.usage(spec.name_expression(dtype))
        assert mod.cubin[:4] == b"\x7fELF"
        assert "-lineinfo" in mod.options and f"-arch={arch}" in mod.options
        assert 0 < use.registers <= 255
        assert use.static_smem == spec.static_smem_bytes(), spec.name
        # Static plus dynamic shared memory must fit a block on the target.
        assert use.static_smem + spec.dynamic_smem_bytes() <= SMEM_LIMIT[arch], spec.name
        if arch == "sm_90a":
            assert use.registers * spec.block_threads() <= 65536, spec.name


@pytest.mark.slow
def test_capped_stage_spills_and_uncapped_does_not():
    for arch in ARCHS:
        capped_spec, free_spec = get_spec("sgemm_reg8x8_capped"), get_spec("sgemm_reg8x8")
        capped = compile_stage(capped_spec, "fp32", arch)
        free = compile_stage(free_spec, "fp32", arch)
        assert capped.usage(capped_spec.name_expression("fp32")).spills, capped.log
        assert not free.usage(free_spec.name_expression("fp32")).spills, free.log


_FFMA = re.compile(r"FFMA\S* (R\d+), -?R\d+(?:\.reuse)?, -?R\d+(?:\.reuse)?, (-?R\d+)")


def _rotated_ffma(name: str) -> tuple[int, int]:
    """(FFMAs that write another register than their addend, all FFMAs) in a stage's SASS."""
    from perfscope.sass.disasm import disassemble

    (kernel,) = disassemble(compile_stage(get_spec(name), "fp32", "sm_90a").cubin_path).kernels
    found = [m for t in kernel.instructions if (m := _FFMA.search(t))]
    return sum(1 for m in found if m.group(1) != m.group(2)), len(found)


@pytest.mark.slow
def test_column_order_keeps_the_accumulators_in_place():
    """sgemm_fma_order's header claims: the FMAs column by column, ptxas rotates 131 of the
    loop's 2,048 accumulators between registers, not 548 as in sgemm_tile8x16 (NVRTC 13.0)."""
    rotated, total = _rotated_ffma("sgemm_tile8x16")
    ordered, same = _rotated_ffma("sgemm_fma_order")
    assert total == same == 2048
    assert rotated >= 0.2 * total and ordered <= 0.08 * total, (rotated, ordered)


def test_sources_are_free_of_forbidden_headers():
    include = re.compile(r"^\s*#\s*include\s*<(cstdint|cuda\.h)>", re.MULTILINE)
    sources = list(KERNEL_DIR.glob("*.cu"))
    assert {p.name for p in sources} >= {"sgemm.cu", "hgemm.cu"}
    for path in sources:
        assert not include.search(path.read_text()), path.name


@pytest.mark.slow
def test_same_path_as_a_plain_request():
    """compile_stage is compile_cubin with the spec's own flags: nothing special in CI."""
    spec = get_spec("hgemm_bcf")
    src = spec.source_path().read_text()
    req = CompileRequest(src, spec.source, (spec.name_expression("fp16"),), "sm_90a",
                         spec.flags, KERNEL_DIR)
    assert compile_cubin(req).cubin == compile_stage(spec, "fp16", "sm_90a").cubin


@pytest.mark.slow
def test_dynamic_buffers_take_the_cta_id_read_out_of_the_loop():
    """sgemm_dyn's header claims: with static buffers ptxas reads SR_CgaCtaId (S2UR) in the
    main loop, with dynamic ones it does not (NVRTC 13.0, sm_90a)."""
    from perfscope.sass.disasm import disassemble
    from perfscope.sass.loops import loops

    def in_loops(name: str) -> int:
        (kernel,) = disassemble(compile_stage(get_spec(name), "fp32", "sm_90a").cubin_path).kernels
        ins = kernel.instructions
        inside = {i for lp in loops(ins) for i in range(lp.first, lp.last + 1)}
        return sum("SR_CgaCtaId" in ins[i] for i in inside)

    assert in_loops("sgemm_tile8x16") >= 1 and in_loops("sgemm_dyn") == 0
