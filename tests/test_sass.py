"""`perfscope sass` and the Blackwell stage: static SASS audits, no GPU (CPU only, as in CI).

The stage path compiles through the NVRTC wheels and disassembles with the pinned
nvidia-cuda-cuobjdump wheel (both in the `build` extra), so it runs in CI; the `.cu`
path needs nvcc and is skipped where there is none.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import disassembler_or_skip
from typer.testing import CliRunner

from perfscope import bench, profiling
from perfscope.audit import audit, audit_stage
from perfscope.build import CompileError, CompileRequest, compile_cubin
from perfscope.cli import app
from perfscope.errors import PerfscopeError
from perfscope.kernels import COMPILED_ONLY, KERNEL_DIR, REGISTRY, audit_specs, get_spec, parse_shape
from perfscope.kernels import launch as launch_mod
from perfscope.kernels import tcgen05 as tc
from perfscope.sass import disasm

STAGE = "hgemm_tcgen05"


pytestmark = pytest.mark.usefixtures("private_cubin_cache")


# ------------------------------------------------------------ descriptor encodings


def test_smem_descriptor_matches_the_ptx_isa_layout():
    """PTX ISA 9.0, §9.7.16.4.1 "Shared memory descriptor" (tcgen05 matrix descriptors):
    bits 0-13 start address >> 4, 16-29 leading-dimension byte offset >> 4, 32-45
    stride-dimension byte offset >> 4, 46-48 fixed 0b001, 49-51 base offset, 52 LBO mode,
    53-60 fixed 0, 61-63 swizzle (0 none, 1 128B with 32B atom, 2 128B, 4 64B, 6 32B)."""
    d = tc.smem_desc(0x1_2400, 16, 1024, tc.SWIZZLE_128B)
    f = tc.decode(d, tc.SMEM_FIELDS)
    assert f == {"start_address": 0x1_2400 >> 4, "leading_byte_offset": 1,
                 "stride_byte_offset": 64, "fixed_0b001": 1, "base_offset": 0, "lbo_mode": 0,
                 "fixed_zero": 0, "swizzle": 2}
    # Exact words, worked by hand from the table.
    assert tc.smem_desc(0, 16, 1024, tc.SWIZZLE_128B) == (1 << 16) | (64 << 32) | (1 << 46) | (2 << 61)
    assert tc.smem_desc(0x400, 8192, 1024, tc.SWIZZLE_128B) == 0x4000_4040_0200_0040
    # Only 18 address bits are encoded (shared-memory window), the low 4 dropped.
    assert tc.decode(tc.smem_desc(0x4_0010, 0, 0, 0), tc.SMEM_FIELDS)["start_address"] == 1
    for mode in tc.SWIZZLES:
        assert tc.decode(tc.smem_desc(0, 0, 0, mode), tc.SMEM_FIELDS)["swizzle"] == mode


def test_smem_descriptor_refuses_unencodable_values():
    with pytest.raises(PerfscopeError, match="multiple of 16"):
        tc.smem_desc(8, 16, 1024, tc.SWIZZLE_128B)
    with pytest.raises(PerfscopeError, match="swizzle mode"):
        tc.smem_desc(0, 16, 1024, 3)


def test_instruction_descriptor_matches_the_ptx_isa_layout():
    """PTX ISA 9.0, §9.7.16.4.2 "Instruction descriptor", table "Instruction descriptor
    format for .kind::tf32, .kind::f16, .kind::f8f6f4 and .kind::i8", .kind::f16 column:
    dtype bits 4-5 (F16 = 0, F32 = 1), atype 7-9 and btype 10-12 (F16 = 0, BF16 = 1),
    negate 13/14, transpose A 15 / B 16 (0 = K-major), N >> 3 at 17-22, bit 23 reserved,
    M >> 4 at 24-28, bit 29 reserved, max shift 30-31 (.ws only, 0)."""
    d = tc.instr_desc_f16("bf16", True, 128, 128, a_mn_major=False, b_mn_major=True)
    f = tc.decode(d, tc.INSTR_F16_FIELDS)
    assert f["dtype"] == 1 and f["atype"] == 1 and f["btype"] == 1
    assert f["transpose_a"] == 0 and f["transpose_b"] == 1
    assert f["n_dim"] == 128 >> 3 and f["m_dim"] == 128 >> 4
    zero = ("sparsity_selector", "sparsity", "saturate", "reserved6", "negate_a", "negate_b",
            "reserved23", "reserved29", "max_shift")
    assert all(f[k] == 0 for k in zero)
    # By hand: (1<<4) | (1<<7) | (1<<10) | (1<<16) | (16<<17) | (8<<24)
    assert d == 0x0821_0490
    h = tc.instr_desc_f16("fp16", True, 64, 256, False, False)
    assert h == (1 << 4) | (32 << 17) | (4 << 24)
    with pytest.raises(PerfscopeError, match="kind::f16 shape"):
        tc.instr_desc_f16("fp16", True, 128, 120, False, False)
    with pytest.raises(PerfscopeError, match="fp16 or bf16"):
        tc.instr_desc_f16("fp32", True, 128, 128, False, False)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_the_cu_encoders_equal_the_python_mirror(dtype):
    """blackwell.cu's constexpr encoders, static_assert-ed against this module's values at
    compile time (NVRTC, sm_100a): the kernel cannot encode differently from what the
    tests above check against the PTX ISA."""
    spec = get_spec(STAGE)
    p = spec.param_dict
    a, b, idesc = tc.stage_descriptors(dtype, p["BM"], p["BN"], p["BK"], a_addr=0x400,
                                       b_addr=0x400 + 16384)
    ab = "tc05::AB_BF16" if dtype == "bf16" else "tc05::AB_F16"
    probe = f"""
static_assert(tc05::smem_desc(0x400u, 16u, 1024u, tc05::SWIZZLE_128B) == {a}ull, "A descriptor");
static_assert(tc05::smem_desc(0x400u + 16384u, {p["BK"] * 128}u, 1024u, tc05::SWIZZLE_128B)
              == {b}ull, "B descriptor");
static_assert(tc05::instr_desc_f16({ab}, true, {p["BM"]}, {p["BN"]}, false, true) == {idesc}u,
              "instruction descriptor");
static_assert(tc05::smem_desc(0x4ab0u, 8192u, 1024u, tc05::SWIZZLE_64B, 3u)
              == {tc.smem_desc(0x4AB0, 8192, 1024, tc.SWIZZLE_64B, 3)}ull, "all fields");
extern "C" __global__ void perfscope_desc_probe() {{}}
"""
    src = spec.source_path().read_text() + probe
    compile_cubin(CompileRequest(src, "blackwell_probe.cu", ("perfscope_desc_probe",), "sm_100a",
                                 (), KERNEL_DIR), use_cache=False)


@pytest.mark.slow
def test_a_wrong_mirror_value_fails_the_compile():
    """The probe above is a real check: a wrong expected value stops NVRTC."""
    src = get_spec(STAGE).source_path().read_text() + (
        'static_assert(tc05::instr_desc_f16(tc05::AB_F16, true, 128, 128, false, true) == 0u, "x");\n'
        'extern "C" __global__ void perfscope_desc_probe() {}\n')
    with pytest.raises(CompileError):
        compile_cubin(CompileRequest(src, "blackwell_probe.cu", ("perfscope_desc_probe",),
                                     "sm_100a", (), KERNEL_DIR), use_cache=False)


# ------------------------------------------------------------ the stage as data


def test_stage_is_labelled_and_kept_out_of_the_runnable_registry():
    spec = get_spec(STAGE)
    assert spec.never_run and spec.label == "compiled, never run"
    assert spec in COMPILED_ONLY and spec not in REGISTRY
    assert spec in audit_specs() and spec.archs == ("sm_100a", "sm_103a")
    assert set(spec.fingerprint) == {"tma", "utcmma", "tmem"}
    assert not [s for s in REGISTRY if s.never_run]


def test_all_never_plans_the_stage(monkeypatch):
    """`plan(["all"])` must not list it at all, so the H200 reference outputs stay identical."""
    monkeypatch.setattr(launch_mod, "driver_compute_capability", lambda: 90)
    jobs = bench.plan(["all"], [], parse_shape("4096x4096x4096"))
    assert STAGE not in {j.spec.name for j in jobs}
    req = profiling.ProfileRequest(stages=("all",), shape="4096x4096x4096")
    plan = profiling.plan_jobs(req)
    assert all(STAGE not in j.stem for j in plan.jobs)
    assert all(STAGE not in r.stem for r in plan.refused)
    with pytest.raises(PerfscopeError, match="compiled, never run"):
        profiling.plan_jobs(profiling.ProfileRequest(stages=(STAGE,), shape="256x256x256"))


@pytest.mark.parametrize("cc, words", [(90, "9.0"), (120, "12.0"), (None, "has none"),
                                       (100, "no host launcher")])
def test_named_stage_is_refused_in_one_sentence(monkeypatch, cc, words):
    monkeypatch.setattr(launch_mod, "driver_compute_capability", lambda: cc)
    with pytest.raises(PerfscopeError) as exc:
        bench.plan([STAGE], [], parse_shape("256x256x256"))
    msg = str(exc.value)
    assert words in msg and "compiled, never run" in msg and "perfscope sass" in msg
    assert "\n" not in msg
    # The launch path refuses the same way, before it would touch CuPy.
    with pytest.raises(PerfscopeError, match="compiled, never run"):
        launch_mod.prepare(get_spec(STAGE), "fp16", parse_shape("256x256x256"))


def test_bench_cli_refuses_it_with_exit_2(monkeypatch):
    monkeypatch.setattr(launch_mod, "driver_compute_capability", lambda: 90)
    res = CliRunner().invoke(app, ["bench", STAGE, "--shape", "256x256x256"])
    assert res.exit_code == 2 and "compiled, never run" in res.output


# ------------------------------------------------------------ the audits


def _audit_cases():
    return [(s, a) for s in audit_specs() for a in s.archs]


@pytest.mark.slow
@pytest.mark.parametrize("spec, arch", _audit_cases(), ids=lambda x: getattr(x, "name", x))
def test_every_stage_shows_its_fingerprint(spec, arch):
    """Every stage with source, for every arch it declares: each fingerprint family is in
    its SASS, in every dtype it takes."""
    tool = disassembler_or_skip()
    for dtype in spec.dtypes:
        a = audit_stage(spec.name, arch, dtype, tool=tool)
        missing = [c.family for c in a.fingerprint if not c.ok]
        assert not missing, f"{spec.name} {dtype} {arch} lacks {missing}"
        assert a.resources is not None and a.resources.static_smem == spec.static_smem_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_100a", "sm_103a"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_tcgen05_sass_shows_the_blackwell_instructions(arch, dtype):
    tool = disassembler_or_skip()
    a = audit_stage(STAGE, arch, dtype, tool=tool)
    bases = a.sass.base_opcodes
    for op in ("UTCHMMA", "UTCBAR", "LDTM", "UTMALDG"):
        assert bases[op] > 0, op
    assert not bases["HMMA"] and not bases["LDGSTS"]
    # 4 k-steps of 16 per BK=64 tile: at least 4 MMAs, and the accumulator never spills.
    assert bases["UTCHMMA"] >= 4
    assert a.resources is not None and not a.resources.spills
    assert a.label == "compiled, never run"
    # No counters-free rule condemns the tcgen05 path.
    assert not a.evaluation.findings
    assert set(a.evaluation.silent) == {"PS130", "PS140", "PS141", "PS142", "PS144", "PS146"}


@pytest.mark.slow
def test_static_rules_reuse_the_counter_rules():
    tool = disassembler_or_skip()
    capped = audit_stage("sgemm_reg8x8_capped", "sm_90a", tool=tool)
    assert [f.code for f in capped.evaluation.findings] == ["PS130"]
    free = audit_stage("sgemm_reg8x8", "sm_90a", tool=tool)
    assert "PS130" in free.evaluation.silent
    hopper = audit_stage("hgemm_bcf_dbf", "sm_90a", tool=tool)
    assert {f.code for f in hopper.evaluation.findings} == {"PS141", "PS142"}
    ampere = audit_stage("hgemm_bcf_dbf", "sm_80", tool=tool)
    assert not ampere.evaluation.findings   # mma.sync is the right path on sm_80


@pytest.mark.slow
def test_cli_prints_the_audit_and_json():
    disassembler_or_skip()
    res = CliRunner().invoke(app, ["sass", STAGE, "--arch", "sm_100a"])
    assert res.exit_code == 0, res.output
    for word in ("compiled, never run", "UTCHMMA", "UTCBAR", "LDTM", "UTMALDG", "fingerprint PASS",
                 "registers"):
        assert word in res.output
    res = CliRunner().invoke(app, ["sass", "hgemm_bcf", "--arch", "sm_90a", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc[0]["fingerprint_ok"] and doc[0]["families"]["hmma"]["count"] > 0
    assert {f["code"] for f in doc[0]["findings"]} == {"PS141", "PS142"}


@pytest.mark.slow
def test_a_cubin_is_audited_as_given():
    tool = disassembler_or_skip()
    from perfscope.kernels.launch import compile_stage

    mod = compile_stage(get_spec(STAGE), "fp16", "sm_103a")
    [a] = audit(str(mod.cubin_path)).audits
    assert a.kind == "cubin" and a.arch == "sm_103a" and a.sass.base_opcodes["UTCHMMA"] > 0
    assert a.resources is None and a.sass.registers == mod.resources[a.kernel].registers
    # Spills and wgmma serialization need ptxas -v, which a cubin lacks; the element type
    # is read from its SASS.
    assert {n.code for n in a.evaluation.not_evaluated} == {"PS130", "PS144"}
    assert "PS140" in a.evaluation.silent
    with pytest.raises(PerfscopeError, match="not sm_90a"):
        audit(str(mod.cubin_path), arch="sm_90a")
    del tool


# ------------------------------------------------------------ wgmma serialization

# ptxas's reports of hgemm_fused_quant (fp8 output) as committed and with its bias pairs
# held across the k loop (tests/fixtures/ptxas/README.md): the held build measured 1.11x
# the cycles of the committed one.
PTXAS = Path(__file__).parent / "fixtures" / "ptxas"
HELD_FP8 = ("HeldBias<T, BN, !RESIDUAL && QUANT == quant::QUANT_INT8> held;",
            "HeldBias<T, BN, !RESIDUAL> held;")


def test_ptxas_wgmma_serialization_is_read_per_entry():
    from perfscope.build import parse_ptxas_log

    (name, usage), = parse_ptxas_log((PTXAS / "hgemm_fused_quant_fp8_held.log").read_text()).items()
    assert name.startswith("_Z17hgemm_fused_quant") and usage.registers == 168
    assert usage.wgmma_serialized == ("non wgmma instructions defining accumulator registers of "
                                      "a wgmma between start and end of the pipeline stage")
    clean = parse_ptxas_log((PTXAS / "hgemm_fused_quant_fp8.log").read_text())
    assert clean[name].wgmma_serialized == "" and clean[name].registers == 168


@pytest.mark.slow
def test_serialized_wgmma_is_a_static_finding_and_no_stage_has_it(caplog):
    """PS144 fires on the build ptxas serialized (the fp8 quant stage holding its bias),
    with ptxas's reason as its evidence, and the compile logs a warning; every committed
    wgmma stage compiles without serialization at its defaults, in both dtypes."""
    import dataclasses
    import logging

    from conftest import benchmark_script

    from perfscope.audit import static_profile
    from perfscope.kernels.launch import compile_stage
    from perfscope.rules import STATIC_REGISTRY, Context, evaluate

    tool = disassembler_or_skip()
    copy = benchmark_script("probed_copy")
    folder = copy.patched_kernel_dir(
        {"fused.cu": copy.patched((KERNEL_DIR / "fused.cu").read_text(), [HELD_FP8])}, "held-fp8-")
    for kernel_dir, serialized in ((folder, True), (KERNEL_DIR, False)):
        spec = dataclasses.replace(get_spec("hgemm_fused_quant"), kernel_dir=kernel_dir)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="perfscope.build"):
            mod = compile_stage(spec, "bf16", "sm_90a")
        mangled = mod.mangled(spec.name_expression("bf16"))
        res = mod.resources[mangled]
        sass = disasm.disassemble(mod.cubin_path, tool).kernel(mangled)
        ev = evaluate(static_profile(sass, "sm_90a", res), None, Context(resources=res),
                      rules=STATIC_REGISTRY)
        codes = {f.code for f in ev.findings}
        if serialized:
            assert "PS144" in codes and res.wgmma_serialized.startswith("non wgmma instructions")
            (f,) = [f for f in ev.findings if f.code == "PS144"]
            assert f.evidence[0].value == res.wgmma_serialized and "{" not in f.fix
            if not mod.from_cache:
                assert any("serialized the wgmma pipeline" in r.getMessage() for r in caplog.records)
        else:
            assert "PS144" in ev.silent and not res.wgmma_serialized
    wgmma = [s for s in audit_specs() if "gmma" in s.fingerprint and "sm_90a" in s.archs]
    assert len(wgmma) >= 8
    for spec in wgmma:
        for dtype in spec.dtypes:
            mod = compile_stage(spec, dtype, "sm_90a")
            assert not mod.resources[mod.mangled(spec.name_expression(dtype))].wgmma_serialized, \
                (spec.name, dtype)


# hgemm_small_m_streamk's producer working out each k tile's tile corner in its loop
# (tests/fixtures/sass/README.md): an integer division per k tile where the TMA loads issue.
DIVIDING = ("""            const int m0 = (pc.tile % tiles_m) * BM, n0 = (pc.tile / tiles_m) * BN;
            for (int kt = pc.k0; kt < pc.k1 && i < to; ++kt, ++i)
                if (i >= from) issue(i, m0, n0, kt);""",
            """            for (int kt = pc.k0; kt < pc.k1 && i < to; ++kt, ++i)
                if (i >= from) issue(i, (pc.tile % tiles_m) * BM, (pc.tile / tiles_m) * BN, kt);""")


@pytest.mark.slow
def test_a_division_in_the_tma_producer_loop_is_a_static_finding_and_no_stage_has_it():
    """PS146 fires on hgemm_small_m_streamk built with its producer dividing per k tile
    (the evidence counts the divisions and loads of the loop), and on no committed TMA
    stage at its defaults, in each dtype and compile target."""
    import dataclasses

    from conftest import benchmark_script

    from perfscope.kernels.fused_specs import small_m_for
    from perfscope.kernels.launch import compile_stage
    from perfscope.kernels.spec import Shape

    tool = disassembler_or_skip()
    copy = benchmark_script("probed_copy")
    folder = copy.patched_kernel_dir(
        {"fused.cu": copy.patched((KERNEL_DIR / "fused.cu").read_text(), [DIVIDING])}, "divides-")
    base = small_m_for(get_spec("hgemm_small_m_streamk"), Shape(16, 8192, 8192))

    def findings(spec, dtype, arch):
        mod = compile_stage(spec, dtype, arch)
        mangled = mod.mangled(spec.name_expression(dtype))
        sass = disasm.disassemble(mod.cubin_path, tool).kernel(mangled)
        return _audit_evaluation(sass, arch, mod.resources[mangled])

    ev = findings(dataclasses.replace(base, kernel_dir=folder), "bf16", "sm_90a")
    (f,) = [f for f in ev.findings if f.code == "PS146"]
    assert [e.value for e in f.evidence[:2]] == [4, 8] and f.estimated_gain is None
    assert f.severity == "optimization"   # no counters, no estimate: never a warning
    tma = [s for s in audit_specs() if "tma" in s.fingerprint]
    assert len(tma) >= 10
    for spec in tma:
        for dtype in spec.dtypes:
            for arch in spec.archs:
                ev = findings(spec, dtype, arch)
                assert "PS146" in ev.silent, (spec.name, dtype, arch, ev.findings)


def _audit_evaluation(sass, arch, resources):
    """The static audit's evaluation of one kernel (perfscope.audit's own call)."""
    from perfscope.audit import _evaluate
    from perfscope.rules import Context

    return _evaluate(sass, arch, resources, Context(resources=resources))


# ------------------------------------------------------------ bad input


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_999", "sm_80a", "hopper", "sm_90x"])
def test_unknown_arch_is_one_sentence(arch):
    res = CliRunner().invoke(app, ["sass", "hgemm_bcf", "--arch", arch])
    assert res.exit_code == 2
    line = res.output.strip()
    assert line.startswith("perfscope: ") and arch in line and "\n" not in line


@pytest.mark.slow
def test_stage_built_for_the_wrong_arch_is_refused():
    with pytest.raises(PerfscopeError, match=r"needs compute capability 10\.0"):
        audit_stage(STAGE, "sm_90a")
    with pytest.raises(PerfscopeError, match="built only for sm_100a, sm_103a"):
        audit_stage(STAGE, "sm_120a")


@pytest.mark.slow
def test_source_that_does_not_compile_shows_the_log():
    """NVRTC, as in CI: the error names the file, the arch and the compiler's own line."""
    src = "__global__ void k(float* p) { p[0] = not_declared; }\n"
    with pytest.raises(CompileError) as exc:
        compile_cubin(CompileRequest(src, "broken.cu", ("k",), "sm_100a"), use_cache=False)
    assert "broken.cu" in str(exc.value) and "not_declared" in str(exc.value)
    assert "not_declared" in exc.value.log


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (a CUDA toolkit)")
def test_cu_path_compiles_with_nvcc_and_shows_the_log(tmp_path):
    disassembler_or_skip()
    good = tmp_path / "good.cu"
    good.write_text("__global__ void twice(float* p) { p[threadIdx.x] *= 2.0f; }\n")
    [a] = audit(str(good), arch="sm_100a").audits
    assert a.kind == "cu" and a.resources is not None and a.sass.base_opcodes["LDG"] == 1
    bad = tmp_path / "bad.cu"
    bad.write_text("__global__ void k(float* p) { p[0] = not_declared; }\n")
    res = CliRunner().invoke(app, ["sass", str(bad)])
    assert res.exit_code == 2
    assert res.output.startswith("perfscope: compiling bad.cu for sm_90a failed")
    assert "not_declared" in res.output


@pytest.mark.slow
def test_cu_path_without_nvcc_says_what_to_do(tmp_path, monkeypatch):
    disassembler_or_skip()
    src = tmp_path / "k.cu"
    src.write_text("__global__ void k() {}\n")
    monkeypatch.setattr(shutil, "which", lambda name: None if name == "nvcc" else "/bin/true")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(disasm, "find_tool", lambda *a, **k: disasm.Tool("cuobjdump", Path("x"), "test"))
    with pytest.raises(PerfscopeError, match="nvcc, which is not on PATH"):
        audit(str(src), arch="sm_90a")


@pytest.mark.slow
def test_missing_disassembler_says_how_to_install(monkeypatch):
    monkeypatch.setenv("PATH", "")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(disasm, "_wheel_binary", lambda tool, dist: None)
    monkeypatch.setattr(disasm, "_pathfinder_binary", lambda tool: None)
    res = CliRunner().invoke(app, ["sass", "hgemm_bcf"])
    assert res.exit_code == 2
    line = res.output.strip()
    # From this checkout: 'perfscope' on PyPI is another project (issue 16, item 12).
    assert "pip install -e '" in line and "[build]'" in line and "nvidia-cuda-cuobjdump" in line
    assert "'perfscope[build]'" not in line
    assert "\n" not in line


def test_disassembler_is_found_in_cuda_home(tmp_path, monkeypatch):
    fake = tmp_path / "bin" / "nvdisasm"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", "")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    tool = disasm.find_tool()
    assert tool.name == "nvdisasm" and tool.origin == "CUDA_HOME"


@pytest.mark.slow
def test_param_audits_a_stage_configuration():
    """`--param` compiles the stage with those template parameters (the kernel's name says
    them) and is refused for anything but a stage name, in one sentence."""
    disassembler_or_skip()
    res = CliRunner().invoke(app, ["sass", "hgemm_ring", "--param", "STAGES=4", "--json"])
    assert res.exit_code == 0, res.output
    [a] = json.loads(res.output)
    assert a["target"] == "hgemm_ring@STAGES=4" and "Li64ELi4ELi8E" in a["kernel"]
    for argv, words in ((["hgemm_ring", "--param", "NOPE=1"], "no template parameter NOPE"),
                        (["hgemm_ring", "--param", "STAGES"], "NAME=INTEGER"),
                        ([str(Path(__file__).resolve().parents[1] / "reports" / "reference" / "h200"
                              / "hgemm_ring-bf16-4096x4096x4096.ncu-rep.xz"), "--param",
                          "STAGES=4"], "not a stage name")):
        res = CliRunner().invoke(app, ["sass", *argv])
        line = res.output.strip()
        assert res.exit_code == 2 and words in line and "\n" not in line, argv


@pytest.mark.slow
def test_not_a_stage_or_a_kernel_file():
    res = CliRunner().invoke(app, ["sass", "sgemm_fastest"])
    assert res.exit_code == 2 and "unknown stage" in res.output
    res = CliRunner().invoke(app, ["sass", "cublas_hgemm"])
    assert res.exit_code == 2 and "no source" in res.output
    res = CliRunner().invoke(app, ["sass", "missing.cubin"])
    assert res.exit_code == 2 and "does not exist" in res.output


def test_sass_parser_reads_both_tools():
    cuobjdump = """
	code for sm_100a
	.target	sm_100a

		Function : _Z1kPf
	.headerflags	@"EF_CUDA_ACCELERATORS EF_CUDA_SM100"
        /*0000*/                   LDC R1, c[0x0][0x37c] ;          /* 0x0000df00ff017b82 */
        /*0010*/              @!P0 UTCHMMA gdesc[UR4], gdesc[UR10], tmem[UR9], idesc[UR13], UPT ;  /* 0x */
        /*0020*/                   LDTM.x16 R4, tmem[UR5] ;
        /*0030*/                   NOP;
"""
    [(name, target, ins)] = disasm.parse_sass(cuobjdump)
    assert name == "_Z1kPf" and target == "sm_100a" and len(ins) == 4
    k = disasm.KernelSass(name, tuple(ins), target)
    assert k.opcodes == {"LDC": 1, "UTCHMMA": 1, "LDTM.x16": 1}
    nvdisasm = """	.target	sm_90a
.text._Z1kPf:
        /*0000*/                   HMMA.16816.F32 R0, R4, R8, R0 ;
"""
    [(name, target, ins)] = disasm.parse_sass(nvdisasm)
    assert name == "_Z1kPf" and target == "sm_90a" and ins == ["HMMA.16816.F32 R0, R4, R8, R0"]
    res = disasm.parse_res_usage(" Function _Z1kPf:\n  REG:28 STACK:0 SHARED:1104 LOCAL:0 CONSTANT[0]:1172\n")
    assert res == {"_Z1kPf": {"REG": 28, "STACK": 0, "SHARED": 1104, "LOCAL": 0}}


@pytest.mark.slow
def test_a_missing_fingerprint_family_fails_with_exit_1(monkeypatch):
    """A stage whose SASS lacks a declared family is reported FAIL, and the command exits 1."""
    disassembler_or_skip()
    import dataclasses

    import perfscope.audit as audit_mod

    real = audit_mod.get_spec
    wrong = dataclasses.replace(real("hgemm_bcf"), fingerprint=("hmma", "gmma"))
    monkeypatch.setattr(audit_mod, "get_spec", lambda name: wrong if name == "hgemm_bcf" else real(name))
    res = CliRunner().invoke(app, ["sass", "hgemm_bcf", "--arch", "sm_90a"])
    assert res.exit_code == 1
    assert "fingerprint FAIL" in res.output and "none in the SASS" in res.output


def test_readme_labels_the_stage():
    text = (Path(__file__).parent.parent / "README.md").read_text()
    assert "perfscope sass" in text and "hgemm_tcgen05" in text
    assert "compiled, never run" in text


def test_a_folder_is_named_as_a_folder(tmp_path):
    """`perfscope sass DIR` (issue 16, item 11): a folder, not "does not exist"."""
    res = CliRunner().invoke(app, ["sass", str(tmp_path)])
    assert res.exit_code == 2 and res.output.count("\n") == 1
    assert f"{tmp_path} is a folder; name one .cu source or .cubin in it" in res.output


def test_fp32_fetch_probe_variants_still_apply_and_compile_as_meant(tmp_path):
    """The FP32 instruction-fetch probe (reports/.../probes/variants/fp32_fetch_probe.py)
    waits for a device; its edits to sgemm.cu are string anchors, so a change to the kernel
    would only show there, after the machine is paid for. Here: every variant still applies,
    chunk8 halves the k loop (its backward branch spans 1,024 FFMAs, not 2,048) with the
    same registers and no spill, and l2hint puts the prefetch hint on every copy."""
    disassembler_or_skip()
    import importlib.util
    path = (Path(__file__).resolve().parents[1] / "reports" / "reference" / "h200" / "probes"
            / "variants" / "fp32_fetch_probe.py")
    loader = importlib.util.spec_from_file_location("fp32_fetch_probe", path)
    probe = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(probe)
    plain = probe.loop_stats(KERNEL_DIR)
    chunk = probe.loop_stats(probe.variant("chunk8", tmp_path))
    hint = probe.loop_stats(probe.variant("l2hint", tmp_path))
    assert plain["ffma"] == 2048 and chunk["ffma"] == 1024
    assert chunk["longest_backward_branch"] < 0.6 * plain["longest_backward_branch"]
    assert chunk["registers"] == plain["registers"] and chunk["spill_stores"] == 0
    assert plain["ldgsts_ltc128b"] == 0 and hint["ldgsts_ltc128b"] > 0
    assert hint["instructions"] == plain["instructions"]
