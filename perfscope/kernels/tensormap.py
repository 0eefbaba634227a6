"""Host side of the tensor-map ABI: encode CUtensorMaps and launch with cuLaunchKernelEx.

The TMA stages (hopper.cu, blackwell.cu) take ``(TensorMap2D tmap_a, tmap_b, tmap_c, T* C,
int M, int N, int K)`` with the maps passed by value as ``__grid_constant__`` parameters.
Their descriptions (dimensions, strides, boxes) are planned by the pure functions of
:mod:`perfscope.kernels.maps`, which the unit tests assert on; only :class:`Driver` touches
the GPU. CuPy allocates the matrices and loads the cubin.

The launch goes through ``cuda.bindings.driver`` (cuda-bindings, in the ``build`` extra):
``cuLaunchKernelEx`` with a ``CUlaunchConfig`` and, for clusters, a
``CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION`` attribute, and ``cuOccupancyMaxActiveClusters``;
enum values come from the same module. The maps themselves are encoded into a buffer of
our own through ``libcuda.so.1`` with ctypes, because cuda-bindings 13.3 keeps a
``CUtensorMap`` inside its Python object at an address 48 bytes past a 64-byte boundary
(checked on x86-64), and the driver requires 64 (cuda-python pull request 1692). Without
cuda-bindings, the launch falls back to hand-laid ``CUlaunchConfig`` structs (x86-64
layout, tested).

References: CUDA Driver API, ``cuTensorMapEncodeTiled`` (its constraints on addresses,
strides, boxes and swizzle) and ``cuLaunchKernelEx`` / ``CUlaunchConfig``; enum values
from ``cuda.h`` of CUDA 13.0 where cuda-bindings is absent.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from perfscope.errors import PerfscopeError
from perfscope.kernels.maps import INTERLEAVE_NONE, OOB_FILL_ZEROS, STRIDE_ALIGN, MapPlan
from perfscope.kernels.spec import Shape

log = logging.getLogger(__name__)


def bindings() -> Any:
    """cuda.bindings.driver, or None where cuda-bindings is not installed."""
    try:
        from cuda.bindings import driver
    except ImportError:
        return None
    return driver


TENSOR_MAP_BYTES = 128
TENSOR_MAP_ALIGN = 64


def persistent_grid(ctas: int, capacity: int, cluster: int = 1) -> int:
    """As many CTAs as run at once (``capacity``: the multiprocessors, or the co-resident
    clusters times their size), never more than the work asks for, in whole clusters."""
    return max(cluster, min(ctas, capacity // cluster * cluster))


def balanced_grid(ctas: int, capacity: int) -> int:
    """The fewest CTAs that still take ``ctas`` units in the rounds one CTA per unit, capped
    at ``capacity``, takes: each CTA the same number of units or one fewer, so the SMs left
    over idle for the whole launch instead of for its last round (512 tiles on 132 SMs: 128
    CTAs of 4 tiles, where 132 take 4 rounds with 16 idle in the last)."""
    full = persistent_grid(ctas, capacity)
    if ctas <= full:
        return full
    rounds = -(-ctas // full)
    return -(-ctas // rounds)


# CUlaunchAttributeID of the cluster shape (cuda.h).
LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4


def launch_config(cu: Any, geometry: Sequence[tuple[int, int, int] | int], stream: int,
                  cluster: int) -> Any:
    """A cuda.bindings CUlaunchConfig: grid, block, dynamic shared memory, stream and, for
    cluster > 1, the cluster shape (cluster, 1, 1) as its one attribute."""
    (gx, gy, gz), (bx, by, bz), smem = geometry
    config = cu.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = gx, gy, gz
    config.blockDimX, config.blockDimY, config.blockDimZ = bx, by, bz
    config.sharedMemBytes = smem
    config.hStream = cu.CUstream(stream)
    if cluster > 1:
        attr = cu.CUlaunchAttribute()
        attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        dim = attr.value.clusterDim
        dim.x, dim.y, dim.z = cluster, 1, 1
        config.attrs = [attr]
        config.numAttrs = 1
    else:
        config.numAttrs = 0
    return config


class _LaunchAttribute(ctypes.Structure):
    # CUlaunchAttribute: the id, padding to 8 bytes, a 64-byte value union whose
    # clusterDim member is three unsigned ints.
    _fields_ = [("id", ctypes.c_uint), ("pad", ctypes.c_ubyte * 4),
                ("value", ctypes.c_uint * 16)]


def _cluster_attributes(cluster: int) -> tuple[ctypes.Array | None, int]:
    if cluster == 1:
        return None, 0
    attrs = (_LaunchAttribute * 1)()
    attrs[0].id = LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    attrs[0].value[0], attrs[0].value[1], attrs[0].value[2] = cluster, 1, 1
    return attrs, 1


class _LaunchConfig(ctypes.Structure):
    # CUlaunchConfig (cuda.h); attrs is NULL unless the launch has a cluster shape.
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint),
                ("gridDimZ", ctypes.c_uint), ("blockDimX", ctypes.c_uint),
                ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.c_void_p), ("numAttrs", ctypes.c_uint)]


class TensorMap:
    """128 bytes on a 64-byte boundary, filled by the driver (a CUtensorMap)."""

    def __init__(self) -> None:
        self._raw = (ctypes.c_ubyte * (TENSOR_MAP_BYTES + TENSOR_MAP_ALIGN))()
        base = ctypes.addressof(self._raw)
        self.address = base + (-base % TENSOR_MAP_ALIGN)

    def bytes(self) -> bytes:
        """The map's 128 bytes, as the driver filled them."""
        return ctypes.string_at(self.address, TENSOR_MAP_BYTES)


class Driver:
    """cuTensorMapEncodeTiled (libcuda.so.1, into our aligned buffer), cuLaunchKernelEx and
    cuOccupancyMaxActiveClusters (cuda.bindings.driver, else libcuda.so.1)."""

    def __init__(self) -> None:
        try:
            self._lib = ctypes.CDLL("libcuda.so.1")
        except OSError:
            raise PerfscopeError("no GPU: the CUDA driver library libcuda.so.1 is not "
                                 "installed") from None
        self._cu = bindings()
        self._lib.cuGetErrorString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        self._lib.cuTensorMapEncodeTiled.argtypes = [
            ctypes.c_void_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64),
            ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32),
            ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        self._lib.cuLaunchKernelEx.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p,
                                               ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
        self._lib.cuOccupancyMaxActiveClusters.argtypes = [
            ctypes.POINTER(ctypes.c_int), ctypes.c_void_p, ctypes.POINTER(_LaunchConfig)]

    def _check(self, code: int, what: str) -> None:
        if code != 0:
            text = ctypes.c_char_p()
            self._lib.cuGetErrorString(code, ctypes.byref(text))
            reason = text.value.decode() if text.value else f"error {code}"
            raise PerfscopeError(f"{what} failed: {reason}")

    def encode(self, plan: MapPlan, address: int) -> TensorMap:
        """The tensor map of one operand at this address; PerfscopeError unless it is 16-byte aligned."""
        if address % STRIDE_ALIGN:
            raise PerfscopeError(f"{plan.operand} starts at an address that is not 16-byte "
                                 "aligned, which TMA needs")
        tmap = TensorMap()
        dims = (ctypes.c_uint64 * 2)(*plan.dims)
        strides = (ctypes.c_uint64 * 1)(plan.row_stride)
        box = (ctypes.c_uint32 * 2)(*plan.box)
        elem_strides = (ctypes.c_uint32 * 2)(1, 1)
        self._check(self._lib.cuTensorMapEncodeTiled(
            tmap.address, plan.data_type, 2, address, dims, strides, box, elem_strides,
            INTERLEAVE_NONE, plan.swizzle, plan.l2_promotion, OOB_FILL_ZEROS),
            f"cuTensorMapEncodeTiled for {plan.operand}")
        return tmap

    @staticmethod
    def _config(geometry: Sequence[tuple[int, int, int] | int], stream: int,
                cluster: int) -> tuple[_LaunchConfig, Any]:
        (gx, gy, gz), (bx, by, bz), smem = geometry
        attrs, count = _cluster_attributes(cluster)
        config = _LaunchConfig(gx, gy, gz, bx, by, bz, smem, stream,
                               ctypes.cast(attrs, ctypes.c_void_p) if attrs else None, count)
        return config, attrs   # attrs must outlive the call that reads config

    def _check_bound(self, result: Any, what: str) -> Any:
        """The value of a cuda.bindings call, whose first element is its CUresult."""
        err, *rest = result if isinstance(result, tuple) else (result,)
        if int(err) != 0:
            _, text = self._cu.cuGetErrorString(err)
            reason = text.decode() if isinstance(text, bytes) and text else f"error {int(err)}"
            raise PerfscopeError(f"{what} failed: {reason}")
        return rest[0] if rest else None

    def launch(self, function: int, geometry: Sequence[tuple[int, int, int] | int],
               stream: int, args: Sequence[Any], cluster: int = 1) -> None:
        """Launch ``function`` (a CUfunction handle) with grid, block, dynamic smem and,
        for cluster > 1, cluster dimensions (cluster, 1, 1)."""
        params = (ctypes.c_void_p * len(args))(
            *[a.address if isinstance(a, TensorMap) else ctypes.addressof(a) for a in args])
        if self._cu is not None:
            cu = self._cu
            try:
                # kernelParams as the address of our void*[] (args stay alive until return).
                result = cu.cuLaunchKernelEx(launch_config(cu, geometry, stream, cluster),
                                             cu.CUfunction(function), ctypes.addressof(params), 0)
            except TypeError as exc:
                # A cuda-bindings whose signature differs: the hand-laid structs still work.
                log.warning("cuda.bindings cuLaunchKernelEx refused its arguments (%s); "
                            "launching through libcuda.so.1", exc)
                self._cu = None
            else:
                self._check_bound(result, "cuLaunchKernelEx")
                return
        config, _attrs = self._config(geometry, stream, cluster)
        self._check(self._lib.cuLaunchKernelEx(ctypes.byref(config), function, params, None),
                    "cuLaunchKernelEx")

    def max_active_clusters(self, function: int, block: tuple[int, int, int], smem: int,
                            cluster: int) -> int:
        """How many clusters of `cluster` CTAs of this kernel the GPU runs at once."""
        if self._cu is not None:
            cu = self._cu
            return int(self._check_bound(cu.cuOccupancyMaxActiveClusters(
                cu.CUfunction(function), launch_config(cu, ((cluster, 1, 1), block, smem), 0, cluster)),
                "cuOccupancyMaxActiveClusters"))
        config, _attrs = self._config(((cluster, 1, 1), block, smem), 0, cluster)
        count = ctypes.c_int(0)
        self._check(self._lib.cuOccupancyMaxActiveClusters(ctypes.byref(count), function,
                                                           ctypes.byref(config)),
                    "cuOccupancyMaxActiveClusters")
        return count.value


@dataclass
class TensorMapLauncher:
    """Launches one prepared tensor-map stage; maps are cached per (A, B, C) addresses."""

    plans: tuple[MapPlan, MapPlan, MapPlan]
    function: int
    geometry: tuple[tuple[int, int, int], tuple[int, int, int], int]
    shape: Shape
    driver: Driver
    cluster: int = 1
    _maps: dict[tuple[int, int, int], tuple[TensorMap, ...]] = field(default_factory=dict)

    def __call__(self, a_ptr: int, b_ptr: int, c_ptr: int, stream: int,
                 extra_ptrs: Sequence[int] = ()) -> None:
        """Launch the kernel on A, B and C at these addresses, encoding their maps on first use;
        ``extra_ptrs`` follow K (the fused stages' bias and residual; 0 passes NULL)."""
        key = (a_ptr, b_ptr, c_ptr)
        maps = self._maps.get(key)
        if maps is None:
            maps = tuple(self.driver.encode(p, ptr) for p, ptr in zip(self.plans, key, strict=True))
            self._maps[key] = maps
        s = self.shape
        args = [*maps, ctypes.c_void_p(c_ptr), ctypes.c_int(s.m), ctypes.c_int(s.n),
                ctypes.c_int(s.k), *(ctypes.c_void_p(p or None) for p in extra_ptrs)]
        self.driver.launch(self.function, self.geometry, stream, args, self.cluster)
