"""perfscope.build: NVRTC to cubin, ptxas resource usage, the cache, compile errors."""

from __future__ import annotations

import pytest

from perfscope.build import (
    CompileError,
    CompileRequest,
    compile_cubin,
    cuda_include_dir,
    parse_ptxas_log,
)
from perfscope.cache import cache_root
from perfscope.errors import PerfscopeError

SRC = r"""
#include <cuda_fp16.h>
template <typename T, int N>
__global__ void scale(const T* a, const T* b, T* c, int M, int NN, int K) {
    __shared__ float tile[N];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    tile[threadIdx.x % N] = (float)a[i];
    __syncthreads();
    if (i < M) c[i] = (T)(tile[(threadIdx.x + 1) % N] * (float)b[i]);
}
"""


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PERFSCOPE_CACHE", str(tmp_path / "cache"))


def _req(**kw) -> CompileRequest:
    base = {"source": SRC, "source_name": "scale.cu",
            "name_expressions": ("scale<__half, 64>", "scale<float, 128>"), "arch": "sm_90a"}
    base.update(kw)
    return CompileRequest(**base)


def test_headers_come_from_the_runtime_wheel():
    assert (cuda_include_dir() / "cuda_bf16.h").is_file()


@pytest.mark.slow
def test_compile_reads_resources_per_instantiation():
    mod = compile_cubin(_req())
    assert mod.cubin[:4] == b"\x7fELF"
    half, single = mod.usage("scale<__half, 64>"), mod.usage("scale<float, 128>")
    assert half.static_smem == 64 * 4 and single.static_smem == 128 * 4
    assert half.registers > 0 and not half.spills
    assert mod.lowered["scale<__half, 64>"].startswith("_Z")


@pytest.mark.slow
def test_cache_hit_and_key(tmp_path):
    first = compile_cubin(_req())
    again = compile_cubin(_req())
    assert not first.from_cache and again.from_cache
    assert again.cubin_path == first.cubin_path and again.resources == first.resources
    assert str(cache_root()).startswith(str(tmp_path))
    other_arch = compile_cubin(_req(arch="sm_80"))
    other_flags = compile_cubin(_req(flags=("-maxrregcount=32",)))
    other_src = compile_cubin(_req(source=SRC + "\n// changed\n"))
    paths = {first.cubin_path, other_arch.cubin_path, other_flags.cubin_path,
             other_src.cubin_path}
    assert len(paths) == 4
    assert other_src.source_hash != first.source_hash


@pytest.mark.slow
def test_local_headers_are_part_of_the_hash(tmp_path):
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "extra.cuh").write_text("#define SCALE 2.0f\n")
    src = '#include "extra.cuh"\n' + SRC
    one = compile_cubin(_req(source=src, include_dir=inc))
    (inc / "extra.cuh").write_text("#define SCALE 3.0f\n")
    two = compile_cubin(_req(source=src, include_dir=inc))
    assert one.source_hash != two.source_hash and not two.from_cache


@pytest.mark.slow
def test_compile_error_carries_the_log():
    with pytest.raises(CompileError) as exc:
        compile_cubin(_req(source=SRC.replace("__syncthreads();", "__syncthreads()")))
    assert "scale.cu" in str(exc.value) and "sm_90a" in str(exc.value)
    assert "error" in exc.value.log
    assert isinstance(exc.value, PerfscopeError)


@pytest.mark.slow
def test_unknown_name_expression_is_an_error():
    with pytest.raises(PerfscopeError):
        compile_cubin(_req(name_expressions=("nothere<float, 4>",)))


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["compute_90", "sm90", "90", "sm_90x"])
def test_bad_arch_refused(arch):
    with pytest.raises(PerfscopeError, match="architecture"):
        compile_cubin(_req(arch=arch))


@pytest.mark.slow
def test_spill_shows_in_resources():
    src = r"""
template <typename T, int N>
__global__ void hog(const T* a, const T* b, T* c, int M, int NN, int K) {
    float acc[N];
#pragma unroll
    for (int k = 0; k < N; ++k) acc[k] = a[(threadIdx.x + k * 977) % M];
    for (int it = 0; it < K; ++it) {
#pragma unroll
        for (int k = 0; k < N; ++k) acc[k] = fmaf(acc[k], b[it], acc[(k + 7) % N]);
    }
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < N; ++k) s += acc[k] * (float)(k + 1);
    c[threadIdx.x] = s;
}
"""
    capped = compile_cubin(_req(source=src, name_expressions=("hog<float, 64>",),
                                flags=("-maxrregcount=32",)))
    free = compile_cubin(_req(source=src, name_expressions=("hog<float, 64>",)))
    assert capped.usage("hog<float, 64>").spills
    assert not free.usage("hog<float, 64>").spills


def test_parse_ptxas_log_sample():
    text = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z1kIfEvv' for 'sm_80'
ptxas info    : Function properties for _Z1kIfEvv
    24 bytes stack frame, 20 bytes spill stores, 16 bytes spill loads
ptxas info    : Used 64 registers, used 1 barriers, 24 bytes cumulative stack size, \
16384 bytes smem, 388 bytes cmem[0]
"""
    use = parse_ptxas_log(text)["_Z1kIfEvv"]
    assert (use.registers, use.static_smem, use.stack_frame, use.spill_stores,
            use.spill_loads, use.barriers, use.cmem0) == (64, 16384, 24, 20, 16, 1, 388)
    assert use.spills


def test_an_empty_log_leaves_the_interpreter_intact():
    """NVRTC writes its log into the buffer it is handed. An empty log is one NUL: handed
    `b" " * 1`, the interpreter's shared b" ", NVRTC turned every b" " of the process into
    b"\\0" (seen on the H200: later ptxas logs came back empty, print wrote NULs)."""
    from perfscope.build import _nvrtc, _program_log

    nvrtc = _nvrtc()
    err, prog = nvrtc.nvrtcCreateProgram(b'extern "C" __global__ void k() {}', b"k.cu", 0, [], [])
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, 1, [b"--gpu-architecture=sm_90a"])
        assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS
        assert nvrtc.nvrtcGetProgramLogSize(prog)[1] == 1   # the case that corrupted b" "
        assert _program_log(nvrtc, prog) == ""
    finally:
        nvrtc.nvrtcDestroyProgram(prog)

    class Recorder:
        """Hands back what NVRTC would, and keeps the buffers it was given."""

        def __init__(self):
            self.given = []

        def nvrtcGetProgramLogSize(self, prog):
            return nvrtc.nvrtcResult.NVRTC_SUCCESS, 1

        def nvrtcGetProgramLog(self, prog, buf):
            self.given.append(buf)
            buf[0] = 0  # what NVRTC does: it writes into the buffer
            return (nvrtc.nvrtcResult.NVRTC_SUCCESS,)

        def __getattr__(self, name):
            return getattr(nvrtc, name)

    fake = Recorder()
    assert _program_log(fake, None) == ""
    # A bytes object would have taken the write (on Python 3.12 the interpreter's own b" ").
    assert isinstance(fake.given[0], bytearray)
    assert bytes([32]) == b" "
