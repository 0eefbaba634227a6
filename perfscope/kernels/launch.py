"""Run a stage on the GPU: compile (or reuse) its cubin, load it through CuPy, launch it.

This is the one call path that ``bench`` and the child process that ``ncu`` profiles
both use, for the ladder kernels (a cubin from :mod:`perfscope.build`, loaded with
``cupy.RawModule``; pointer-ABI stages launched by CuPy, tensor-map stages through
:mod:`perfscope.kernels.tensormap` and ``cuLaunchKernelEx``) and for the cuBLAS references
(``cupy.matmul``, which CuPy 14 sends to cuBLAS for float32, float16 and
ml_dtypes.bfloat16 arrays); the cuBLASLt references go through nvmath-python's stateful
``Matmul`` (planned once per set of operands, then executed in place into C).

CuPy is imported only here and only when a GPU is asked for, so the CPU-only parts of
perfscope (compiling, the registry, reading reports) work without it.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from perfscope.build import CompiledModule, CompileRequest, check_arch, compile_cubin
from perfscope.errors import PerfscopeError, one_line
from perfscope.kernels.epilogue import (
    ELEMENTWISE_SOURCE,
    ELEMENTWISE_SOURCE_NAME,
    Epilogue,
    EpilogueOperands,
    elementwise_expression,
    elementwise_grid,
    epilogue_of,
)
from perfscope.kernels.fp8 import FP8, FP8_SCALES
from perfscope.kernels.fused_specs import fused_geometry, output_dtype
from perfscope.kernels.maps import plan_maps
from perfscope.kernels.registry import LT_FP8_FAST_ACCUMULATION, LT_REFERENCES
from perfscope.kernels.spec import KERNEL_DIR, KernelSpec, Shape
from perfscope.kernels.tensormap import (
    Driver,
    TensorMapLauncher,
    balanced_grid,
    persistent_grid,
)
from perfscope.kernels.weights import ROW_MAJOR, check_weight, weight_for
from perfscope.locations import install_hint

log = logging.getLogger(__name__)


def _driver() -> ctypes.CDLL | None:
    """libcuda, initialised, loaded without CuPy; None with no driver or a failed cuInit."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    return cuda if cuda.cuInit(0) == 0 else None


def driver_device_count() -> int:
    """CUDA devices the driver reports, asked without CuPy (0 with no driver)."""
    cuda, count = _driver(), ctypes.c_int(0)
    if cuda is None or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value


def _driver_attributes(*attributes: int) -> tuple[int, ...] | None:
    """Device 0's CUdevice_attribute values, asked of the driver without CuPy; None with no
    driver or no device."""
    cuda, dev = _driver(), ctypes.c_int(0)
    if cuda is None or cuda.cuDeviceGet(ctypes.byref(dev), 0) != 0:
        return None
    values = []
    for attribute in attributes:
        value = ctypes.c_int(0)
        if cuda.cuDeviceGetAttribute(ctypes.byref(value), attribute, dev) != 0:
            return None
        values.append(value.value)
    return tuple(values)


def driver_compute_capability() -> int | None:
    """Device 0's compute capability as 90 for 9.0, asked of the driver without CuPy; None
    with no driver or no device."""
    # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75, _MINOR = 76 (cuda.h).
    got = _driver_attributes(75, 76)
    return None if got is None else got[0] * 10 + got[1]


def driver_multiprocessors() -> int | None:
    """Device 0's multiprocessor count, asked of the driver without CuPy; None with no
    driver or no device."""
    # CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16 (cuda.h).
    got = _driver_attributes(16)
    return None if got is None else got[0]


def never_run_refusal(spec: KernelSpec, cc: int | None) -> str:
    """The one sentence that refuses to run a "compiled, never run" stage on this machine."""
    need = " or ".join(f"{c / 10:.1f}" for c in spec.only_cc) or f"{spec.min_cc / 10:.1f}+"
    audit = f"audit its SASS with `perfscope sass {spec.name}` instead"
    if cc is None:
        return (f"{spec.name} is {spec.label}: it needs a GPU of compute capability {need} and "
                f"this machine has none; {audit}")
    if spec.only_cc and cc not in spec.only_cc:
        return (f"{spec.name} is {spec.label}: it needs a GPU with tcgen05 (compute capability "
                f"{need}) and this one has {cc / 10:.1f}; {audit}")
    # On a tcgen05 GPU: its A and B arrive as CUtensorMaps, which the CuPy launch path
    # (pointers only) cannot pass yet.
    return (f"{spec.name} is {spec.label}: perfscope has no host launcher for its CUtensorMap "
            f"arguments yet, so bench and profile cannot run it; {audit}")


def require_gpu() -> Any:
    """The cupy module with a usable CUDA device, or a one-sentence refusal."""
    # TF32 would make cuBLAS's FP32 reference a different (less exact) computation;
    # CuPy reads this variable when it is imported.
    if os.environ.get("CUPY_TF32", "0") not in ("", "0"):
        raise PerfscopeError("CUPY_TF32 is set; unset it so the FP32 cuBLAS reference "
                             "computes in true FP32")
    if "ncu_report" in sys.modules and "cupy" not in sys.modules and driver_device_count() > 0:
        # Seen on the H200: CuPy's import segfaults once Nsight Compute's report reader is
        # loaded, so kernels and reports live in separate processes.
        raise PerfscopeError("Nsight Compute's report reader is loaded in this process and CuPy "
                             "would crash beside it; run bench or profile in a process that "
                             "reads no reports.")
    try:
        import cupy
    except ImportError:
        raise PerfscopeError("no GPU: CuPy is not installed (install perfscope with the "
                             f"'cuda13' or 'cuda12' extra on a machine with an NVIDIA GPU: "
                             f"{install_hint('cuda13')})"
                             ) from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CuPy raises its own CUDARuntimeError without a driver
        raise PerfscopeError(f"no GPU: CUDA reports no usable device ({exc})") from None
    if count < 1:
        raise PerfscopeError("no GPU: CUDA reports no device")
    return cupy


def device_arch(cupy: Any) -> tuple[str, int]:
    """The cubin target for the current device (sm_90a on Hopper) and its capability."""
    # CuPy spells it as a string of digits: "90" for 9.0, "120" for 12.0.
    cc = int(cupy.cuda.Device().compute_capability)
    # Arch-specific targets where the chip has instructions only they expose (wgmma,
    # setmaxnreg on 9.0; tcgen05 on 10.x); a plain target elsewhere.
    suffix = "a" if cc in (90, 100, 103) else ""
    return f"sm_{cc}{suffix}", cc


def numpy_dtype(dtype: str) -> Any:
    """The NumPy dtype of an element type (bf16 through ml_dtypes); PerfscopeError for another."""
    import numpy as np

    if dtype == "fp32":
        return np.dtype(np.float32)
    if dtype == "fp16":
        return np.dtype(np.float16)
    if dtype == "bf16":
        try:
            import ml_dtypes
        except ImportError:
            raise PerfscopeError("bf16 needs the ml_dtypes package, which is not installed"
                                 ) from None
        return np.dtype(ml_dtypes.bfloat16)
    raise PerfscopeError(f"unknown dtype {dtype!r}")


# cuBLAS's enums for cublasGemmStridedBatchedEx (library_types.h, cublas_api.h).
_CUDA_DATA_TYPE = {"fp32": 0, "fp16": 2, "bf16": 14}     # CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF
_CUBLAS_COMPUTE_32F = 68     # fp32 accumulate; no TF32 unless the handle's math mode asks
_CUBLAS_GEMM_DEFAULT = -1


def _strided_batched(cupy: Any, a: Any, b: Any, c: Any, dtype: str) -> None:
    """C[i] = A[i]·B[i] for the whole batch in one cublasGemmStridedBatchedEx, the call
    torch.bmm makes (CuPy's matmul on 3-D bfloat16 operands fails on the dtype). Row-major
    operands are column-major transposes, so cuBLAS computes C^T = B^T·A^T."""
    import numpy as np
    from cupy_backends.cuda.libs import cublas

    batch, m, k = a.shape
    n = b.shape[2]
    data_type = _CUDA_DATA_TYPE[dtype]
    one, zero = np.ones(1, np.float32), np.zeros(1, np.float32)
    handle = cupy.cuda.device.get_cublas_handle()
    cublas.setStream(handle, cupy.cuda.get_current_stream().ptr)
    cublas.gemmStridedBatchedEx(handle, cublas.CUBLAS_OP_N, cublas.CUBLAS_OP_N, n, m, k,
                                one.ctypes.data, b.data.ptr, data_type, n, k * n,
                                a.data.ptr, data_type, k, m * k, zero.ctypes.data,
                                c.data.ptr, data_type, n, m * n, batch, _CUBLAS_COMPUTE_32F,
                                _CUBLAS_GEMM_DEFAULT)


def output_array(cp: Any, prep: Prepared) -> Any:
    """An uninitialised C for a prepared stage: of its dtype, or one byte per element (uint8
    codes for fp8, int8) for a quantising stage or group."""
    out = output_dtype(prep.spec, prep.dtype)
    nd = {"fp8": cp.uint8, "int8": cp.int8}.get(out) or numpy_dtype(out)
    return cp.empty((*prep.shape.lead, prep.shape.m, prep.shape.n), dtype=nd)


def compile_stage(spec: KernelSpec, dtype: str, arch: str) -> CompiledModule:
    """The cubin of one stage instantiated for one dtype (CPU only; cached)."""
    spec.check_dtype(dtype)
    path = spec.source_path()
    if not path.is_file():
        raise PerfscopeError(f"{spec.name}'s source {path.name} is missing from {spec.kernel_dir}")
    check_arch(arch)
    spec.check_arch(arch)
    req = CompileRequest(source=path.read_text(), source_name=path.name,
                         name_expressions=(spec.name_expression(dtype),), arch=arch,
                         flags=spec.flags, include_dir=spec.kernel_dir)
    return compile_cubin(req)


@dataclass(frozen=True)
class Prepared:
    """A stage ready to launch on one shape: ``launch(a, b, c)`` enqueues one GEMM."""

    spec: KernelSpec
    dtype: str
    shape: Shape
    module: CompiledModule | None
    function: Any
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_smem: int
    # Held so the loaded module outlives every launch of its function.
    raw_module: Any = None
    # Set for tensor-map stages: encodes A, B and C's maps and calls cuLaunchKernelEx.
    tensormap: Any = None
    # Set for the cuBLASLt references: an LtMatmul.
    library: Any = None
    # Set for a fused stage and for its group reference: what follows the GEMM.
    epilogue: Epilogue | None = None
    # Set for a group reference: the elementwise pass launched after cuBLAS.
    elementwise: Any = None
    # Set for a quantising group: cuBLAS's C of the GEMM's dtype, which the pass reads.
    scratch: Any = None
    # Set for an fp8 stage: scale_a and scale_b (fp8.FP8_SCALES) on the device, the kernel's
    # last pointer argument.
    scales: Any = None

    @property
    def expression(self) -> str:
        """The name expression of the kernel that was compiled: the stage's, or for a group
        reference its elementwise pass's."""
        if self.elementwise is not None and self.epilogue is not None:
            return elementwise_expression(self.dtype, self.epilogue)
        return self.spec.name_expression(self.dtype)

    @property
    def source_name(self) -> str:
        """The CUDA source file the compiled kernel came from."""
        if self.elementwise is not None:
            return ELEMENTWISE_SOURCE_NAME
        return self.spec.source or ""

    def weight(self, b: Any) -> Any:
        """B (the row-major K x N matrix) as this stage takes it: itself, or packed into
        hgemm_small_m_packed's strips (kernels/weights.py). Called once per weight, before
        any launch is timed, as an inference engine packs a model's weights when it loads
        them."""
        if self.spec.weight_layout == ROW_MAJOR:
            return b
        import cupy

        return weight_for(cupy, self.spec.weight_layout, b)

    def launch(self, a: Any, b: Any, c: Any, extra: EpilogueOperands | None = None) -> None:
        """Enqueue C = A·B (then the epilogue, given its bias and residual in ``extra``) on the
        current stream: through cuBLASLt, cuBLAS, a tensor-map launch or the kernel itself.
        B is in the stage's own layout (``weight``)."""
        if self.epilogue is not None and extra is None:
            raise PerfscopeError(f"{self.spec.name} applies {self.epilogue.label} and needs its "
                                 "bias" + (" and residual" if self.epilogue.residual else "")
                                 + " operands")
        if self.library is not None:
            self.library(a, b, c)
            return
        if self.function is None:
            import cupy

            if self.shape.batch > 1:
                _strided_batched(cupy, a, b, c, self.dtype)
                return
            cupy.matmul(a, b, out=c if self.scratch is None else self.scratch)
            if self.elementwise is not None:
                self._elementwise(cupy, c, extra)
            return
        if self.tensormap is not None:
            import cupy

            if self.spec.weight_layout != ROW_MAJOR:
                check_weight(self.spec.name, self.spec.weight_layout, b, self.shape.k,
                             self.shape.n)
            ptrs = () if extra is None else _operand_pointers(extra, self.epilogue)
            if self.scales is not None:
                ptrs = (*ptrs, self.scales.data.ptr)
            self.tensormap(a.data.ptr, b.data.ptr, c.data.ptr,
                           cupy.cuda.get_current_stream().ptr, ptrs)
            return
        import numpy as np

        s = self.shape
        self.function(self.grid, self.block, (a, b, c, np.int32(s.m), np.int32(s.n),
                                              np.int32(s.k)), shared_mem=self.dynamic_smem)

    def _elementwise(self, cupy: Any, c: Any, extra: EpilogueOperands) -> None:
        import numpy as np

        s = self.shape
        vectors, blocks = self.grid[0], self.grid[1]
        # In place on C, or (quantising) from cuBLAS's scratch C into the one-byte C.
        y = c if self.scratch is None else self.scratch
        res = extra.residual if extra.residual is not None else y
        bias, y16, res16 = extra.bias.view(cupy.uint16), y.view(cupy.uint16), res.view(cupy.uint16)
        if self.scratch is None:
            operands = (y16, bias, res16)
        else:
            amax = extra.amax if extra.amax is not None else 0
            operands = (y16, c.view(cupy.uint8), bias, res16, extra.scale, amax)
        self.elementwise((blocks,), (256,), (*operands, np.int64(vectors), np.int32(s.n // 8)))


def prepare(spec: KernelSpec, dtype: str, shape: Shape) -> Prepared:
    """Check dtype and shape, compile for this GPU, load, and fix the launch geometry."""
    spec.check_dtype(dtype)
    spec.check_shape(shape)
    if spec.never_run:
        raise PerfscopeError(never_run_refusal(spec, driver_compute_capability()))
    epilogue = epilogue_of(spec)
    cupy = require_gpu()
    arch, cc = device_arch(cupy)
    refusal = capability_refusal(spec, cc)
    if refusal:
        raise PerfscopeError(refusal)
    if spec.is_reference:
        if epilogue is not None:
            return _group(cupy, spec, dtype, shape, epilogue, arch)
        lt = None
        if spec.name in LT_FP8_FAST_ACCUMULATION:
            lt = LtFp8Matmul(nvmath_advanced(), LT_FP8_FAST_ACCUMULATION[spec.name])
        elif spec.name in _LT_NAMES:
            lt = LtMatmul(nvmath_advanced())
        return Prepared(spec, dtype, shape, None, None, (0, 0, 0), (0, 0, 0), 0, library=lt)
    module = compile_stage(spec, dtype, arch)
    raw = cupy.RawModule(path=str(module.cubin_path))
    fn = raw.get_function(module.mangled(spec.name_expression(dtype)))
    smem = spec.dynamic_smem_bytes()
    if smem > 48 * 1024:
        # Above 48 KiB the driver needs the kernel's explicit opt-in.
        fn.max_dynamic_shared_size_bytes = smem
    grid, block = spec.grid_dims(shape), spec.block_dims()
    launcher = None
    if spec.abi == "tensormap":
        driver = Driver()
        cluster = spec.cluster
        if epilogue is not None:
            grid, cluster = _fused_geometry(cupy, spec, shape, driver, fn.kernel.ptr, smem)
        elif spec.persistent:
            capacity = _capacity(cupy, spec, driver, fn.kernel.ptr, smem)
            tiles = grid[0] * grid[1] * grid[2]
            grid = (balanced_grid(tiles, capacity) if spec.balanced
                    else persistent_grid(tiles, capacity, spec.cluster), 1, 1)
        launcher = TensorMapLauncher(plan_maps(spec, dtype, shape), fn.kernel.ptr,
                                     (grid, block, smem), shape, driver, cluster)
    scales = cupy.asarray(FP8_SCALES, dtype=cupy.float32) if dtype == FP8 else None
    return Prepared(spec, dtype, shape, module, fn, grid, block, smem, raw, launcher,
                    epilogue=epilogue, scales=scales)


def _group(cupy: Any, spec: KernelSpec, dtype: str, shape: Shape, epilogue: Epilogue,
           arch: str) -> Prepared:
    """cuBLAS then the elementwise epilogue pass: one prepared group of two launches (grid
    holds the pass's (vectors, blocks))."""
    expr = elementwise_expression(dtype, epilogue)   # N % 8 == 0: the spec's constraint
    module = compile_cubin(elementwise_request(dtype, epilogue, arch))
    raw = cupy.RawModule(path=str(module.cubin_path))
    fn = raw.get_function(module.mangled(expr))
    sms = int(cupy.cuda.Device().attributes["MultiProcessorCount"])
    vectors, blocks = elementwise_grid(shape.m, shape.n, sms)
    scratch = (cupy.empty((shape.m, shape.n), dtype=numpy_dtype(dtype))
               if epilogue.quant is not None else None)
    return Prepared(spec, dtype, shape, module, None, (vectors, blocks, 1), (256, 1, 1), 0, raw,
                    epilogue=epilogue, elementwise=fn, scratch=scratch)


def _operand_pointers(extra: EpilogueOperands, epilogue: Epilogue | None) -> tuple[int, ...]:
    """The fused stages' pointer arguments after K: bias, residual (0: NULL) and, for a
    quantising epilogue, scale and amax (0: not computed)."""
    ptrs = (extra.bias.data.ptr, extra.residual.data.ptr if extra.residual is not None else 0)
    if epilogue is None or epilogue.quant is None:
        return ptrs
    if extra.scale is None:
        raise PerfscopeError(f"a {epilogue.quant} epilogue needs its scale operand")
    return (*ptrs, extra.scale.data.ptr, extra.amax.data.ptr if extra.amax is not None else 0)


def elementwise_request(dtype: str, epilogue: Epilogue, arch: str) -> CompileRequest:
    """The NVRTC request of the unfused baseline's elementwise pass for a dtype and epilogue
    (it includes activation.cuh from perfscope/kernels, as fused.cu does)."""
    return CompileRequest(source=ELEMENTWISE_SOURCE, source_name=ELEMENTWISE_SOURCE_NAME,
                          name_expressions=(elementwise_expression(dtype, epilogue),), arch=arch,
                          include_dir=KERNEL_DIR)


def cluster_fit(driver: Any, function: int, block: tuple[int, int, int], smem: int
                ) -> Callable[[int, int], bool]:
    """fused_geometry's ``fits(ctas, clusters)`` for one compiled kernel: whether that many
    clusters of that many CTAs are co-resident (the driver's cuOccupancyMaxActiveClusters);
    a failing query counts as no."""
    def fits(ctas: int, clusters: int) -> bool:
        try:
            return driver.max_active_clusters(function, block, smem, ctas) >= clusters
        except Exception as exc:
            log.warning("cuOccupancyMaxActiveClusters for %d CTAs: %s", ctas, exc)
            return False

    return fits


def _fused_geometry(cupy: Any, spec: KernelSpec, shape: Shape, driver: Driver, function: int,
                    smem: int) -> tuple[tuple[int, int, int], int]:
    sms = int(cupy.cuda.Device().attributes["MultiProcessorCount"])
    return fused_geometry(spec, shape, sms, cluster_fit(driver, function, spec.block_dims(), smem))


def _capacity(cupy: Any, spec: KernelSpec, driver: Driver, function: int, smem: int) -> int:
    """CTAs of a persistent stage that run at once: one per multiprocessor, or for a
    cluster launch the co-resident clusters the driver reports times their size."""
    if spec.cluster == 1:
        return int(cupy.cuda.Device().attributes["MultiProcessorCount"])
    clusters = driver.max_active_clusters(function, spec.block_dims(), smem, spec.cluster)
    if clusters < 1:
        raise PerfscopeError(f"{spec.name} cannot run on this GPU: not one cluster of "
                             f"{spec.cluster} CTAs with {smem} bytes of shared memory fits")
    return clusters * spec.cluster


def capability_refusal(spec: KernelSpec, cc: int) -> str | None:
    """Why a runnable stage cannot run on a GPU of capability cc (one sentence), or None."""
    if cc < spec.min_cc:
        return (f"{spec.name} needs compute capability {spec.min_cc / 10:.1f} or newer; this "
                f"GPU has {cc / 10:.1f}")
    if spec.only_cc and cc not in spec.only_cc:
        need = " or ".join(f"{c / 10:.1f}" for c in spec.only_cc)
        return (f"{spec.name} runs only on compute capability {need} (its instructions exist "
                f"on {', '.join(spec.archs)} alone); this GPU has {cc / 10:.1f}")
    return None


# ------------------------------------------------------------------ cuBLASLt (nvmath)

_LT_NAMES = frozenset(s.name for s in LT_REFERENCES)


def nvmath_advanced() -> Any:
    """nvmath.linalg.advanced, or a one-sentence refusal that says how to get it."""
    try:
        import nvmath.linalg.advanced as advanced
    except Exception as exc:  # ImportError, or a CUDA library missing behind it
        raise PerfscopeError(f"the cuBLASLt references need nvmath-python, which does not import "
                             f"here ({type(exc).__name__}: {exc}); pip install nvmath-python, or "
                             "diff against 'cublas' instead") from None
    if not hasattr(advanced, "Matmul"):
        raise PerfscopeError("this nvmath-python has no stateful nvmath.linalg.advanced.Matmul; "
                             "install nvmath-python 0.5 or newer")
    return advanced


class LtMatmul:
    """C = A·B through cuBLASLt, planned once per (A, B, C) and executed per call.

    In place (``inplace=True``, C as the operand with beta 0), so execute() writes the
    row-major C it is given and allocates nothing: no copy kernel lands beside cuBLASLt's
    inside a profiled range. nvmath's one-shot ``matmul`` would re-plan on every call.
    """

    def __init__(self, advanced: Any) -> None:
        self._advanced = advanced
        self._plans: dict[tuple[int, int, int], Any] = {}
        # nvmath logs to the root logger unless given one; keep its INFO lines out of the
        # profiled runner's output.
        self._log = logging.getLogger("perfscope.nvmath")
        self._log.setLevel(logging.WARNING)

    def _plan(self, a: Any, b: Any, c: Any) -> Any:
        try:
            mm = self._advanced.Matmul(a, b, c=c, alpha=1.0, beta=0.0,
                                       options={"inplace": True, "logger": self._log})
        except TypeError as exc:
            raise PerfscopeError(f"this nvmath-python cannot multiply in place ({exc}); install "
                                 "nvmath-python 0.5 or newer") from None
        mm.plan()
        return mm

    def __call__(self, a: Any, b: Any, c: Any) -> None:
        """C = A·B, planned on the first call with these three arrays and executed from then on."""
        key = (a.data.ptr, b.data.ptr, c.data.ptr)
        mm = self._plans.get(key)
        if mm is None:
            mm = self._plans[key] = self._plan(a, b, c)
        mm.execute()

    def free(self) -> None:
        """Release every plan."""
        for mm in self._plans.values():
            mm.free()
        self._plans.clear()


class LtFp8Matmul(LtMatmul):
    """C = bf16(scale_a * scale_b * A·Btᵀ) through cuBLASLt's FP8 GEMM, planned once per
    (A, Bt, C) and executed in place per call, as LtMatmul.

    CuPy has no fp8 type and nvmath reads FP8 only from torch's float8 tensors, so the plan
    is made on torch views of the same device bytes (A's and Bt's codes, C's bf16 halves):
    A row-major M x K, B = Btᵀ (K x N, K contiguous: the layout cuBLASLt's FP8 GEMM takes),
    the scales those of fp8.FP8_SCALES. ``fast``: cuBLASLt's fast accumulation (the tensor
    cores' fp32 accumulators over the whole K) instead of its default promotion of the
    partial sums to fp32 on the CUDA cores.
    """

    def __init__(self, advanced: Any, fast: bool) -> None:
        super().__init__(advanced)
        self._fast = fast

    def _plan(self, a: Any, b: Any, c: Any) -> Any:
        torch = _torch()
        import cupy

        fp8 = torch.float8_e4m3fn
        ta = torch.from_dlpack(a.view(cupy.uint8)).view(fp8)
        tb = torch.from_dlpack(b.view(cupy.uint8)).view(fp8).t()
        tc = torch.from_dlpack(c.view(cupy.uint16)).view(torch.bfloat16)
        scale_a, scale_b = FP8_SCALES
        try:
            mm = self._advanced.Matmul(ta, tb, c=tc, alpha=1.0, beta=0.0,
                                       quantization_scales={"a": scale_a, "b": scale_b},
                                       options={"inplace": True, "logger": self._log,
                                                "fast_accumulation": self._fast})
        except (TypeError, ValueError) as exc:
            raise PerfscopeError(f"nvmath-python cannot plan cuBLASLt's FP8 GEMM for this "
                                 f"problem ({one_line(exc)})") from None
        mm.plan()
        return mm


def _torch() -> Any:
    """torch, or a one-sentence refusal: the FP8 reference needs its float8 tensors."""
    try:
        import torch
    except Exception as exc:  # ImportError, or a CUDA library missing behind it
        raise PerfscopeError(f"the cuBLASLt FP8 reference needs torch for its float8 tensors, "
                             f"which does not import here ({type(exc).__name__}: {exc})") from None
    if not hasattr(torch, "float8_e4m3fn"):
        raise PerfscopeError("this torch has no float8_e4m3fn type; the cuBLASLt FP8 reference "
                             "needs torch 2.1 or newer")
    return torch
